"""API key storage: hashes only."""

from __future__ import annotations

from typing import Any

from psycopg import AsyncConnection

from shared.security import generate_key, hash_key, key_id_of, keys_match

__all__ = ["create_api_key", "workspace_for_key"]


async def create_api_key(conn: AsyncConnection[Any], workspace_id: str, name: str | None = None) -> str:
    """Create a key for ``workspace_id``; returns the full key (the only time it exists in clear)."""
    key_id, full = generate_key()
    await conn.execute(
        "INSERT INTO api_keys (workspace_id, key_id, key_hash, name) VALUES (%s, %s, %s, %s)",
        (workspace_id, key_id, hash_key(full), name),
    )
    return full


async def workspace_for_key(conn: AsyncConnection[Any], full_key: str) -> str | None:
    """The workspace a live key belongs to, or None (unknown, malformed or revoked)."""
    key_id = key_id_of(full_key)
    if key_id is None:
        return None
    cur = await conn.execute(
        "SELECT workspace_id, key_hash FROM api_keys WHERE key_id = %s AND revoked_at IS NULL", (key_id,))
    for ws, stored in await cur.fetchall():
        if keys_match(full_key, stored):
            return str(ws)
    return None
