"""Hybrid recall: one SQL statement over HNSW candidates and full-text candidates, fused and ranked.

1. Candidates: the nearest drawers by embedding ∪ the best full-text matches (GIN, ordered by
   ``ts_rank_cd``; an OR of the query's lexemes, since ``plainto_tsquery``'s AND misses most
   paraphrases). The HNSW index is shared by all workspaces and pgvector 0.6 filters *after* the graph
   walk, so a small workspace in a big table would get only a handful of its own neighbours; workspaces
   under ``exact_max`` drawers therefore get an exact scan (``+ 0`` keeps the planner off the index; 5k
   distances cost a few ms), larger ones the HNSW index with a raised ``hnsw.ef_search``. In those
   large workspaces the full-text branch also asks for two of the query's lexemes together (an OR of
   pairs): a plain OR matched 27% of a 100k-drawer workspace and ranking every match cost ~170 ms
   (bench/search.py); and at most ``fts_scan_max`` matching rows are ranked, which bounds the tail on
   very large workspaces.
2. Each candidate gets three signals: cosine similarity, min-max normalised over the candidates
   (e5-family cosines sit in a narrow band, so raw cosines let any text weight swamp them); Okapi BM25
   of its content against the query's lexemes, divided by the best BM25 among the candidates; and
   whether its speaker is named in the query. Document frequencies and the mean length are counted
   among the candidates (a few hundred rows, no term-statistics table to maintain), which measured
   as well as workspace-wide statistics and better than ``ts_rank_cd``, which has no notion of how
   rare a word is. The speaker signal exists because recall questions name people ("What did Ana
   decide?") and the answer is in what that person said, not in what was said to them; the embedded
   text carries the speaker too, but diluted by the preceding turn. Fused
   ``w_dense·dense + w_text·bm25 + w_speaker·named``.
3. Conversation structure: a drawer inherits ``smooth`` × the better of its neighbouring turns'
   scores (an answer sits next to its question), and ``session_boost`` × the mean of its session's
   three best scores (evidence clusters in sessions).
4. Importance and recency nudge the result.

Weights were chosen on ../shared/bench/locomo-dev.json with ``bench/ranking_lab.py`` (README,
"Recall quality"). Everything is scoped to one workspace; merged or deleted drawers never return.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np
from psycopg import AsyncConnection
from psycopg.rows import dict_row

__all__ = ["SearchHit", "SearchParams", "hybrid_search", "touch_access", "workspace_size"]


@dataclass(frozen=True)
class SearchParams:
    k: int = 10
    ann_candidates: int = 100
    fts_candidates: int = 100
    exact_max: int = 5_000
    fts_scan_max: int = 2_000
    w_dense: float = 0.65
    w_text: float = 0.35
    w_speaker: float = 0.3
    bm25_k1: float = 1.2
    bm25_b: float = 0.75
    smooth: float = 0.2
    session_boost: float = 0.3
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
WITH lex AS (
    SELECT DISTINCT unnest(tsvector_to_array(to_tsvector('english', %(text)s))) AS l
), q AS (
    SELECT %(emb)s::vector AS emb,
           CASE WHEN %(exact)s OR (SELECT count(*) FROM lex) < 2
                THEN replace(plainto_tsquery('english', %(text)s)::text, ' & ', ' | ')
                ELSE (SELECT string_agg(format('(%%L & %%L)', a.l, b.l), ' | ') FROM lex a JOIN lex b ON a.l < b.l)
           END::tsquery AS tsq,
           replace(plainto_tsquery('english', %(text)s)::text, ' & ', ' | ')::tsquery AS tsq_any
), ann_exact AS (
    SELECT d.id
      FROM drawers d
     WHERE %(use_ann)s AND %(exact)s AND d.workspace_id = %(ws)s AND d.embedding IS NOT NULL
       AND d.deleted_at IS NULL AND d.state <> 'merged'
     ORDER BY (d.embedding <=> %(emb)s::vector) + 0
     LIMIT %(n_ann)s
), ann_hnsw AS (
    SELECT d.id
      FROM drawers d
     WHERE %(use_ann)s AND NOT %(exact)s AND d.workspace_id = %(ws)s AND d.embedding IS NOT NULL
       AND d.deleted_at IS NULL AND d.state <> 'merged'
     ORDER BY d.embedding <=> %(emb)s::vector
     LIMIT %(n_ann)s
), fts AS (
    -- Through the migration-0003 function, so the GIN index serves it under row-level security.
    SELECT t.id FROM q, palace_text_candidates(%(ws)s, q.tsq, %(fts_scan)s, %(n_fts)s) t
), feat AS (
    SELECT d.id, d.session_id, d.seq,
           CASE WHEN %(use_ann)s AND d.embedding IS NOT NULL THEN 1 - (d.embedding <=> q.emb) END AS cos,
           ts_filter(d.tsv, '{a}') AS ctsv,
           (to_tsvector('english', coalesce(d.speaker, '')) @@ q.tsq_any)::int AS named
      FROM (SELECT id FROM ann_exact UNION SELECT id FROM ann_hnsw UNION SELECT id FROM fts) c
      JOIN drawers d ON d.workspace_id = %(ws)s AND d.id = c.id, q
), terms AS (
    SELECT f.id, u.lexeme, coalesce(array_length(u.positions, 1), 1) AS tf
      FROM feat f, unnest(f.ctsv) u
), doclen AS (
    SELECT id, sum(tf) AS dl FROM terms GROUP BY id
), hits AS (
    SELECT t.id, t.lexeme, t.tf FROM terms t JOIN lex ON lex.l = t.lexeme
), bm25 AS (
    SELECT h.id,
           sum(ln(1 + (st.n - df.df + 0.5) / (df.df + 0.5))
               * h.tf * (%(k1)s + 1) / (h.tf + %(k1)s * (1 - %(b)s + %(b)s * dl.dl / st.avgdl))) AS bm
      FROM hits h
      JOIN (SELECT lexeme, count(*) AS df FROM hits GROUP BY lexeme) df ON df.lexeme = h.lexeme
      JOIN doclen dl ON dl.id = h.id,
           (SELECT count(*) AS n, avg(dl) AS avgdl FROM doclen) st
     GROUP BY h.id
), base AS (
    SELECT f.id, f.session_id, f.seq, f.named,
           coalesce((f.cos - min(f.cos) OVER ()) / nullif(max(f.cos) OVER () - min(f.cos) OVER (), 0), 0) AS dense_n,
           coalesce(b.bm / nullif(max(b.bm) OVER (), 0), 0) AS text_n
      FROM feat f LEFT JOIN bm25 b ON b.id = f.id
), fused AS (
    SELECT id, session_id, seq, dense_n, text_n,
           %(w_dense)s * dense_n + %(w_text)s * text_n + %(w_speaker)s * named AS s
      FROM base
), smoothed AS (
    SELECT f.id, f.session_id, f.dense_n, f.text_n,
           f.s + %(smooth)s * coalesce(max(n.s), 0) AS s
      FROM fused f
      LEFT JOIN fused n ON n.session_id = f.session_id AND n.seq IN (f.seq - 1, f.seq + 1)
     GROUP BY f.id, f.session_id, f.dense_n, f.text_n, f.s
), sessions AS (
    SELECT session_id, avg(s) AS top_s
      FROM (SELECT session_id, s, row_number() OVER (PARTITION BY session_id ORDER BY s DESC) AS rn
              FROM smoothed WHERE session_id IS NOT NULL) x
     WHERE rn <= 3 GROUP BY session_id
)
SELECT d.id, d.content, d.memory_type, d.importance, d.wing, d.room, d.session_id, d.speaker, d.role,
       d.occurred_at, d.metadata, m.dense_n AS dense, m.text_n,
       (m.s + %(sess)s * coalesce(se.top_s, 0))
         * (1 + %(w_imp)s * (d.importance - 3))
         * (1 + %(w_rec)s / (1 + extract(epoch FROM now() - coalesce(d.last_accessed_at, d.filed_at))
                                 / 86400.0 / %(rec_days)s)) AS score
  FROM smoothed m
  LEFT JOIN sessions se ON se.session_id = m.session_id
  JOIN drawers d ON d.workspace_id = %(ws)s AND d.id = m.id
 ORDER BY score DESC, d.id
 LIMIT %(k)s
"""


async def hybrid_search(
    conn: AsyncConnection[Any], workspace_id: str, query: str, embedding: np.ndarray | None,
    params: SearchParams = SearchParams(), *, workspace_size: int | None = None,
) -> list[SearchHit]:
    """Top-k drawers of one workspace for a query.

    Args:
        conn: a connection with pgvector registered.
        workspace_id: the tenant; nothing outside it is ever read.
        query: the query text (full-text branch).
        embedding: the query's embedding, or None to search full text only (embedder down).
        params: fusion weights and candidate counts.
        workspace_size: live drawers in the workspace, if known: at most ``params.exact_max`` selects the
            exact nearest-neighbour scan (None: HNSW).
    """
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(
            _SQL,
            {
                "emb": embedding, "use_ann": embedding is not None,
                "text": query, "ws": workspace_id, "n_ann": params.ann_candidates,
                "n_fts": params.fts_candidates, "w_dense": params.w_dense, "w_text": params.w_text,
                "w_speaker": params.w_speaker, "k1": params.bm25_k1, "b": params.bm25_b,
                "smooth": params.smooth, "sess": params.session_boost, "w_imp": params.w_importance,
                "w_rec": params.w_recency, "rec_days": params.recency_days,
                "k": params.k, "fts_scan": params.fts_scan_max,
                "exact": workspace_size is not None and workspace_size <= params.exact_max,
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


async def workspace_size(conn: AsyncConnection[Any], workspace_id: str) -> int:
    """Live drawers in a workspace (an index-only count); decides exact vs HNSW candidate search."""
    cur = await conn.execute(
        "SELECT count(*) FROM drawers WHERE workspace_id = %s AND deleted_at IS NULL", (workspace_id,))
    row = await cur.fetchone()
    return int(row[0]) if row else 0


async def touch_access(conn: AsyncConnection[Any], workspace_id: str, ids: list[str]) -> None:
    """Recall keeps memories alive: bump access stats of what was returned."""
    if ids:
        await conn.execute(
            "UPDATE drawers SET access_count = access_count + 1, last_accessed_at = now()"
            " WHERE workspace_id = %s AND id = ANY(%s)",
            (workspace_id, ids),
        )
