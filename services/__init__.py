"""Palace services: transport only (NATS subscribers, HTTP routes). Logic lives in ``shared``."""
