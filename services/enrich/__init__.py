"""enrich: ``session.stored`` → episode (extractive summary, L0 abstract) → ``episodic.created``;
``episodic.created`` → entities and mentions (pattern-based) → ``entity.upserted``."""
