"""API key storage: hashes only."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from shared.db.tenancy import key_lookup_tx, workspace_tx
from shared.security import generate_key, hash_key, key_id_of, keys_match

__all__ = ["ApiKeyRow", "create_api_key", "list_api_keys", "revoke_api_key", "store_api_key", "workspace_for_key"]

StoreOutcome = Literal["created", "present", "revoked"]


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


async def store_api_key(pool: AsyncConnectionPool, workspace_id: str, full_key: str,
                        name: str | None = None) -> StoreOutcome:
    """Store a key chosen elsewhere (a deployment's secret) for ``workspace_id``; safe to repeat.

    ``created`` on first store, ``present`` when it is already there, ``revoked`` when it was stored and
    later revoked (left revoked: restarting with an old secret must not bring a key back). A key
    already stored for another workspace raises ``ValueError``: one key never opens two workspaces.
    """
    key_id = key_id_of(full_key)
    if key_id is None:
        raise ValueError(f"malformed API key for workspace {workspace_id}")
    async with workspace_tx(pool, workspace_id) as conn:
        cur = await conn.execute(
            "INSERT INTO api_keys (workspace_id, key_id, key_hash, name) VALUES (%s, %s, %s, %s)"
            " ON CONFLICT DO NOTHING", (workspace_id, key_id, hash_key(full_key), name),
        )
        if cur.rowcount == 1:
            return "created"
    # The row that conflicted may belong to another workspace, which this workspace cannot see.
    async with key_lookup_tx(pool, key_id) as conn:
        rows = await (await conn.execute(
            "SELECT workspace_id, key_hash, revoked_at IS NOT NULL FROM api_keys WHERE key_id = %s", (key_id,)
        )).fetchall()
    for ws, stored, revoked in rows:
        if keys_match(full_key, stored):
            if ws != workspace_id:
                raise ValueError(f"the API key given for workspace {workspace_id} (key id {key_id}) is already "
                                 f"stored for workspace {ws}")
            return "revoked" if revoked else "present"
    raise ValueError(f"key id {key_id} of workspace {workspace_id} is already taken by another key; "
                     "generate a new key")


@dataclass(frozen=True)
class ApiKeyRow:
    """A stored key as an operator sees it: never the key, only its id (the part after ``pk_``)."""

    key_id: str
    name: str | None
    created_at: datetime
    revoked_at: datetime | None


async def list_api_keys(conn: AsyncConnection[Any], workspace_id: str) -> list[ApiKeyRow]:
    """The workspace's keys, newest first, revoked ones included."""
    cur = await conn.execute("SELECT key_id, name, created_at, revoked_at FROM api_keys WHERE workspace_id = %s"
                             " ORDER BY created_at DESC, key_id", (workspace_id,))
    return [ApiKeyRow(*r) for r in await cur.fetchall()]


async def revoke_api_key(conn: AsyncConnection[Any], workspace_id: str, key_id: str) -> bool | None:
    """Revoke a key of the workspace at once and for good (a restart with it still in
    PALACE_API_BOOTSTRAP_KEYS leaves it revoked: ``store_api_key``). True when revoked now, False when it
    already was, None when the workspace has no such key."""
    cur = await conn.execute(
        "UPDATE api_keys SET revoked_at = COALESCE(revoked_at, now()) WHERE workspace_id = %s AND key_id = %s"
        " RETURNING revoked_at = now()", (workspace_id, key_id))
    row = await cur.fetchone()
    return None if row is None else bool(row[0])
