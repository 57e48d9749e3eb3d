"""Access statistics: one batched UPDATE per workspace for everything recall returned meanwhile.

Recall keeps memories alive (maintain decays drawers nobody reads), so every drawer a layer or a
search returns gets ``access_count`` and ``last_accessed_at`` bumped. Doing that row by row, or one
statement per search, puts a write in every read's path; this writes many searches' worth at once.
Rows another transaction holds are skipped rather than waited for (``SKIP LOCKED``), and the
statement gives up quickly on any other lock (``lock_timeout``): an access count is worth less than
a search that is not kept waiting.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from psycopg import AsyncConnection

__all__ = ["bump_access"]

_SQL = """
WITH u AS (
    SELECT * FROM unnest(%(ids)s::text[], %(n)s::int[], %(at)s::timestamptz[]) AS u(id, n, at)
), free AS (
    SELECT d.id FROM drawers d JOIN u ON u.id = d.id
     WHERE d.workspace_id = %(ws)s
     FOR UPDATE OF d SKIP LOCKED
)
UPDATE drawers d
   SET access_count = d.access_count + u.n,
       last_accessed_at = greatest(coalesce(d.last_accessed_at, u.at), u.at)
  FROM u, free
 WHERE d.workspace_id = %(ws)s AND d.id = free.id AND u.id = free.id
RETURNING d.id
"""


async def bump_access(
    conn: AsyncConnection[Any], workspace_id: str, counts: dict[str, tuple[int, datetime]],
    *, lock_timeout_ms: int = 200,
) -> set[str]:
    """Add each drawer's pending access count and move its last access forward, in one statement.

    Args:
        conn: a connection inside the workspace's transaction (shared.db.tenancy.workspace_tx).
        counts: drawer id → (accesses since the last flush, time of the latest one).
        lock_timeout_ms: how long the statement may wait for a lock before it fails.

    Returns the ids updated; an id missing from it was locked by another transaction (or is gone).
    """
    if not counts:
        return set()
    await conn.execute(f"SET LOCAL lock_timeout = '{int(lock_timeout_ms)}ms'")
    ids = list(counts)
    cur = await conn.execute(_SQL, {"ids": ids, "n": [counts[i][0] for i in ids], "at": [counts[i][1] for i in ids],
                                    "ws": workspace_id})
    return {r[0] for r in await cur.fetchall()}
