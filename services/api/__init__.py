"""api: HTTP recall (hybrid search), workspace stats, and a raw-first write path onto the bus."""
