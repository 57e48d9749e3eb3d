"""SQL of the memory layers: the workspace identity (L0) and drawers by importance (L1, L2)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg import AsyncConnection, sql

__all__ = ["LayerRow", "drawers_by_importance", "essential_query", "get_identity"]


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
    longer: bool = False  # the content goes on past the prefix read


async def get_identity(conn: AsyncConnection[Any], workspace_id: str) -> tuple[str, datetime] | None:
    """The workspace's identity text and when it was last set, or None."""
    cur = await conn.execute("SELECT text, updated_at FROM identities WHERE workspace_id = %s", (workspace_id,))
    row = await cur.fetchone()
    return (row[0], row[1]) if row else None


# Keys are read in the order of the index ``drawers_essential`` (migration 0034): by importance_peak,
# an upper bound of importance. The first read asks for FETCH_FACTOR times the limit; when that cannot
# settle the answer, the next asks for FETCH_GROWTH times more.
FETCH_FACTOR, FETCH_GROWTH = 4, 4


def essential_query(wing: str | None = None, room: str | None = None) -> sql.Composed:
    """The statement ``drawers_by_importance`` reads candidate keys with: live drawers of the workspace
    (optionally of a wing and/or room) in the order of the index ``drawers_essential``, as (id,
    importance, recency in whole microseconds since the epoch, importance_peak). Parameters: ws, wing,
    room (when given), fetch (how many rows).

    Only keys: a workspace whose top drawers decayed below their peaks needs hundreds of rows read to
    settle fifteen, and reading their contents (and ranking full rows in Python) cost more than the
    walk itself. Recency comes as an integer so that ties compare exactly and cheaply."""
    where = [sql.SQL("workspace_id = %(ws)s AND deleted_at IS NULL AND state <> 'merged'")]
    if wing is not None:
        where.append(sql.SQL("wing = %(wing)s"))
    if room is not None:
        where.append(sql.SQL("room = %(room)s"))
    # Conditions are left out rather than written ``(%s IS NULL OR wing = %s)``: a generic plan for that
    # form cannot use the wing/room index.
    return sql.SQL(
        "SELECT id, importance, (extract(epoch FROM coalesce(occurred_at, filed_at)) * 1000000)::int8,"
        "       importance_peak"
        "  FROM drawers WHERE {}"
        " ORDER BY importance_peak DESC, coalesce(occurred_at, filed_at) DESC, id LIMIT %(fetch)s"
    ).format(sql.SQL(" AND ").join(where))


_ROWS = ("SELECT id, left(content, %(n)s), wing, room, importance, memory_type, occurred_at, filed_at,"
         "       length(content) > %(n)s"
         "  FROM drawers WHERE workspace_id = %(ws)s AND id = ANY(%(ids)s)"
         "   AND CASE WHEN deleted_at IS NULL AND state <> 'merged' THEN true END")  # by key only: docs/scale.md


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
    enter the answer. Usually the first read settles it; a workspace whose top drawers have all decayed
    well below their peaks needs a few more rows. The rows of the answer are read last, by primary key,
    in the same transaction.
    """
    if limit <= 0:
        return []
    query = essential_query(wing, room)
    fetch = limit * FETCH_FACTOR
    while True:
        cur = await conn.execute(query, {"ws": workspace_id, "wing": wing, "room": room, "fetch": fetch})
        keys = await cur.fetchall()
        # Smaller is better: importance, then the most recent, then the id.
        ranked = sorted(((-float(imp), -at, did) for did, imp, at, _ in keys))[:limit]
        if len(keys) < fetch:
            break  # every candidate was read
        last_id, _, last_at, last_peak = keys[-1]
        if len(ranked) == limit and ranked[-1] <= (-float(last_peak), -last_at, last_id):
            break
        fetch *= FETCH_GROWTH
    if not ranked:
        return []
    cur = await conn.execute(_ROWS, {"ws": workspace_id, "ids": [r[2] for r in ranked], "n": prefix_chars})
    rows = {r[0]: r for r in await cur.fetchall()}
    return [LayerRow(r[0], r[1], r[2], r[3], float(r[4]), r[5], r[6], r[7], bool(r[8]))
            for r in (rows[did] for _, _, did in ranked if did in rows)]
