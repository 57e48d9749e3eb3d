"""SQL of the memory-lifecycle jobs: decay, prune to the archive, restore, expiry, and job leases.

Every statement here touches at most one batch of rows found through an index (migration 0020) and
runs in its own short transaction, chosen by the caller: the jobs run beside full traffic, so none
may scan or lock a whole table, and rows another transaction holds are skipped (``SKIP LOCKED``) and
picked up by the next run instead of waited for.

The archive is ``drawers.deleted_at``: every search path and pipeline stage excludes it, and the row
keeps its embedding, classification and provenance, so restoring is clearing the mark.
"""

from __future__ import annotations

from typing import Any

from psycopg import AsyncConnection

__all__ = [
    "archive_batch",
    "decay_batch",
    "estimated_drawer_count",
    "expire_episodes_batch",
    "live_drawer_count",
    "next_workspace",
    "prune_candidates_span",
    "purge_archive_batch",
    "release_lease",
    "renew_lease",
    "restore_batch",
]

# The walk of the primary key starts before every real key.
START_KEY = ("", "")


# Every batch names one workspace and its rows' ids as an array: ``id = ANY(...)`` is an index
# condition on the primary key. (Joining the modified table to a CTE of picked keys let the planner
# hash-join a sequential scan of all drawers instead: the EXPLAIN test caught it.)

DECAY_SQL = """
        WITH span AS (
            SELECT id FROM drawers WHERE workspace_id = %(ws)s AND id > %(id)s ORDER BY id LIMIT %(n)s),
        upd AS (
            UPDATE drawers d SET importance = greatest(d.importance * %(factor)s, %(floor)s::real), updated_at = now()
             WHERE d.workspace_id = %(ws)s
               AND d.id = ANY(ARRAY(
                   SELECT c.id FROM drawers c
                    WHERE c.workspace_id = %(ws)s AND c.id = ANY(ARRAY(SELECT id FROM span))
                      AND c.deleted_at IS NULL AND c.state = 'processed' AND NOT c.pinned
                      AND c.importance > %(floor)s::real
                      AND c.filed_at < now() - make_interval(secs => %(older)s)
                      AND coalesce(c.last_accessed_at, c.filed_at) < now() - make_interval(secs => %(idle)s)
                      FOR UPDATE SKIP LOCKED))
            RETURNING 1)
        SELECT (SELECT max(id) FROM span), (SELECT count(*) FROM span), (SELECT count(*) FROM upd)
        """

NEXT_WORKSPACE_SQL = "SELECT workspace_id FROM drawers WHERE workspace_id > %s ORDER BY workspace_id LIMIT 1"

LIVE_COUNT_SQL = "SELECT count(*) FROM drawers WHERE workspace_id = %s AND deleted_at IS NULL AND state <> 'merged'"

# Prune candidates, a span of the primary key at a time (there is deliberately no index on
# importance: see migration 0020).
PRUNE_SPAN_SQL = """
        SELECT id, importance, (deleted_at IS NULL AND state = 'processed' AND NOT pinned
                      AND importance < %(below)s AND access_count < %(acc)s) FROM drawers
         WHERE workspace_id = %(ws)s AND id > %(id)s ORDER BY id LIMIT %(n)s
        """

# The eligibility is checked again under the row lock: a recall since the span was read saves it.
# The ids go through an init-plan array: given a literal array of a full batch, the planner priced
# 500 primary-key probes above a sequential scan of a 20k-row table, a choice that only gets worse
# as the table grows, while the probes stay the same 500.
ARCHIVE_SQL = """
        WITH upd AS (
            UPDATE drawers d SET deleted_at = now()
             WHERE d.workspace_id = %(ws)s
               AND d.id = ANY(ARRAY(
                   SELECT id FROM drawers
                    WHERE workspace_id = %(ws)s AND id = ANY(ARRAY(SELECT unnest(%(ids)s::text[])))
                      AND deleted_at IS NULL AND state = 'processed' AND NOT pinned
                      AND importance < %(below)s AND access_count < %(acc)s
                      FOR UPDATE SKIP LOCKED))
            RETURNING d.workspace_id, d.id, d.importance, d.access_count),
        hist AS (
            INSERT INTO memory_history (workspace_id, id, drawer_id, action, actor, reason, new_value)
            SELECT workspace_id, 'archive:' || md5(id || clock_timestamp()::text), id, 'ARCHIVE', 'maintain.prune',
                   'importance below ' || %(below)s::text || ', fewer than ' || %(acc)s::text || ' recalls',
                   jsonb_build_object('importance', importance, 'access_count', access_count)
              FROM upd
            RETURNING 1)
        SELECT count(*) FROM hist
        """

# Only what prune archived comes back: a drawer whose deletion is an ARCHIVE record of the same moment
# (prune writes both in one statement; by index memory_history_drawer). A drawer someone deleted (the API, a
# curation DELETE) is not the archive's, and stays deleted. A restored drawer's importance is raised to the
# prune threshold (its old value in the RESTORE record), or the next prune would archive it again, and the
# restore counts as a recall (last_accessed_at): decay would otherwise take it below that threshold at its
# next run, and prune archive it again within a day or two.
RESTORE_SQL = """
        WITH picked AS (
            SELECT d.id, d.importance FROM drawers d
             WHERE d.workspace_id = %(ws)s AND d.deleted_at IS NOT NULL
               AND (%(ids)s::text[] IS NULL OR d.id = ANY(%(ids)s::text[]))
               AND EXISTS (SELECT 1 FROM memory_history h
                            WHERE h.workspace_id = %(ws)s AND h.drawer_id = d.id AND h.created_at = d.deleted_at
                              AND h.action = 'ARCHIVE')
             ORDER BY d.deleted_at LIMIT %(n)s FOR UPDATE OF d SKIP LOCKED),
        upd AS (
            UPDATE drawers d SET deleted_at = NULL, importance = greatest(d.importance, %(floor)s::real),
                                 last_accessed_at = now()
              FROM picked p
             WHERE d.workspace_id = %(ws)s AND d.id = p.id
            RETURNING d.workspace_id, d.id, p.importance AS was),
        hist AS (
            INSERT INTO memory_history (workspace_id, id, drawer_id, action, actor, reason, event_id, old_value,
                                        new_value)
            SELECT workspace_id, 'restore:' || md5(id || clock_timestamp()::text), id, 'RESTORE', %(actor)s,
                   %(reason)s, %(event)s, jsonb_build_object('importance', was),
                   jsonb_build_object('importance', greatest(was, %(floor)s::real))
              FROM upd
            RETURNING 1)
        SELECT count(*) FROM hist
        """

# Cross-workspace jobs first find the workspace holding the oldest due row, then take a batch of it.
OLDEST_EXPIRED_EPISODE_SQL = "SELECT workspace_id FROM episodes WHERE expires_at < now() ORDER BY expires_at LIMIT 1"

EXPIRE_EPISODES_SQL = """
        DELETE FROM episodes
         WHERE workspace_id = %(ws)s
           AND id = ANY(ARRAY(SELECT id FROM episodes WHERE workspace_id = %(ws)s AND expires_at < now()
                               ORDER BY expires_at LIMIT %(n)s FOR UPDATE SKIP LOCKED))
        """

OLDEST_PURGEABLE_SQL = """SELECT workspace_id FROM drawers WHERE deleted_at < now() - make_interval(secs => %s)
                           ORDER BY deleted_at LIMIT 1"""

PURGE_ARCHIVE_SQL = """
        WITH pick AS (
            SELECT ARRAY(SELECT id FROM drawers
                          WHERE workspace_id = %(ws)s AND deleted_at < now() - make_interval(secs => %(ret)s)
                          ORDER BY deleted_at LIMIT %(n)s FOR UPDATE SKIP LOCKED) AS ids),
        mentions AS (
            DELETE FROM entity_mentions m
             WHERE m.workspace_id = %(ws)s AND m.drawer_id = ANY((SELECT ids FROM pick)::text[])),
        del AS (
            DELETE FROM drawers d WHERE d.workspace_id = %(ws)s AND d.id = ANY((SELECT ids FROM pick)::text[])
            RETURNING d.workspace_id, d.id),
        -- Near-duplicates merged into a purged drawer come back as themselves (hidden for good otherwise),
        -- and what it superseded is no longer superseded by nothing: as a forget does (indexes
        -- drawers_cluster, drawers_superseded_by).
        unmerged AS (
            UPDATE drawers d SET state = 'processed', cluster_id = NULL, updated_at = now()
             WHERE d.workspace_id = %(ws)s AND d.cluster_id = ANY((SELECT ids FROM pick)::text[])
               AND d.state = 'merged' AND NOT (d.id = ANY((SELECT ids FROM pick)::text[]))),
        unsuperseded AS (
            UPDATE drawers d SET superseded_by = NULL, updated_at = now()
             WHERE d.workspace_id = %(ws)s AND d.superseded_by = ANY((SELECT ids FROM pick)::text[])
               AND NOT (d.id = ANY((SELECT ids FROM pick)::text[]))),
        hist AS (
            INSERT INTO memory_history (workspace_id, id, drawer_id, action, actor, reason)
            SELECT workspace_id, 'purge:' || md5(id || clock_timestamp()::text), id, 'PURGE', 'maintain.expire',
                   'archive retention ended'
              FROM del
            RETURNING 1)
        SELECT count(*) FROM hist
        """


async def renew_lease(conn: AsyncConnection[Any], job: str, holder: str, ttl_s: float) -> bool:
    """Extend ``holder``'s lease on ``job``; False when it was lost (expired and taken by another)."""
    cur = await conn.execute(
        """UPDATE job_leases SET expires_at = now() + make_interval(secs => %s)
            WHERE workspace_id = '*' AND job = %s AND holder = %s RETURNING 1""",
        (ttl_s, job, holder),
    )
    return (await cur.fetchone()) is not None


async def release_lease(conn: AsyncConnection[Any], job: str, holder: str, *, failed: bool = False) -> None:
    """Let the lease go at once. The schedule still counts from ``last_run_at`` (set when the lease was
    taken), unless the run ``failed``: then the job is due again at once, not a whole period later."""
    await conn.execute(
        "UPDATE job_leases SET expires_at = now(), last_run_at = CASE WHEN %s THEN NULL ELSE last_run_at END"
        " WHERE workspace_id = '*' AND job = %s AND holder = %s",
        (failed, job, holder),
    )


async def decay_batch(
    conn: AsyncConnection[Any], after: tuple[str, str], *, batch: int, factor: float, floor: float,
    older_than_days: float, idle_days: float,
) -> tuple[tuple[str, str] | None, int]:
    """Decay the eligible drawers among the next ``batch`` primary keys after ``after``.

    The span is bounded by key order, not by how many rows qualify, so a batch costs the same whether
    few or all drawers decay; it stays within one workspace and moves to the next one when that is
    done. Returns (where the next batch starts, or None at the end; rows decayed). Only drawers above
    the floor change, and never below it; a recall (``last_accessed_at``) resets the idle clock.
    """
    ws, after_id = after
    if not ws:
        nxt = await next_workspace(conn, "")
        if nxt is None:
            return None, 0
        ws, after_id = nxt, ""
    cur = await conn.execute(
        DECAY_SQL,
        {"ws": ws, "id": after_id, "n": batch, "floor": floor, "factor": factor,
         "older": older_than_days * 86_400.0, "idle": idle_days * 86_400.0},
    )
    row = await cur.fetchone()
    assert row is not None
    last, spanned, decayed = row[0], int(row[1]), int(row[2])
    if spanned < batch:  # this workspace is done
        nxt = await next_workspace(conn, ws)
        return ((nxt, "") if nxt is not None else None), decayed
    return (ws, last), decayed


async def next_workspace(conn: AsyncConnection[Any], after: str) -> str | None:
    """The next workspace holding drawers (one primary-key probe: a skip scan, not a DISTINCT)."""
    cur = await conn.execute(
        NEXT_WORKSPACE_SQL, (after,))
    row = await cur.fetchone()
    return row[0] if row else None


async def estimated_drawer_count(conn: AsyncConnection[Any]) -> int | None:
    """The planner's estimate of all drawers (pg_class.reltuples: free, no scan), for a progress bar's
    total; None before the table was first analysed."""
    cur = await conn.execute("SELECT reltuples::bigint FROM pg_class WHERE oid = 'drawers'::regclass")
    row = await cur.fetchone()
    return int(row[0]) if row and row[0] and row[0] > 0 else None


async def live_drawer_count(conn: AsyncConnection[Any], workspace_id: str) -> int:
    """Drawers search can return in the workspace (not archived, not merged into a twin)."""
    cur = await conn.execute(
        LIVE_COUNT_SQL,
        (workspace_id,),
    )
    row = await cur.fetchone()
    return int(row[0]) if row else 0


async def prune_candidates_span(
    conn: AsyncConnection[Any], workspace_id: str, after: str, *, batch: int, importance_below: float,
    accesses_below: int,
) -> tuple[str | None, list[tuple[float, str]]]:
    """The next ``batch`` drawers of the workspace after id ``after``: (the last id, or None at the
    end; the prunable ones among them as (importance, id))."""
    cur = await conn.execute(PRUNE_SPAN_SQL, {"ws": workspace_id, "id": after, "n": batch,
                                              "below": importance_below, "acc": accesses_below})
    rows = await cur.fetchall()
    last = rows[-1][0] if len(rows) == batch else None
    return last, [(float(r[1]), r[0]) for r in rows if r[2]]


async def archive_batch(
    conn: AsyncConnection[Any], workspace_id: str, ids: list[str], *, importance_below: float, accesses_below: int,
) -> int:
    """Archive these drawers if they are still prunable. Only the archive mark is set: importance,
    access counts and ``updated_at`` stay as they were, so a restore is exact. Each one gets an
    ARCHIVE record in memory_history."""
    cur = await conn.execute(
        ARCHIVE_SQL,
        {"ws": workspace_id, "ids": ids, "below": importance_below, "acc": accesses_below},
    )
    row = await cur.fetchone()
    return int(row[0]) if row else 0


async def restore_batch(
    conn: AsyncConnection[Any], workspace_id: str, *, drawer_ids: list[str] | None, limit: int, actor: str,
    importance_floor: float = 0.0, reason: str | None = None, event_id: str | None = None,
) -> int:
    """Bring drawers prune archived back into search (all of them when ``drawer_ids`` is None, a batch
    at a time), importance raised to ``importance_floor`` (``RESTORE_SQL``). Each gets a RESTORE record in
    memory_history."""
    cur = await conn.execute(
        RESTORE_SQL,
        {"ws": workspace_id, "ids": drawer_ids, "n": limit, "actor": actor, "floor": importance_floor,
         "reason": reason, "event": event_id},
    )
    row = await cur.fetchone()
    return int(row[0]) if row else 0


async def expire_episodes_batch(conn: AsyncConnection[Any], *, limit: int) -> int:
    """Delete up to ``limit`` episodes (summary and L0 abstract) whose expiry has passed."""
    cur = await conn.execute(OLDEST_EXPIRED_EPISODE_SQL)
    row = await cur.fetchone()
    if row is None:
        return 0
    cur = await conn.execute(EXPIRE_EPISODES_SQL, {"ws": row[0], "n": limit})
    return cur.rowcount


async def purge_archive_batch(conn: AsyncConnection[Any], *, retention_days: float, limit: int) -> int:
    """End up to ``limit`` archived drawers past retention: the drawer, its provenance (cascade) and
    its entity mentions go; a PURGE record (without content) stays in memory_history."""
    ret = retention_days * 86_400.0
    cur = await conn.execute(OLDEST_PURGEABLE_SQL, (ret,))
    row = await cur.fetchone()
    if row is None:
        return 0
    cur = await conn.execute(PURGE_ARCHIVE_SQL, {"ws": row[0], "ret": ret, "n": limit})
    out = await cur.fetchone()
    return int(out[0]) if out else 0
