"""Which drawers semantic extraction has read, and which still wait for it (migration 0042).

Two triggers extract a drawer's entities and facts: its session's ``episodic.created`` (enrich-kg), and,
for a processed drawer of importance >= ``KG_MIN_IMPORTANCE`` that no extractor has read, the leased
sweep in enrich. Classify queues such a drawer (``due_at``) in the statement that classifies it; every
extractor marks what it read (``extracted_at``). The sweep reads a partial index that holds only
drawers still waiting, so its cost follows the backlog, not the size of the workspace.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from psycopg import AsyncConnection

__all__ = ["DUE_SQL", "DUE_TURNS_SQL", "due_drawers", "due_turns", "lock_unread", "mark_extracted"]


# The sweep's read (tests check its plan): drawers queued, unread, past their grace; oldest first.
DUE_SQL = """SELECT workspace_id, drawer_id FROM drawer_extraction
              WHERE extracted_at IS NULL AND due_at < now() - make_interval(secs => %s)
              ORDER BY due_at LIMIT %s"""


async def mark_extracted(conn: AsyncConnection[Any], workspace_id: str, drawer_ids: Sequence[str]) -> int:
    """Record that an extractor read these drawers (queued or not): the sweep leaves them alone from now
    on. Idempotent: a drawer read before keeps its first time. Returns how many rows changed."""
    ids = sorted(set(drawer_ids))
    if not ids:
        return 0
    cur = await conn.execute(
        """INSERT INTO drawer_extraction (workspace_id, drawer_id, extracted_at)
           SELECT %s, d, now() FROM unnest(%s::text[]) AS x(d)
           ON CONFLICT (workspace_id, drawer_id) DO UPDATE SET extracted_at = EXCLUDED.extracted_at
            WHERE drawer_extraction.extracted_at IS NULL""",
        (workspace_id, ids))
    return cur.rowcount


async def due_drawers(conn: AsyncConnection[Any], older_than_s: float, limit: int = 500) -> list[tuple[str, str]]:
    """(workspace_id, drawer_id) of drawers queued more than ``older_than_s`` ago that no extractor has
    read, oldest first, across workspaces (maintenance role). The partial index drawer_extraction_due."""
    cur = await conn.execute(DUE_SQL, (older_than_s, limit))
    return [(str(w), str(d)) for w, d in await cur.fetchall()]


DUE_TURNS_SQL = """SELECT d.id, d.speaker, d.content, COALESCE(m.created_at, d.occurred_at, d.filed_at), d.seq,
                  d.session_id
             FROM drawers d
             LEFT JOIN messages m ON m.workspace_id = d.workspace_id AND m.session_id = d.session_id AND m.seq = d.seq
            WHERE d.workspace_id = %(ws)s AND d.id = ANY(%(ids)s)
              AND CASE WHEN d.state = 'processed' AND d.deleted_at IS NULL THEN true END  -- by key only: docs/scale.md
              AND NOT EXISTS (SELECT 1 FROM drawer_extraction x WHERE x.workspace_id = d.workspace_id
                                 AND x.drawer_id = d.id AND x.extracted_at IS NOT NULL)
            ORDER BY d.session_id NULLS LAST, d.seq, d.id"""


async def due_turns(conn: AsyncConnection[Any], workspace_id: str, drawer_ids: Sequence[str]) -> list[dict[str, Any]]:
    """The queued drawers that are still worth reading (processed, not archived, and not read by an
    extractor since the sweep listed them: their session's extraction may have come first), with the
    message of their first sighting: its time is when the drawer's facts were said."""
    cur = await conn.execute(DUE_TURNS_SQL, {"ws": workspace_id, "ids": sorted(set(drawer_ids))})
    cols = ("id", "speaker", "content", "said_at", "seq", "session_id")
    return [dict(zip(cols, r, strict=True)) for r in await cur.fetchall()]


async def lock_unread(conn: AsyncConnection[Any], workspace_id: str, drawer_ids: Sequence[str]) -> set[str]:
    """Of these queued drawers, those no extractor has read, their queue rows locked until the caller's
    transaction ends (in id order). A session's extraction marks its drawers read in the transaction that
    stores what it found: one that committed while the sweep was reading (or asking the model) is seen
    here, and one still writing is waited for, so the sweep does not store a second reading of them."""
    ids = sorted(set(drawer_ids))
    if not ids:
        return set()
    cur = await conn.execute(
        """SELECT drawer_id FROM drawer_extraction WHERE workspace_id = %s AND drawer_id = ANY(%s)
              AND extracted_at IS NULL ORDER BY drawer_id FOR UPDATE""", (workspace_id, ids))
    return {str(r[0]) for r in await cur.fetchall()}
