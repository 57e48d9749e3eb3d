"""SQL of the memory layers: the workspace identity (L0) and drawers by importance (L1, L2)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from psycopg import AsyncConnection, sql

__all__ = ["LayerRow", "drawers_by_importance", "essential_query", "get_identity", "put_identity"]


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


# Rows are fetched in the order of the index ``drawers_essential`` (migration 0034): by importance_peak,
# an upper bound of importance. The first fetch asks for FETCH_FACTOR times the limit; when that cannot
# settle the answer, the next asks for FETCH_GROWTH times more.
FETCH_FACTOR, FETCH_GROWTH = 4, 4


def _rank_key(importance: float, recency: datetime, drawer_id: str) -> tuple[float, float, str]:
    # The order of the layers: importance, then the most recent, then the id; smaller is better.
    # Recency as whole microseconds since the epoch keeps the comparison exact.
    return (-importance, -float((recency - _EPOCH) // _MICROSECOND), drawer_id)


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def essential_query(wing: str | None = None, room: str | None = None) -> sql.Composed:
    """The statement ``drawers_by_importance`` reads candidates with: live drawers of the workspace
    (optionally of a wing and/or room) in the order of the index ``drawers_essential``. Parameters:
    ws, wing, room (when given), fetch (how many rows), n (characters of content)."""
    where = [sql.SQL("workspace_id = %(ws)s AND deleted_at IS NULL AND state <> 'merged'")]
    if wing is not None:
        where.append(sql.SQL("wing = %(wing)s"))
    if room is not None:
        where.append(sql.SQL("room = %(room)s"))
    # Conditions are left out rather than written ``(%s IS NULL OR wing = %s)``: a generic plan for that
    # form cannot use the wing/room index.
    return sql.SQL(
        "SELECT id, left(content, %(n)s), wing, room, importance, memory_type, occurred_at, filed_at,"
        "       importance_peak"
        "  FROM drawers WHERE {}"
        " ORDER BY importance_peak DESC, coalesce(occurred_at, filed_at) DESC, id LIMIT %(fetch)s"
    ).format(sql.SQL(" AND ").join(where))


async def drawers_by_importance(
    conn: AsyncConnection[Any], workspace_id: str, *, wing: str | None = None, room: str | None = None,
    limit: int = 15, prefix_chars: int = 400,
) -> list[LayerRow]:
    """The ``limit`` most important live drawers, optionally of one wing and/or room; ties go to the most
    recent, then the id, so the answer is stable. Only the first ``prefix_chars`` of each content are read.

    Importance itself is in no index (decay rewrites it daily and must stay HOT, migration 0020), so the
    drawers are read in the order of ``drawers_essential``, by ``importance_peak``, which bounds
    importance from above (migration 0034): once the rank the next drawer could at best reach (its peak
    in place of its importance) is below the ``limit``-th drawer found so far, no drawer further down can
    enter the answer. Usually the first fetch settles it; a workspace whose top drawers have all decayed
    well below their peaks needs a few more rows.
    """
    query = essential_query(wing, room)
    if limit <= 0:
        return []
    fetch = limit * FETCH_FACTOR
    while True:
        cur = await conn.execute(query, {"ws": workspace_id, "wing": wing, "room": room, "fetch": fetch,
                                         "n": prefix_chars})
        rows = await cur.fetchall()
        ranked = sorted(rows, key=lambda r: _rank_key(float(r[4]), r[6] or r[7], r[0]))[:limit]
        if len(rows) < fetch:
            break  # every candidate was read
        last = rows[-1]
        bound = _rank_key(float(last[8]), last[6] or last[7], last[0])
        if len(ranked) == limit and _rank_key(float(ranked[-1][4]), ranked[-1][6] or ranked[-1][7],
                                              ranked[-1][0]) <= bound:
            break
        fetch *= FETCH_GROWTH
    return [LayerRow(r[0], r[1], r[2], r[3], float(r[4]), r[5], r[6], r[7]) for r in ranked]
