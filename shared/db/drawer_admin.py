"""Drawer operations agents and people ask for directly: soft delete and restore (audited, revertible),
near-duplicate lookup, an agent's diary."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np
from psycopg import AsyncConnection

from shared.db.drawers import record_history

__all__ = ["PREFIX_LOOKUP_SQL", "DrawerSummary", "diary_entries", "drawers_by_id_prefix", "restore_drawer",
           "similar_drawers", "soft_delete_drawer"]


@dataclass(frozen=True)
class DrawerSummary:
    id: str
    content: str
    wing: str
    room: str
    hall: str | None
    memory_type: str | None
    filed_at: datetime
    occurred_at: datetime | None = None
    similarity: float | None = None


async def soft_delete_drawer(
    conn: AsyncConnection[Any], workspace_id: str, drawer_id: str, *, actor: str, event_id: str,
    reason: str | None = None,
) -> bool:
    """Mark a live drawer deleted (search, layers and the graph stop seeing it); the row, its
    embedding and provenance stay, so ``restore_drawer`` brings it back. False if no live drawer."""
    cur = await conn.execute(
        "UPDATE drawers SET deleted_at = now(), updated_at = now()"
        " WHERE workspace_id = %s AND id = %s AND deleted_at IS NULL RETURNING wing, room, deleted_at",
        (workspace_id, drawer_id),
    )
    row = await cur.fetchone()
    if row is None:
        return False
    await record_history(conn, workspace_id, drawer_id=drawer_id, action="DELETE", actor=actor, event_id=event_id,
                         reason=reason, old_value={"deleted_at": None},
                         new_value={"deleted_at": row[2], "wing": row[0], "room": row[1]})
    return True


async def restore_drawer(
    conn: AsyncConnection[Any], workspace_id: str, drawer_id: str, *, actor: str, event_id: str,
    reason: str | None = None,
) -> bool:
    """Undo a soft delete. False if the drawer is not deleted (or does not exist)."""
    cur = await conn.execute(
        "UPDATE drawers SET deleted_at = NULL, updated_at = now()"
        " WHERE workspace_id = %s AND id = %s AND deleted_at IS NOT NULL RETURNING 1",
        (workspace_id, drawer_id),
    )
    if await cur.fetchone() is None:
        return False
    await record_history(conn, workspace_id, drawer_id=drawer_id, action="RESTORE", actor=actor, event_id=event_id,
                         reason=reason, new_value={"deleted_at": None})
    return True


@dataclass(frozen=True)
class Placement:
    """Where a drawer is filed, whether it is soft-deleted, and the hash of the words it holds now (a curation
    UPDATE rewrites a drawer's words under its id)."""

    wing: str
    room: str | None
    hall: str | None
    deleted: bool
    content_hash: str


async def drawer_placements(conn: AsyncConnection[Any], workspace_id: str, ids: list[str]) -> dict[str, Placement]:
    """The drawers among ``ids`` that exist (deleted ones included), by primary key."""
    cur = await conn.execute(
        "SELECT id, wing, room, hall, deleted_at IS NOT NULL, content_hash FROM drawers"
        " WHERE workspace_id = %s AND id = ANY(%s)", (workspace_id, ids))
    return {str(r[0]): Placement(str(r[1]), r[2] or None, r[3], bool(r[4]), str(r[5])) for r in await cur.fetchall()}


async def similar_drawers(
    conn: AsyncConnection[Any], workspace_id: str, embedding: np.ndarray, *, threshold: float, limit: int,
    exact: bool,
) -> list[DrawerSummary]:
    """Live drawers whose cosine similarity to ``embedding`` is at least ``threshold``, nearest first.

    ``exact`` (small workspaces) scans the workspace instead of walking the shared HNSW index,
    which filters by workspace only after the walk (see shared/db/search.py).
    """
    order = "(embedding <=> %(emb)s) + 0" if exact else "embedding <=> %(emb)s"
    cur = await conn.execute(
        f"""SELECT * FROM (
              SELECT id, content, wing, room, hall, memory_type, filed_at, occurred_at,
                     1 - (embedding <=> %(emb)s) AS sim
                FROM drawers
               WHERE workspace_id = %(ws)s AND deleted_at IS NULL AND state <> 'merged' AND embedding IS NOT NULL
               ORDER BY {order} LIMIT %(n)s) c
             WHERE c.sim >= %(t)s ORDER BY c.sim DESC""",  # noqa: S608 - order is one of two constants
        {"emb": embedding, "ws": workspace_id, "n": limit, "t": threshold},
    )
    return [DrawerSummary(*r[:8], similarity=float(r[8])) for r in await cur.fetchall()]


async def diary_entries(conn: AsyncConnection[Any], workspace_id: str, agent: str, limit: int) -> list[DrawerSummary]:
    """An agent's diary (wing 'diary', hall = agent), newest written first (index drawers_diary)."""
    cur = await conn.execute(
        """SELECT id, content, wing, room, hall, memory_type, filed_at, occurred_at FROM drawers
            WHERE workspace_id = %s AND wing = 'diary' AND hall = %s AND deleted_at IS NULL
            ORDER BY occurred_at DESC NULLS LAST, filed_at DESC LIMIT %s""",
        (workspace_id, agent, limit),
    )
    return [DrawerSummary(*r) for r in await cur.fetchall()]


# The range bounds the primary-key walk (every hex continuation of the prefix sorts below prefix || 'g',
# in the C collation and the usual locales alike); ``left`` is the exact test.
PREFIX_LOOKUP_SQL = """SELECT id, content, wing, room, hall, memory_type, filed_at, occurred_at FROM drawers
                        WHERE workspace_id = %(ws)s AND id >= %(p)s AND id < %(p)s || 'g'
                          AND left(id, length(%(p)s)) = %(p)s AND deleted_at IS NULL
                        ORDER BY id LIMIT %(n)s"""


async def drawers_by_id_prefix(
    conn: AsyncConnection[Any], workspace_id: str, prefix: str, *, limit: int = 5,
) -> list[DrawerSummary]:
    """Live drawers of the workspace whose id starts with ``prefix`` (a citation's short id, or a whole
    id), at most ``limit``, by id: more than one means the prefix is ambiguous."""
    cur = await conn.execute(PREFIX_LOOKUP_SQL, {"ws": workspace_id, "p": prefix, "n": limit})
    return [DrawerSummary(*r) for r in await cur.fetchall()]
