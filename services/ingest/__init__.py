"""ingest: ``session.completed`` → raw session + messages + drawers (state raw) → ``drawer.created``."""
