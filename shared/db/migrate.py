"""Versioned SQL migrations (``shared/db/migrations/NNNN_name.sql``), applied in order, once.

A session-level advisory lock serialises concurrent runners (every service may call this at start),
and each migration runs in its own transaction with its ``schema_migrations`` row, so a crash
mid-migration leaves the previous version intact. The embedding dimension is fixed at the first
migration and checked on every later run, because only ``palace reembed`` may change it (it records
the new active space, which services then follow whatever their settings say).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from importlib import resources
from typing import Any

import psycopg
from psycopg import sql

__all__ = ["Migration", "apply_migrations", "load_migrations", "pending_migrations"]

_LOCK_KEY = 0x5A1ACE  # arbitrary, constant advisory-lock key
_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    text: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()[:16]


def load_migrations() -> list[Migration]:
    """All migrations shipped in the package, sorted by version."""
    out = []
    for entry in resources.files("shared.db.migrations").iterdir():
        m = _NAME.match(entry.name)
        if m:
            out.append(Migration(int(m.group(1)), m.group(2), entry.read_text()))
    return sorted(out, key=lambda m: m.version)


def _render(text: str, embed_dim: int) -> sql.Composed:
    # Identifiers/literals through psycopg.sql, never str.format on values.
    return sql.SQL(text.replace("{", "{{").replace("}", "}}").replace("{{embed_dim}}", "{embed_dim}")).format(
        embed_dim=sql.Literal(int(embed_dim))
    )


def apply_migrations(database_url: str, embed_dim: int) -> list[str]:
    """Apply pending migrations; returns the names applied (empty when up to date).

    Args:
        database_url: PostgreSQL URL.
        embed_dim: dimension of the ``vector`` columns; must equal the one the database was created with.
    """
    applied: list[str] = []
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("SELECT pg_advisory_lock(%s)", (_LOCK_KEY,))
        try:
            conn.execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations (version integer PRIMARY KEY, name text NOT NULL,"
                " checksum text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"
            )
            conn.execute("CREATE TABLE IF NOT EXISTS palace_meta (key text PRIMARY KEY, value text NOT NULL)")
            row = conn.execute("SELECT value FROM palace_meta WHERE key = 'embed_dim'").fetchone()
            if row and int(row[0]) != embed_dim and not _reembedded(conn, int(row[0])):
                raise RuntimeError(
                    f"database was created with embedding dimension {row[0]}, configuration says {embed_dim}: "
                    "set PALACE_EMBED_DIM to match, or change it with `palace reembed`"
                )
            dim = int(row[0]) if row else embed_dim  # the database's own, once it has one
            done = dict(conn.execute("SELECT version, checksum FROM schema_migrations").fetchall())
            for mig in load_migrations():
                if mig.version in done and done[mig.version] != mig.checksum:
                    # An applied migration was edited: this database has the old schema. Fail loudly.
                    raise RuntimeError(
                        f"migration {mig.version:04d}_{mig.name} changed after it was applied to this database "
                        f"(checksum {done[mig.version]} → {mig.checksum}); add a new migration instead, or "
                        "recreate a development database"
                    )
                if mig.version in done:
                    continue
                with conn.transaction():
                    conn.execute(_render(mig.text, dim))
                    conn.execute(
                        "INSERT INTO schema_migrations (version, name, checksum) VALUES (%s, %s, %s)",
                        (mig.version, mig.name, mig.checksum),
                    )
                    conn.execute(
                        "INSERT INTO palace_meta (key, value) VALUES ('embed_dim', %s) ON CONFLICT (key) DO NOTHING",
                        (str(dim),),
                    )
                applied.append(f"{mig.version:04d}_{mig.name}")
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (_LOCK_KEY,))
    return applied


def _reembedded(conn: psycopg.Connection[Any], dim: int) -> bool:
    """True when ``palace reembed`` made a space of ``dim`` active: services follow the database's active
    space (shared/adapters/space_embedder.py), so settings still naming the first one are not an error."""
    row = conn.execute("SELECT to_regclass('embedding_spaces') IS NOT NULL").fetchone()
    if not (row and row[0]):
        return False
    return conn.execute("SELECT 1 FROM embedding_spaces WHERE state = 'active' AND provider IS NOT NULL"
                        " AND dim = %s", (dim,)).fetchone() is not None


def pending_migrations(database_url: str) -> list[str]:
    """Names of the shipped migrations this database has not applied yet, without changing anything.

    Read-only, so a container that must not run DDL (a Kubernetes initContainer waiting for the
    migration Job) can poll it until the schema is current.
    """
    with psycopg.connect(database_url, autocommit=True) as conn:
        row = conn.execute("SELECT to_regclass('schema_migrations') IS NOT NULL").fetchone()
        done = {v for (v,) in conn.execute("SELECT version FROM schema_migrations").fetchall()} if row and row[0] \
            else set()
    return [f"{m.version:04d}_{m.name}" for m in load_migrations() if m.version not in done]
