"""Recall: embed the query (cached), run the hybrid search, touch what was returned.

Used by the HTTP API, the CLI and the benchmarks, so every figure we publish measures the same path
users call. If the embedder fails, recall degrades to full-text only instead of failing.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np
import psycopg
from psycopg_pool import AsyncConnectionPool

from shared.access import access_log
from shared.adapters.space_embedder import pinned
from shared.db.search import SearchHit, SearchParams, hybrid_search, workspace_size
from shared.db.tenancy import workspace_tx
from shared.db.vector_indexes import request_vector_index, vector_index_ready
from shared.logging import get_logger
from shared.metrics import SEARCH_SECONDS
from shared.ports import Embedder

__all__ = ["Recaller"]

log = get_logger("palace.recall")


@dataclass
class Recaller:
    """Query-side state: the pool, the embedder and a small LRU of query embeddings."""

    pool: AsyncConnectionPool
    embedder: Embedder | None
    params: SearchParams = field(default_factory=SearchParams)
    cache_size: int = 2048
    touch: bool = True
    size_ttl_s: float = 60.0
    vector_index_min: int = 5_000  # PALACE_VECTOR_INDEX_MIN_DRAWERS
    _cache: OrderedDict[tuple[str, str], np.ndarray] = field(default_factory=OrderedDict)
    _sizes: dict[str, tuple[int, bool, float]] = field(default_factory=dict)

    async def _embed(self, query: str, *, recheck_space: bool = False) -> np.ndarray | None:
        if self.embedder is None:
            return None
        try:
            # Cached per model: after a re-embed switches the space, old vectors would not even compare.
            embedder = await pinned(self.embedder, force=recheck_space)
        except Exception as e:
            log.warning("query_embedding_failed", error=repr(e)[:300])
            return None
        key = (embedder.model_name, query)
        hit = self._cache.get(key)
        if hit is not None:
            self._cache.move_to_end(key)
            return hit
        try:
            t0 = time.perf_counter()
            vec = await embedder.embed_query(query)
            SEARCH_SECONDS.labels("embed").observe(time.perf_counter() - t0)
        except Exception as e:  # degrade to full text rather than fail the turn
            log.warning("query_embedding_failed", error=repr(e)[:300])
            return None
        self._cache[key] = vec
        if len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)
        return vec

    async def search(self, workspace_id: str, query: str, k: int = 10) -> list[SearchHit]:
        """Top-k drawers of ``workspace_id`` for ``query``.

        The query is embedded before the transaction opens, not alongside the database work: on 2 cores
        the overlap measured slower (LoCoMo-dev questions, p50 39.4 vs 30.6 ms), the model's threads and
        PostgreSQL contending for the same cores and caches.
        """
        t0 = time.perf_counter()
        vec = await self._embed(query)
        params = SearchParams(**{**self.params.__dict__, "k": k})
        t1 = time.perf_counter()
        try:
            hits = await self._search(workspace_id, query, vec, params)
        except psycopg.errors.DataException as e:
            if vec is None or "dimensions" not in str(e):
                raise
            # The embedding space switched (palace reembed) between embedding the query and searching:
            # embed it again in the space now active.
            log.info("embedding_space_switched", error=str(e)[:200])
            vec = await self._embed(query, recheck_space=True)
            hits = await self._search(workspace_id, query, vec, params)
        SEARCH_SECONDS.labels("sql").observe(time.perf_counter() - t1)
        SEARCH_SECONDS.labels("total").observe(time.perf_counter() - t0)
        if self.touch and hits:  # noted, written later in one batch (shared/access.py): never awaited here
            access_log(self.pool).note(workspace_id, [h.id for h in hits])
        return hits

    async def _search(self, workspace_id: str, query: str, vec: np.ndarray | None,
                      params: SearchParams) -> list[SearchHit]:
        cached = self._sizes.get(workspace_id)
        if cached is None or time.monotonic() - cached[2] > self.size_ttl_s:
            async with workspace_tx(self.pool, workspace_id) as conn:
                size = await workspace_size(conn, workspace_id, max(self.params.exact_max, self.vector_index_min) + 1)
                ready = await vector_index_ready(conn, workspace_id)
                if not ready and size > self.vector_index_min:
                    # Exact scans until maintain has built the workspace's own index.
                    await request_vector_index(conn, workspace_id, size)
            cached = (size, ready, time.monotonic())
            self._sizes[workspace_id] = cached
        # The search scopes its own transaction to the workspace, all in one round trip (hybrid_search).
        async with self.pool.connection() as conn:
            return await hybrid_search(conn, workspace_id, query, vec, params, workspace_size=cached[0],
                                       vector_index=cached[1])

    async def drain(self) -> None:
        """Write the access statistics still pending (at shutdown)."""
        await access_log(self.pool).aclose()
