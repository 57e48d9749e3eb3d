"""Palace's development package: what develops Palace, kept apart from what runs in production.

The embedded PostgreSQL + NATS stack (``devstack``), the supervisor that runs every service as its own
process (``palace up``, ``palace demo``, the integration tests, the benches), the demo conversation, and
the LoCoMo evaluation with its benchmark. ``services/`` and ``shared/`` never import it at module level:
the ``palace`` CLI imports it lazily and says to install ``palace[dev]`` when it is missing.
"""
