"""A query that names a time window ("in October 2023") brings the window's drawers nearest to it as
candidates, when the window holds few enough of them to rank all; a window holding more brings none
(the first rows of it in time order were a sample biased to its start), and its drawers compete
through the other branches, as every drawer does."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from shared.adapters.hash_embedder import HashEmbedder
from shared.db.search import SearchParams, candidates
from shared.memory.timeexpr import date_windows
from tests.integration.helpers import Stack, analyze, ws

pytestmark = pytest.mark.integration

QUERY = "What did the team talk about in October 2023?"
SCAN_MAX = 200  # fts_scan_max for these searches: the most drawers of a window ranked by distance


def _seed(stack: Stack, workspace: str, in_window: int) -> list[str]:
    """600 drawers dated 2022 and ``in_window`` dated across October 2023 (their ids, in time order);
    no drawer shares a word with the query but for 'team', which all of them hold."""
    emb = HashEmbedder(stack.settings.embed_dim)
    start = datetime(2023, 10, 1, tzinfo=UTC)
    rows = [(f"team note {i}: copper lantern {i % 7} harbor", datetime(2022, 3, 1, tzinfo=UTC) + timedelta(hours=i))
            for i in range(600)]
    rows += [(f"team entry {i}: meadow violin {i % 5} orchard", start + timedelta(days=30) * i / in_window)
             for i in range(in_window)]
    vecs = asyncio.run(emb.embed_documents([t for t, _ in rows]))
    with psycopg.connect(stack.database_url, autocommit=True) as conn, conn.cursor() as cur:
        cur.executemany(
            """INSERT INTO drawers (workspace_id, id, content, content_hash, state, embedding, dedup_bands,
                                    occurred_at)
               VALUES (%s, md5(%s), %s, md5(%s), 'processed', %s::vector, '{}', %s)""",
            [(workspace, t, t, t, "[" + ",".join(f"{x:.6f}" for x in v) + "]", when)
             for (t, when), v in zip(rows, vecs, strict=True)])
        analyze(conn, "drawers")
        ids = [r[0] for r in conn.execute(
            "SELECT id FROM drawers WHERE workspace_id = %s AND occurred_at >= %s ORDER BY occurred_at, id",
            (workspace, start)).fetchall()]
    return ids


def _candidate_ids(stack: Stack, workspace: str, windows: list[tuple[datetime, datetime]]) -> dict[str, bool]:
    """Candidate id → whether it lies in a window, as search gathers them (exact scan, no index)."""
    emb = HashEmbedder(stack.settings.embed_dim)
    vec = asyncio.run(emb.embed_query(QUERY))
    params = SearchParams(fts_scan_max=SCAN_MAX, ann_candidates=20, fts_candidates=20)

    async def go() -> dict[str, bool]:
        async with await psycopg.AsyncConnection.connect(stack.database_url) as conn:
            from pgvector.psycopg import register_vector_async

            await register_vector_async(conn)
            await conn.execute("SET ROLE palace_app")
            await conn.execute("SELECT set_config('palace.workspace_id', %s, false)", (workspace,))
            _, cands, _ = await candidates(conn, workspace, QUERY, vec, windows, params, workspace_size=10_000)
            return {c.id: c.dated for c in cands}

    return asyncio.run(go())


def test_a_window_of_few_drawers_brings_its_nearest_as_candidates(stack: Stack) -> None:
    w = ws()
    october = _seed(stack, w, 60)
    windows = date_windows(QUERY)
    assert windows == [(datetime(2023, 10, 1, tzinfo=UTC), datetime(2023, 11, 1, tzinfo=UTC))]
    with_window = _candidate_ids(stack, w, windows)
    without = _candidate_ids(stack, w, [])
    brought = set(with_window) - set(without)
    # The dated branch's 50 (date_candidates), all of the window, from anywhere in it.
    assert brought and brought <= set(october)
    assert len(set(with_window) & set(october)) >= min(len(october), SearchParams().date_candidates)
    assert all(with_window[i] for i in set(october) & set(with_window))
    late = set(october[len(october) // 2:])
    assert brought & late, "drawers of the window's second half are candidates too"


def test_a_window_of_more_drawers_than_are_ranked_brings_none(stack: Stack) -> None:
    """Before, the first SCAN_MAX of the window in time order were ranked: the candidates it brought all lay
    in the window's first days."""
    w = ws()
    october = _seed(stack, w, SCAN_MAX * 3)
    with_window = _candidate_ids(stack, w, date_windows(QUERY))
    without = _candidate_ids(stack, w, [])
    assert set(with_window) == set(without)
    # What does lie in the window still counts as dated for ranking.
    assert all(with_window[i] == (i in set(october)) for i in with_window)


def test_a_month_without_a_year_reads_its_windows_not_the_years_between(stack: Stack) -> None:
    """"In December" is a window in each of the last eleven years. Counting them as one range from the first
    to the last walked every drawer in between: in a workspace with none in December, all of them, each
    search. Each window is counted on its own, so what is read does not grow with the workspace."""
    import json

    from shared.db.search import _DATED, _W

    w = ws()
    with psycopg.connect(stack.database_url, autocommit=True) as conn:
        conn.execute("""INSERT INTO drawers (workspace_id, id, content, content_hash, state, dedup_bands, occurred_at)
                        SELECT %s, md5(g::text), 'note ' || g, md5(g::text), 'processed', '{}',
                               make_timestamptz(2015 + g %% 10, 1 + g %% 11, 1 + g %% 28, 12, 0, 0, 'UTC')
                          FROM generate_series(1, 30000) g""", (w,))
        analyze(conn, "drawers")
        windows = date_windows("What did we plan in December?", datetime(2025, 11, 20, tzinfo=UTC))
        assert len(windows) == 11
        sql = "WITH q0 AS (SELECT 1)" + _W + _DATED + " SELECT id FROM dated"  # noqa: S608 - constants
        params = {"ws": w, "lo": [a for a, _ in windows], "hi": [b for _, b in windows], "fts_scan": 2000,
                  "n_date": 50, "use_ann": False, "emb": None}
        plan = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, params).fetchone()[0]  # type: ignore[index]

    def read(node: dict) -> float:
        own = 0.0
        if node.get("Relation Name") == "drawers":
            own = (node.get("Actual Rows", 0) + node.get("Rows Removed by Filter", 0)
                   + node.get("Rows Removed by Index Recheck", 0)) * node.get("Actual Loops", 1)
        return own + sum(read(child) for child in node.get("Plans", []))

    rows = read(plan[0]["Plan"])
    assert rows < 1000, f"{rows:.0f} drawer rows read for a search naming December\n" + json.dumps(plan)[:3000]
