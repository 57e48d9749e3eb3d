"""embed: ``drawer.created`` → batch embeddings (cache by content hash) → ``drawer.embedded``."""
