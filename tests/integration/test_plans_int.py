"""Hot-path statements use an index at a size where a sequential scan would show (tens of thousands of
drawers in one workspace, statistics up to date): their cost must not grow with the workspace."""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.types.json import Jsonb

from shared.db.drawers import OLDER_TWINS_SQL
from shared.memory.dedup import BANDS, wording_bands
from tests.integration.helpers import Stack, analyze, fresh_database, ws

pytestmark = pytest.mark.integration

N = 30_000


@pytest.fixture(scope="module")
def big_workspace(stack: Stack) -> str:
    """N processed drawers (no embeddings: the plans below do not depend on the vector index), a few raw."""
    w = ws()
    with psycopg.connect(stack.database_url, autocommit=True) as conn:
        conn.execute(
            """INSERT INTO drawers (workspace_id, id, content, content_hash, state, filed_at, updated_at, dedup_bands)
               SELECT %s, md5(g::text), 'drawer number ' || g || ' says something', md5(g::text),
                      CASE WHEN g %% 1000 = 0 THEN 'raw' ELSE 'processed' END,
                      now() - g * interval '1 second',
                      -- raw ones touched in the future: the stack's maintain would re-drive them (as stuck)
                      -- into its pipeline, which then asks for this workspace's index and lexicon
                      CASE WHEN g %% 1000 = 0 THEN now() + interval '1 day' ELSE now() - g * interval '1 second' END,
                      ARRAY[g::bigint * 7919, g::bigint * 104729]
                 FROM generate_series(1, %s) g""",
            (w, N),
        )
        analyze(conn, "drawers")
    return w


def _plan(stack: Stack, sql: str, params: tuple[object, ...], role: str = "palace_maintenance") -> str:
    with psycopg.connect(stack.database_url) as conn:
        conn.execute(f"SET ROLE {role}")
        rows = conn.execute("EXPLAIN (FORMAT JSON) " + sql, params).fetchall()
        conn.rollback()
    return json.dumps(rows[0][0])


def _function_plan(stack: Stack, function: str, workspace: str, values: dict[str, sql.Composable]) -> str:
    """The plan of a deployed SQL function's own statement, read back from the catalogue, with its
    parameters replaced by real values, planned as the role it runs as with its own settings."""
    body = stack.sql("SELECT prosrc FROM pg_proc WHERE proname = %s", (function,))[0][0]
    with psycopg.connect(stack.database_url) as conn:
        for name, value in values.items():
            body = re.sub(rf"\b{name}\b", value.as_string(conn).replace("\\", "\\\\"), body)
        conn.execute("SET ROLE palace_maintenance")
        conn.execute("SELECT set_config('palace.workspace_id', %s, true)", (workspace,))
        for setting in stack.sql("SELECT unnest(proconfig) FROM pg_proc WHERE proname = %s", (function,)):
            name, _, value = setting[0].partition("=")
            conn.execute(sql.SQL("SET {} = {}").format(sql.Identifier(name), sql.Literal(value)))
        plan = json.dumps(conn.execute("EXPLAIN (FORMAT JSON) " + body).fetchall()[0][0])  # type: ignore[arg-type]
        conn.rollback()
    return plan


def test_near_duplicate_candidates_come_from_the_wording_index(stack: Stack, big_workspace: str) -> None:
    """The deployed lookup function's own statement (read back from the catalogue), planned as the role
    it runs as, with real parameters."""
    bands = wording_bands(big_workspace, "drawer number 17 says something")
    plan = _function_plan(stack, "palace_wording_candidates", big_workspace, {
        "ws": sql.Literal(big_workspace), "bands": sql.SQL("{}::bigint[]").format(sql.Literal(bands)),
        "scan_limit": sql.Literal(200)})
    assert "drawers_dedup_bands" in plan and '"Seq Scan"' not in plan, plan
    # And the whole check runs through it, as the application role under row-level security.
    with psycopg.connect(stack.database_url) as conn:
        conn.execute("SET ROLE palace_app")
        conn.execute("SELECT set_config('palace.workspace_id', %s, false)", (big_workspace,))
        emb = "[" + ",".join(["0.05"] * 384) + "]"
        rows = conn.execute(OLDER_TWINS_SQL.replace("%(emb)s", "%(emb)s::vector"),
                            {"ws": big_workspace, "id": "x", "emb": emb, "bands": bands, "n": 5}).fetchall()
        assert rows == []  # the synthetic drawers carry no embeddings; the statement must run, not match


def _plpgsql_generic_plan(stack: Stack, function: str, workspace: str, args: list[sql.Composable]) -> str:
    """The generic plan (parameters, not values: what a PL/pgSQL function keeps per connection) of a
    deployed PL/pgSQL function's ``RETURN QUERY`` statement, planned as the role it runs as with its own
    settings."""
    body, names, types = stack.sql(
        "SELECT prosrc, proargnames, array(SELECT format_type(t, NULL) FROM unnest(proargtypes) t)"
        "  FROM pg_proc WHERE proname = %s", (function,))[0]
    statement = body.split("RETURN QUERY", 1)[1].rsplit(";", 1)[0]
    for n, name in enumerate(names[: len(types)], 1):
        statement = re.sub(rf"\b{name}\b", f"${n}", statement)
    with psycopg.connect(stack.database_url) as conn:
        conn.execute("SET ROLE palace_maintenance")
        conn.execute("SELECT set_config('palace.workspace_id', %s, true)", (workspace,))
        settings = dict(s[0].partition("=")[::2] for s in stack.sql(
            "SELECT unnest(proconfig) FROM pg_proc WHERE proname = %s", (function,)))
        assert settings.get("plan_cache_mode") == "force_generic_plan", settings
        for name, value in settings.items():
            conn.execute(sql.SQL("SET {} = {}").format(sql.Identifier(name), sql.Literal(value)))
        conn.execute(sql.SQL("PREPARE generic_plan ({}) AS {}").format(
            sql.SQL(", ").join(map(sql.SQL, types)), sql.SQL(statement)))  # type: ignore[arg-type]
        plan = json.dumps(conn.execute(sql.SQL("EXPLAIN (FORMAT JSON) EXECUTE generic_plan ({})").format(
            sql.SQL(", ").join(args))).fetchall()[0][0])
        conn.rollback()
    return plan


def test_the_workspace_scoped_words_match_only_their_workspace(stack: Stack) -> None:
    """Migration 0047 indexes each lexeme under its workspace and rewrites a query's lexemes the same way:
    quoted lexemes (an apostrophe, a backslash), operators and prefix marks survive the rewrite, and a
    workspace's query never matches another's words."""
    words = ["it's", "b\\c", "plain"]
    for query, same in [(r"'it''s' & 'b\\c'", True), ("'plai':*", True),
                        ("'plain' <-> 'it''s'", False), ("'nothing'", False)]:
        row = stack.sql("SELECT palace_ws_lexemes('w1', array_to_tsvector(%s::text[])) @@ palace_ws_tsquery('w1', %s),"
                        "       palace_ws_lexemes('w2', array_to_tsvector(%s::text[])) @@ palace_ws_tsquery('w1', %s)",
                        (words, query, words, query))[0]
        assert row == (same, False), query
    prefix = stack.sql("SELECT left(md5('w1'), 8)")[0][0]
    assert stack.sql("SELECT palace_ws_tsquery('w1', %s)::text", ("'a' & 'b'",))[0][0] == (
        f"'{prefix}.a' & '{prefix}.b'")


def test_full_text_candidates_come_from_the_workspace_scoped_index(stack: Stack, big_workspace: str) -> None:
    """The full-text lookup goes through the GIN index that knows the workspace, so a small workspace in
    a big table never pays for the other tenants' matches; and it does so in the plan the function keeps
    for every call (generic, migration 0046), whatever the query."""
    plan = _plpgsql_generic_plan(stack, "palace_text_candidates", big_workspace, [
        sql.Literal(big_workspace), sql.SQL("to_tsquery('english', '17 | 42')"), sql.SQL("'{17,42}'::text[]"),
        sql.Literal(2000), sql.Literal(100)])
    assert "drawers_ws_lexemes" in plan and '"Seq Scan"' not in plan, plan
    assert "drawers_tsv_gin" not in plan, plan


def test_workspace_size_counts_from_an_index(stack: Stack, big_workspace: str) -> None:
    """Search and cluster ask a workspace's size (up to a cap) often: a small workspace in a big table
    counts from an index. (The big workspace may be read in table order: it is most of this table, and
    the cap bounds the read either way.)"""
    from shared.db.drawers import WORKSPACE_SIZE_SQL

    plan = _plan(stack, WORKSPACE_SIZE_SQL, (ws(), 5001))
    assert '"Seq Scan"' not in plan and "Index" in plan, plan


def test_maintain_finds_waiting_index_requests_by_their_index(stack: Stack) -> None:
    """maintain polls for requested vector indexes every few seconds: among tens of thousands of
    workspaces whose index is ready, the few waiting (or marked as building) are read from the partial
    index of migration 0049.
    (No row here waits: the test stack's maintain would build an index for it.)"""
    from shared.db.vector_indexes import OLDEST_WAIT_SQL, WANTED_SQL

    prefix = ws()
    with psycopg.connect(stack.database_url, autocommit=True) as conn:
        conn.execute("""INSERT INTO vector_indexes (workspace_id, index_name, drawers, state)
                        SELECT %s || g, 'drawers_hnsw_x' || g, 6000,
                               CASE WHEN g %% 5000 = 0 THEN 'failed' ELSE 'ready' END
                          FROM generate_series(1, 30000) g""", (prefix,))
        analyze(conn, "vector_indexes")
        try:
            plans = [_plan(stack, WANTED_SQL, (10,)), _plan(stack, OLDEST_WAIT_SQL, ())]
        finally:
            conn.execute("DELETE FROM vector_indexes WHERE workspace_id LIKE %s", (prefix + "%",))
    for plan in plans:
        assert "vector_indexes_pending" in plan and '"Seq Scan"' not in plan, plan


@pytest.mark.parametrize("sql", [
    # maintain: re-drive and give up on raw drawers idle too long
    """SELECT workspace_id, id FROM drawers WHERE state = 'raw' AND deleted_at IS NULL AND retry_count < 3
          AND updated_at < now() - interval '5 minutes' ORDER BY filed_at LIMIT 1000 FOR UPDATE SKIP LOCKED""",
    """SELECT workspace_id, id FROM drawers WHERE state = 'raw' AND deleted_at IS NULL AND retry_count >= 3
          AND updated_at < now() - interval '5 minutes' ORDER BY filed_at LIMIT 1000 FOR UPDATE SKIP LOCKED""",
    # cluster: drawers processed before wording bands existed
    """SELECT workspace_id, id, content FROM drawers
        WHERE dedup_bands IS NULL AND state = 'processed' AND deleted_at IS NULL ORDER BY filed_at LIMIT 500""",
])
def test_maintenance_sweeps_use_an_index(stack: Stack, big_workspace: str, sql: str) -> None:
    plan = _plan(stack, sql, ())
    assert '"Seq Scan"' not in plan, plan


def test_cluster_reads_what_changed_in_a_workspace_from_its_rev_index(stack: Stack, big_workspace: str) -> None:
    """Each event, the cluster's vector cache reads only the drawers changed since its last read, from the
    (workspace, rev) index, however large the workspace; the winners' contents (and who said each) come by
    primary key."""
    from shared.db.clustering import CONTENTS_SQL, DELTA_SQL

    xmax, xip = stack.sql("SELECT pg_snapshot_xmax(s)::text, ARRAY(SELECT x::text FROM pg_snapshot_xip(s) x) "
                          "FROM pg_current_snapshot() s")[0]
    with psycopg.connect(stack.database_url) as conn:
        conn.execute("SET ROLE palace_app")
        conn.execute("SELECT set_config('palace.workspace_id', %s, false)", (big_workspace,))
        plan = json.dumps(conn.execute("EXPLAIN (FORMAT JSON) " + DELTA_SQL, {"ws": big_workspace, "xmax": xmax,
                                                                            "xip": [*xip, xmax]},
                                       prepare=False).fetchall()[0][0])
        ids = [r[0] for r in conn.execute("SELECT id FROM drawers WHERE workspace_id = %s LIMIT 5", (big_workspace,))]
        contents = json.dumps(conn.execute("EXPLAIN (FORMAT JSON) " + CONTENTS_SQL, {"ws": big_workspace, "ids": ids},
                                           prepare=False).fetchall()[0][0])
        conn.rollback()
    assert "drawers_rev" in plan and '"Seq Scan"' not in plan, plan
    assert "drawers_pkey" in contents and '"Seq Scan"' not in contents, contents


def test_cluster_finds_what_a_redelivered_event_decided_by_the_source_drawer_index(
        stack: Stack, big_workspace: str) -> None:
    """A redelivered drawer.classified looks up the decisions its first delivery committed through the
    (workspace, source drawer) index of the audit, however long the workspace's history."""
    from shared.db.decisions import DECIDED_SQL

    with psycopg.connect(stack.database_url, autocommit=True) as conn:
        conn.execute("""INSERT INTO memory_history (workspace_id, id, drawer_id, action, actor, event_id, new_value)
                        SELECT %s, 'plan-' || g, md5(g::text), 'ADD', 'cluster', 'e' || g || ':' || md5(g::text),
                               jsonb_build_object('source_drawer', md5(g::text), 'outcome', 'applied')
                          FROM generate_series(1, %s) g""", (big_workspace, N))
        analyze(conn, "memory_history")
        try:
            conn.execute("SET ROLE palace_app")
            conn.execute("SELECT set_config('palace.workspace_id', %s, false)", (big_workspace,))
            ids = ["c4ca4238a0b923820dcc509a6f75849b", "c81e728d9d4c2f636f067f89cc14862c"]
            plan = json.dumps(conn.execute("EXPLAIN (FORMAT JSON) " + DECIDED_SQL,
                                           {"ws": big_workspace, "ids": ids},
                                           prepare=False).fetchall()[0][0])
            conn.execute("RESET ROLE")
        finally:
            conn.execute("DELETE FROM memory_history WHERE workspace_id = %s AND id LIKE 'plan-%%'", (big_workspace,))
    assert "memory_history_source_drawer" in plan and '"Seq Scan"' not in plan, plan


def test_full_text_candidates_come_from_the_workspaces_rare_words(stack: Stack, big_workspace: str) -> None:
    """Past exact search, a query's common words (in every drawer of the big workspace: 'drawer',
    'number') no longer decide which drawers the index must evaluate once maintain has counted them:
    the rare one ('17') alone does; with no rare word the pairs remain, and an exact workspace ORs all."""
    import asyncio

    from shared.db.lexicon import refresh_lexicon
    from shared.db.pool import open_pool
    from shared.db.tenancy import maintenance_tx, workspace_tx

    def text_query(lexemes: list[str], exact: bool, pair_terms: int = 4) -> str:
        with psycopg.connect(stack.database_url) as conn:
            conn.execute("SET ROLE palace_app")
            conn.execute("SELECT set_config('palace.workspace_id', %s, false)", (big_workspace,))
            return str(conn.execute("SELECT palace_text_query(%s, %s, %s, %s)::text",
                                    (big_workspace, lexemes, exact, pair_terms)).fetchone()[0])  # type: ignore[index]

    before = text_query(["drawer", "number", "17"], False)
    assert before.count("&") == 3, before  # no lexicon yet: every pair
    assert text_query(["drawer", "number", "17", "42", "99"], False, pair_terms=2).count("&") == 10

    async def refresh() -> int:
        pool = await open_pool(stack.database_url, name="test-lexicon", max_size=1)
        try:
            async with maintenance_tx(pool) as conn:
                await conn.execute(
                    "INSERT INTO vector_indexes (workspace_id, index_name, drawers, state)"
                    " VALUES (%s, 'x', %s, 'failed') ON CONFLICT (workspace_id) DO NOTHING", (big_workspace, N))
                n = await refresh_lexicon(conn, big_workspace, 0.01)
            async with workspace_tx(pool, "someone-else") as conn:  # row-level security on the lexicon
                seen = await (await conn.execute("SELECT count(*) FROM workspace_lexicon")).fetchone()
                assert seen == (0,)
            return n
        finally:
            await pool.close()

    assert asyncio.run(refresh()) >= 4  # drawer, number, say, someth
    assert text_query(["drawer", "number", "17"], False) == "'17'"
    assert text_query(["drawer", "number"], False) == "'drawer' & 'number'"
    assert set(text_query(["drawer", "number", "17"], True).split(" | ")) == {"'drawer'", "'number'", "'17'"}
    # Common words only: the pairs come from the rarest of them by the lexicon's counts, ties in the query's order.
    assert text_query(["say", "drawer", "number"], False, pair_terms=2) == "'drawer' & 'say'"
    stack.sql("UPDATE workspace_lexicon SET ndoc = 10 WHERE workspace_id = %s AND lexeme = 'number' RETURNING 1",
              (big_workspace,))
    assert text_query(["say", "drawer", "number"], False, pair_terms=2) == "'number' & 'say'"


@pytest.mark.parametrize("wing", [None, "w"])
def test_essential_story_reads_its_index(stack: Stack, big_workspace: str, wing: str | None) -> None:
    """wake_up's L1 (the most important drawers, optionally of a wing) walks drawers_essential: the first
    rows of its order, not a sort of the whole workspace."""
    from shared.db.layers import essential_query

    with psycopg.connect(stack.database_url) as conn:
        conn.execute("SET ROLE palace_app")
        conn.execute("SELECT set_config('palace.workspace_id', %s, false)", (big_workspace,))
        query = sql.SQL("EXPLAIN (FORMAT JSON) ") + essential_query(wing)
        plan = json.dumps(conn.execute(query, {"ws": big_workspace, "wing": wing, "fetch": 60, "n": 400}
                                       ).fetchall()[0][0])
        conn.rollback()
    assert '"Seq Scan"' not in plan, plan
    if wing is None:
        assert "drawers_essential" in plan and '"Sort"' not in plan, plan


def test_cluster_twins_come_from_the_wording_index_by_primary_key(stack: Stack, big_workspace: str) -> None:
    """The cluster stage's twin lookup for an event's drawers: each drawer's wording candidates fetched by
    primary key, never a scan of the workspace (joined to the lookup function, whose row count the planner
    cannot know, it hashed every processed drawer of the workspace once per drawer)."""
    from shared.db.clustering import TWINS_SQL

    ids = [r[0] for r in stack.sql("SELECT id FROM drawers WHERE workspace_id = %s ORDER BY filed_at LIMIT 10",
                                   (big_workspace,))]
    bands = [b for i in ids for b in wording_bands(big_workspace, f"drawer {i} says something")]
    emb = "[" + ",".join(["0.05"] * 384) + "]"
    with psycopg.connect(stack.database_url) as conn:
        conn.execute("SET ROLE palace_app")
        conn.execute("SELECT set_config('palace.workspace_id', %s, false)", (big_workspace,))
        params = {"ws": big_workspace, "ids": ids, "embs": [emb] * len(ids), "bands": bands,
                  "nb": len(bands) // len(ids), "n": 5}
        sql_ = TWINS_SQL.replace("%(embs)b::vector[]", "%(embs)s::text[]::vector[]")
        plan = json.dumps(conn.execute("EXPLAIN (FORMAT JSON) " + sql_, params, prepare=False).fetchall()[0][0])
        assert conn.execute(sql_, params, prepare=False).fetchall() == []  # no embeddings here: runs, matches none
        conn.rollback()
    assert '"Seq Scan"' not in plan and '"Hash Join"' not in plan, plan
    # By primary key: as an index scan or, as the planner may choose for a handful of ids, a bitmap of it.
    assert "drawers_pkey" in plan, plan
    assert set(re.findall(r'"Node Type": "Bitmap Index Scan", [^}]*?"Index Name": "([^"]+)"', plan)) <= {
        "drawers_pkey"}, plan


def test_cluster_exact_neighbours_read_the_workspace_once_per_event(stack: Stack, big_workspace: str) -> None:
    """Without an HNSW index of its own, a workspace is ranked exactly: its drawers are read from the heap
    once for the whole event, never once per drawer of the event (which visited every page of the
    workspace ten times for a ten-drawer session); the rest is primary-key lookups."""
    from shared.db.clustering import CANDIDATES_SQL

    ids = [r[0] for r in stack.sql("SELECT id FROM drawers WHERE workspace_id = %s ORDER BY filed_at DESC LIMIT 10",
                                   (big_workspace,))]
    bands = [b for i in ids for b in wording_bands(big_workspace, f"drawer {i} says something")]
    emb = "[" + ",".join(["0.05"] * 384) + "]"
    with psycopg.connect(stack.database_url) as conn:
        conn.execute("SET ROLE palace_app")
        conn.execute("SELECT set_config('palace.workspace_id', %s, false)", (big_workspace,))
        params = {"ws": big_workspace, "ids": ids, "embs": [emb] * len(ids), "bands": bands,
                  "nb": len(bands) // len(ids), "n": 5}
        sql_ = CANDIDATES_SQL.replace("%(embs)b::vector[]", "%(embs)s::text[]::vector[]")
        plan = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql_, params, prepare=False).fetchall()[0][0]
        conn.rollback()

    def nodes(node: dict[str, object]) -> list[dict[str, object]]:
        return [node, *(n for child in node.get("Plans", []) for n in nodes(child))]  # type: ignore[attr-defined]

    def pkey_lookup(node: dict[str, object]) -> bool:
        # The primary key probed by id, not scanned by its leading workspace_id (which reads the workspace).
        cond = str(node.get("Index Cond"))
        return node.get("Index Name") == "drawers_pkey" and re.search(r"(?<![a-z_])id = ", cond) is not None

    def by_primary_key(node: dict[str, object]) -> bool:
        # An index scan of the primary key, or a bitmap heap scan whose bitmap is made from it alone (the
        # planner picks either for `id = ANY(...)`, depending on the table's statistics).
        if node.get("Node Type") == "Bitmap Heap Scan":
            return all(pkey_lookup(n) for n in nodes(node) if n.get("Node Type") == "Bitmap Index Scan")
        return pkey_lookup(node)

    scans = [n for n in nodes(plan[0]["Plan"]) if n.get("Relation Name") == "drawers" and not by_primary_key(n)]
    # The one read of the workspace (no embeddings here, so it keeps no row, but it ran: once). Here the
    # workspace is nearly the whole table, so reading it may well be a sequential scan.
    assert len(scans) == 1 and scans[0]["Actual Loops"] == 1, json.dumps(plan)


@pytest.fixture(scope="module")
def settled(stack: Stack) -> Iterator[tuple[str, str]]:
    """(database URL, workspace) of a database of its own, analysed while nothing was in flight: N processed
    drawers in sessions of ten ('s0', 's1', ...), each session's episode built and announced."""
    from shared.db.migrate import apply_migrations

    w = ws()
    with fresh_database(stack, "palace_backlog") as url:
        apply_migrations(url, stack.settings.embed_dim)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("""INSERT INTO drawers (workspace_id, id, content, content_hash, state)
                            SELECT %s, md5(g::text), 'drawer ' || g, md5(g::text), 'processed'
                              FROM generate_series(1, %s) g""", (w, N))
            conn.execute("INSERT INTO drawer_sources (workspace_id, drawer_id, session_id, seq)"
                         " SELECT %s, md5(g::text), 's' || (g / 10), g %% 10 FROM generate_series(1, %s) g", (w, N))
            conn.execute("""INSERT INTO episodes (workspace_id, id, session_id, summary, abstract, status, announced_at)
                            SELECT %s, 'e' || g, 's' || g, '', '', 'ready', now() FROM generate_series(0, %s) g""",
                         (w, N // 10))
            for table in ("drawers", "drawer_sources", "episodes"):
                analyze(conn, table)
                # The statistics stay what this analysis saw: autovacuum, woken by the rolled-back backlogs'
                # dead rows, would otherwise recount the indexes between tests.
                conn.execute(sql.SQL("ALTER TABLE {} SET (autovacuum_enabled = off)").format(sql.Identifier(table)))
        yield url, w


@contextlib.contextmanager
def _backlog(settled: tuple[str, str]) -> Iterator[psycopg.Connection[Any]]:
    """A connection as the services' role in the settled workspace, inside one transaction that is rolled
    back, in which a backlog waits: 5,000 drawers still raw (filed, not yet embedded; ten of them the
    session 'progress-session', whose episode waits for them) and 3,000 episodes not yet announced. The
    last analysis saw none of either, as it is while a backlog builds (autovacuum analyses a table after a
    tenth of it changed): the statistics say the partial indexes of in-flight rows hold a row or two, and a
    plan built on them walks the whole backlog, of every workspace, for each event."""
    url, w = settled
    with psycopg.connect(url) as conn:
        conn.execute("""INSERT INTO drawers (workspace_id, id, content, content_hash, state, filed_at, updated_at)
                        SELECT %s, 'backlog' || g, 'waiting ' || g, md5('b' || g), 'raw', now(), now()
                          FROM generate_series(1, 5000) g""", (w,))
        conn.execute("""INSERT INTO drawer_sources (workspace_id, drawer_id, session_id, seq)
                        SELECT %s, 'backlog' || g, 'progress-session', g FROM generate_series(1, 10) g""", (w,))
        conn.execute("UPDATE episodes SET announced_at = NULL, status = 'pending', pending_since = now()"
                     " WHERE workspace_id = %s AND substr(id, 2)::int < 3000", (w,))
        conn.execute("""INSERT INTO episodes (workspace_id, id, session_id, summary, abstract, status, pending_since)
                        VALUES (%s, 'progress-episode', 'progress-session', '', '', 'pending', now())""", (w,))
        conn.execute("SET LOCAL ROLE palace_app")
        conn.execute("SELECT set_config('palace.workspace_id', %s, true)", (w,))
        try:
            yield conn
        finally:
            conn.rollback()


def _explain(conn: psycopg.Connection[Any], statement: str, params: Any) -> str:
    return json.dumps(conn.execute("EXPLAIN (FORMAT JSON) " + statement, params).fetchall()[0][0])


_IN_FLIGHT_INDEXES = ("drawers_raw_idle", "drawers_state", "episodes_unannounced")


def test_an_episodes_progress_walks_its_sessions_drawers_only(settled: tuple[str, str]) -> None:
    """Asked on every drawer.embedded event while its session's episode waits: how many of the session's
    drawers still wait for a vector. The count walks the session's ten drawers by key."""
    from shared.db.episodes import EPISODE_PROGRESS_SQL

    w = settled[1]
    with _backlog(settled) as conn:
        assert conn.execute(EPISODE_PROGRESS_SQL, (w, "progress-episode")).fetchone()[-2:] == (10, 10)
        plan = _explain(conn, EPISODE_PROGRESS_SQL, (w, "progress-episode"))
    drawers = re.findall(r'"Index Name": "(\w+)", "Relation Name": "drawers"', plan)
    assert drawers == ["drawers_pkey"] and '"Seq Scan"' not in plan, plan


def test_the_sessions_awaiting_an_episode_are_found_by_key(settled: tuple[str, str]) -> None:
    """Asked on every drawer.embedded event: which of its drawers' sessions have an episode still waiting.
    The answer comes from the drawers' sources and each session's episode by key."""
    from shared.db.episodes import AWAITING_EPISODE_SQL

    w = settled[1]
    with _backlog(settled) as conn:
        drawers = [r[0] for r in conn.execute("SELECT drawer_id FROM drawer_sources WHERE workspace_id = %s"
                                              " AND session_id IN ('s7', 's8') ORDER BY drawer_id", (w,))]
        conn.execute("UPDATE episodes SET announced_at = now() WHERE workspace_id = %s AND session_id = 's8'", (w,))
        params = {"ws": w, "ids": drawers}
        assert conn.execute(AWAITING_EPISODE_SQL, params).fetchall() == [("s7",)]
        plan = _explain(conn, AWAITING_EPISODE_SQL, params)
    assert not any(i in plan for i in _IN_FLIGHT_INDEXES) and '"Seq Scan"' not in plan, plan


def _in_flight_statements(w: str) -> dict[str, tuple[str, Any]]:
    """Each statement that finds rows by key and then asks whether they are still in flight, with
    parameters naming ten backlog drawers (or one, or an episode). Each of them was planned on an index of
    in-flight rows in this backlog before its test became a CASE."""
    from shared.db.curation import LLM_FAILURE_SQL
    from shared.db.drawers import NOTE_FAILURE_SQL, QUEUE_CLASSIFIED_SQL, SAVE_CLASSIFICATIONS_SQL
    from shared.db.episodes import UNANNOUNCED_EPISODE_SQL
    from shared.db.sessions import _STORE_SQL

    ids = [f"backlog{g}" for g in range(100, 110)]
    empty: list[Any] = []
    store = {"ws": w, "session": "progress-session", "event": "e", "agent": None, "user": None, "started": None,
             "completed": None, "smeta": Jsonb({}), "message_count": 0, "session_hash": "h", "m_seqs": empty,
             "m_roles": empty, "m_names": empty, "m_contents": empty, "m_hashes": empty, "m_created": empty,
             "m_metadata": empty, "m_noise": empty, "bands": empty, "nb": BANDS, "ids": ids,
             "contents": ids, "hashes": ids, "wings": ids, "rooms": ids, "halls": ids, "seqs": list(range(10)),
             "contexts": ids, "roles": ids, "speakers": ids, "occurred": [None] * 10, "metadata": [Jsonb({})] * 10,
             "s_ids": empty, "s_seqs": empty, "s_chunks": empty, "s_starts": empty, "s_ends": empty}
    return {
        "ingest: the session's drawers already stored": (_STORE_SQL, store),
        "embed: a failed attempt's reason": (NOTE_FAILURE_SQL, ("down", w, ids)),
        "classify: the batch's outcomes": (SAVE_CLASSIFICATIONS_SQL, {
            "ws": w, "min_imp": 3.0, "ids": ids, "types": ["fact"] * 10, "confs": [0.5] * 10, "imps": [2.0] * 10,
            "tiers": ["heuristic"] * 10}),
        "classify: the batch's queue rows": (QUEUE_CLASSIFIED_SQL, {
            "ws": w, "min_imp": 3.0, "ids": ids, "imps": [4.0] * 10}),
        "classify: an LLM failure": (LLM_FAILURE_SQL, {"reason": "down", "ws": w, "id": ids[0]}),
        "enrich: an episode to announce": (UNANNOUNCED_EPISODE_SQL, (w, "e17")),
    }


@pytest.mark.parametrize("name", list(_in_flight_statements("w")))
def test_in_flight_rows_are_found_by_key_in_a_backlog(settled: tuple[str, str], name: str) -> None:
    """A statement that names its rows by key and keeps those still in flight (raw drawers, unannounced
    episodes) reads those rows by key in a backlog: the in-flight test is a CASE the planner cannot match
    to the partial indexes of in-flight rows (docs/scale.md, "In-flight states")."""
    statement, params = _in_flight_statements(settled[1])[name]
    with _backlog(settled) as conn:
        plan = _explain(conn, statement, params)
    assert not any(i in plan for i in _IN_FLIGHT_INDEXES) and '"Seq Scan"' not in plan, plan


def test_a_small_exact_workspace_finds_both_candidate_lists_in_one_pass(stack: Stack, big_workspace: str) -> None:
    """At most ``fts_scan_max`` drawers and no index of its own: search reads the workspace's rows once,
    through an index on the workspace (the big workspace shares the table), for both the nearest
    neighbours and the full-text matches, and finds exactly the candidates that the separate exact scan
    and full-text function find."""
    import numpy as np

    from shared.db.search import SearchParams, _candidate_params, statement

    w = ws()
    rng = np.random.default_rng(7)
    words = ["river", "garden", "violin", "tennis", "bakery", "museum", "camping", "painting", "guitar", "puppy"]
    n = 600
    vecs = rng.normal(size=(n, 384)).astype(np.float32)
    with psycopg.connect(stack.database_url, autocommit=True) as conn, conn.cursor() as cur:
        cur.executemany(
            """INSERT INTO drawers (workspace_id, id, content, content_hash, state, embedding, dedup_bands)
               VALUES (%s, md5(%s), %s, md5(%s), 'processed', %s::vector, '{}')""",
            [(w, f"{w}{i}", text, text, "[" + ",".join(f"{x:.5f}" for x in vecs[i]) + "]")
             for i in range(n) for text in [f"note {i}: " + " ".join(words[j] for j in range(10) if (i >> j) & 1)]])
        analyze(conn, "drawers")
    with psycopg.connect(stack.database_url) as conn:
        conn.execute("SET ROLE palace_app")
        conn.execute("SELECT set_config('palace.workspace_id', %s, false)", (w,))
        for i, query in enumerate(["river garden violin", "a puppy at the museum", "tennis", "zebra"]):
            p = _candidate_params(w, query, vecs[i * 7], [], SearchParams(), n, False, None)
            assert p["scan"]
            p["emb"] = "[" + ",".join(map(repr, vecs[i * 7].tolist())) + "]"
            cur = psycopg.ClientCursor(conn)
            one_pass = sorted(r[:7] + r[8:] for r in cur.execute(statement("scan", False, False), p).fetchall())
            separate = sorted(r[:7] + r[8:] for r in cur.execute(statement("exact", False, False), p).fetchall())
            assert one_pass == separate, query
            assert len(one_pass) >= 100
        plan = conn.execute("EXPLAIN (FORMAT JSON) " + cur.mogrify(statement("scan", False, False), p)).fetchall()[0][0]
        conn.rollback()
    text = json.dumps(plan)
    assert '"Seq Scan"' not in text and "palace_text_candidates" not in text, text


@pytest.mark.parametrize("mode", ["force_generic_plan", "force_custom_plan"])
def test_an_extraction_finds_when_and_what_was_said_by_keys(stack: Stack, big_workspace: str, mode: str) -> None:
    """An extraction's facts are decided in fixed statements over arrays (shared.db.kg): when each was said
    (its turn's message) and the fact already true then. Both probe by key as the services' role, under
    row-level security, with a generic plan and with a custom one, in a workspace of tens of thousands of
    messages and facts: a COALESCE in the message's join condition once kept it out of the index (it is
    not known to be leakproof) and every extraction read the workspace's messages whole."""
    from shared.db.kg import _SAID_WHEN, _TRUE_THEN

    w = _with_messages(stack, big_workspace)
    with psycopg.connect(stack.database_url) as conn:
        conn.execute("SET ROLE palace_app")
        conn.execute("SELECT set_config('palace.workspace_id', %s, true)", (w,))
        conn.execute(sql.SQL("SET plan_cache_mode = {}").format(sql.Literal(mode)))
        when = json.dumps(conn.execute("EXPLAIN (FORMAT JSON) " + _SAID_WHEN, {
            "ws": w, "drawer": [md5 for (md5,) in conn.execute("SELECT md5('7') UNION ALL SELECT md5('8')")],
            "sess": ["s1", None], "seq": [None, 3], "vf": [None, None]}).fetchall()[0][0])
        then = json.dumps(conn.execute("EXPLAIN (FORMAT JSON) " + _TRUE_THEN, {
            "ws": w, "s": ["speaker", "speaker"], "p": ["likes", "likes"], "o": ["thing 5", "thing 9"],
            "vf": ["2026-01-01T00:00:00Z", "2026-01-02T00:00:00Z"]}).fetchall()[0][0])
        conn.rollback()
    assert '"Seq Scan"' not in when and '"messages_pkey"' in when and '"drawers_pkey"' in when, when
    assert '"Seq Scan"' not in then and '"Bitmap Heap Scan"' not in then, then


def test_ingest_reads_what_a_sessions_positions_hold_by_key(stack: Stack, big_workspace: str) -> None:
    """Every session.completed asks what its positions already hold (an edited message, or an earlier
    revision coming back): a range of the messages' primary key, and of message_revisions' per position."""
    from shared.db.sessions import KNOWN_MESSAGES_SQL

    w = _with_messages(stack, big_workspace)
    with psycopg.connect(stack.database_url) as conn:
        conn.execute("SET ROLE palace_app")
        conn.execute("SELECT set_config('palace.workspace_id', %s, true)", (w,))
        plan = json.dumps(conn.execute("EXPLAIN (FORMAT JSON) " + KNOWN_MESSAGES_SQL, {
            "ws": w, "sid": "s7", "seqs": list(range(100))}).fetchall()[0][0])
        conn.rollback()
    assert '"Seq Scan"' not in plan and '"messages_pkey"' in plan and '"message_revisions_pkey"' in plan, plan


def _with_messages(stack: Stack, w: str) -> str:
    """The big workspace with 300 sessions of 100 messages (a tenth of them edited once) and N facts (once
    per module), statistics taken."""
    if not stack.sql("SELECT 1 FROM messages WHERE workspace_id = %s LIMIT 1", (w,)):
        with psycopg.connect(stack.database_url, autocommit=True) as conn:
            conn.execute("INSERT INTO sessions (workspace_id, session_id, event_id, message_count, content_hash)"
                         " SELECT %s, 's' || g, 'e' || g, 100, md5(g::text)"
                         " FROM generate_series(1, 300) g", (w,))
            conn.execute("INSERT INTO messages (workspace_id, session_id, seq, role, content, content_hash)"
                         " SELECT %s, 's' || (g / 100 + 1), g %% 100, 'user', 'turn ' || g, md5(g::text)"
                         " FROM generate_series(0, 29999) g", (w,))
            conn.execute("INSERT INTO triples (workspace_id, id, subject_id, predicate, object_id, valid_from)"
                         " SELECT %s, md5(g::text), 'speaker', 'likes', 'thing ' || g, now() - g * interval '1 hour'"
                         " FROM generate_series(1, %s) g", (w, N))
            # Every tenth message edited once.
            conn.execute("INSERT INTO message_revisions (workspace_id, session_id, seq, revision, role, content,"
                         " content_hash) SELECT workspace_id, session_id, seq, 0, role, 'first ' || content,"
                         " md5('first ' || content) FROM messages WHERE workspace_id = %s AND seq %% 10 = 0", (w,))
            for table in ("sessions", "messages", "message_revisions", "triples"):
                analyze(conn, table)
    return w


def test_two_lexicon_refreshes_of_one_workspace_at_once_both_succeed(stack: Stack, big_workspace: str) -> None:
    """Two refreshes side by side (two maintain replicas, or one and an operator): the second waits for the
    first and replaces what it wrote, where both deleting first and inserting after failed on the key."""
    import asyncio

    from shared.db.lexicon import refresh_lexicon
    from shared.db.pool import open_pool
    from shared.db.tenancy import maintenance_tx

    async def both() -> list[int]:
        pool = await open_pool(stack.database_url, name="test-lexicon-twice", max_size=2)

        async def one() -> int:
            async with maintenance_tx(pool) as conn:
                n = await refresh_lexicon(conn, big_workspace, 0.01)
                await asyncio.sleep(0.3)  # still uncommitted while the other one starts
                return n
        try:
            return list(await asyncio.gather(one(), one()))
        finally:
            await pool.close()

    a, b = asyncio.run(both())
    assert a == b > 0
    assert stack.sql("SELECT count(*) FROM workspace_lexicon WHERE workspace_id = %s", (big_workspace,)) == [(a,)]
