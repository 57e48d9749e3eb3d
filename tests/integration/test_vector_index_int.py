"""Per-workspace vector indexes: search asks for one when a workspace outgrows exact scans, maintain
builds it (concurrently, as a partial index), search then plans its nearest-neighbour part on it —
and finds what the exact scan finds."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import psycopg
import pytest

from shared.adapters.hash_embedder import HashEmbedder
from shared.db.pool import open_pool
from shared.db.search import _SQL, SearchParams
from shared.db.vector_indexes import index_name_for
from shared.recall import Recaller
from tests.integration.helpers import Stack, wait_for, ws

pytestmark = pytest.mark.integration

N = 3000


def _seed(stack: Stack, workspace: str) -> list[str]:
    """N processed drawers with real (lexical) embeddings, straight into the table."""
    emb = HashEmbedder(stack.settings.embed_dim)
    texts = [f"note {i}: the {['red', 'green', 'blue'][i % 3]} team shipped feature {i} on day {i % 30}"
             for i in range(N)]
    vecs = asyncio.run(emb.embed_documents(texts))
    with psycopg.connect(stack.database_url, autocommit=True) as conn, conn.cursor() as cur:
        cur.executemany(
            """INSERT INTO drawers (workspace_id, id, content, content_hash, state, embedding)
               VALUES (%s, md5(%s), %s, md5(%s), 'processed', %s::vector)""",
            [(workspace, t, t, t, "[" + ",".join(f"{x:.6f}" for x in v) + "]")
             for t, v in zip(texts, vecs, strict=True)],
        )
        cur.execute("ANALYZE drawers")
    return texts


def test_a_growing_workspace_gets_its_own_index_and_search_uses_it(stack: Stack) -> None:
    w = ws()
    _seed(stack, w)
    emb = HashEmbedder(stack.settings.embed_dim)

    async def search(query: str, min_drawers: int) -> list[str]:
        pool = await open_pool(stack.database_url, name="test", max_size=2, role=stack.settings.db_role)
        try:
            r = Recaller(pool, emb, touch=False, vector_index_min=min_drawers)
            return [h.id for h in await r.search(w, query, 10)]
        finally:
            await pool.close()

    exact = asyncio.run(search("which team shipped feature 42", 10_000))
    assert not stack.sql("SELECT 1 FROM vector_indexes WHERE workspace_id = %s", (w,))
    asyncio.run(search("which team shipped feature 42", 1000))  # over the threshold: asks for an index
    assert stack.sql("SELECT state FROM vector_indexes WHERE workspace_id = %s", (w,))[0][0] in (
        "wanted", "building", "ready")
    wait_for(lambda: stack.sql("SELECT state FROM vector_indexes WHERE workspace_id = %s", (w,))[0][0] == "ready",
             120, "maintain to build the workspace's index")
    name = index_name_for(w)
    indexdef = stack.sql("SELECT pg_get_indexdef(to_regclass(%s))", (name,))[0][0]
    assert "hnsw" in indexdef and w in indexdef

    # The statement search runs, planned the way search runs it (unprepared), walks that index.
    q = asyncio.run(emb.embed_query("which team shipped feature 42"))
    p = SearchParams()
    with psycopg.connect(stack.database_url) as conn:
        from pgvector.psycopg import register_vector

        register_vector(conn)
        conn.execute("SET ROLE palace_app")
        conn.execute("SELECT set_config('palace.workspace_id', %s, false)", (w,))
        # Whether a walk beats a scan at this small size depends on the shared test database's statistics;
        # what must hold is that the unprepared statement can match the partial index at all.
        conn.execute("SET enable_sort = off")
        plan = conn.execute("EXPLAIN (FORMAT JSON) " + _SQL, {
            "text": "which team shipped feature 42", "emb": np.asarray(q), "use_ann": True, "ws": w, "exact": True,
            "hnsw": True, "max_terms": p.max_terms, "n_ann": p.ann_candidates, "n_fts": p.fts_candidates,
            "fts_scan": p.fts_scan_max, "n_date": 0, "lo": [], "hi": [], "lo_min": None, "hi_max": None,
            "graph_ids": [],
        }, prepare=False).fetchall()[0][0]
    assert name in json.dumps(plan)

    indexed = asyncio.run(search("which team shipped feature 42", 1000))
    assert indexed[:5] == exact[:5]
