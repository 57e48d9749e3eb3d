"""Hybrid recall: one SQL statement over HNSW candidates and full-text candidates, fused and ranked.

Dense similarity and BM25-style rank (``ts_rank_cd``, max-normalised over the candidates) are fused
0.7 / 0.3, as the seeds measured, then nudged by importance and recency. The full-text query is an
OR of the query's lexemes (``plainto_tsquery`` joins with AND, which misses most paraphrases).
Everything is scoped to one workspace; drawers merged into a twin or deleted are never returned.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np
from psycopg import AsyncConnection
from psycopg.rows import dict_row

__all__ = ["SearchHit", "SearchParams", "hybrid_search", "touch_access"]


@dataclass(frozen=True)
class SearchParams:
    k: int = 10
    ann_candidates: int = 100
    fts_candidates: int = 100
    w_dense: float = 0.7
    w_text: float = 0.3
    w_importance: float = 0.02
    recency_days: float = 30.0
    w_recency: float = 0.05


@dataclass(frozen=True)
class SearchHit:
    id: str
    content: str
    score: float
    dense: float
    text: float
    memory_type: str | None
    importance: float
    wing: str
    room: str
    session_id: str | None
    speaker: str | None
    role: str | None
    occurred_at: datetime | None
    metadata: dict[str, Any]


_SQL = """
WITH q AS (
    SELECT %(emb)s::vector AS emb,
           replace(plainto_tsquery('english', %(text)s)::text, ' & ', ' | ')::tsquery AS tsq
), ann AS (
    SELECT d.id, 1 - (d.embedding <=> q.emb) AS dense
      FROM drawers d, q
     WHERE %(use_ann)s AND d.workspace_id = %(ws)s AND d.embedding IS NOT NULL
       AND d.deleted_at IS NULL AND d.state <> 'merged'
     ORDER BY d.embedding <=> q.emb
     LIMIT %(n_ann)s
), fts AS (
    SELECT d.id, ts_rank_cd(d.tsv, q.tsq, 1) AS text_rank
      FROM drawers d, q
     WHERE d.workspace_id = %(ws)s AND d.tsv @@ q.tsq AND d.deleted_at IS NULL AND d.state <> 'merged'
     ORDER BY text_rank DESC
     LIMIT %(n_fts)s
), cand AS (
    SELECT id, max(dense) AS dense, max(text_rank) AS text_rank
      FROM (SELECT id, dense, NULL::real AS text_rank FROM ann
            UNION ALL SELECT id, NULL, text_rank FROM fts) u
     GROUP BY id
), scored AS (
    SELECT c.id, coalesce(c.dense, 0) AS dense,
           coalesce(c.text_rank / nullif(max(c.text_rank) OVER (), 0), 0) AS text_n
      FROM cand c
)
SELECT d.id, d.content, d.memory_type, d.importance, d.wing, d.room, d.session_id, d.speaker, d.role,
       d.occurred_at, d.metadata, s.dense, s.text_n,
       (%(w_dense)s * s.dense + %(w_text)s * s.text_n)
         * (1 + %(w_imp)s * (d.importance - 3))
         * (1 + %(w_rec)s / (1 + extract(epoch FROM now() - coalesce(d.last_accessed_at, d.filed_at))
                                 / 86400.0 / %(rec_days)s)) AS score
  FROM scored s
  JOIN drawers d ON d.workspace_id = %(ws)s AND d.id = s.id
 ORDER BY score DESC, d.id
 LIMIT %(k)s
"""


async def hybrid_search(
    conn: AsyncConnection[Any], workspace_id: str, query: str, embedding: np.ndarray | None,
    params: SearchParams = SearchParams(),
) -> list[SearchHit]:
    """Top-k drawers of one workspace for a query.

    Args:
        conn: a connection with pgvector registered.
        workspace_id: the tenant; nothing outside it is ever read.
        query: the query text (full-text branch).
        embedding: the query's embedding, or None to search full text only (embedder down).
        params: fusion weights and candidate counts.
    """
    dim_vec = embedding if embedding is not None else np.zeros(1, dtype=np.float32)
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(
            _SQL,
            {
                "emb": dim_vec if embedding is not None else None, "use_ann": embedding is not None,
                "text": query, "ws": workspace_id, "n_ann": params.ann_candidates,
                "n_fts": params.fts_candidates, "w_dense": params.w_dense, "w_text": params.w_text,
                "w_imp": params.w_importance, "w_rec": params.w_recency, "rec_days": params.recency_days,
                "k": params.k,
            },
        )
        rows = await cur.fetchall()
    return [
        SearchHit(
            id=r["id"], content=r["content"], score=float(r["score"]), dense=float(r["dense"]),
            text=float(r["text_n"]), memory_type=r["memory_type"], importance=float(r["importance"]),
            wing=r["wing"], room=r["room"], session_id=r["session_id"], speaker=r["speaker"], role=r["role"],
            occurred_at=r["occurred_at"], metadata=r["metadata"] or {},
        )
        for r in rows
    ]


async def touch_access(conn: AsyncConnection[Any], workspace_id: str, ids: list[str]) -> None:
    """Recall keeps memories alive: bump access stats of what was returned."""
    if ids:
        await conn.execute(
            "UPDATE drawers SET access_count = access_count + 1, last_accessed_at = now()"
            " WHERE workspace_id = %s AND id = ANY(%s)",
            (workspace_id, ids),
        )
