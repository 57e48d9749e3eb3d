"""Per-workspace vector indexes: search asks for one when a workspace outgrows exact scans, maintain
builds it (concurrently, as a partial index), search then plans its nearest-neighbour part on it —
and finds what the exact scan finds, the one drawer holding the query's rare word included."""

from __future__ import annotations

import asyncio
import json
import time

import numpy as np
import psycopg
import pytest
from psycopg import sql

from shared.adapters.hash_embedder import HashEmbedder
from shared.db.clustering import INDEXED_CANDIDATES_SQL
from shared.db.pool import open_pool
from shared.db.search import _SQL, SearchParams, hybrid_search
from shared.db.vector_indexes import index_name_for
from shared.recall import Recaller
from tests.integration.helpers import Stack, analyze, session, wait_for, ws

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
            """INSERT INTO drawers (workspace_id, id, content, content_hash, state, embedding, dedup_bands)
               VALUES (%s, md5(%s), %s, md5(%s), 'processed', %s::vector, '{}')""",
            [(workspace, t, t, t, "[" + ",".join(f"{x:.6f}" for x in v) + "]")
             for t, v in zip(texts, vecs, strict=True)],
        )
        analyze(conn, "drawers")
    return texts


def test_a_growing_workspace_gets_its_own_index_and_search_uses_it(stack: Stack) -> None:
    w = ws()
    texts = _seed(stack, w)
    emb = HashEmbedder(stack.settings.embed_dim)

    async def search(query: str, min_drawers: int) -> list[tuple[str, float]]:
        pool = await open_pool(stack.database_url, name="test", max_size=2, role=stack.settings.db_role)
        try:
            r = Recaller(pool, emb, touch=False, vector_index_min=min_drawers)
            return [(h.id, round(h.score, 4)) for h in await r.search(w, query, 10)]
        finally:
            await pool.close()

    # Every drawer matches the query's common words; only the last one written holds "2999". Full text
    # ranks at most text_rank_max (1,000) of a plain OR's matches, in the order the scan meets them, so the
    # rare word's drawer, last in the heap, must come from a pass that ranks every match (searched
    # exactly) or from a query for the rare word alone (the lexicon, once the workspace has an index).
    query = "which team shipped feature 2999"
    rare = stack.sql("SELECT md5(%s)", (texts[-1],))[0][0]
    exact = asyncio.run(search(query, 10_000))
    assert exact[0][0] == rare

    async def text_only() -> list[str]:  # no embedding (the embedder is down): full text alone must find it
        async with await psycopg.AsyncConnection.connect(stack.database_url, autocommit=True) as conn:
            await conn.execute("SET ROLE palace_app")
            return [h.id for h in await hybrid_search(conn, w, query, None, SearchParams(k=3), workspace_size=N)]

    assert asyncio.run(text_only())[0] == rare
    assert not stack.sql("SELECT 1 FROM vector_indexes WHERE workspace_id = %s", (w,))
    asyncio.run(search(query, 1000))  # over the threshold: asks for an index
    assert stack.sql("SELECT state FROM vector_indexes WHERE workspace_id = %s", (w,))[0][0] in (
        "wanted", "building", "ready")
    wait_for(lambda: stack.sql("SELECT state = 'ready' AND lexicon_at IS NOT NULL FROM vector_indexes "
                               "WHERE workspace_id = %s", (w,))[0][0],
             120, "maintain to build the workspace's index and count its common words")
    name = index_name_for(w)
    indexdef = stack.sql("SELECT pg_get_indexdef(to_regclass(%s))", (name,))[0][0]
    assert "hnsw" in indexdef and w in indexdef

    # The statement search runs, planned the way search runs it (unprepared), walks that index.
    q = asyncio.run(emb.embed_query(query))
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
            "text": query, "emb": np.asarray(q), "use_ann": True, "ws": w, "exact": True,
            "hnsw": True, "max_terms": p.max_terms, "pair_terms": p.pair_terms, "n_ann": p.ann_candidates,
            "n_fts": p.fts_candidates, "fts_scan": p.fts_scan_max, "text_rank": p.text_rank_max,
            "n_date": 0, "lo": [], "hi": [],
            "graph_ids": [],
        }, prepare=False).fetchall()[0][0]
    assert name in json.dumps(plan)
    # The index holds what a walk may return (live, not merged): search's statement (above) and cluster's
    # neighbour walks (processed drawers) both imply that, so both match it.
    assert "merged" in indexdef and "deleted_at IS NULL" in indexdef
    with psycopg.connect(stack.database_url) as conn:
        from pgvector.psycopg import register_vector

        register_vector(conn)
        conn.execute("SET ROLE palace_app")
        conn.execute("SELECT set_config('palace.workspace_id', %s, false)", (w,))
        conn.execute("SET enable_sort = off")
        one = stack.sql("SELECT id FROM drawers WHERE workspace_id = %s LIMIT 1", (w,))[0][0]
        plan = conn.execute("EXPLAIN (FORMAT JSON) " + INDEXED_CANDIDATES_SQL, {
            "ws": w, "ids": [one], "embs": [np.asarray(q, dtype=np.float32)], "bands": [0] * 4, "nb": 4, "n": 5,
        }, prepare=False).fetchall()[0][0]
    assert name in json.dumps(plan)
    # The drawers filed after the event's drawer are read in filing order from the state index, not scanned.
    assert "drawers_state" in json.dumps(plan) and '"Seq Scan"' not in json.dumps(plan), json.dumps(plan)

    indexed = asyncio.run(search(query, 1000))
    # The same best hit, scored the same. Past it the drawers tie on score here, and the candidate sets
    # differ (the walk's neighbours, the rare word's drawers), so which of them show may differ.
    assert indexed[0] == exact[0]


def test_a_workspace_written_but_never_searched_gets_its_index_from_cluster(stack: Stack) -> None:
    """cluster ranks every new drawer's neighbours in its workspace: exactly, with one scan of it per event,
    until the workspace has an index. Search was the only stage asking for one, so a workspace nobody
    searched was scanned per event for ever. Now cluster asks too, once the workspace is past
    PALACE_VECTOR_INDEX_MIN_DRAWERS."""
    w = ws()
    past = stack.settings.vector_index_min_drawers + 1
    # Drawers without embeddings: they count towards the size, and the index maintain then builds over
    # them is empty (cheap, beside the other tests).
    with psycopg.connect(stack.database_url, autocommit=True) as conn:
        conn.execute("""INSERT INTO drawers (workspace_id, id, content, content_hash, state, dedup_bands)
                        SELECT %s, md5(%s || g), 'old note ' || g, md5(%s || g), 'processed', '{}'
                          FROM generate_series(1, %s) g""", (w, w, w, past))
    stack.publish(session(w, "s1", ["The deploy pipeline now runs the database migrations before the canary."]))
    stack.wait_processed(w, past + 1)
    wait_for(lambda: stack.sql("SELECT state FROM vector_indexes WHERE workspace_id = %s", (w,)) != [], 60,
             "cluster to ask for the workspace's index")
    assert stack.sql("SELECT drawers > %s FROM vector_indexes WHERE workspace_id = %s",
                     (stack.settings.vector_index_min_drawers, w))[0][0]
    # Built before the next test starts: a concurrent index build and another test's ANALYZE of the
    # drawers table can deadlock.
    wait_for(lambda: stack.sql("SELECT state FROM vector_indexes WHERE workspace_id = %s", (w,))[0][0] == "ready",
             120, "maintain to build it")


def test_a_build_whose_builder_died_is_built_again(stack: Stack) -> None:
    """A request left marked as building (maintain killed mid-build) was never looked at again: the
    workspace searched exactly for ever. Under the build lease no build can be running, so maintain asks
    for it again, drops the half-built (invalid) index the dead build left, and builds it."""
    w = ws()
    name = index_name_for(w)
    with psycopg.connect(stack.database_url, autocommit=True) as conn:
        conn.execute("""INSERT INTO drawers (workspace_id, id, content, content_hash, state, dedup_bands)
                        SELECT %s, md5(%s || g), 'old note ' || g, md5(%s || g), 'processed', '{}'
                          FROM generate_series(1, 50) g""", (w, w, w))
        conn.execute("INSERT INTO vector_indexes (workspace_id, index_name, drawers, state) VALUES (%s, %s, 50, "
                     "'building')", (w, name))
        # What CREATE INDEX CONCURRENTLY leaves when it dies: an index marked invalid.
        conn.execute(sql.SQL("CREATE INDEX {} ON drawers USING hnsw (embedding vector_cosine_ops) "
                             "WHERE workspace_id = {}").format(sql.Identifier(name), sql.Literal(w)))
        conn.execute("UPDATE pg_index SET indisvalid = false WHERE indexrelid = to_regclass(%s)", (name,))
    wait_for(lambda: stack.sql("SELECT state FROM vector_indexes WHERE workspace_id = %s", (w,))[0][0] == "ready",
             120, "maintain to build the orphaned request again")
    assert stack.sql("SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass(%s)", (name,))[0][0]
    assert "merged" in stack.sql("SELECT pg_get_indexdef(to_regclass(%s))", (name,))[0][0]


def test_the_build_lease_is_renewed_while_a_build_runs_and_released_after(
        stack: Stack, monkeypatch: pytest.MonkeyPatch) -> None:
    """The lease can be short (a builder killed mid-build holds it minutes, not hours) because the
    builder renews it while it builds: here a 3 s lease outlives a 4 s build (renewed each 0.5 s, so a renewal
    delayed by a busy machine does not let it lapse)."""
    import services.maintain.indexes as indexes
    from services._runtime import Deps

    monkeypatch.setattr(indexes, "_LEASE_S", 3.0)
    monkeypatch.setattr(indexes, "_RENEW_S", 0.5)
    seen: list[bool] = []

    async def wanted(conn: object, limit: int = 10) -> list[tuple[str, str]]:
        return [(ws(), "drawers_hnsw_test_lease")]

    async def build(database_url: str, workspace_id: str, index_name: str) -> None:
        await asyncio.sleep(4.0)  # past the lease's 3 s: held only if it was renewed
        seen.append(stack.sql("SELECT expires_at > now() FROM job_leases WHERE job = 'vector_indexes'")[0][0])

    monkeypatch.setattr(indexes, "wanted_vector_indexes", wanted)
    monkeypatch.setattr(indexes, "build_vector_index", build)
    holder = f"test-{ws()}"

    async def go() -> int:
        pool = await open_pool(stack.database_url, name="test-lease", max_size=2, role=stack.settings.db_role)
        try:
            return await indexes.build_wanted(Deps(stack.settings, "maintain", pool, None), holder)  # type: ignore[arg-type]
        finally:
            await pool.close()

    # The stack's own maintain takes this lease while any request waits (another test's, or cluster's for a
    # big workspace): start once none waits and the lease is free.
    wait_for(lambda: stack.sql("SELECT (SELECT count(*) FROM vector_indexes WHERE state IN ('wanted', 'building'))"
                               " + (SELECT count(*) FROM job_leases WHERE job = 'vector_indexes'"
                               " AND expires_at > now())") == [(0,)], 120, "no index request waiting, the lease free")
    assert asyncio.run(go()) == 1
    assert seen == [True]
    assert stack.sql("SELECT holder, expires_at <= now() FROM job_leases WHERE job = 'vector_indexes'")[0] == (
        holder, True)


def test_a_builder_that_loses_its_lease_stops_building(stack: Stack, monkeypatch: pytest.MonkeyPatch) -> None:
    """A builder whose renewals failed until its lease expired and another replica took it stops: the new
    holder asks for the half-done build again, and two builds of one index must not run at once. Here
    the lease is taken from it during its first build; the build is cancelled and the second never starts,
    and the other holder's lease is left alone."""
    import services.maintain.indexes as indexes
    from services._runtime import Deps

    monkeypatch.setattr(indexes, "_LEASE_S", 30.0)
    monkeypatch.setattr(indexes, "_RENEW_S", 0.2)
    started: list[str] = []
    finished: list[str] = []
    thief = f"other-{ws()}"

    async def wanted(conn: object, limit: int = 10) -> list[tuple[str, str]]:
        return [(ws(), "drawers_hnsw_test_lost_1"), (ws(), "drawers_hnsw_test_lost_2")]

    async def build(database_url: str, workspace_id: str, index_name: str) -> None:
        started.append(index_name)
        stack.sql("UPDATE job_leases SET holder = %s, expires_at = now() + interval '1 minute'"
                  " WHERE job = 'vector_indexes' RETURNING holder", (thief,))
        await asyncio.sleep(60)  # cancelled once the lease is seen lost
        finished.append(index_name)

    monkeypatch.setattr(indexes, "wanted_vector_indexes", wanted)
    monkeypatch.setattr(indexes, "build_vector_index", build)
    holder = f"test-{ws()}"

    async def go() -> tuple[int, float]:
        pool = await open_pool(stack.database_url, name="test-lease-lost", max_size=2, role=stack.settings.db_role)
        t0 = time.monotonic()
        try:
            built = await indexes.build_wanted(Deps(stack.settings, "maintain", pool, None), holder)  # type: ignore[arg-type]
            return built, time.monotonic() - t0
        finally:
            await pool.close()

    wait_for(lambda: stack.sql("SELECT (SELECT count(*) FROM vector_indexes WHERE state IN ('wanted', 'building'))"
                               " + (SELECT count(*) FROM job_leases WHERE job = 'vector_indexes'"
                               " AND expires_at > now())") == [(0,)], 120, "no index request waiting, the lease free")
    try:
        built, took = asyncio.run(go())
        assert (built, started, finished) == (0, ["drawers_hnsw_test_lost_1"], [])
        assert took < 20, took  # far below the build's minute
        assert stack.sql("SELECT holder, expires_at > now() FROM job_leases WHERE job = 'vector_indexes'")[0] == (
            thief, True)
    finally:
        stack.sql("UPDATE job_leases SET expires_at = now() WHERE job = 'vector_indexes' AND holder = %s"
                  " RETURNING holder", (thief,))


def test_an_index_is_built_serially_on_a_pgvector_whose_parallel_build_overflows(stack: Stack) -> None:
    """pgvector 0.6.0–0.8.1 overflows a buffer in its parallel HNSW build (CVE-2026-3172; here a parallel
    worker's segfault once restarted the whole server mid-suite). The builders turn parallel workers off on
    such a server (the embedded one ships 0.6.2) and leave them alone on a fixed one."""
    import asyncio

    from shared.db.vector_indexes import PARALLEL_BUILD_FIXED_IN, _version, build_serially_unless_fixed

    assert _version("0.8.1") < PARALLEL_BUILD_FIXED_IN <= _version("0.8.2") < _version("0.10.0")

    async def workers() -> tuple[bool, str, str, str]:
        async with await psycopg.AsyncConnection.connect(stack.database_url, autocommit=True) as conn:
            row = await (await conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'")).fetchone()
            before = await (await conn.execute("SHOW max_parallel_maintenance_workers")).fetchone()
            changed = await build_serially_unless_fixed(conn)
            after = await (await conn.execute("SHOW max_parallel_maintenance_workers")).fetchone()
            assert row is not None and before is not None and after is not None
            return changed, str(row[0]), str(before[0]), str(after[0])

    changed, version, before, after = asyncio.run(workers())
    assert changed == (_version(version) < PARALLEL_BUILD_FIXED_IN)
    assert after == ("0" if changed else before)
