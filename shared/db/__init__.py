"""Database access: the connection pool, the migration runner and the SQL of each table group.

This package and ``shared.adapters`` are the only places that do I/O against PostgreSQL.
"""
