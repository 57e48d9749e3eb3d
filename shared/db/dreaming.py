"""Dreaming in SQL: which pairs are due, claiming a run (once per threshold), storing what it
synthesised, and finishing it (episodes promoted). See migration 0030.

A claim is one short transaction under a per-pair advisory lock: it re-reads the pair's unpromoted
episodes, checks the debounce and any run still in progress, and inserts the run whose id derives
from the episodes it takes, so two replicas (or an operator's run beside the maintain service's)
cannot both consolidate the same threshold. No LLM or network call happens inside any of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg import AsyncConnection
from psycopg.types.json import Jsonb

from shared.db.forget import forgotten_pair
from shared.memory.dreaming import EpisodeIn, Memory, run_id, session_id_of

__all__ = ["Claim", "claim_run", "due_pairs", "finish_run", "save_memories"]

# Both episode reads repeat the predicate of the partial index episodes_unpromoted (migration 0030)
# word for word, so the planner can use it.


async def due_pairs(conn: AsyncConnection[Any], threshold: int, limit: int = 500) -> list[tuple[str, str, str, int]]:
    """(workspace, agent, user, unpromoted episodes) of pairs at or over the threshold, across
    workspaces (maintenance role). '' stands for no agent / no user."""
    cur = await conn.execute(
        """SELECT workspace_id, coalesce(agent_id, ''), coalesce(user_id, ''), count(*) FROM episodes
             WHERE promoted_at IS NULL AND status = 'ready' AND session_id NOT LIKE 'dreaming:%%'
             GROUP BY 1, 2, 3 HAVING count(*) >= %s ORDER BY 1, 2, 3 LIMIT %s""", (threshold, limit))
    return [(str(w), str(a), str(u), int(n)) for w, a, u, n in await cur.fetchall()]


@dataclass(frozen=True)
class Claim:
    """A run this holder may carry out: new, or one whose holder died (taken over)."""

    run_id: str
    session_id: str
    episodes: list[EpisodeIn]
    memories: list[Memory] | None   # set when an earlier attempt synthesised them already
    source: str | None
    claimed_at: datetime


async def claim_run(
    conn: AsyncConnection[Any], workspace_id: str, agent_id: str, user_id: str, *, holder: str, threshold: int,
    max_episodes: int, debounce_s: float, stale_s: float,
) -> Claim | str:
    """Claim the pair's next run, or say why not ('busy', 'debounced', 'below_threshold', 'forgotten')."""
    cur = await conn.execute("SELECT pg_try_advisory_xact_lock(hashtextextended(%s, 0))",
                             (f"dreaming\x1f{workspace_id}\x1f{agent_id}\x1f{user_id}",))
    row = await cur.fetchone()
    if not row or not row[0]:
        return "busy"
    # Ordered with forget (shared.db.forget): a claim either commits before a forget's tombstones (and
    # the forget finds its run) or sees them, and takes no episode of a forgotten session or pair.
    if await forgotten_pair(conn, workspace_id, agent_id, user_id):
        return "forgotten"
    pair = {"ws": workspace_id, "a": agent_id, "u": user_id}
    cur = await conn.execute(
        """SELECT id, status, holder, claimed_at, done_at, claimed_at < now() - make_interval(secs => %(stale)s),
                  episode_ids, memories, source
             FROM dreaming_runs WHERE workspace_id = %(ws)s AND agent_id = %(a)s AND user_id = %(u)s
            ORDER BY claimed_at DESC LIMIT 1""", {**pair, "stale": stale_s})
    last = await cur.fetchone()
    resume: tuple[Any, ...] | None = None
    if last is not None:
        rid, status, _, _, done_at, stale, ids, memories, source = last
        if status == "claimed" and not stale:
            return "busy"
        if status == "claimed":
            resume = (rid, ids, memories, source)
        else:
            cur = await conn.execute("SELECT %s::timestamptz > now() - make_interval(secs => %s)",
                                     (done_at, debounce_s))
            recent = await cur.fetchone()
            if recent and recent[0]:
                return "debounced"
    if resume is not None:
        rid, ids, memories, source = resume
        cur = await conn.execute(
            """UPDATE dreaming_runs SET holder = %s, claimed_at = now() WHERE workspace_id = %s AND id = %s
               RETURNING claimed_at""", (holder, workspace_id, rid))
        claimed = await cur.fetchone()
        assert claimed is not None
        episodes = await _episodes(conn, workspace_id, list(ids))
        return Claim(str(rid), session_id_of(str(rid)), episodes,
                     [Memory.of(m) for m in memories] if memories is not None else None, source, claimed[0])
    cur = await conn.execute(
        """SELECT id FROM episodes
             WHERE workspace_id = %(ws)s AND coalesce(agent_id, '') = %(a)s AND coalesce(user_id, '') = %(u)s
               AND promoted_at IS NULL AND status = 'ready' AND session_id NOT LIKE 'dreaming:%%'
               AND NOT EXISTS (SELECT 1 FROM forget_tombstones t WHERE t.workspace_id = %(ws)s
                                  AND t.kind = 'session'
                                  AND t.value = palace_forget_key(%(ws)s, 'session', episodes.session_id))
             ORDER BY completed_at, id LIMIT %(n)s""", {**pair, "n": max_episodes})
    ids = [str(r[0]) for r in await cur.fetchall()]
    if len(ids) < threshold:
        return "below_threshold"
    rid = run_id(workspace_id, agent_id, user_id, ids)
    cur = await conn.execute(
        """INSERT INTO dreaming_runs (workspace_id, id, agent_id, user_id, episode_ids, session_id, holder)
           VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING RETURNING claimed_at""",
        (workspace_id, rid, agent_id, user_id, ids, session_id_of(rid), holder))
    claimed = await cur.fetchone()
    if claimed is None:
        return "busy"  # the same run exists: its episodes are being (or were) promoted
    return Claim(rid, session_id_of(rid), await _episodes(conn, workspace_id, ids), None, None, claimed[0])


async def _episodes(conn: AsyncConnection[Any], workspace_id: str, ids: list[str]) -> list[EpisodeIn]:
    cur = await conn.execute(
        """SELECT id, session_id, summary, abstract, topics, coalesce(completed_at, started_at, created_at)
             FROM episodes WHERE workspace_id = %s AND id = ANY(%s) ORDER BY 6, id""", (workspace_id, ids))
    return [EpisodeIn(str(i), str(s), sm, ab, list(t), w) for i, s, sm, ab, t, w in await cur.fetchall()]


async def save_memories(conn: AsyncConnection[Any], workspace_id: str, run: str, holder: str,
                        memories: list[Memory], source: str, warnings: list[str]) -> list[Memory] | None:
    """Store what the run synthesised before it is published; returns the memories to publish (an
    earlier attempt's when it stored them first), or None when the run is no longer ours."""
    cur = await conn.execute(
        """UPDATE dreaming_runs SET memories = coalesce(memories, %s), source = coalesce(source, %s),
                  warnings = CASE WHEN memories IS NULL THEN %s ELSE warnings END
            WHERE workspace_id = %s AND id = %s AND holder = %s AND status = 'claimed'
           RETURNING memories""",
        (Jsonb([m.as_json() for m in memories]), source, warnings, workspace_id, run, holder))
    row = await cur.fetchone()
    return None if row is None else [Memory.of(m) for m in row[0]]


async def finish_run(conn: AsyncConnection[Any], workspace_id: str, run: str, holder: str,
                     drawer_ids: list[str]) -> int:
    """Mark the run's episodes promoted and the run done (once); returns the episodes promoted."""
    cur = await conn.execute(
        """UPDATE dreaming_runs SET status = 'done', done_at = now(), drawer_ids = %s
            WHERE workspace_id = %s AND id = %s AND holder = %s AND status = 'claimed' RETURNING episode_ids""",
        (drawer_ids, workspace_id, run, holder))
    row = await cur.fetchone()
    if row is None:
        return 0
    cur = await conn.execute(
        "UPDATE episodes SET promoted_at = now() WHERE workspace_id = %s AND id = ANY(%s) AND promoted_at IS NULL",
        (workspace_id, list(row[0])))
    return cur.rowcount
