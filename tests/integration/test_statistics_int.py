"""Planner statistics that see a new workspace (``shared.db.statistics``): in a database whose statistics
list every workspace it had, a workspace that arrived since is estimated at one row however large it
grows, and a lookup by primary key then ties with a scan of the whole workspace. maintain's check
finds such a table (and only such a one) and analyzes it; the lookups go by primary key again."""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from shared.db.migrate import apply_migrations
from shared.db.statistics import analyze_tables, blind_tables, estimated_rows, stale_tables
from tests.integration.helpers import Stack, fresh_database, wait_for

pytestmark = pytest.mark.integration

TURNS = 10
# An in-flight test written as a CASE (the condition holds no other CASE), and the condition alone.
_CASE = re.compile(r"CASE WHEN ((?:(?!CASE WHEN).)+?)\s+THEN true END", flags=re.S)
# The statement shape of session_turns (shared.db.episodes): a session's sources, each joined to its drawer.
TURNS_SQL = """SELECT d.id FROM drawer_sources ds
                 JOIN drawers d ON d.workspace_id = ds.workspace_id AND d.id = ds.drawer_id
                WHERE ds.workspace_id = %s AND ds.session_id = %s AND d.deleted_at IS NULL"""


@pytest.fixture
def database(stack: Stack) -> Iterator[str]:
    """A database of its own: what its statistics hold is up to this test alone."""
    with fresh_database(stack, "palace_stats") as url:
        apply_migrations(url, stack.settings.embed_dim)
        yield url


def _no_autovacuum(url: str) -> None:
    """Keep autovacuum off this database's tables: an analyze of its own, between the seeding and the
    check, would make the statistics see the new workspace before maintain's check could miss it."""
    with psycopg.connect(url, autocommit=True) as conn:
        for (t,) in conn.execute("SELECT relname FROM pg_class WHERE relkind IN ('r', 'p')"
                                 " AND relnamespace = 'public'::regnamespace").fetchall():
            conn.execute(sql.SQL("ALTER TABLE {} SET (autovacuum_enabled = false)").format(sql.Identifier(t)))


def _seed(url: str, workspace: str, sessions: int) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            """INSERT INTO sessions (workspace_id, session_id, event_id, message_count, content_hash)
               SELECT %(w)s, 's' || s, 'e' || s, %(t)s, md5(s::text) FROM generate_series(1, %(n)s) s""",
            {"w": workspace, "n": sessions, "t": TURNS})
        conn.execute(
            """INSERT INTO drawers (workspace_id, id, content, content_hash, session_id, seq)
               SELECT %(w)s, 'd' || s || '-' || t, 'turn ' || t || ' of session ' || s, md5(s || '-' || t),
                      's' || s, t
                 FROM generate_series(1, %(n)s) s, generate_series(1, %(t)s) t""",
            {"w": workspace, "n": sessions, "t": TURNS})
        conn.execute(
            """INSERT INTO drawer_sources (workspace_id, drawer_id, session_id, seq)
               SELECT %(w)s, 'd' || s || '-' || t, 's' || s, t
                 FROM generate_series(1, %(n)s) s, generate_series(1, %(t)s) t""",
            {"w": workspace, "n": sessions, "t": TURNS})


def _maintenance(url: str, fn: Any) -> Any:
    async def go() -> Any:
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            await conn.execute("SET ROLE palace_maintenance")
            return await fn(conn)
    return asyncio.run(go())


def _drawer_rows_read(url: str, query: str, params: tuple[Any, ...] | dict[str, Any], *, as_app: bool = False,
                      workspace: str | None = None) -> int:
    """Rows the plan of ``query`` read from drawers (all loops), measured by EXPLAIN ANALYZE (in a transaction
    rolled back: an UPDATE writes nothing). ``as_app``: as the services' role, scoped to ``workspace`` (by
    default the first parameter, or ``ws``), as row-level security's qualifier is part of the plan."""
    with psycopg.connect(url) as conn:
        if as_app:
            conn.execute("SET LOCAL ROLE palace_app")
            conn.execute("SELECT set_config('palace.workspace_id', %s, true)",
                         (workspace or (params["ws"] if isinstance(params, dict) else params[0]),))
        plan = conn.execute(sql.SQL("EXPLAIN (ANALYZE, FORMAT JSON) ") + sql.SQL(query),  # type: ignore[operator]
                            params).fetchone()[0]
        conn.rollback()
    plan = json.loads(plan) if isinstance(plan, str) else plan

    def walk(node: dict[str, Any]) -> int:
        own = (int(node["Actual Rows"]) + int(node.get("Rows Removed by Filter", 0))
               + int(node.get("Rows Removed by Join Filter", 0))) * int(node["Actual Loops"]) \
            if node.get("Relation Name") == "drawers" else 0
        return own + sum(walk(c) for c in node.get("Plans", []))

    return walk(plan[0]["Plan"])


def test_a_new_workspace_the_statistics_miss_gets_its_tables_analyzed(database: str) -> None:
    old, new, small = "ws-old", "ws-new", "ws-small"
    _no_autovacuum(database)
    _seed(database, old, 300)
    with psycopg.connect(database, autocommit=True) as conn:
        conn.execute("ANALYZE")
    _seed(database, new, 100)   # 1,000 drawers the statistics have never seen
    _seed(database, small, 5)   # 50: under the threshold

    # The planner expects one row of the new workspace, in every table that has it.
    assert _maintenance(database, lambda c: estimated_rows(c, "drawers", new)) <= 1
    blind = wait_for(lambda: _maintenance(database, lambda c: blind_tables(c, 100)) or None, 30,
                     "the written rows to reach the table statistics")
    assert blind.get("drawers") == [new] and blind.get("drawer_sources") == [new], blind
    assert all(ws == [new] for ws in blind.values()), blind  # neither the analyzed nor the small one

    done, skipped = asyncio.run(analyze_tables(database, sorted(blind)))
    assert sorted(done) == sorted(blind) and not skipped
    assert _maintenance(database, lambda c: estimated_rows(c, "drawers", new)) >= 100
    assert _maintenance(database, lambda c: blind_tables(c, 100)) == {}
    # A session's turns are read by primary key: its ten drawers, not the workspace's thousand.
    assert _drawer_rows_read(database, TURNS_SQL, (new, "s7")) <= 2 * TURNS


def test_a_role_that_does_not_own_the_table_is_told_why(database: str) -> None:
    """ANALYZE by a role that does not own the table only warns; the check must say so, not count it."""
    info = psycopg.conninfo.conninfo_to_dict(database)
    role = f"stats_{uuid.uuid4().hex[:6]}"
    with psycopg.connect(database, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
    try:
        info["user"] = role
        done, skipped = asyncio.run(analyze_tables(psycopg.conninfo.make_conninfo(**info), ["drawers"]))
        assert done == [] and "lock" not in skipped["drawers"], skipped  # PostgreSQL's "permission denied"
    finally:
        with psycopg.connect(database, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def test_known_pairs_are_not_asked_again(database: str) -> None:
    _no_autovacuum(database)
    _seed(database, "ws-a", 30)
    with psycopg.connect(database, autocommit=True) as conn:
        conn.execute("ANALYZE")
    _seed(database, "ws-b", 30)
    known: set[tuple[str, str]] = set()
    blind = wait_for(lambda: _maintenance(database, lambda c: blind_tables(c, 100, known=known)) or None, 30,
                     "the written rows to reach the table statistics")
    assert blind["drawers"] == ["ws-b"]
    assert ("drawers", "ws-a") in known and ("drawers", "ws-b") not in known


# A drawer by primary key, only while processed: what cluster's merge (shared.db.clustering.MERGE_SQL) asks of
# each drawer it names, in its plain form (the merge itself writes the state test as a CASE).
MERGE_SQL = """SELECT d.id FROM drawers d
                WHERE d.workspace_id = %s AND d.id = %s AND d.state = 'processed'"""


def _state_estimate(url: str, ws: str) -> float:
    with psycopg.connect(url, autocommit=True) as conn:
        plan = conn.execute("EXPLAIN (FORMAT JSON) SELECT 1 FROM drawers WHERE workspace_id = %s"
                            " AND state = 'processed'", (ws,)).fetchone()[0]
    plan = json.loads(plan) if isinstance(plan, str) else plan
    return float(plan[0]["Plan"]["Plan Rows"])


def test_a_table_autovacuum_has_not_analyzed_yet_is_analyzed_whole(database: str) -> None:
    """A new database whose drawers arrived faster than autovacuum analyzes (here: autovacuum off for the
    table, as when its worker is busy vacuuming): ``state`` has no statistics, ``state = 'processed'`` looks
    as selective as the primary key, and a lookup by id walks the workspace's processed drawers. Analyzing
    the workspace column alone does not help; maintain's check finds the table stale and analyzes it whole."""
    ws = "ws-fresh"
    with psycopg.connect(database, autocommit=True) as conn:
        conn.execute("ALTER TABLE drawers SET (autovacuum_enabled = false)")
    _seed(database, ws, 300)
    with psycopg.connect(database, autocommit=True) as conn:
        conn.execute("UPDATE drawers SET state = 'processed' WHERE workspace_id = %s", (ws,))

    stale = wait_for(lambda: "drawers" in _maintenance(database, lambda c: stale_tables(c, 1000)) or None, 30,
                     "the written rows to reach the table statistics")
    assert stale
    done, skipped = asyncio.run(analyze_tables(database, ["drawers"]))  # the workspace column alone
    assert done == ["drawers"] and not skipped
    # ... and the columns of the statistics over where drawers are filed (migration 0059), which PostgreSQL
    # builds only with all of them (it skipped them, with a warning, at every such round).
    with psycopg.connect(database) as conn:
        assert conn.execute("SELECT most_common_vals IS NOT NULL FROM pg_stats_ext"
                            " WHERE statistics_name = 'drawers_layout'").fetchall() == [(True,)]
    assert "drawers" in _maintenance(database, lambda c: stale_tables(c, 1000))  # still: the count stays
    # Without statistics of the column, the planner guesses half a percent of the workspace.
    assert _state_estimate(database, ws) < 300

    done, skipped = asyncio.run(analyze_tables(database, ["drawers"], whole={"drawers"}))
    assert done == ["drawers"] and not skipped
    assert "drawers" not in _maintenance(database, lambda c: stale_tables(c, 1000))
    assert _state_estimate(database, ws) > 2_000  # every one of the 3,000 is processed
    assert _drawer_rows_read(database, MERGE_SQL, (ws, "d7-3"), as_app=True) <= 2
    # A smaller change than the table holds is autovacuum's to notice, not this check's.
    with psycopg.connect(database, autocommit=True) as conn:
        conn.execute("UPDATE drawers SET importance = 0.4 WHERE workspace_id = %s AND seq = 1", (ws,))
    assert "drawers" not in _maintenance(database, lambda c: stale_tables(c, 1000))


def _without_liveness_statistics(database: str, ws: str, tables: list[str],
                                 *writes: tuple[str, tuple[Any, ...]]) -> None:
    """A workspace of 3,000 processed drawers (``_seed``, then ``writes``) in a table whose ``state`` and
    ``deleted_at`` have no statistics: autovacuum off, and ``tables`` analysed on their workspace column
    alone, as maintain's first analysis of a new workspace does."""
    with psycopg.connect(database, autocommit=True) as conn:
        conn.execute("ALTER TABLE drawers SET (autovacuum_enabled = false)")
    _seed(database, ws, 300)
    with psycopg.connect(database, autocommit=True) as conn:
        conn.execute("UPDATE drawers SET state = 'processed' WHERE workspace_id = %s", (ws,))
        for statement, params in writes:
            conn.execute(statement, params)  # type: ignore[arg-type]
    done, _ = asyncio.run(analyze_tables(database, tables))
    assert sorted(done) == sorted(tables) and _state_estimate(database, ws) < 300


def test_clusters_writes_read_their_drawers_by_key_where_state_has_no_statistics(database: str) -> None:
    """Cluster's merges and supersessions name their drawers by key and test whether each is still processed.
    Where ``state`` has no statistics yet (a new database, autovacuum behind), the plain test made the
    planner walk the workspace's processed drawers from the state index; the statements test it as a CASE
    (docs/scale.md, "In-flight states") and read each named drawer, and each merge's twin, by key."""
    from shared.db.clustering import MERGE_SQL, SUPERSEDE_SQL

    ws = "ws-cluster-writes"
    _without_liveness_statistics(database, ws, ["drawers"])

    newer, older = [f"d{s}-1" for s in range(1, 11)], [f"d{s}-2" for s in range(1, 11)]
    for statement, params in ((MERGE_SQL, {"ws": ws, "ids": newer, "targets": older}),
                              (SUPERSEDE_SQL, {"ws": ws, "olds": older, "news": newer})):
        cases = _CASE.findall(statement)
        assert len(cases) == (2 if statement is MERGE_SQL else 1)  # the drawer's test, and the twin's
        for test in cases:  # each written plainly walks the workspace: the trap is there
            plain = re.sub(rf"CASE WHEN {re.escape(test)}\s+THEN true END", test.replace("\\", "\\\\"), statement,
                           flags=re.S)
            assert _drawer_rows_read(database, plain, params, as_app=True) > 1_000, test
        assert _drawer_rows_read(database, statement, params, as_app=True) <= 2 * 2 * len(newer)


def _by_key_statements(ws: str) -> dict[str, tuple[str, dict[str, Any]]]:
    """Hot-path statements that name ten drawers by key (by id, or as session 's7''s through its sources)
    and keep the live (or processed) ones, with their parameters in ``ws``. (An episode's progress and the
    drawers it cites, which aggregate a session's drawers, read this small table whole here in either form,
    a hash join the planner prefers at 3,000 rows; test_plans_int.py checks the progress at 30,000.)"""
    from shared.db.clustering import CONTENTS_SQL
    from shared.db.drawers import BY_ID_SQL
    from shared.db.episodes import SESSION_TURNS_SQL
    from shared.db.extraction_queue import DUE_TURNS_SQL
    from shared.db.layers import _ROWS
    from shared.db.search import _FETCH

    ids = [f"d{s}-3" for s in range(1, 11)]
    # A search's fetch of its candidates, with the CTEs it reads (statement() builds the ids from the
    # candidate lists, here a constant array of ten; the planner estimates either as about ten).
    fetch = ("WITH lex AS (SELECT 'x'::text AS l), c AS (SELECT %(ids)s::text[] AS ids) "
             + _FETCH.format(dated="false"))
    return {
        "embed, classify, cluster: an event's drawers": (BY_ID_SQL, {"emb": False, "ws": ws, "ids": ids}),
        "cluster: the winners' contents": (CONTENTS_SQL, {"ws": ws, "ids": ids}),
        "search: the candidates' rows": (fetch, {"ws": ws, "ids": ids, "use_ann": False, "emb": None}),
        "wake_up / recall layers: the chosen rows": (_ROWS, {"ws": ws, "ids": ids, "n": 200}),
        "enrich: the drawers due for extraction": (DUE_TURNS_SQL, {"ws": ws, "ids": ids}),
        "enrich: a session's turns": (SESSION_TURNS_SQL, {"emb": False, "ws": ws, "sid": "s7"}),
    }


@pytest.mark.parametrize("name", list(_by_key_statements("ws")))
def test_drawers_named_by_key_are_read_by_key_where_liveness_has_no_statistics(database: str, name: str) -> None:
    """Where ``state`` and ``deleted_at`` have no statistics yet (a new database, autovacuum behind), a plain
    test of either looks as selective as the key, and an index whose predicate it matches (live drawers,
    drawers by state) was walked instead of the primary key: the plain form of each statement below read
    the whole workspace here. Written as a CASE, each reads its ten drawers by key."""
    ws = "ws-by-key"
    _without_liveness_statistics(database, ws, ["drawers", "drawer_sources"], (
        "INSERT INTO episodes (workspace_id, id, session_id, summary, abstract, status)"
        " VALUES (%s, 'e7', 's7', '', '', 'pending')", (ws,)))
    # Whether a sighting is current (drawer_sources.revision, NULL nearly everywhere) has statistics, as
    # autovacuum gives a settled table: without them a plain test of it looks selective and hides the trap.
    with psycopg.connect(database, autocommit=True) as conn:
        conn.execute("ANALYZE drawer_sources (revision)")
    statement, params = _by_key_statements(ws)[name]
    plain = _CASE.sub(lambda m: m.group(1), statement)
    assert plain != statement
    read = _drawer_rows_read(database, plain, params, as_app=True, workspace=ws)
    assert read >= 1_000, f"the plain form read {read} rows"  # the trap is there
    assert _drawer_rows_read(database, statement, params, as_app=True, workspace=ws) <= 2 * 10  # ten, by key


def test_clusters_twins_are_read_by_key_where_liveness_has_no_statistics(database: str) -> None:
    """Cluster's near-duplicate twins (for a workspace past its in-process cache) are the drawers sharing a
    wording band, fetched by key. With the twins' liveness tested plainly and no statistics on it, each of an
    event's ten drawers walked the workspace's processed drawers from the state index instead; as a CASE,
    each reads its session's ten."""
    from shared.db.clustering import TWINS_SQL

    ws = "ws-twins"
    vec = "[" + ",".join(["0.05"] * 384) + "]"
    _without_liveness_statistics(database, ws, ["drawers", "drawer_sources"], (  # a session's drawers share a band
        "UPDATE drawers SET embedding = %s::vector, dedup_bands = ARRAY[hashtext(session_id)::bigint],"
        " filed_at = now() - seq * interval '1 s' WHERE workspace_id = %s", (vec, ws)))
    with psycopg.connect(database, autocommit=True) as conn:
        bands = [r[0] for r in conn.execute("SELECT hashtext('s' || g)::bigint FROM generate_series(1, 10) g")]
    # The vectors as text here (the services send them in binary): the plan does not depend on it.
    statement = TWINS_SQL.replace("%(embs)b::vector[]", "%(embs)s::vector[]")
    params = {"ws": ws, "ids": [f"d{s}-1" for s in range(1, 11)], "embs": [vec] * 10, "bands": bands, "nb": 1,
              "n": 5}
    test, again = _CASE.findall(statement)  # the twins filed before each drawer, and those filed after it
    assert test == again
    plain = _CASE.sub(lambda m: m.group(1), statement)
    assert _drawer_rows_read(database, plain, params, as_app=True) >= 10 * 1_000, test  # the trap is there
    assert _drawer_rows_read(database, statement, params, as_app=True) <= 10 + 10 * 10 * 2


def test_maintains_check_analyzes_a_stale_table_whole(stack: Stack, database: str) -> None:
    """The check maintain runs every few seconds, end to end: a table autovacuum has not reached is
    found and analyzed whole (its planner estimates are right afterwards), and the next round finds
    nothing to do."""
    from services._runtime import Deps
    from services.maintain.statistics import refresh_statistics
    from shared.db.pool import open_pool

    ws = "ws-stale"
    with psycopg.connect(database, autocommit=True) as conn:
        conn.execute("ALTER TABLE drawers SET (autovacuum_enabled = false)")
        conn.execute("ALTER TABLE drawer_sources SET (autovacuum_enabled = false)")
    _seed(database, ws, 300)
    with psycopg.connect(database, autocommit=True) as conn:
        conn.execute("UPDATE drawers SET state = 'processed' WHERE workspace_id = %s", (ws,))
    settings = stack.settings.model_copy(update={"database_url": database})

    async def go() -> tuple[list[str], list[str]]:
        pool = await open_pool(database, name="test-statistics", max_size=2, role=settings.db_role)
        try:
            deps = Deps(settings, "maintain", pool, None)  # type: ignore[arg-type]
            first = await refresh_statistics(deps, "test-statistics")
            return first, await refresh_statistics(deps, "test-statistics")
        finally:
            await pool.close()

    # Each table's counters reach the statistics on their own: wait for both.
    wait_for(lambda: {"drawers", "drawer_sources"} <= set(_maintenance(
                 database, lambda c: stale_tables(c, settings.statistics_stale_rows))) or None,
             30, "the written rows to reach the table statistics")
    first, second = asyncio.run(go())
    assert "drawers" in first and "drawer_sources" in first, first
    assert "drawers" not in second, second
    assert _state_estimate(database, ws) > 2_000
