"""L0 identity: one short text per workspace, set by the user or an agent, audited on every change."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from psycopg import AsyncConnection

from shared.db.drawers import record_history

__all__ = ["get_identity", "set_identity"]


async def get_identity(conn: AsyncConnection[Any], workspace_id: str) -> str | None:
    cur = await conn.execute("SELECT text FROM identities WHERE workspace_id = %s", (workspace_id,))
    row = await cur.fetchone()
    return str(row[0]) if row else None


async def set_identity(
    conn: AsyncConnection[Any], workspace_id: str, text: str, *, actor: str, event_id: str
) -> tuple[str | None, datetime]:
    """Replace the workspace's identity; the previous text goes to memory_history (revertible). The one
    writer of identities, for every interface. Returns the previous text and when this one was set."""
    old = await get_identity(conn, workspace_id)
    cur = await conn.execute(
        "INSERT INTO identities (workspace_id, text) VALUES (%s, %s) ON CONFLICT (workspace_id)"
        " DO UPDATE SET text = EXCLUDED.text, updated_at = now() RETURNING updated_at",
        (workspace_id, text),
    )
    row = await cur.fetchone()
    assert row is not None
    await record_history(conn, workspace_id, drawer_id=None, action="SET_IDENTITY", actor=actor,
                         event_id=event_id, old_value={"text": old}, new_value={"text": text})
    return old, row[0]
