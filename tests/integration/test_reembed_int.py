"""`palace reembed` on the real stack: every vector moves to a new model and dimension while searches
run and sessions keep arriving; no search fails, and afterwards search, the embed service and the
per-workspace HNSW index all work in the new space. The stack is switched back at the end (with
--drop-old), so the test also covers a second switch and dropping the retired space."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest
from typer.testing import CliRunner

from services.cli import app
from shared.adapters.hash_embedder import HashEmbedder
from shared.db.embedding_spaces import SpaceTarget
from shared.db.pool import open_pool
from shared.db.vector_indexes import index_name_for
from shared.logging import configure_logging
from shared.memory.filing import embedding_text
from shared.recall import Recaller
from shared.reembed import _connect, _settle, reembed
from tests.integration.helpers import Stack, session, wait_for, ws

pytestmark = pytest.mark.integration

TOPICS = ["the Orion launch moved to Lisbon", "the quarterly roadmap review", "our wifi password rotation",
          "the database migration window", "hiring a second designer", "the offsite in Porto"]


def _texts(i: int) -> list[str]:
    t = TOPICS[i % len(TOPICS)]
    return [f"Session {i}: we talked about {t} and agreed on step {i}.",
            f"Right, for {t} the owner of step {i} is person {i % 3}.",
            f"Remember that {t} depends on ticket {100 + i}."]


def _index_column_type(stack: Stack, name: str) -> str | None:
    rows = stack.sql("""SELECT format_type(a.atttypid, a.atttypmod) FROM pg_index i
                          JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
                         WHERE i.indexrelid = to_regclass(%s)""", (name,))
    return rows[0][0] if rows else None


def _column_types(stack: Stack) -> dict[tuple[str, str], str]:
    return {(r[0], r[1]): r[2] for r in stack.sql(
        """SELECT c.relname, a.attname, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a
             JOIN pg_class c ON c.oid = a.attrelid
            WHERE c.relname IN ('drawers', 'episodes', 'entities')
              AND a.attname IN ('embedding', 'embedding_next', 'embedding_old')
              AND a.attnum > 0 AND NOT a.attisdropped""")}


def _reembed(*args: str) -> str:
    result = CliRunner().invoke(app, ["reembed", *args])
    configure_logging("INFO", json=False)  # the command logged to the runner's stream, closed now
    assert result.exit_code == 0, (result.output, result.exception)
    return result.output


@pytest.mark.timeout(600)  # two re-embeds of the whole shared database
def test_reembed_switches_model_and_dimension_while_searches_run(stack: Stack) -> None:
    w = ws()
    for i in range(8):
        stack.publish(session(w, f"s{i}", _texts(i)))
    stack.wait_processed(w, 24, timeout=120)
    wait_for(lambda: stack.sql("SELECT count(*) FROM episodes WHERE workspace_id = %s AND status = 'ready'",
                               (w,))[0][0] == 8, 120, "eight episodes")
    # The workspace searches through its own HNSW index: the new space needs one as well.

    async def ask_for_index() -> None:
        pool = await open_pool(stack.database_url, name="test-reembed", max_size=2, role=stack.settings.db_role)
        try:
            await Recaller(pool, None, touch=False, vector_index_min=1).search(w, "Orion launch", 5)
        finally:
            await pool.close()

    asyncio.run(ask_for_index())
    wait_for(lambda: stack.sql("SELECT state FROM vector_indexes WHERE workspace_id = %s", (w,)) == [("ready",)],
             120, "maintain to build the workspace's index")
    assert _index_column_type(stack, index_name_for(w)) == "vector(384)"

    # A re-embed that dies half-way through the drawers leaves its progress in the database...
    def crash_after_a_batch(phase: str, done: int, total: int) -> None:
        if phase == "drawers" and done >= 8:
            raise RuntimeError("simulated crash")

    def crashed_reembed(dim: int) -> None:
        with pytest.raises(RuntimeError, match="simulated crash"):
            asyncio.run(reembed(stack.settings, stack.database_url, SpaceTarget("hash", "hash", dim), batch=8,
                                progress=crash_after_a_batch))

    # (one abandoned with --abort leaves nothing behind)
    crashed_reembed(32)
    assert _column_types(stack)[("drawers", "embedding_next")] == "vector(32)"
    assert "re-embed abandoned" in _reembed("--abort")
    assert stack.sql("SELECT count(*) FROM embedding_spaces WHERE state = 'building'") == [(0,)]
    assert stack.sql("SELECT count(*) FROM pg_class WHERE relname LIKE '%%_reembed_todo'") == [(0,)]
    assert ("drawers", "embedding_next") not in _column_types(stack)
    crashed_reembed(64)
    building = stack.sql("SELECT id FROM embedding_spaces WHERE state = 'building'")
    assert len(building) == 1
    # Every table's rows still to do are found by an index (a batch of episodes or entities walked every row
    # already done, and the switch counted them by scanning, under its exclusive locks).
    todo = ("SELECT to_regclass(t || '_reembed_todo') IS NOT NULL"
            " FROM unnest(ARRAY['drawers', 'episodes', 'entities']) t")
    assert stack.sql(todo) == [(True,)] * 3
    assert 0 < stack.sql("SELECT count(*) FROM drawers WHERE embedding_next IS NOT NULL")[0][0] < 24
    with pytest.raises(ValueError, match="in progress"):  # another target must wait for it (or --abort)
        asyncio.run(reembed(stack.settings, stack.database_url, SpaceTarget("hash", "hash", 32)))

    failures: list[str] = []
    searches: list[float] = []  # how long each search took
    stop = threading.Event()

    def search_loop() -> None:
        while not stop.is_set():
            try:
                t0 = time.perf_counter()
                hits = stack.search(w, "who owns the Orion launch step", 5)
                searches.append(time.perf_counter() - t0)
                if not hits:
                    failures.append("no hits")
            except Exception as e:  # any failure of a search during the switch fails the test
                failures.append(repr(e))

    def publish_loop() -> None:  # sessions keep arriving while the space is rebuilt
        for i in range(8, 14):
            stack.publish(session(w, f"s{i}", _texts(i)))
            time.sleep(0.3)

    threads = [threading.Thread(target=search_loop), threading.Thread(target=publish_loop)]
    for t in threads:
        t.start()
    try:
        t0 = time.perf_counter()
        out = _reembed("--provider", "hash", "--dim", "64", "--batch", "8")
        took = time.perf_counter() - t0
        time.sleep(2.0)  # a few searches after the switch too
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    assert not failures, failures[:5]
    assert len(searches) >= 5, len(searches)
    assert stack.sql("SELECT count(*) FROM pg_class WHERE relname LIKE '%%_reembed_todo'") == [(0,)]
    print(f"re-embed {took:.1f} s; {len(searches)} searches meanwhile, p50 {np.median(searches) * 1000:.0f} ms,"
          f" max {max(searches) * 1000:.0f} ms")
    print(out)
    assert "active space" in out and "64 dimensions" in out, out
    spaces = dict(stack.sql("SELECT state, model FROM embedding_spaces WHERE state IN ('active', 'building')"))
    assert spaces == {"active": "hash"}
    # ... and running it again resumed that space rather than starting another.
    assert stack.sql("SELECT id FROM embedding_spaces WHERE state = 'active'") == building
    types = _column_types(stack)
    assert types[("drawers", "embedding")] == types[("episodes", "embedding")] == "vector(64)"
    assert types[("drawers", "embedding_old")] == "vector(384)"  # kept until --drop-old
    assert ("drawers", "embedding_next") not in types
    # The index over the new vectors took the workspace's index name; the old one is kept with the old vectors.
    assert _index_column_type(stack, index_name_for(w)) == "vector(64)"
    assert stack.sql("SELECT state FROM vector_indexes WHERE workspace_id = %s", (w,)) == [("ready",)]

    # Every drawer, those that arrived during the re-embed included, holds the new model's vector of its text.
    stack.wait_processed(w, 42, timeout=120)
    hash64 = HashEmbedder(64)
    rows = stack.sql("SELECT content, speaker, context, embedding::real[], embedding_model FROM drawers"
                     " WHERE workspace_id = %s", (w,))
    assert len(rows) == 42
    want = asyncio.run(hash64.embed_documents([embedding_text(r[0], r[1], r[2]) for r in rows]))
    assert np.allclose(np.asarray([r[3] for r in rows], dtype=np.float32), want, atol=1e-5)
    assert {r[4] for r in rows} == {"hash-64"}
    # A service still on the old space that embeds an existing drawer again (its text changed) labels the
    # vector with its own model; with the same dimension the column takes it, and the settle pass re-embeds
    # it in the active space (it found only drawers new since the switch).
    stale_id, stale_text = stack.sql("SELECT id, content FROM drawers WHERE workspace_id = %s"
                                     " AND embedding_old IS NOT NULL ORDER BY id LIMIT 1", (w,))[0]
    stack.sql("UPDATE drawers SET embedding = %s::real[]::vector, embedding_model = 'stale-64'"
              " WHERE workspace_id = %s AND id = %s RETURNING id", ([1.0] + [0.0] * 63, w, stale_id))

    async def settle() -> int:
        conn = await _connect(stack.database_url)
        try:
            return await _settle(conn, hash64, 8)
        finally:
            await conn.close()

    assert asyncio.run(settle()) >= 1  # this one (any other drawer written meanwhile by a stale service too)
    row = stack.sql("SELECT speaker, context, embedding::real[], embedding_model FROM drawers"
                    " WHERE workspace_id = %s AND id = %s", (w, stale_id))[0]
    assert row[3] == "hash-64"
    assert np.allclose(row[2], asyncio.run(hash64.embed_documents([embedding_text(stale_text, row[0], row[1])]))[0],
                       atol=1e-5)
    # A session published after the switch is embedded by the embed service in the new space.
    stack.publish(session(w, "after", ["The Lisbon office opens its doors on the first of May."]))
    stack.wait_processed(w, 43, timeout=60)
    got = stack.sql("SELECT embedding::real[] FROM drawers WHERE workspace_id = %s AND session_id = 'after'", (w,))
    assert len(got[0][0]) == 64
    # Search answers from the new space: a query with a drawer's very words is its nearest vector.
    hits = stack.search(w, "The Lisbon office opens its doors on the first of May.", 3)
    assert hits[0]["content"].startswith("The Lisbon office") and hits[0]["dense"] > 0.5, hits[0]

    # Back to the stack's own model, dropping the retired vectors: the other tests run on it.
    _reembed("--provider", "local", "--model", stack.settings.embed_model, "--dim", str(stack.settings.embed_dim),
             "--drop-old")
    types = _column_types(stack)
    assert types == {(t, "embedding"): f"vector({stack.settings.embed_dim})"
                     for t in ("drawers", "episodes", "entities")}
    assert _index_column_type(stack, index_name_for(w)) == f"vector({stack.settings.embed_dim})"
    assert stack.sql("SELECT count(*) FROM embedding_cache WHERE model = 'hash-64'") == [(0,)]
    hits = stack.search(w, "The Lisbon office opens its doors on the first of May.", 3)
    assert hits[0]["content"].startswith("The Lisbon office")
