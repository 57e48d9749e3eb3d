"""Graph-boosted recall against real PostgreSQL: a query's named entity, one hop through a triple, to the
drawers that mention them; index-backed, deadline-bounded, and never able to break a search."""

from __future__ import annotations

import asyncio
import json
import tempfile
import threading
from collections.abc import AsyncIterator

import psycopg
import pytest
from psycopg import pq
from psycopg_pool import AsyncConnectionPool

from shared.adapters.hash_embedder import HashEmbedder
from shared.db.graph_recall import _SQL, graph_candidates, graph_params
from shared.db.kg import add_triple, link_drawers
from shared.db.pool import open_pool
from shared.db.search import SearchParams, hybrid_search
from shared.db.tenancy import workspace_tx
from shared.memory.graph_signal import GraphParams, query_names
from shared.memory.ranking import RankParams
from tests.integration.helpers import Stack, ws

pytestmark = pytest.mark.integration

TEXTS = {
    "d-direct": "Orvieto sent the quarterly numbers over this morning.",
    "d-hop": "Lumbago Labs moved its whole team to the new office in March.",
    "d-other": "We had pasta for dinner and watched a film.",
    **{f"d-fill-{i}": f"Routine note {i}: the weekly sync went fine and nothing changed." for i in range(30)},
}


@pytest.fixture
async def pool(stack: Stack) -> AsyncIterator[AsyncConnectionPool]:
    p = await open_pool(stack.database_url, name="test-graph", max_size=2, role=stack.settings.db_role)
    try:
        yield p
    finally:
        await p.close()


async def _seed(stack: Stack, pool: AsyncConnectionPool) -> str:
    w = ws()
    emb = HashEmbedder(stack.settings.embed_dim)
    vecs = await emb.embed_documents(list(TEXTS.values()))
    with psycopg.connect(stack.database_url, autocommit=True) as conn, conn.cursor() as cur:
        cur.executemany(
            """INSERT INTO drawers (workspace_id, id, content, content_hash, state, embedding)
               VALUES (%s, %s, %s, md5(%s), 'processed', %s::vector)""",
            [(w, i, t, t, "[" + ",".join(f"{x:.6f}" for x in v) + "]")
             for (i, t), v in zip(TEXTS.items(), vecs, strict=True)])
    async with workspace_tx(pool, w) as c:
        await add_triple(c, w, "Orvieto", "works at", "Lumbago Labs", valid_from="2026-01-01")
        await link_drawers(c, w, list(TEXTS.items()))
    return w


# Correctness is checked with a generous deadline (a loaded test machine must not decide it); the
# deadline itself has its own test below.
ROOMY = GraphParams(timeout_ms=5000)


async def test_named_entity_and_its_neighbour_reach_their_drawers(stack: Stack, pool: AsyncConnectionPool) -> None:
    w = await _seed(stack, pool)
    async with workspace_tx(pool, w) as c:
        got = await graph_candidates(c, w, "Who does Orvieto work for?", len(TEXTS), ROOMY)
        # Orvieto is named: its drawer; Lumbago Labs is one triple away: its drawer, at half the weight.
        assert set(got) == {"d-direct", "d-hop"}
        assert got["d-hop"] == pytest.approx(got["d-direct"] * GraphParams().hop_factor)
        assert await graph_candidates(c, w, "what did we have for dinner?", len(TEXTS), ROOMY) == {}
        # An entity in more drawers than max_df selects nothing.
        assert await graph_candidates(c, w, "Who does Orvieto work for?", len(TEXTS),
                                      GraphParams(max_df=0, timeout_ms=5000)) == {}

    # Through the search: the hop drawer shares no word and (hash embeddings) no vector with the question,
    # yet comes back, with the graph's share in its explanation; without the signal its score has none.
    q = "Where is Orvieto employed?"
    vec = await HashEmbedder(stack.settings.embed_dim).embed_query(q)
    async with workspace_tx(pool, w) as c:
        on = await hybrid_search(c, w, q, vec, SearchParams(k=5, graph=ROOMY), workspace_size=33)
        off = await hybrid_search(c, w, q, vec, SearchParams(k=5, rank=RankParams(w_graph=0.0)), workspace_size=33)
    by_id = {h.id: h for h in on}
    assert "d-hop" in by_id and by_id["d-hop"].explanation.graph > 0
    assert by_id["d-direct"].explanation.graph > by_id["d-hop"].explanation.graph
    assert all(h.explanation.graph == 0 for h in off)
    assert [h.score for h in on] == sorted((h.score for h in on), reverse=True)


async def test_a_slow_graph_lookup_is_cut_off_and_the_search_goes_on(stack: Stack, pool: AsyncConnectionPool) -> None:
    w = await _seed(stack, pool)
    locked, release = threading.Event(), threading.Event()

    def hold_lock() -> None:  # another session holds the alias table: the lookup would wait for it
        with psycopg.connect(stack.database_url) as conn:
            conn.execute("LOCK TABLE entity_aliases IN ACCESS EXCLUSIVE MODE")
            locked.set()
            release.wait(60)

    t = threading.Thread(target=hold_lock)
    t.start()
    try:
        assert locked.wait(10)
        q = "Who does Orvieto work for?"
        vec = await HashEmbedder(stack.settings.embed_dim).embed_query(q)
        async with workspace_tx(pool, w) as c:
            before = (await (await c.execute("SHOW statement_timeout")).fetchone())[0]  # type: ignore[index]
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            assert await graph_candidates(c, w, q, len(TEXTS), GraphParams(timeout_ms=50)) == {}
            assert loop.time() - t0 < 10.0  # far below the lock's minute, for a loaded machine
            # The transaction is usable and keeps its own timeout; the search still answers.
            assert (await (await c.execute("SHOW statement_timeout")).fetchone())[0] == before  # type: ignore[index]
            hits = await hybrid_search(c, w, q, vec, SearchParams(k=3, graph=GraphParams(timeout_ms=50)),
                                       workspace_size=33)
            assert hits and hits[0].id == "d-direct" and all(h.explanation.graph == 0 for h in hits)
    finally:
        release.set()
        t.join()


def test_the_graph_lookup_is_index_backed(stack: Stack) -> None:
    """Every step probes an index by its key (alias key, triple end, entity), in a workspace big enough
    for the planner to choose; the rows and their statistics are rolled back with the transaction."""
    w = ws()
    names = query_names("Who does Orvieto work for at Lumbago Labs?")
    params = graph_params(w, names, 20_000, GraphParams())
    with psycopg.connect(stack.database_url) as conn:
        conn.execute("""INSERT INTO entities (workspace_id, id, name)
                        SELECT %(ws)s, 'e' || i, 'name ' || i FROM generate_series(1, 20000) i""", {"ws": w})
        conn.execute("""INSERT INTO entity_aliases (workspace_id, alias_key, anchor, entity_id, alias, cased)
                        SELECT %(ws)s, 'name ' || i, 'name', 'e' || i, 'Name ' || i, true
                          FROM generate_series(1, 20000) i""", {"ws": w})
        conn.execute("""INSERT INTO entity_mentions (workspace_id, entity_id, drawer_id)
                        SELECT %(ws)s, 'e' || (i %% 20000 + 1), 'd' || i FROM generate_series(1, 60000) i""",
                     {"ws": w})
        conn.execute("""INSERT INTO triples (workspace_id, id, subject_id, predicate, object_id)
                        SELECT %(ws)s, 't' || i, 'e' || i, 'knows', 'e' || (i + 1)
                          FROM generate_series(1, 20000) i""", {"ws": w})
        conn.execute("ANALYZE entity_aliases, entity_mentions, triples")
        plan = json.dumps(conn.execute("EXPLAIN (FORMAT JSON) " + _SQL, params).fetchall()[0][0])
        conn.rollback()
    assert '"Seq Scan"' not in plan, plan
    for index, key in (("entity_aliases_pkey", "alias_key"), ("entity_mentions_pkey", "entity_id"),
                       ("triples_subject_from", "subject_id"), ("triples_object_from", "object_id")):
        assert any(index in node and key in node for node in plan.split('"Node Type"')), (index, plan)


async def test_a_search_is_one_round_trip_with_the_graph_under_its_deadline(stack: Stack,
                                                                           pool: AsyncConnectionPool) -> None:
    """On an idle connection the whole search (workspace setting, graph lookup, candidates) is one
    message to the server, in a transaction of its own; the lookup still has its deadline there, and
    a lookup past it leaves a search without the graph and a connection as the pool handed it out."""
    w = await _seed(stack, pool)
    q = "Where is Orvieto employed?"
    vec = await HashEmbedder(stack.settings.embed_dim).embed_query(q)
    params = SearchParams(k=5, graph=ROOMY)
    async with workspace_tx(pool, w) as c:  # the same search inside a transaction, for comparison
        in_tx = await hybrid_search(c, w, q, vec, params, workspace_size=33)
    async with pool.connection() as c:
        await hybrid_search(c, w, q, vec, params, workspace_size=33)  # the first prepares the lookup
        with tempfile.TemporaryFile("w+") as trace:
            c.pgconn.trace(trace.fileno())
            c.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS)
            hits = await hybrid_search(c, w, q, vec, params, workspace_size=33)
            c.pgconn.untrace()
            trace.seek(0)
            sent = [line.split("\t")[2] for line in trace.read().splitlines() if line.startswith("F\t")]
        assert sent == ["Query"], sent
        assert not c.autocommit and c.info.transaction_status == pq.TransactionStatus.IDLE
    assert [h.id for h in hits] == [h.id for h in in_tx]  # (scores move with the drawers' age, by the second)
    assert [h.score for h in hits] == pytest.approx([h.score for h in in_tx], abs=1e-6)
    assert {h.id for h in hits if h.explanation.graph > 0} == {"d-direct", "d-hop"}
    async with pool.connection() as c:  # psycopg deallocates everything after some rollbacks: the graph stays
        await c.execute("DEALLOCATE ALL")
        await c.commit()
        again = await hybrid_search(c, w, q, vec, params, workspace_size=33)
    assert {h.id for h in again if h.explanation.graph > 0} == {"d-direct", "d-hop"}
    # Only the strongest max_drawers drawers are candidates, chosen in SQL as graph_strengths chooses.
    async with pool.connection() as c:
        one = await hybrid_search(c, w, q, vec, SearchParams(k=5, graph=GraphParams(timeout_ms=5000, max_drawers=1)),
                                  workspace_size=33)
    assert {h.id for h in one if h.explanation.graph > 0} == {"d-direct"}

    locked, release = threading.Event(), threading.Event()

    def hold_lock() -> None:
        with psycopg.connect(stack.database_url) as conn:
            conn.execute("LOCK TABLE entity_aliases IN ACCESS EXCLUSIVE MODE")
            locked.set()
            release.wait(60)

    t = threading.Thread(target=hold_lock)
    t.start()
    try:
        assert locked.wait(10)
        for _ in range(2):  # a connection that has the lookup prepared, and a new one (PREPARE takes locks too)
            async with pool.connection() as c:
                loop = asyncio.get_running_loop()
                t0 = loop.time()
                hits = await hybrid_search(c, w, q, vec, SearchParams(k=3, graph=GraphParams(timeout_ms=50)),
                                           workspace_size=33)
                assert loop.time() - t0 < 10.0  # far below the lock's minute, for a loaded machine
                assert hits and hits[0].id == "d-direct" and all(h.explanation.graph == 0 for h in hits)
                assert not c.autocommit and c.info.transaction_status == pq.TransactionStatus.IDLE
                await c.close()  # the next round takes a fresh connection
    finally:
        release.set()
        t.join()
    async with pool.connection() as c:  # once the lock is gone, the graph is back
        hits = await hybrid_search(c, w, q, vec, params, workspace_size=33)
    assert {h.id for h in hits if h.explanation.graph > 0} == {"d-direct", "d-hop"}
