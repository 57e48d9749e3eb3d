"""Episodes and the knowledge-graph tables written by the enrich service."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import numpy as np
from psycopg import AsyncConnection

from shared.db.drawers import as_array

__all__ = ["existing_drawers", "session_turns", "upsert_entities", "upsert_episode"]


async def session_turns(conn: AsyncConnection[Any], workspace_id: str, session_id: str) -> list[dict[str, Any]]:
    """The session's drawers in conversation order, with their embeddings when present."""
    cur = await conn.execute(
        """SELECT d.id, d.speaker, d.content, d.embedding, s.agent_id, s.started_at, s.completed_at
             FROM drawer_sources ds
             JOIN drawers d ON d.workspace_id = ds.workspace_id AND d.id = ds.drawer_id
             JOIN sessions s ON s.workspace_id = ds.workspace_id AND s.session_id = ds.session_id
            WHERE ds.workspace_id = %s AND ds.session_id = %s AND d.deleted_at IS NULL
            ORDER BY ds.seq, ds.chunk_index""",
        (workspace_id, session_id),
    )
    cols = ["id", "speaker", "content", "embedding", "agent_id", "started_at", "completed_at"]
    rows = [dict(zip(cols, r, strict=True)) for r in await cur.fetchall()]
    for row in rows:
        if row["embedding"] is not None:
            row["embedding"] = as_array(row["embedding"])
    return rows


async def upsert_episode(
    conn: AsyncConnection[Any], workspace_id: str, *, episode_id: str, session_id: str, agent_id: str | None,
    summary: str, abstract: str, topics: list[str], embedding: np.ndarray | None,
    started_at: datetime | None, completed_at: datetime | None, ttl_days: float,
) -> None:
    await conn.execute(
        """INSERT INTO episodes (workspace_id, id, session_id, agent_id, summary, abstract, topics, embedding,
                                 started_at, completed_at, expires_at)
           VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, now() + make_interval(days => %s))
           ON CONFLICT (workspace_id, id) DO UPDATE
              SET summary = EXCLUDED.summary, abstract = EXCLUDED.abstract, topics = EXCLUDED.topics,
                  embedding = EXCLUDED.embedding""",
        (workspace_id, episode_id, session_id, agent_id, summary, abstract, topics, embedding,
         started_at, completed_at, int(ttl_days)),
    )


async def upsert_entities(
    conn: AsyncConnection[Any], workspace_id: str, entities: list[tuple[str, str, str]],
    mentions: list[tuple[str, str]],
) -> None:
    """entities: (id, name, type); mentions: (entity_id, drawer_id). Idempotent."""
    async with conn.cursor() as cur:
        await cur.executemany(
            """INSERT INTO entities (workspace_id, id, name, entity_type) VALUES (%s, %s, %s, %s)
               ON CONFLICT (workspace_id, id) DO UPDATE SET updated_at = now()""",
            [(workspace_id, i, n, t) for i, n, t in entities],
        )
        await cur.executemany(
            "INSERT INTO entity_mentions (workspace_id, entity_id, drawer_id) VALUES (%s, %s, %s)"
            " ON CONFLICT DO NOTHING",
            [(workspace_id, e, d) for e, d in mentions],
        )
        await cur.execute(
            """UPDATE drawers d SET entity_count = m.n FROM
                 (SELECT drawer_id, count(*) AS n FROM entity_mentions WHERE workspace_id = %s
                   AND drawer_id = ANY(%s) GROUP BY drawer_id) m
               WHERE d.workspace_id = %s AND d.id = m.drawer_id""",
            (workspace_id, list({d for _, d in mentions}), workspace_id),
        )


async def existing_drawers(conn: AsyncConnection[Any], workspace_id: str, ids: list[str]) -> set[str]:
    """Which of these drawers exist (archived ones included)."""
    cur = await conn.execute("SELECT id FROM drawers WHERE workspace_id = %s AND id = ANY(%s)", (workspace_id, ids))
    return {r[0] for r in await cur.fetchall()}
