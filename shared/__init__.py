"""Palace's common library: configuration, events, domain logic, adapters and database access.

Only ``shared.bus`` imports FastStream, and only ``shared.db`` and ``shared.adapters`` do I/O;
``shared.memory`` is pure domain logic so it can be unit-tested without servers.
"""
