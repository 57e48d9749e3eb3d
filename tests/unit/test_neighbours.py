"""The cluster process's exact ranking from the vectors it holds: the same neighbours the database's exact
scan returns (nearest first, among the other drawers, those filed after each marked by filing time then
id), after any sequence of changes, within a memory budget."""

from __future__ import annotations

import numpy as np
import pytest

from shared.memory import neighbours
from shared.memory.dedup import BANDS
from shared.memory.neighbours import Change, Ranked, VectorCache, WorkspaceVectors

DIMS = 16


def _reference(held: dict[str, tuple[int, np.ndarray, list[int]]], qid: str, q: np.ndarray, qbands: list[int],
               limit: int) -> tuple[list[str], list[str], set[str]]:
    """The database's statements, in Python: nearest by cosine (in float64), at most ``limit`` among the
    drawers filed before the query (time, then id) and ``limit`` among those filed after it: those sharing
    a band (any position, as ``&&``), and all; and which of them were filed after it."""
    qf = held[qid][0]
    out: dict[bool, tuple[list[str], list[str]]] = {}
    for later in (False, True):
        cands = [(i, v, b) for i, (f, v, b) in held.items() if i != qid and ((f, i) > (qf, qid)) == later]
        cos = sorted(((_cos(v, q), i, b) for i, v, b in cands), key=lambda x: (-x[0], x[1]))
        out[later] = [i for _, i, b in cos if set(b) & set(qbands)][:limit], [i for _, i, _ in cos[:limit]]
    newer = set(out[True][0] + out[True][1])

    def nearest(ids: list[str]) -> list[str]:
        return sorted(ids, key=lambda i: (-_cos(held[i][1], q), i))

    return nearest(out[False][0] + out[True][0]), nearest(out[False][1] + out[True][1]), newer


def _cos(v: np.ndarray, q: np.ndarray) -> float:
    return float(v @ q / np.linalg.norm(v) / np.linalg.norm(q))


def _ids(near: list[tuple[str, float]]) -> list[str]:
    return [i for i, _ in near]


def _bands(rng: np.random.Generator) -> list[int]:
    """Bands from a small pool of keys per position, so that drawers share some."""
    return [int(b * 1000 + rng.integers(0, 6)) for b in range(BANDS)]


def test_the_ranking_is_the_exact_one_through_adds_changes_and_drops() -> None:
    rng = np.random.default_rng(3)
    wv = WorkspaceVectors(DIMS)
    held: dict[str, tuple[int, np.ndarray]] = {}
    watermark = (0, ())
    seen_twins = seen_newer = 0
    for step in range(12):
        changes = []
        # New drawers (several filed in the same microsecond: the id decides between them).
        for _ in range(40):
            i = f"{rng.integers(1 << 60):032x}"
            f = int(1_000_000 * step + rng.integers(0, 5))
            v, b = rng.normal(size=DIMS), _bands(rng)
            held[i] = (f, v, b)
            changes.append(Change(i, f, v, b))
        # Some stop being candidates (merged, archived, forgotten), some get a new vector or bands in place.
        for i in list(rng.choice(sorted(held), size=8, replace=False)):
            changes.append(Change(i, held.pop(i)[0], None))
        for i in list(rng.choice(sorted(held), size=4, replace=False)):
            held[i] = (held[i][0], rng.normal(size=DIMS), _bands(rng))
            changes.append(Change(i, *held[i]))
        watermark = (watermark[0] + 1, (watermark[0],))
        wv.apply(changes, watermark)
        assert wv.watermark == watermark and wv.n == len(held) == len(wv.slot)
        queries = [(i, held[i][1], held[i][2]) for i in rng.choice(sorted(held), size=10, replace=False)]
        ranked = wv.rank(queries, 5)
        assert ranked is not None
        for (qid, q, qb), got in zip(queries, ranked, strict=True):
            twins, near, newer = _reference(held, qid, q, qb, 5)
            # The same drawers in the same order, but for two whose cosines differ by less than float32 can
            # tell apart (ranked from float32 vectors, as in the database).
            for found, want in ((_ids(got.twins), twins), (_ids(got.near), near)):
                assert set(found) == set(want)
                assert np.allclose([_cos(held[i][1], q) for i in found], [_cos(held[i][1], q) for i in want],
                                   atol=1e-6, rtol=0)
            assert set(got.newer) == newer
            seen_newer += len(newer)
            for i, sim in got.twins + got.near:
                v = held[i][1]
                assert sim == pytest.approx(float(v @ q / np.linalg.norm(v) / np.linalg.norm(q)), abs=1e-5)
        seen_twins += sum(len(r.twins) for r in ranked)
    assert seen_twins > 50  # the bands were shared often enough to test the twins
    assert seen_newer > 50  # and drawers filed after a query were among its candidates


def test_a_full_read_replaces_what_was_held() -> None:
    wv = WorkspaceVectors(DIMS)
    v = np.ones(DIMS)
    wv.apply([Change("a", 1, v), Change("b", 2, v), Change("c", 3, v)], (10, ()))
    wv.apply([Change("b", 2, v), Change("d", 4, v)], (20, ()), full=True)
    assert sorted(wv.slot) == ["b", "d"] and wv.n == 2
    assert wv.rank([("b", v, [])], 5) == [Ranked([], [("d", pytest.approx(1.0))], frozenset({"d"}))]


def test_a_query_drawer_not_held_is_left_to_the_database() -> None:
    wv = WorkspaceVectors(DIMS)
    wv.apply([Change("a", 1, np.ones(DIMS))], (1, ()))
    assert wv.rank([("zz", np.ones(DIMS), [])], 5) is None


def test_a_zero_vector_ranks_last_with_no_similarity() -> None:
    """The database's cosine with a zero vector is NaN, which sorts after every number."""
    wv = WorkspaceVectors(DIMS)
    e = np.eye(DIMS)
    wv.apply([Change("a", 1, np.zeros(DIMS)), Change("b", 2, -e[0]), Change("q", 3, e[0])], (1, ()))
    (r,) = wv.rank([("q", e[0], [])], 5)  # type: ignore[misc]
    assert _ids(r.near) == ["b", "a"]
    assert r.near[0][1] == pytest.approx(-1.0) and np.isnan(r.near[1][1])


def test_ids_wider_than_usual_keep_their_order() -> None:
    wv = WorkspaceVectors(DIMS)
    v = np.ones(DIMS)
    long_ids = ["x" * 40 + "b", "x" * 40 + "a", "y"]
    wv.apply([Change(i, 5, v) for i in long_ids], (1, ()))
    (r,) = wv.rank([("y", v, [])], 5)  # type: ignore[misc]
    assert _ids(r.near) == ["x" * 40 + "a", "x" * 40 + "b"]  # filed together: the smaller ids, by id


def test_a_tie_at_the_limit_is_decided_by_id() -> None:
    """Equal cosines across the cut: the smaller ids are kept, as the database's ORDER BY distance, id
    keeps them, whichever order the drawers are held in."""
    v = np.ones(DIMS)
    ids = [f"d{n:02d}" for n in range(40)]
    for order in (ids, ids[::-1]):
        wv = WorkspaceVectors(DIMS)
        wv.apply([Change(i, 1, v, [7] * BANDS) for i in order] + [Change("q", 2, v, [7] * BANDS)], (1, ()))
        (r,) = wv.rank([("q", v, [7] * BANDS)], 5)  # type: ignore[misc]
        assert _ids(r.near) == _ids(r.twins) == ids[:5]


def test_bands_of_another_shape_still_make_twins() -> None:
    """Bands stored by another version (not ``BANDS`` keys) are matched as the database's ``&&`` does:
    any key in common; a drawer without bands is nobody's twin."""
    wv = WorkspaceVectors(DIMS)
    v = np.ones(DIMS)
    usual = list(range(100, 100 + BANDS))
    wv.apply([Change("a", 1, v, [7, 8]), Change("b", 2, v, None), Change("c", 3, v, usual), Change("q", 4, v, usual)],
             (1, ()))
    (r,) = wv.rank([("q", v, [8, *usual[1:]])], 5)  # type: ignore[misc]
    assert sorted(_ids(r.twins)) == ["a", "c"] and len(r.near) == 3
    (r,) = wv.rank([("q", v, [1, 2, 3])], 5)  # type: ignore[misc]  # a query of another shape
    assert r.twins == []


def test_the_cache_keeps_its_budget_least_recently_used_first(monkeypatch: pytest.MonkeyPatch) -> None:
    per_row = 4 * DIMS + 8 * BANDS + neighbours._ROW_OVERHEAD
    cache = VectorCache(max_bytes=200 * per_row)
    assert cache.fits(200, DIMS) and not cache.fits(201, DIMS)
    for w in ("w1", "w2", "w3"):
        cache.get(w, DIMS).apply([Change(f"{w}-{i}", i, np.ones(DIMS)) for i in range(60)], (1, ()))
    cache.get("w1", DIMS)  # used again: w2 is now the least recently used
    cache.trim()
    assert len(cache) == 3
    cache.get("w4", DIMS).apply([Change(f"w4-{i}", i, np.ones(DIMS)) for i in range(60)], (1, ()))
    cache.trim()
    assert cache.nbytes <= cache.max_bytes
    assert cache.get("w2", DIMS).watermark is None  # dropped, so held again from nothing
    assert cache.get("w1", DIMS).watermark == (1, ())


def test_an_idle_workspace_and_other_dimensions_start_afresh(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000.0]
    monkeypatch.setattr(neighbours.time, "monotonic", lambda: now[0])
    cache = VectorCache(max_bytes=1 << 20)
    cache.get("w", DIMS).apply([Change("a", 1, np.ones(DIMS))], (7, ()))
    assert cache.get("w", DIMS).watermark == (7, ())
    assert cache.get("w", DIMS + 1).watermark is None  # re-embedded at another size
    cache.get("w", DIMS).apply([Change("a", 1, np.ones(DIMS))], (8, ()))
    now[0] += neighbours.IDLE_S + 1
    assert cache.get("w", DIMS).watermark is None


def test_a_workspace_too_large_is_declined_for_a_while(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past ``MAX_DRAWERS`` (where the workspace's own HNSW index serves better) or the budget, a workspace
    is left to the database, and not counted again on every event."""
    now = [1000.0]
    monkeypatch.setattr(neighbours.time, "monotonic", lambda: now[0])
    cache = VectorCache(max_bytes=1 << 40)
    assert cache.fits(neighbours.MAX_DRAWERS, DIMS) and not cache.fits(neighbours.MAX_DRAWERS + 1, DIMS)
    cache.get("w", DIMS).apply([Change("a", 1, np.ones(DIMS))], (1, ()))
    cache.decline("w")
    assert cache.declined("w") and len(cache) == 0
    now[0] += neighbours.DECLINE_S + 1
    assert not cache.declined("w")
