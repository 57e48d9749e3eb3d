"""Recall: embed the query (cached), run the hybrid search, touch what was returned.

Used by the HTTP API, the CLI and the benchmarks, so every figure we publish measures the same path
users call. If the embedder fails, recall degrades to full-text only instead of failing.
"""

from __future__ import annotations

import contextlib
import time
from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import numpy as np
import psycopg
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from shared.access import access_log
from shared.adapters.space_embedder import pinned
from shared.config import Settings
from shared.db.drawers import workspace_size
from shared.db.episodes import search_episodes, session_drawers
from shared.db.search import SearchHit, SearchParams, hybrid_search, one_pass
from shared.db.tenancy import workspace_tx
from shared.db.vector_indexes import recheck_after, vector_index_for
from shared.logging import get_logger
from shared.memory.citations import cite
from shared.memory.ranking import RankParams
from shared.metrics import SEARCH_SECONDS
from shared.ports import Embedder

__all__ = ["EPISODE_DRAWERS", "RecalledEpisode", "Recaller", "Recollection"]

# How long a search waits for its second connection when the pool showed one idle: only for the pool's
# lock, which another task may hold for a moment.
SPARE_WAIT_S = 0.005
EPISODE_DRAWERS = 20  # citations an episode carries at most (its drawer_count says how many it has)

log = get_logger("palace.recall")


@dataclass(frozen=True)
class RecalledEpisode:
    """A session's episode returned by recall. ``score`` is the 0–1 relevance of its embedding to the
    query, the cosine mapped on the same band as a drawer's vector signal (``RankParams.cos_floor`` → 0,
    ``cos_ceiling`` → 1, clipped): what a hit's ``dense`` would be at that cosine; ``cosine`` is
    the raw similarity. ``drawers`` are the citations of the session's live drawers in conversation order
    (at most ``EPISODE_DRAWERS``; ``drawer_count`` is how many it has), each resolvable like a hit's."""

    episode_id: str
    session_id: str
    score: float
    cosine: float
    abstract: str
    summary: str
    topics: list[str]
    started_at: datetime | None
    completed_at: datetime | None
    agent_id: str | None
    user_id: str | None
    drawers: list[str]
    drawer_ids: list[str]
    drawer_count: int


@dataclass(frozen=True)
class Recollection:
    """What one recall returns: the ranked drawers, and the nearest episodes when they were asked for."""

    hits: list[SearchHit]
    episodes: list[RecalledEpisode] | None = None


@contextlib.asynccontextmanager
async def spare_connection(pool: AsyncConnectionPool, wanted: bool = True,
                           ) -> AsyncIterator[psycopg.AsyncConnection[Any] | None]:
    """A second connection for a search's full-text lookup (``hybrid_search``'s ``text_conn``), when the
    pool has one idle now; otherwise None, and the search runs on one connection as before. Never waited
    for: a busy pool is better spent on other searches, and a search holding one connection while it waits
    for a second could wait on others doing the same."""
    if not wanted or pool.get_stats().get("pool_available", 0) < 1:
        yield None
        return
    try:
        conn = await pool.getconn(timeout=SPARE_WAIT_S)
    except PoolTimeout:
        yield None
        return
    try:
        yield conn
    finally:
        await pool.putconn(conn)


def episode_score(cosine: float, rank: RankParams) -> float:
    """The cosine on the drawers' vector band, 0–1."""
    band = max(rank.cos_ceiling - rank.cos_floor, 1e-9)
    return float(min(1.0, max(0.0, (cosine - rank.cos_floor) / band)))


@dataclass
class Recaller:
    """Query-side state: the pool, the embedder and a small LRU of query embeddings."""

    pool: AsyncConnectionPool
    embedder: Embedder | None
    params: SearchParams = field(default_factory=SearchParams)
    cache_size: int = 2048
    touch: bool = True
    size_ttl_s: float = 60.0
    index_poll_s: float = 5.0  # PALACE_VECTOR_INDEX_POLL_S: how soon a requested index is looked for again
    vector_index_min: int = 5_000  # PALACE_VECTOR_INDEX_MIN_DRAWERS
    inject_threshold: float = Settings.model_fields["inject_threshold"].default  # PALACE_INJECT_THRESHOLD
    _cache: OrderedDict[tuple[str, str], np.ndarray] = field(default_factory=OrderedDict)
    _sizes: dict[str, tuple[int, bool, float]] = field(default_factory=dict)
    _searching: int = 0  # searches of this recaller under way (``_search``)

    @classmethod
    def from_settings(cls, pool: AsyncConnectionPool, embedder: Embedder | None, settings: Settings) -> Recaller:
        """The recaller every interface uses (api, MCP, CLI): search and index settings from PALACE_*."""
        return cls(pool, embedder, SearchParams.from_settings(settings),
                   vector_index_min=settings.vector_index_min_drawers, index_poll_s=settings.vector_index_poll_s,
                   inject_threshold=settings.inject_threshold)

    async def _embed(self, query: str, workspace_id: str, *, recheck_space: bool = False) -> np.ndarray | None:
        if self.embedder is None:
            return None
        try:
            # Cached per model: after a re-embed switches the space, old vectors would not even compare.
            embedder = await pinned(self.embedder, force=recheck_space)
        except Exception as e:
            log.warning("query_embedding_failed", error=repr(e)[:300])
            return None
        # Per workspace too: shared between tenants, a fast answer told one that another had just asked the
        # very same question.
        key = (workspace_id, embedder.model_name, query)
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

    async def search(self, workspace_id: str, query: str, k: int = 10, *, touch: bool = True) -> list[SearchHit]:
        """Top-k drawers of ``workspace_id`` for ``query`` (see ``recall``)."""
        return (await self.recall(workspace_id, query, k, touch=touch)).hits

    def note_access(self, workspace_id: str, drawer_ids: list[str]) -> None:
        """Count these drawers as recalled (their last access and access count, which recency ranking,
        decay and prune read): what a caller showed, when it searched with ``touch=False``."""
        if self.touch and drawer_ids:
            access_log(self.pool).note(workspace_id, drawer_ids)

    async def recall(self, workspace_id: str, query: str, k: int = 10, *, episodes: int = 0,
                     touch: bool = True) -> Recollection:
        """Top-k drawers of ``workspace_id`` for ``query`` and, when ``episodes`` > 0, the nearest built,
        unexpired episodes of its sessions (``episodes`` at most), ranked on their own.

        Episodes are not mixed into the drawer ranking (as ranking documents they did not raise held-out
        recall, docs/recall.md): the drawers and their scores are the same with or without them. They
        reuse the query's embedding, in the same transaction; when the embedder is down there are none.

        The query is embedded before the transaction opens, not alongside the database work: on 2 cores
        that overlap measured slower, with the model's threads spinning and PostgreSQL contending for the
        same cores and caches (docs/recall.md); so did starting only the full-text lookup before the
        embedding, built into the search (docs/benchmarks.md, "The model's threads no longer spin").
        """
        t0 = time.perf_counter()
        vec = await self._embed(query, workspace_id)
        params = SearchParams(**{**self.params.__dict__, "k": k})
        t1 = time.perf_counter()
        try:
            hits, found = await self._search(workspace_id, query, vec, params, episodes)
        except psycopg.errors.DataException as e:
            if vec is None or "dimensions" not in str(e):
                raise
            # The embedding space switched (palace reembed) between embedding the query and searching:
            # embed it again in the space now active.
            log.info("embedding_space_switched", error=str(e)[:200])
            vec = await self._embed(query, workspace_id, recheck_space=True)
            hits, found = await self._search(workspace_id, query, vec, params, episodes)
        SEARCH_SECONDS.labels("sql").observe(time.perf_counter() - t1)
        SEARCH_SECONDS.labels("total").observe(time.perf_counter() - t0)
        if touch:  # noted, written later in one batch (shared/access.py): never awaited here
            self.note_access(workspace_id, [h.id for h in hits])
        return Recollection(hits, found if episodes > 0 else None)

    async def _search(self, workspace_id: str, query: str, vec: np.ndarray | None, params: SearchParams,
                      episodes: int = 0) -> tuple[list[SearchHit], list[RecalledEpisode]]:
        cached = self._sizes.get(workspace_id)
        if cached is None or time.monotonic() > cached[2]:
            async with workspace_tx(self.pool, workspace_id) as conn:
                size = await workspace_size(conn, workspace_id, max(self.params.exact_max, self.vector_index_min) + 1)
                # Exact scans until maintain has built the workspace's own index.
                ready = await vector_index_for(conn, workspace_id, size, self.vector_index_min)
            cached = (size, ready, time.monotonic() + recheck_after(size, ready, self.vector_index_min,
                                                                    self.size_ttl_s, self.index_poll_s))
            self._sizes[workspace_id] = cached
        # The workspace's own index only past the size that asks for one: below it an exact scan costs
        # less than the walk and is exact (an index can outlive a workspace that shrank, or be made early).
        indexed = cached[1] and cached[0] > self.vector_index_min
        # Searched in one pass (small, no index) or by full text alone, a second connection has nothing to do.
        # And only a search running alone here splits: searches running together already keep the cores
        # busy, and a split adds a little work to each (its second statement's scope and planning).
        split = vec is not None and not one_pass(cached[0], indexed, params) and self._searching == 0
        self._searching += 1
        try:
            # The search scopes its own transaction to the workspace, all in one round trip (hybrid_search).
            async with self.pool.connection() as conn, spare_connection(self.pool, split) as text_conn:
                hits = await hybrid_search(conn, workspace_id, query, vec, params, workspace_size=cached[0],
                                           vector_index=indexed, text_conn=text_conn)
        finally:
            self._searching -= 1
        found: list[RecalledEpisode] = []
        if episodes > 0 and vec is not None:
            # Only when asked for: a transaction of its own, after the drawers' round trip.
            async with workspace_tx(self.pool, workspace_id) as conn:
                found = await self._episodes(conn, workspace_id, vec, episodes)
        return hits, found

    async def _episodes(self, conn: psycopg.AsyncConnection, workspace_id: str, vec: np.ndarray,
                        k: int) -> list[RecalledEpisode]:
        near = await search_episodes(conn, workspace_id, vec, k=k)
        cited = await session_drawers(conn, workspace_id, [e.session_id for e in near], per_session=EPISODE_DRAWERS)
        out = []
        for e in near:
            sd = cited.get(e.session_id)
            drawers = sd.drawers if sd else []
            out.append(RecalledEpisode(
                episode_id=e.id, session_id=e.session_id, score=round(episode_score(e.score, self.params.rank), 4),
                cosine=round(e.score, 4), abstract=e.abstract, summary=e.summary, topics=e.topics,
                started_at=e.started_at, completed_at=e.completed_at, agent_id=e.agent_id, user_id=e.user_id,
                drawers=[cite(w, r, i) for i, w, r in drawers], drawer_ids=[i for i, _, _ in drawers],
                drawer_count=sd.total if sd else 0))
        return out

    async def drain(self) -> None:
        """Write the access statistics still pending (at shutdown)."""
        await access_log(self.pool).aclose()
