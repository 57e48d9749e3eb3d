"""cluster: ``drawer.classified`` → near-duplicate merge (memory_history MERGE); ``entity.upserted`` →
entity mention bookkeeping."""
