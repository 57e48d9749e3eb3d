"""Maintenance sweeps: the job lease and the stuck-drawer re-drive. Each is one short statement.

The lifecycle jobs (decay, prune, expire) are in ``shared.db.lifecycle``."""

from __future__ import annotations

from typing import Any

from psycopg import AsyncConnection

__all__ = ["fail_exhausted", "revive_failed", "stuck_drawers", "take_lease"]


async def take_lease(conn: AsyncConnection[Any], job: str, holder: str, ttl_s: float, every_s: float) -> bool:
    """Claim ``job`` for ``ttl_s`` if its lease expired and it last ran ``every_s`` ago: one replica runs it."""
    cur = await conn.execute(
        """INSERT INTO job_leases (workspace_id, job, holder, expires_at, last_run_at)
           VALUES ('*', %(job)s, %(holder)s, now() + make_interval(secs => %(ttl)s), now())
           ON CONFLICT (workspace_id, job) DO UPDATE
              SET holder = EXCLUDED.holder, expires_at = EXCLUDED.expires_at, last_run_at = now()
            WHERE job_leases.expires_at < now()
              AND (job_leases.last_run_at IS NULL OR job_leases.last_run_at < now() - make_interval(secs => %(every)s))
           RETURNING holder""",
        {"job": job, "holder": holder, "ttl": ttl_s, "every": every_s},
    )
    return (await cur.fetchone()) is not None


async def stuck_drawers(conn: AsyncConnection[Any], older_than_s: float, max_retries: int,
                        limit: int = 1000) -> list[tuple[str, str, int]]:
    """(workspace_id, drawer_id, retry_count) of raw drawers idle too long, bumping their retry count."""
    cur = await conn.execute(
        """WITH s AS MATERIALIZED (  -- chosen once: a subquery in FROM may run again per row, past its LIMIT
               SELECT workspace_id, id FROM drawers
                WHERE state = 'raw' AND deleted_at IS NULL AND retry_count < %s
                  AND updated_at < now() - make_interval(secs => %s)
                  AND (llm_claimed_until IS NULL OR llm_claimed_until < now())  -- not while a model is asked
                ORDER BY filed_at LIMIT %s FOR UPDATE SKIP LOCKED)
           UPDATE drawers d SET retry_count = d.retry_count + 1, updated_at = now()
             FROM s WHERE d.workspace_id = s.workspace_id AND d.id = s.id
        RETURNING d.workspace_id, d.id, d.retry_count""",
        (max_retries, older_than_s, limit),
    )
    return [(r[0], r[1], r[2]) for r in await cur.fetchall()]


async def fail_exhausted(conn: AsyncConnection[Any], older_than_s: float, max_retries: int,
                         limit: int = 1000) -> int:
    """Drawers still raw after every re-drive are marked failed, with the reason (and the last
    error a stage recorded, e.g. the embedding endpoint's answer); never deleted. At most ``limit``
    a round, found through the idle-raw index (migration 0018)."""
    cur = await conn.execute(
        """WITH s AS MATERIALIZED (
               SELECT workspace_id, id FROM drawers
                WHERE state = 'raw' AND deleted_at IS NULL AND retry_count >= %s
                  AND updated_at < now() - make_interval(secs => %s)
                  AND (llm_claimed_until IS NULL OR llm_claimed_until < now())
                ORDER BY filed_at LIMIT %s FOR UPDATE SKIP LOCKED)
           UPDATE drawers d SET state = 'failed', updated_at = now(),
                  failure_reason = 'still raw after ' || d.retry_count || ' re-drives'
                                   || coalesce('; last error: ' || d.failure_reason, '')
             FROM s WHERE d.workspace_id = s.workspace_id AND d.id = s.id""",
        (max_retries, older_than_s, limit),
    )
    return cur.rowcount



async def revive_failed(conn: AsyncConnection[Any], workspace_id: str, after: tuple[Any, str] | None = None,
                        limit: int = 1000) -> tuple[list[str], tuple[Any, str] | None]:
    """Up to ``limit`` of the workspace's failed drawers filed after ``after`` (filing time, id) made raw
    again, their failure and its counts cleared (``palace retry-failed``, once what failed them is fixed: an
    LLM that was down, an embedding endpoint); returns them and where the next call goes on from (None: no
    more). Paged, so a drawer failing again at once (the cause not fixed after all) is not taken twice in one
    run. A claim still held by a batch asking the model about it is kept. The caller announces them;
    maintain's re-drive finds any it could not. Through the ``(workspace_id, state, filed_at)`` index."""
    f, i = after if after is not None else (None, "")
    cur = await conn.execute(
        """WITH f AS MATERIALIZED (  -- chosen once: a subquery in FROM may be run again per row, and skip others
               SELECT id FROM drawers WHERE workspace_id = %(ws)s AND state = 'failed' AND deleted_at IS NULL
                  AND (%(f)s::timestamptz IS NULL OR (filed_at, id) > (%(f)s::timestamptz, %(i)s))
                ORDER BY filed_at, id LIMIT %(n)s FOR UPDATE SKIP LOCKED)
           UPDATE drawers d SET state = 'raw', failure_reason = NULL, retry_count = 0,
                  metadata = d.metadata - 'llm_failures', updated_at = now()
             FROM f WHERE d.workspace_id = %(ws)s AND d.id = f.id
        RETURNING d.id, d.filed_at""", {"ws": workspace_id, "f": f, "i": i, "n": limit})
    rows = sorted(await cur.fetchall(), key=lambda r: (r[1], r[0]))
    return [str(r[0]) for r in rows], ((rows[-1][1], str(rows[-1][0])) if rows else None)
