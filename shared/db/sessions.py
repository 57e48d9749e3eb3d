"""Raw sessions, messages and the drawers filed from them — written in one short transaction."""

from __future__ import annotations

from typing import Any

from psycopg import AsyncConnection
from psycopg.types.json import Jsonb

from shared.memory.dedup import wording_bands
from shared.memory.filing import SessionPlan

__all__ = ["store_session", "unembedded_drawer_ids"]


async def store_session(conn: AsyncConnection[Any], plan: SessionPlan) -> list[str]:
    """Upsert the raw session, its messages, its drawers (state raw) and their provenance.

    Idempotent: replaying the same plan changes nothing. Returns the ids of drawers newly created.
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
    async with conn.cursor() as cur:
        # First write of a (session, seq) wins: a message, once stored, is never overwritten.
        await cur.executemany(
            """
            INSERT INTO messages (workspace_id, session_id, seq, role, name, content, content_hash, created_at,
                                  metadata, is_noise)
            VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
            ON CONFLICT (workspace_id, session_id, seq) DO NOTHING
            """,
            [(ws, e.session_id, m.seq, m.role, m.name, m.content, m.content_hash, m.created_at,
              Jsonb(m.metadata), m.is_noise) for m in plan.messages],
        )
        created: list[str] = []
        if plan.drawers:
            await cur.executemany(
                """
                INSERT INTO drawers (workspace_id, id, content, content_hash, wing, room, hall, session_id,
                                     seq, context, agent_id, user_id, role, speaker, occurred_at, metadata, dedup_bands)
                VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
                ON CONFLICT (workspace_id, id) DO NOTHING
                RETURNING id
                """,
                [(ws, d.id, d.content, d.content_hash, d.wing, d.room or "general", d.hall, e.session_id,
                  d.seq, d.context, e.agent_id, e.user_id, d.role, d.speaker, d.occurred_at, Jsonb(d.metadata),
                  # Wording bands now, with the row: a later UPDATE of an indexed column would re-insert the
                  # row into every index (the vector one included).
                  wording_bands(ws, d.content))
                 for d in plan.drawers],
                returning=True,
            )
            while True:
                row = await cur.fetchone()
                if row:
                    created.append(row[0])
                if not cur.nextset():
                    break
            await cur.executemany(
                """
                INSERT INTO drawer_sources (workspace_id, drawer_id, session_id, seq, chunk_index, char_start, char_end)
                VALUES (%s, %s, %s, %s, %s, %s, %s)
                ON CONFLICT DO NOTHING
                """,
                [(ws, s.drawer_id, e.session_id, s.seq, s.chunk_index, s.char_start, s.char_end)
                 for s in plan.sources],
            )
    return created


async def unembedded_drawer_ids(conn: AsyncConnection[Any], workspace_id: str, drawer_ids: list[str]) -> list[str]:
    """Which of these drawers still wait in state raw (so a redelivered ingest re-announces them)."""
    cur = await conn.execute(
        "SELECT id FROM drawers WHERE workspace_id = %s AND id = ANY(%s) AND state = 'raw' AND deleted_at IS NULL",
        (workspace_id, drawer_ids),
    )
    return [r[0] for r in await cur.fetchall()]
