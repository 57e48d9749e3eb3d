"""The workspace lexicon (migration 0037): per workspace past exact search, the lexemes that occur in a
sizeable share of its drawers, so that search can build its full-text candidates from the query's
rare words (few matches, the ones BM25 values most) instead of pairs of common ones (thousands of
matches evaluated by GIN before any LIMIT)."""

from __future__ import annotations

import math
from typing import Any

from psycopg import AsyncConnection, sql

__all__ = ["refresh_lexicon", "stale_lexicons"]


async def stale_lexicons(conn: AsyncConnection[Any], max_age_s: float, limit: int = 1) -> list[str]:
    """Workspaces past exact search (they have a vector_indexes row) whose lexicon is missing or older
    than ``max_age_s``, the longest waiting first (maintenance role)."""
    cur = await conn.execute(
        """SELECT workspace_id FROM vector_indexes
            WHERE lexicon_at IS NULL OR lexicon_at < now() - make_interval(secs => %s)
            ORDER BY lexicon_at NULLS FIRST LIMIT %s""",
        (max_age_s, limit),
    )
    return [r[0] for r in await cur.fetchall()]


async def refresh_lexicon(conn: AsyncConnection[Any], workspace_id: str, common_share: float) -> int:
    """Replace the workspace's lexicon with the lexemes found in at least ``common_share`` of its live
    drawers; returns how many. One pass over the workspace's rows (``ts_stat``), run by maintain at
    most once per refresh period, never by a search. In the caller's transaction, one refresh of a
    workspace at a time: a second one waits for the first to commit, then deletes what it wrote (two at
    once each deleted before the other inserted, and the second insert hit the first's rows)."""
    await conn.execute("SELECT pg_advisory_xact_lock(hashtextextended('palace.lexicon:' || %s, 0))",
                       (workspace_id,))
    cur = await conn.execute(
        "SELECT count(*) FROM drawers WHERE workspace_id = %s AND deleted_at IS NULL AND state <> 'merged'",
        (workspace_id,))
    row = await cur.fetchone()
    cutoff = max(1, math.ceil((row[0] if row else 0) * common_share))
    rows_sql = sql.SQL("SELECT tsv FROM public.drawers WHERE workspace_id = {} AND deleted_at IS NULL"
                       " AND state <> 'merged'").format(sql.Literal(workspace_id)).as_string(conn)
    await conn.execute("DELETE FROM workspace_lexicon WHERE workspace_id = %s", (workspace_id,))
    cur = await conn.execute(
        "INSERT INTO workspace_lexicon (workspace_id, lexeme, ndoc) SELECT %s, word, ndoc FROM ts_stat(%s)"
        " WHERE ndoc >= %s",
        (workspace_id, rows_sql, cutoff))
    n = cur.rowcount
    await conn.execute("UPDATE vector_indexes SET lexicon_at = now() WHERE workspace_id = %s", (workspace_id,))
    return n
