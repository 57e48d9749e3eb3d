"""Raw sessions, messages and the drawers filed from them — written in one short transaction."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from psycopg import AsyncConnection
from psycopg.types.json import Jsonb

from shared.memory.dedup import BANDS, wording_bands
from shared.memory.filing import SessionPlan

__all__ = ["StoredSession", "store_session"]


@dataclass(frozen=True)
class StoredSession:
    """What ``store_session`` wrote: the drawers it created, and every drawer of the session still raw
    (created now, or by an earlier attempt that died before announcing them), both in the plan's order."""

    created: list[str]
    raw: list[str]


# One statement for the whole session: each table's rows as arrays (unnest), the tables written by the
# WITH's sub-statements. They share one snapshot, so the final SELECT sees the drawers as they were
# before this statement (those it inserts come back from ``d``); the foreign keys (messages → sessions,
# drawer_sources → drawers) are checked at the statement's end, when the rows it inserted are there.
_STORE_SQL = """
WITH s AS (
    INSERT INTO sessions (workspace_id, session_id, event_id, agent_id, user_id, started_at, completed_at,
                          metadata, message_count, content_hash)
    VALUES (%(ws)s, %(session)s, %(event)s, %(agent)s, %(user)s, %(started)s, %(completed)s, %(smeta)s,
            %(message_count)s, %(session_hash)s)
    ON CONFLICT (workspace_id, session_id) DO UPDATE
       SET message_count = GREATEST(sessions.message_count, EXCLUDED.message_count),
           completed_at  = COALESCE(EXCLUDED.completed_at, sessions.completed_at),
           metadata      = sessions.metadata || EXCLUDED.metadata,
           updated_at    = now()
     WHERE sessions.content_hash IS DISTINCT FROM EXCLUDED.content_hash
),
m AS (
    -- First write of a (session, seq) wins: a message, once stored, is never overwritten.
    INSERT INTO messages (workspace_id, session_id, seq, role, name, content, content_hash, created_at,
                          metadata, is_noise)
    SELECT %(ws)s, %(session)s, m.seq, m.role, m.name, m.content, m.content_hash, m.created_at, m.metadata,
           m.is_noise
      FROM unnest(%(m_seqs)s::integer[], %(m_roles)s::text[], %(m_names)s::text[], %(m_contents)s::text[],
                  %(m_hashes)s::text[], %(m_created)s::timestamptz[], %(m_metadata)s::jsonb[],
                  %(m_noise)s::boolean[])
           AS m(seq, role, name, content, content_hash, created_at, metadata, is_noise)
    ON CONFLICT (workspace_id, session_id, seq) DO NOTHING
),
d AS (
    INSERT INTO drawers (workspace_id, id, content, content_hash, wing, room, hall, session_id,
                         seq, context, agent_id, user_id, role, speaker, occurred_at, metadata, dedup_bands)
    SELECT %(ws)s, d.id, d.content, d.content_hash, d.wing, d.room, d.hall, %(session)s, d.seq, d.context,
           %(agent)s, %(user)s, d.role, d.speaker, d.occurred_at, d.metadata,
           (%(bands)s::bigint[])[(d.i - 1) * %(nb)s + 1 : d.i * %(nb)s]
      FROM unnest(%(ids)s::text[], %(contents)s::text[], %(hashes)s::text[], %(wings)s::text[], %(rooms)s::text[],
                  %(halls)s::text[], %(seqs)s::integer[], %(contexts)s::text[], %(roles)s::text[],
                  %(speakers)s::text[], %(occurred)s::timestamptz[], %(metadata)s::jsonb[]) WITH ORDINALITY
           AS d(id, content, content_hash, wing, room, hall, seq, context, role, speaker, occurred_at, metadata, i)
    ON CONFLICT (workspace_id, id) DO NOTHING
    RETURNING id
),
src AS (
    INSERT INTO drawer_sources (workspace_id, drawer_id, session_id, seq, chunk_index, char_start, char_end)
    SELECT %(ws)s, s.drawer_id, %(session)s, s.seq, s.chunk_index, s.char_start, s.char_end
      FROM unnest(%(s_ids)s::text[], %(s_seqs)s::integer[], %(s_chunks)s::integer[], %(s_starts)s::integer[],
                  %(s_ends)s::integer[])
           AS s(drawer_id, seq, chunk_index, char_start, char_end)
    ON CONFLICT DO NOTHING
)
SELECT id, true FROM d
UNION ALL
SELECT id, false FROM drawers
 WHERE workspace_id = %(ws)s AND id = ANY(%(ids)s)
   AND CASE WHEN state = 'raw' AND deleted_at IS NULL THEN true END  -- by key only: docs/scale.md
"""


async def store_session(conn: AsyncConnection[Any], plan: SessionPlan) -> StoredSession:
    """Upsert the raw session, its messages, its drawers (state raw) and their provenance, in one statement.

    Idempotent: replaying the same plan changes nothing. Each table gets its rows as arrays (a statement per
    row cost the client a message per row and the server an execution per row), and the four tables one
    statement between them (one round trip where there were four). Wording bands are written with the row:
    a later UPDATE of an indexed column would re-insert the row into every index (the vector one included).
    Drawer i's bands are the i-th run of BANDS values in one flat bigint[] (a 2-D array cannot hold them per
    row through unnest).
    """
    e, ms, ds, ss = plan.event, plan.messages, plan.drawers, plan.sources
    ws = e.workspace_id
    bands = [wording_bands(ws, d.content) for d in ds]
    cur = await conn.execute(_STORE_SQL, {
        "ws": ws, "session": e.session_id, "event": e.event_id, "agent": e.agent_id, "user": e.user_id,
        "started": e.started_at, "completed": e.completed_at, "smeta": Jsonb(e.metadata),
        "message_count": len(ms), "session_hash": plan.session_hash,
        "m_seqs": [m.seq for m in ms], "m_roles": [m.role for m in ms], "m_names": [m.name for m in ms],
        "m_contents": [m.content for m in ms], "m_hashes": [m.content_hash for m in ms],
        "m_created": [m.created_at for m in ms], "m_metadata": [Jsonb(m.metadata) for m in ms],
        "m_noise": [m.is_noise for m in ms],
        "bands": [b for bs in bands for b in bs], "nb": BANDS,
        "ids": [d.id for d in ds], "contents": [d.content for d in ds], "hashes": [d.content_hash for d in ds],
        "wings": [d.wing for d in ds], "rooms": [d.room or "general" for d in ds], "halls": [d.hall for d in ds],
        "seqs": [d.seq for d in ds], "contexts": [d.context for d in ds], "roles": [d.role for d in ds],
        "speakers": [d.speaker for d in ds], "occurred": [d.occurred_at for d in ds],
        "metadata": [Jsonb(d.metadata) for d in ds],
        "s_ids": [x.drawer_id for x in ss], "s_seqs": [x.seq for x in ss], "s_chunks": [x.chunk_index for x in ss],
        "s_starts": [x.char_start for x in ss], "s_ends": [x.char_end for x in ss],
    })
    rows = await cur.fetchall()
    # In the plan's order, whatever order the server returned them in (the lookup's plan decides it).
    place = {d.id: n for n, d in enumerate(ds)}
    created = sorted((str(i) for i, new in rows if new), key=place.__getitem__)
    return StoredSession(created, sorted((str(i) for i, _ in rows), key=place.__getitem__))
