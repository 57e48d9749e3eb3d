"""Cluster's twins and neighbours ranked from what it keeps are the database's exact ones: on a first
read, and after drawers are added, merged, re-embedded in place or deleted outright, each caught by what
the cache reads back (the row's ``rev`` stamp, or the winners' check)."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import psycopg
import pytest

from shared.db.clustering import cluster_candidates
from shared.db.drawers import drawers_by_id
from shared.db.pool import open_pool
from shared.db.tenancy import workspace_tx
from shared.memory.dedup import wording_bands
from shared.memory.neighbours import VectorCache
from tests.integration.helpers import Stack, ws

pytestmark = pytest.mark.integration

DIMS = 384


def _vec(v: np.ndarray) -> str:
    return "[" + ",".join(f"{x:.6f}" for x in v) + "]"


_WORDS = ["we", "went", "hiking", "by", "the", "lake", "on", "sunday", "with", "my", "sister", "and", "dog"]


def _insert(stack: Stack, w: str, start: int, n: int, rng: np.random.Generator) -> list[str]:
    """n processed drawers with random vectors, filed in pairs (two per second: the id orders a pair),
    worded from a few words so that many share a wording band."""
    ids = [f"{w}-{i:05d}" for i in range(start, start + n)]
    texts = [" ".join(rng.choice(_WORDS, size=4)) for _ in ids]
    with psycopg.connect(stack.database_url, autocommit=True) as conn, conn.cursor() as cur:
        cur.executemany(
            """INSERT INTO drawers (workspace_id, id, content, content_hash, state, embedding, dedup_bands, filed_at)
               VALUES (%s, %s, %s, md5(%s), 'processed', %s::vector, %s,
                       timestamptz '2026-01-01' + %s * interval '1 second')""",
            [(w, i, t, i, _vec(rng.normal(size=DIMS)), wording_bands(w, t), (start + k) // 2)
             for k, (i, t) in enumerate(zip(ids, texts, strict=True))])
    return ids


def _exec(stack: Stack, query: str, params: tuple[Any, ...]) -> None:
    with psycopg.connect(stack.database_url, autocommit=True) as conn:
        conn.execute(query, params)  # type: ignore[arg-type]


async def _both(pool: Any, w: str, event: list[str], cache: VectorCache) -> tuple[dict[str, Any], dict[str, Any]]:
    """The event's neighbours ranked by the database and from the cache, each in a transaction of its own."""
    out = []
    for c in (None, cache):
        async with workspace_tx(pool, w) as conn:
            rows = await drawers_by_id(conn, w, event, with_embedding=True)
            found = await cluster_candidates(conn, w, [(r.id, r.embedding, wording_bands(w, r.content)) for r in rows],
                                             cache=c)
        out.append({d: ([i for i, _, _ in n.near], [s for _, s, _ in n.near], [c for _, _, c in n.near],
                        [i for i, _, _ in n.twins], [s for _, s, _ in n.twins], [c for _, _, c in n.twins],
                        n.newer)
                    for d, n in found.items()})
    return out[0], out[1]


async def _vectors(pool: Any, w: str, ids: list[str]) -> list[Any]:
    async with workspace_tx(pool, w) as conn:
        return [r.embedding.to_numpy() for r in await drawers_by_id(conn, w, ids, with_embedding=True)]


def _same(db: dict[str, Any], here: dict[str, Any]) -> None:
    assert db.keys() == here.keys()
    for d in db:
        assert here[d][6] == db[d][6], d  # the same ones filed after the drawer
        for k in (0, 3):  # the neighbours, then the twins: ids, contents, similarities
            assert here[d][k] == db[d][k], d
            assert here[d][k + 2] == db[d][k + 2]
            assert np.allclose(here[d][k + 1], db[d][k + 1], atol=1e-5)


def test_the_cache_ranks_as_the_database_through_every_kind_of_change(stack: Stack) -> None:
    w = ws()
    rng = np.random.default_rng(11)
    ids = _insert(stack, w, 0, 300, rng)

    async def go() -> None:
        pool = await open_pool(stack.database_url, name="test-neighbours", max_size=2, role=stack.settings.db_role)
        cache = VectorCache(64 * 2**20)
        try:
            event = ids[-10:]
            db, here = await _both(pool, w, event, cache)
            _same(db, here)
            # Five filed before each, and as many filed after it as there are (up to five).
            assert all(len([i for i in n[0] if i not in n[6]]) == 5 for n in db.values())
            assert [len([i for i in db[d][0] if i in db[d][6]]) for d in event] == [5, 5, 5, 5, 5, 4, 3, 2, 1, 0]
            assert sum(len(n[3]) for n in db.values()) >= 10  # the wording made twins to compare
            assert cache.get(w, DIMS).n == 300

            # Changes the next read must see: new drawers, merges, a vector rewritten in place, and a
            # winner deleted outright (no row left to read: the winners' check finds it).
            new = _insert(stack, w, 300, 40, rng)
            winners = sorted({i for n in db.values() for i in n[0]})
            merged, rewritten, deleted = winners[0], winners[1], winners[2]
            _exec(stack, "UPDATE drawers SET state = 'merged' WHERE workspace_id = %s AND id = %s", (w, merged))
            _exec(stack, "UPDATE drawers SET embedding = %s::vector WHERE workspace_id = %s AND id = %s",
                      (_vec(rng.normal(size=DIMS)), w, rewritten))
            _exec(stack, "DELETE FROM drawers WHERE workspace_id = %s AND id = %s", (w, deleted))
            for event in (ids[-10:], new[-10:], new[:5] + ids[100:105]):
                db, here = await _both(pool, w, event, cache)
                _same(db, here)
                assert not {merged, deleted} & {i for n in here.values() for i in n[0]}
            assert merged not in cache.get(w, DIMS) and deleted not in cache.get(w, DIMS)
            assert cache.get(w, DIMS).n == 340 - 2

            # A change by a transaction still running when the cache reads, committed after that read:
            # the next read takes it (the cache's winners check could not: the drawer stays a candidate).
            event = new[-10:]
            db, _ = await _both(pool, w, event, cache)
            moved = db[event[0]][0][0]
            far = -np.asarray((await _vectors(pool, w, [event[0]]))[0])
            async with await psycopg.AsyncConnection.connect(stack.database_url) as other:
                await other.execute("UPDATE drawers SET embedding = %s::vector WHERE workspace_id = %s AND id = %s",
                                    (_vec(far), w, moved))
                # A later transaction commits first: the read's snapshot then lists the open one as running.
                _exec(stack, "SELECT pg_current_xact_id()", ())
                db, here = await _both(pool, w, event, cache)
                _same(db, here)
                assert moved in here[event[0]][0]
            db, here = await _both(pool, w, event, cache)
            _same(db, here)
            assert moved not in here[event[0]][0]

            # A workspace larger than the budget is left to the database, and nothing of it is kept.
            small = VectorCache(100 * 4 * DIMS)
            db, here = await _both(pool, w, ids[-10:], small)
            _same(db, here)
            assert len(small) == 0
        finally:
            await pool.close()

    asyncio.run(go())


def test_a_drawer_is_stamped_when_its_candidacy_or_vector_changes_only(stack: Stack) -> None:
    """``rev`` moves with state, deletion, vector and filing time; an update of anything else (an access
    count, the importance) leaves it, so such updates stay heap-only (HOT) as before."""
    w = ws()
    _insert(stack, w, 0, 1, np.random.default_rng(1))
    d = f"{w}-00000"

    def rev() -> int:
        return int(stack.sql("SELECT rev::text FROM drawers WHERE workspace_id = %s AND id = %s", (w, d))[0][0])

    first = rev()
    _exec(stack, "UPDATE drawers SET importance = 4.5 WHERE workspace_id = %s AND id = %s", (w, d))
    assert rev() == first
    for change in ("state = 'merged'", "deleted_at = now()", "embedding = NULL", "filed_at = now()",
                   "dedup_bands = '{1, 2}'"):
        before = rev()
        _exec(stack, f"UPDATE drawers SET {change} WHERE workspace_id = %s AND id = %s", (w, d))  # noqa: S608
        assert rev() > before, change


def test_a_re_embedding_makes_the_cache_read_the_workspace_again(stack: Stack) -> None:
    """`palace reembed` swaps every drawer's vector (a column rename) without stamping a row: the reads
    return the active embedding space, and a new one makes the cache read the workspace whole, so it
    never ranks with the old space's vectors (here of the same size, as a model of the same dimension)."""
    w = ws()
    ids = _insert(stack, w, 0, 200, np.random.default_rng(5))

    async def go() -> None:
        pool = await open_pool(stack.database_url, name="test-neighbours-space", max_size=2,
                               role=stack.settings.db_role)
        cache = VectorCache(64 * 2**20)
        space = stack.sql("SELECT id FROM embedding_spaces WHERE state = 'active'")[0][0]
        try:
            db, here = await _both(pool, w, ids[-10:], cache)
            _same(db, here)
            with psycopg.connect(stack.database_url) as conn:  # one transaction, as the swap
                conn.execute("ALTER TABLE drawers DISABLE TRIGGER drawers_rev")
                conn.execute("UPDATE drawers SET embedding = (SELECT array_agg(-x) FROM unnest(embedding::real[]) x)"
                             "::vector WHERE workspace_id = %s AND id <> ALL(%s)", (w, ids[-10:]))
                conn.execute("ALTER TABLE drawers ENABLE TRIGGER drawers_rev")
                conn.execute("UPDATE embedding_spaces SET id = %s WHERE state = 'active'", (space + "-next",))
            for _ in range(2):  # the first falls back to the database, the next reads the workspace whole
                db, here = await _both(pool, w, ids[-10:], cache)
                _same(db, here)
            assert cache.get(w, DIMS).space == space + "-next" and cache.get(w, DIMS).n == 200
        finally:
            _exec(stack, "UPDATE embedding_spaces SET id = %s WHERE state = 'active'", (space,))
            await pool.close()

    asyncio.run(go())
