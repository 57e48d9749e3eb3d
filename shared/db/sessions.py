"""Raw sessions, messages and the drawers filed from them — written in one short transaction."""

from __future__ import annotations

from typing import Any

from psycopg import AsyncConnection
from psycopg.types.json import Jsonb

from shared.memory.dedup import BANDS, wording_bands
from shared.memory.filing import SessionPlan

__all__ = ["store_session", "unembedded_drawer_ids"]


async def store_session(conn: AsyncConnection[Any], plan: SessionPlan) -> list[str]:
    """Upsert the raw session, its messages, its drawers (state raw) and their provenance.

    Idempotent: replaying the same plan changes nothing. Returns the ids of drawers newly created.
    Each table gets one INSERT of arrays for the whole session: a statement per row (``executemany``)
    cost the client a message per row and the server an execution per row.
    """
    e = plan.event
    ws = e.workspace_id
    await conn.execute(
        """
        INSERT INTO sessions (workspace_id, session_id, event_id, agent_id, user_id, started_at, completed_at,
                              metadata, message_count, content_hash)
        VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
        ON CONFLICT (workspace_id, session_id) DO UPDATE
           SET message_count = GREATEST(sessions.message_count, EXCLUDED.message_count),
               completed_at  = COALESCE(EXCLUDED.completed_at, sessions.completed_at),
               metadata      = sessions.metadata || EXCLUDED.metadata,
               updated_at    = now()
         WHERE sessions.content_hash IS DISTINCT FROM EXCLUDED.content_hash
        """,
        (ws, e.session_id, e.event_id, e.agent_id, e.user_id, e.started_at, e.completed_at,
         Jsonb(e.metadata), len(plan.messages), plan.session_hash),
    )
    if plan.messages:
        ms = plan.messages
        # First write of a (session, seq) wins: a message, once stored, is never overwritten.
        await conn.execute(
            """
            INSERT INTO messages (workspace_id, session_id, seq, role, name, content, content_hash, created_at,
                                  metadata, is_noise)
            SELECT %s, %s, m.seq, m.role, m.name, m.content, m.content_hash, m.created_at, m.metadata, m.is_noise
              FROM unnest(%s::integer[], %s::text[], %s::text[], %s::text[], %s::text[], %s::timestamptz[],
                          %s::jsonb[], %s::boolean[])
                   AS m(seq, role, name, content, content_hash, created_at, metadata, is_noise)
            ON CONFLICT (workspace_id, session_id, seq) DO NOTHING
            """,
            (ws, e.session_id, [m.seq for m in ms], [m.role for m in ms], [m.name for m in ms],
             [m.content for m in ms], [m.content_hash for m in ms], [m.created_at for m in ms],
             [Jsonb(m.metadata) for m in ms], [m.is_noise for m in ms]),
        )
    if not plan.drawers:
        return []
    ds = plan.drawers
    # Wording bands now, with the row: a later UPDATE of an indexed column would re-insert the row into
    # every index (the vector one included). Drawer i's bands are the i-th run of BANDS values in one flat
    # bigint[] (a 2-D array cannot hold them per row through unnest).
    bands = [wording_bands(ws, d.content) for d in ds]
    cur = await conn.execute(
        """
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
        """,
        {"ws": ws, "session": e.session_id, "agent": e.agent_id, "user": e.user_id,
         "bands": [b for bs in bands for b in bs], "nb": BANDS,
         "ids": [d.id for d in ds], "contents": [d.content for d in ds], "hashes": [d.content_hash for d in ds],
         "wings": [d.wing for d in ds], "rooms": [d.room or "general" for d in ds], "halls": [d.hall for d in ds],
         "seqs": [d.seq for d in ds], "contexts": [d.context for d in ds], "roles": [d.role for d in ds],
         "speakers": [d.speaker for d in ds], "occurred": [d.occurred_at for d in ds],
         "metadata": [Jsonb(d.metadata) for d in ds]},
    )
    created = [str(r[0]) for r in await cur.fetchall()]
    if plan.sources:
        ss = plan.sources
        await conn.execute(
            """
            INSERT INTO drawer_sources (workspace_id, drawer_id, session_id, seq, chunk_index, char_start, char_end)
            SELECT %s, s.drawer_id, %s, s.seq, s.chunk_index, s.char_start, s.char_end
              FROM unnest(%s::text[], %s::integer[], %s::integer[], %s::integer[], %s::integer[])
                   AS s(drawer_id, seq, chunk_index, char_start, char_end)
            ON CONFLICT DO NOTHING
            """,
            (ws, e.session_id, [s.drawer_id for s in ss], [s.seq for s in ss], [s.chunk_index for s in ss],
             [s.char_start for s in ss], [s.char_end for s in ss]),
        )
    return created


async def unembedded_drawer_ids(conn: AsyncConnection[Any], workspace_id: str, drawer_ids: list[str]) -> list[str]:
    """Which of these drawers still wait in state raw (so a redelivered ingest re-announces them)."""
    cur = await conn.execute(
        "SELECT id FROM drawers WHERE workspace_id = %s AND id = ANY(%s) AND state = 'raw' AND deleted_at IS NULL",
        (workspace_id, drawer_ids),
    )
    return [r[0] for r in await cur.fetchall()]
