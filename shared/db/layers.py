"""SQL of the memory layers: the workspace identity (L0) and drawers by importance (L1, L2)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg import AsyncConnection, sql

__all__ = ["LayerRow", "drawers_by_importance", "get_identity", "put_identity"]


@dataclass(frozen=True, slots=True)
class LayerRow:
    id: str
    content: str  # at most the requested prefix of the content
    wing: str
    room: str
    importance: float
    memory_type: str | None
    occurred_at: datetime | None
    filed_at: datetime


async def get_identity(conn: AsyncConnection[Any], workspace_id: str) -> tuple[str, datetime] | None:
    """The workspace's identity text and when it was last set, or None."""
    cur = await conn.execute("SELECT text, updated_at FROM identities WHERE workspace_id = %s", (workspace_id,))
    row = await cur.fetchone()
    return (row[0], row[1]) if row else None


async def put_identity(conn: AsyncConnection[Any], workspace_id: str, text: str) -> datetime:
    """Set (or replace) the workspace's one identity; returns its ``updated_at``."""
    cur = await conn.execute(
        "INSERT INTO identities (workspace_id, text) VALUES (%s, %s)"
        " ON CONFLICT (workspace_id) DO UPDATE SET text = EXCLUDED.text, updated_at = now()"
        " RETURNING updated_at", (workspace_id, text))
    row = await cur.fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


async def drawers_by_importance(
    conn: AsyncConnection[Any], workspace_id: str, *, wing: str | None = None, room: str | None = None,
    limit: int = 15, prefix_chars: int = 400,
) -> list[LayerRow]:
    """The ``limit`` most important live drawers, optionally of one wing and/or room; ties go to the most
    recent, then the id, so the answer is stable. Without a filter the partial index
    ``drawers_importance`` serves the order; with one, ``drawers_wing_room`` the filter.
    Only the first ``prefix_chars`` of each content are read."""
    where = [sql.SQL("workspace_id = %(ws)s AND deleted_at IS NULL AND state <> 'merged'")]
    if wing is not None:
        where.append(sql.SQL("wing = %(wing)s"))
    if room is not None:
        where.append(sql.SQL("room = %(room)s"))
    # Conditions are left out rather than written ``(%s IS NULL OR wing = %s)``: a generic plan for that
    # form cannot use the wing/room index.
    query = sql.SQL(
        "SELECT id, left(content, %(n)s), wing, room, importance, memory_type, occurred_at, filed_at"
        "  FROM drawers WHERE {}"
        " ORDER BY importance DESC, coalesce(occurred_at, filed_at) DESC, id LIMIT %(limit)s"
    ).format(sql.SQL(" AND ").join(where))
    cur = await conn.execute(query, {"ws": workspace_id, "wing": wing, "room": room, "limit": limit,
                                     "n": prefix_chars})
    return [LayerRow(r[0], r[1], r[2], r[3], float(r[4]), r[5], r[6], r[7]) for r in await cur.fetchall()]
