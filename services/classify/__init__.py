"""classify: ``drawer.embedded`` → memory type, confidence, importance (heuristic tier) → ``drawer.classified``."""
