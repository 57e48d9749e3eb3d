"""A search given a second connection finds its full-text candidates there while the first finds the rest
(``hybrid_search``'s ``text_conn``): the same hits with the same scores as on one connection, both
connections back idle after a failure, and the recaller takes a second connection only when the pool has
one idle."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from shared.adapters.hash_embedder import HashEmbedder
from shared.db.pool import open_pool
from shared.db.search import SearchParams, hybrid_search
from shared.db.tenancy import workspace_tx
from shared.recall import Recaller, spare_connection
from tests.integration.helpers import Stack, analyze, ws

pytestmark = pytest.mark.integration

WORDS = ["copper", "lantern", "harbor", "meadow", "violin", "orchard", "export", "nightly", "budget", "review",
         "garden", "salmon", "ticket", "window", "river", "castle"]
QUERIES = ["Why did the nightly export fail at the harbor?", "lantern by the meadow orchard",
           "What happened with the budget in October 2023?", "salmon garden castle river window"]
# Few vector candidates and more full-text ones: the top k holds drawers only full text found, so a search
# that lost the second connection's rows would rank differently.
PARAMS = SearchParams(k=10, ann_candidates=5, fts_candidates=30, exact_max=0)


def _seed(stack: Stack, workspace: str) -> None:
    emb = HashEmbedder(stack.settings.embed_dim)
    start = datetime(2023, 6, 1, tzinfo=UTC)
    texts = [" ".join(WORDS[(i * k) % len(WORDS)] for k in (1, 3, 5, 7)[: 2 + i % 3]) + f" note {i}"
             for i in range(240)]
    vecs = asyncio.run(emb.embed_documents(texts))
    with psycopg.connect(stack.database_url, autocommit=True) as conn, conn.cursor() as cur:
        cur.executemany(
            """INSERT INTO drawers (workspace_id, id, content, content_hash, state, embedding, dedup_bands,
                                    occurred_at, session_id, seq)
               VALUES (%s, md5(%s), %s, md5(%s), 'processed', %s::vector, '{}', %s, %s, %s)""",
            [(workspace, t, t, t, "[" + ",".join(f"{x:.6f}" for x in v) + "]", start + timedelta(days=i),
              f"s{i // 12}", i % 12) for i, (t, v) in enumerate(zip(texts, vecs, strict=True))])
        analyze(conn, "drawers")


def _hits(hits: list) -> list[tuple[str, float]]:
    return [(h.id, round(h.score, 6)) for h in hits]


async def _both(stack: Stack, workspace: str) -> tuple[list, list]:
    emb = HashEmbedder(stack.settings.embed_dim)
    pool = await open_pool(stack.database_url, name="test-split", min_size=2, max_size=2)
    try:
        one, two = [], []
        for q in QUERIES:
            vec = await emb.embed_query(q)
            async with pool.connection() as a:
                one.append(_hits(await hybrid_search(a, workspace, q, vec, PARAMS, workspace_size=10_000)))
            async with pool.connection() as a, pool.connection() as b:
                two.append(_hits(await hybrid_search(a, workspace, q, vec, PARAMS, workspace_size=10_000,
                                                     text_conn=b)))
                assert a.info.transaction_status == b.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        return one, two
    finally:
        await pool.close()


def test_a_split_search_returns_what_one_connection_returns(stack: Stack) -> None:
    w = ws()
    _seed(stack, w)
    one, two = asyncio.run(_both(stack, w))
    assert [len(h) for h in one] == [PARAMS.k] * len(QUERIES)
    for a, b in zip(one, two, strict=True):
        assert b == a, (set(a) ^ set(b))


def test_a_failure_on_either_connection_fails_the_search_and_leaves_the_other_idle(stack: Stack) -> None:
    w = ws()
    _seed(stack, w)

    async def go() -> None:
        emb = HashEmbedder(stack.settings.embed_dim)
        vec = await emb.embed_query(QUERIES[0])
        pool = await open_pool(stack.database_url, name="test-split", min_size=1, max_size=1)
        try:
            async with pool.connection() as a:
                dead = await psycopg.AsyncConnection.connect(stack.database_url)
                await dead.close()
                with pytest.raises(psycopg.OperationalError):
                    await hybrid_search(a, w, QUERIES[0], vec, PARAMS, workspace_size=10_000, text_conn=dead)
                assert a.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
                # and the other way round: the first connection's statement fails (a vector of the wrong
                # dimension): its error is the one reported, once the second is idle again
                async with await psycopg.AsyncConnection.connect(stack.database_url) as b:
                    await b.execute("SET ROLE palace_app")
                    await b.commit()
                    with pytest.raises(psycopg.errors.DataException):
                        await hybrid_search(a, w, QUERIES[0], vec[:3], PARAMS, workspace_size=10_000, text_conn=b)
                    assert b.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
                    assert a.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
            async with workspace_tx(pool, w) as c:  # the pool's connection still works
                assert await (await c.execute("SELECT count(*) FROM drawers")).fetchone() == (240,)
        finally:
            await pool.close()

    asyncio.run(go())


def test_a_second_connection_is_taken_only_when_the_pool_has_one_idle(stack: Stack) -> None:
    async def go() -> None:
        pool = await open_pool(stack.database_url, name="test-spare", min_size=2, max_size=2)
        try:
            async with spare_connection(pool) as spare:
                assert spare is not None
                assert pool.get_stats()["pool_available"] == 1
            assert pool.get_stats()["pool_available"] == 2
            async with spare_connection(pool, wanted=False) as spare:
                assert spare is None
            async with pool.connection(), pool.connection():
                t0 = time.perf_counter()
                async with spare_connection(pool) as spare:
                    assert spare is None  # none idle: not waited for
                assert time.perf_counter() - t0 < 5  # waiting would take the pool's timeout, a minute
        finally:
            await pool.close()

    asyncio.run(go())


def test_the_recaller_splits_a_search_past_exact_scans_only(stack: Stack, monkeypatch: pytest.MonkeyPatch) -> None:
    """With an idle connection to spare, a workspace past exact search gets one; one searched in a single
    pass does not (its pass finds both lists), nor a search that starts while another is under way."""
    import shared.recall as recall

    w = ws()
    _seed(stack, w)
    given: list[bool] = []
    search = recall.hybrid_search

    async def spy(*args, **kwargs):  # type: ignore[no-untyped-def]
        given.append(kwargs.get("text_conn") is not None)
        return await search(*args, **kwargs)

    monkeypatch.setattr(recall, "hybrid_search", spy)

    async def go() -> None:
        pool = await open_pool(stack.database_url, name="test-recaller", min_size=2, max_size=2)
        try:
            emb = HashEmbedder(stack.settings.embed_dim)
            for exact_max, split in ((0, True), (5_000, False)):
                r = Recaller(pool, emb, params=SearchParams(exact_max=exact_max), touch=False, cache_size=0,
                             vector_index_min=10**9)
                assert len(await r.search(w, QUERIES[1], 5)) == 5
                assert given[-1] is split
            # Two at once: the first splits, the one that starts while it runs does not (together they
            # already keep the cores busy).
            given.clear()
            r = Recaller(pool, emb, params=SearchParams(exact_max=0), touch=False, cache_size=0,
                         vector_index_min=10**9)
            await r.search(w, QUERIES[0], 5)  # the workspace's size, noted
            given.clear()
            both = await asyncio.gather(r.search(w, QUERIES[0], 5), r.search(w, QUERIES[1], 5))
            assert [len(h) for h in both] == [5, 5]
            assert given == [True, False]
            assert r._searching == 0
        finally:
            await pool.close()

    asyncio.run(go())


def test_the_full_text_lookup_ranks_at_most_text_rank_max_matches(stack: Stack) -> None:
    """Past exact search the full-text function ranks the first ``text_rank_max`` matches its scan meets, no
    more: the bound on a search's slowest questions."""
    from shared.db.search import candidates

    w = ws()
    _seed(stack, w)

    async def go(n: int) -> int:
        async with await psycopg.AsyncConnection.connect(stack.database_url) as conn:
            await conn.execute("SET ROLE palace_app")
            await conn.execute("SELECT set_config('palace.workspace_id', %s, false)", (w,))
            params = SearchParams(exact_max=0, fts_candidates=100, text_rank_max=n)
            _, cands, _ = await candidates(conn, w, QUERIES[1], None, [], params, workspace_size=10_000)
            return len(cands)

    assert asyncio.run(go(7)) == 7
    assert asyncio.run(go(1_000)) > 7
