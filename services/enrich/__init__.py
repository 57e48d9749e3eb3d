"""enrich: ``session.stored`` → episode, built once the session's drawers are embedded
(``drawer.embedded``, or a leased sweep after ``episode_wait_s``): extractive summary, L0 abstract,
topics, embedding, expiry → ``episodic.created``;
``episodic.created`` → entities and mentions (pattern-based) → ``entity.upserted``."""
