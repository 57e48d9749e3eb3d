"""Episodes and the knowledge-graph tables written by the enrich service."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np
from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from shared.db.drawers import as_array
from shared.db.tenancy import scoped_rows, scoped_statement

__all__ = [
    "REOPEN_EPISODES_SQL",
    "SESSION_DRAWERS_SQL",
    "SESSION_TURNS_SQL",
    "EpisodeHit",
    "EpisodeProgress",
    "SessionDrawers",
    "discard_pending_episode",
    "episode_progress",
    "existing_drawers",
    "mark_announced",
    "mark_episode_pending",
    "overdue_episodes",
    "reopen_episodes_of",
    "save_episode",
    "search_episodes",
    "session_drawers",
    "session_turns",
    "sessions_awaiting_episode",
    "unannounced_episode",
]


# Reached through the session's sources, by key; liveness tested as a CASE (docs/scale.md, "In-flight states").
SESSION_TURNS_SQL = """SELECT d.id, d.speaker, d.content, CASE WHEN %(emb)s THEN d.embedding END, s.agent_id,
                  s.started_at, s.completed_at, ds.seq,
                  COALESCE(m.created_at, d.occurred_at, s.started_at)
             FROM drawer_sources ds
             JOIN drawers d ON d.workspace_id = ds.workspace_id AND d.id = ds.drawer_id
             JOIN sessions s ON s.workspace_id = ds.workspace_id AND s.session_id = ds.session_id
             LEFT JOIN messages m ON m.workspace_id = ds.workspace_id AND m.session_id = ds.session_id
                                 AND m.seq = ds.seq
            WHERE ds.workspace_id = %(ws)s AND ds.session_id = %(sid)s
              AND ds.revision IS NULL  -- what the session says now (a sighting edited away is stale)
              AND CASE WHEN d.deleted_at IS NULL THEN true END  -- by key only: docs/scale.md
            ORDER BY ds.seq, ds.chunk_index"""


async def session_turns(conn: AsyncConnection[Any], workspace_id: str, session_id: str, *,
                        with_embedding: bool = True) -> list[dict[str, Any]]:
    """The session's drawers in conversation order, with their embeddings when present (and asked
    for: an extraction reads only the text), the message each came from (seq) and when it was said
    (the message's time, else the drawer's). Read in binary, which spares parsing vectors as text."""
    cur = await conn.execute(SESSION_TURNS_SQL, {"emb": with_embedding, "ws": workspace_id, "sid": session_id},
                             binary=True)
    cols = ["id", "speaker", "content", "embedding", "agent_id", "started_at", "completed_at", "seq", "said_at"]
    rows = [dict(zip(cols, r, strict=True)) for r in await cur.fetchall()]
    for row in rows:
        if row["embedding"] is not None:
            row["embedding"] = as_array(row["embedding"])
    return rows


@dataclass(frozen=True)
class EpisodeHit:
    """A built, unexpired episode and its cosine similarity to the query."""

    id: str
    session_id: str
    abstract: str
    summary: str
    topics: list[str]
    score: float                # the raw cosine similarity
    started_at: datetime | None
    completed_at: datetime | None
    agent_id: str | None = None
    user_id: str | None = None


# The most recent built episodes recall ranks exactly: the size up to which drawer search, too, scans a
# workspace exactly (SearchParams.exact_max) before it wants an index.
EPISODE_SCAN_MAX = 5_000

_SEARCH_SQL = """
SELECT id, session_id, abstract, summary, topics, 1 - (embedding <=> %(q)s::vector) AS score,
       started_at, completed_at, agent_id, user_id
  FROM (SELECT id, session_id, abstract, summary, topics, embedding, started_at, completed_at, agent_id, user_id
          FROM episodes
         WHERE workspace_id = %(ws)s AND status = 'ready' AND embedding IS NOT NULL
           AND (expires_at IS NULL OR expires_at > now())
         ORDER BY completed_at DESC NULLS LAST, id
         LIMIT %(scan)s) recent
 ORDER BY embedding <=> %(q)s::vector, id
 LIMIT %(k)s"""


async def search_episodes(
    conn: AsyncConnection[Any], workspace_id: str, embedding: np.ndarray, *, k: int = 5,
    scan_max: int = EPISODE_SCAN_MAX,
) -> list[EpisodeHit]:
    """The ``k`` built, unexpired episodes nearest to ``embedding``, best first.

    Exact, among the workspace's ``scan_max`` most recently completed episodes, which the partial index
    of migration 0043 yields in that order: the cost is bounded by the cap, whatever the table holds.
    Not an approximate index: pgvector applies the workspace filter after its graph walk (see
    shared/db/vector_indexes.py), so a shared HNSW could return fewer than ``k`` even when more exist,
    and one episode per session, expiring, keeps a workspace's episodes far fewer than its drawers.
    Past the cap the oldest episodes are left out of recall (the drawers still hold every turn).
    """
    cur = await conn.execute(
        _SEARCH_SQL,
        {"q": np.asarray(embedding, dtype=np.float32), "ws": workspace_id, "k": max(1, min(int(k), 100)),
         "scan": max(1, int(scan_max))},
    )
    return [EpisodeHit(str(i), str(sid), a, sm, list(t), float(sc), st, ct, ag, us)
            for i, sid, a, sm, t, sc, st, ct, ag, us in await cur.fetchall()]


@dataclass(frozen=True)
class SessionDrawers:
    """A session's live drawers in conversation order (at most the first ``per_session``) and how many it has."""

    drawers: list[tuple[str, str, str]]   # (id, wing, room)
    total: int


# Through the sessions' sources, by key.
SESSION_DRAWERS_SQL = """SELECT s.sid, x.ids, x.wings, x.rooms, x.total
             FROM unnest(%(sids)s::text[]) AS s(sid)
             CROSS JOIN LATERAL (
                 SELECT (array_agg(d.id ORDER BY o.first))[1:%(n)s] AS ids,
                        (array_agg(d.wing ORDER BY o.first))[1:%(n)s] AS wings,
                        (array_agg(d.room ORDER BY o.first))[1:%(n)s] AS rooms,
                        count(*) AS total
                   FROM (SELECT ds.drawer_id, min(ds.seq::bigint * 1000000 + ds.chunk_index) AS first
                           FROM drawer_sources ds
                          WHERE ds.workspace_id = %(ws)s AND ds.session_id = s.sid AND ds.revision IS NULL
                          GROUP BY ds.drawer_id) o
                   JOIN drawers d ON d.workspace_id = %(ws)s AND d.id = o.drawer_id
                  WHERE d.deleted_at IS NULL AND d.state <> 'merged') x"""


async def session_drawers(
    conn: AsyncConnection[Any], workspace_id: str, session_ids: list[str], *, per_session: int = 20
) -> dict[str, SessionDrawers]:
    """The live drawers of these sessions, so an episode cites what it summarises: one statement, each
    session read through ``drawer_sources_session`` (its drawers in message order)."""
    if not session_ids:
        return {}
    cur = await conn.execute(SESSION_DRAWERS_SQL,
                             {"sids": session_ids, "ws": workspace_id, "n": max(1, int(per_session))})
    out: dict[str, SessionDrawers] = {}
    for sid, ids, wings, rooms, total in await cur.fetchall():
        out[str(sid)] = SessionDrawers(list(zip(ids or [], wings or [], rooms or [], strict=True)), int(total))
    return out


@dataclass(frozen=True)
class EpisodeProgress:
    """Where a session's episode stands, and whether its drawers are embedded yet."""

    status: str                 # 'pending' or 'ready'
    source_hash: str | None
    announced: bool
    waited_s: float             # since it became pending
    drawers: int
    unembedded: int             # drawers still raw without a vector


async def mark_episode_pending(conn: AsyncConnection[Any], workspace_id: str, episode_id: str,
                               session_id: str) -> bool:
    """Open the session's episode (pending) unless one was already built or opened from the same
    drawers; a session re-published with more turns reopens it. True when (re)opened."""
    cur = await conn.execute(
        """WITH src AS (SELECT md5(string_agg(DISTINCT drawer_id, ',' ORDER BY drawer_id)) AS h
                          FROM drawer_sources WHERE workspace_id = %(ws)s AND session_id = %(sid)s
                           AND revision IS NULL)
           INSERT INTO episodes (workspace_id, id, session_id, agent_id, user_id, summary, abstract, status,
                                 source_hash, pending_since, started_at, completed_at)
           SELECT s.workspace_id, %(id)s, s.session_id, s.agent_id, s.user_id, '', '', 'pending', src.h, now(),
                  s.started_at, s.completed_at
             FROM sessions s, src WHERE s.workspace_id = %(ws)s AND s.session_id = %(sid)s
           ON CONFLICT (workspace_id, id) DO UPDATE
              SET status = 'pending', source_hash = EXCLUDED.source_hash, pending_since = now(),
                  announced_at = NULL, agent_id = EXCLUDED.agent_id, user_id = EXCLUDED.user_id,
                  started_at = EXCLUDED.started_at,
                  completed_at = EXCLUDED.completed_at
            WHERE episodes.source_hash IS DISTINCT FROM EXCLUDED.source_hash
           RETURNING id""",
        {"id": episode_id, "ws": workspace_id, "sid": session_id},
    )
    return await cur.fetchone() is not None


# A session's drawers and how many still wait for a vector, in one walk of its drawers (its sources, then
# each drawer by primary key). Counted apart, the second count was planned on the partial index of raw
# drawers (estimated at a row or two, as it is between analyses while the pipeline files and embeds),
# which then walked every raw drawer of every workspace, and every entry left by one embedded since the
# last vacuum, for each drawer.embedded event.
EPISODE_PROGRESS_SQL = """SELECT e.status, e.source_hash, e.announced_at IS NOT NULL,
                  extract(epoch FROM now() - coalesce(e.pending_since, e.created_at)), n.drawers, n.unembedded
             FROM episodes e
            CROSS JOIN LATERAL (
                  SELECT count(DISTINCT d.id) AS drawers,
                         count(DISTINCT d.id) FILTER (WHERE d.embedding IS NULL AND d.state = 'raw') AS unembedded
                    FROM drawer_sources ds
                    JOIN drawers d ON d.workspace_id = ds.workspace_id AND d.id = ds.drawer_id
                   WHERE ds.workspace_id = e.workspace_id AND ds.session_id = e.session_id
                     AND ds.revision IS NULL AND d.deleted_at IS NULL) n
            WHERE e.workspace_id = %s AND e.id = %s"""


async def episode_progress(conn: AsyncConnection[Any], workspace_id: str, episode_id: str) -> EpisodeProgress | None:
    """The episode's state and its session's embedding progress; None when no episode was opened."""
    cur = await conn.execute(EPISODE_PROGRESS_SQL, (workspace_id, episode_id))
    row = await cur.fetchone()
    if row is None:
        return None
    status, source_hash, announced, waited, drawers, unembedded = row
    return EpisodeProgress(str(status), source_hash, bool(announced), float(waited), int(drawers), int(unembedded))


# The sessions of these drawers (by key), then each one's episode by its unique key, asked whether it still
# waits. Written as a join, it was planned from the partial index of unannounced episodes (estimated at a
# row or two between analyses), which holds every waiting episode of every workspace: a backlog made each
# drawer.embedded event walk all of them.
AWAITING_EPISODE_SQL = """SELECT s.session_id
      FROM (SELECT DISTINCT ds.session_id FROM drawer_sources ds
             WHERE ds.workspace_id = %(ws)s AND ds.drawer_id = ANY(%(ids)s)) s
     WHERE (SELECT e.announced_at IS NULL FROM episodes e
             WHERE e.workspace_id = %(ws)s AND e.session_id = s.session_id)"""


async def sessions_awaiting_episode(pool: AsyncConnectionPool, workspace_id: str, drawer_ids: list[str]) -> list[str]:
    """Sessions holding any of these drawers whose episode is opened but not announced: a read of its own,
    in one round trip (most drawer.embedded events find none)."""
    rows = await scoped_rows(pool, workspace_id, AWAITING_EPISODE_SQL, {"ws": workspace_id, "ids": drawer_ids})
    return [str(r[0]) for r in rows]


async def save_episode(
    conn: AsyncConnection[Any], workspace_id: str, *, episode_id: str, source_hash: str | None,
    summary: str, abstract: str, topics: list[str], embedding: np.ndarray | None, ttl_days: float,
) -> bool:
    """Fill a pending episode built from ``source_hash``; False when it is no longer pending for
    that content (built meanwhile, or reopened by newer content, which its own build will fill)."""
    cur = await conn.execute(
        """UPDATE episodes SET summary = %s, abstract = %s, topics = %s, embedding = %s, status = 'ready',
                               expires_at = now() + make_interval(secs => %s)
            WHERE workspace_id = %s AND id = %s AND status = 'pending' AND source_hash IS NOT DISTINCT FROM %s
           RETURNING id""",
        (summary, abstract, topics, embedding, float(ttl_days) * 86_400.0, workspace_id, episode_id, source_hash),
    )
    return await cur.fetchone() is not None


async def discard_pending_episode(conn: AsyncConnection[Any], workspace_id: str, episode_id: str) -> None:
    """Drop an opened episode whose session has nothing left to summarise."""
    await conn.execute("DELETE FROM episodes WHERE workspace_id = %s AND id = %s AND status = 'pending'",
                       (workspace_id, episode_id))


# A built episode not announced yet, by key.
UNANNOUNCED_EPISODE_SQL = """SELECT session_id, summary, abstract, topics, source_hash FROM episodes
    WHERE workspace_id = %s AND id = %s AND status = 'ready'
      AND CASE WHEN announced_at IS NULL THEN true END  -- by key only: docs/scale.md"""


async def unannounced_episode(conn: AsyncConnection[Any], workspace_id: str, episode_id: str) -> dict[str, Any] | None:
    """A built episode whose episodic.created has not been published yet (with what the event carries)."""
    cur = await conn.execute(
        UNANNOUNCED_EPISODE_SQL,
        (workspace_id, episode_id),
    )
    row = await cur.fetchone()
    if row is None:
        return None
    return dict(zip(("session_id", "summary", "abstract", "topics", "source_hash"), row, strict=True))


async def mark_announced(
    pool: AsyncConnectionPool, workspace_id: str, episode_id: str, source_hash: str | None
) -> None:
    """Record that episodic.created went out for this content, so no later attempt publishes it again: a
    transaction of its own (it follows the publish), in one round trip."""
    await scoped_statement(
        pool, workspace_id,
        """UPDATE episodes SET announced_at = now()
            WHERE workspace_id = %(ws)s AND id = %(id)s AND status = 'ready'
              AND source_hash IS NOT DISTINCT FROM %(hash)s""",
        {"ws": workspace_id, "id": episode_id, "hash": source_hash},
    )


# A drawer deleted or restored changes what the episodes of its sessions may say (an extractive summary
# quotes turns verbatim): they are reopened, which takes them out of search at once (only built ones are
# searched), and rebuilt from the live drawers by enrich's overdue sweep, due at once. A new source hash
# gives the rebuilt episode a new episodic.created (its id is derived from it).
REOPEN_EPISODES_SQL = """
    UPDATE episodes e
       SET status = 'pending', announced_at = NULL, source_hash = md5(coalesce(e.source_hash, '') || %(change)s),
           pending_since = now() - make_interval(secs => %(due)s)
     WHERE e.workspace_id = %(ws)s
       AND e.session_id IN (SELECT s.session_id FROM drawer_sources s
                             WHERE s.workspace_id = %(ws)s AND s.drawer_id = %(id)s)"""


async def reopen_episodes_of(conn: AsyncConnection[Any], workspace_id: str, drawer_id: str, *, change: str,
                             due_after_s: float) -> int:
    """``REOPEN_EPISODES_SQL`` for this drawer; ``change`` names what changed (once per change), and
    ``due_after_s`` is the sweep's wait (``episode_wait_s``), so the sweep's next round rebuilds them."""
    cur = await conn.execute(REOPEN_EPISODES_SQL, {"ws": workspace_id, "id": drawer_id, "change": change,
                                                   "due": due_after_s + 1})
    return cur.rowcount


async def overdue_episodes(conn: AsyncConnection[Any], older_than_s: float, limit: int = 500) -> list[tuple[str, str]]:
    """(workspace_id, session_id) of episodes unannounced for longer than ``older_than_s``, across
    workspaces (maintenance role): their drawers were never all embedded, or a build was cut short."""
    cur = await conn.execute(
        """SELECT workspace_id, session_id FROM episodes
            WHERE announced_at IS NULL AND pending_since < now() - make_interval(secs => %s)
            ORDER BY pending_since LIMIT %s""",
        (older_than_s, limit),
    )
    return [(str(w), str(s)) for w, s in await cur.fetchall()]


async def existing_drawers(conn: AsyncConnection[Any], workspace_id: str, ids: list[str]) -> set[str]:
    """Which of these drawers exist (archived ones included)."""
    cur = await conn.execute("SELECT id FROM drawers WHERE workspace_id = %s AND id = ANY(%s)", (workspace_id, ids))
    return {r[0] for r in await cur.fetchall()}
