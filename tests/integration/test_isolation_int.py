"""Tenant isolation enforced by PostgreSQL itself (row-level security, migration 0003), and a
property-based sweep of the API: no call, with any key, ever returns another workspace's memory."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import psycopg
import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.api.app import create_app
from shared.config import Settings
from shared.db.pool import open_pool
from shared.db.tenancy import maintenance_tx, workspace_tx
from tests.integration.helpers import Stack, api_key_for, session, ws

WORDS = ["violin", "glacier", "compiler", "saffron", "tram", "orchid"]


def _workspace_tables(stack: Stack) -> list[str]:
    rows = stack.sql(
        """SELECT c.table_name FROM information_schema.columns c
             JOIN information_schema.tables t USING (table_schema, table_name)
            WHERE c.table_schema = 'public' AND c.column_name = 'workspace_id' AND t.table_type = 'BASE TABLE'"""
    )
    return sorted(r[0] for r in rows)


def test_every_workspace_table_has_forced_row_level_security(stack: Stack) -> None:
    tables = _workspace_tables(stack)
    assert {"drawers", "messages", "sessions", "api_keys"} <= set(tables)
    for t in tables:
        (enabled, forced), = stack.sql(
            "SELECT relrowsecurity, relforcerowsecurity FROM pg_class WHERE oid = %s::regclass", (t,))
        assert enabled and forced, f"{t}: row-level security not enabled and forced"
        policies = {r[0] for r in stack.sql(
            "SELECT unnest(roles)::text FROM pg_policies WHERE schemaname = 'public' AND tablename = %s", (t,))}
        assert policies >= {"palace_app", "palace_maintenance"}, f"{t}: policies for {policies}"


def _seed(stack: Stack, n: int = 2) -> list[str]:
    spaces = [ws() for _ in range(n)]
    for i, w in enumerate(spaces):
        stack.publish(session(w, "s1", [f"my {WORDS[i]} lesson is on tuesday with the {WORDS[-1 - i]} club",
                                        f"I keep the {WORDS[i]} in the blue case near the door"]))
    for w in spaces:
        stack.wait_processed(w, 2)
    return spaces


async def test_queries_without_a_workspace_filter_still_see_one_workspace(stack: Stack) -> None:
    a, b = await asyncio.to_thread(_seed, stack)
    pool = await open_pool(stack.database_url, name="test-rls", max_size=1)
    try:
        async with workspace_tx(pool, a) as conn:
            # Deliberately no WHERE clause: the database alone keeps b out.
            seen = {r[0] for r in await (await conn.execute("SELECT DISTINCT workspace_id FROM drawers")).fetchall()}
            assert seen == {a}
            for t in ("sessions", "messages", "drawer_sources", "episodes"):
                rows = await (await conn.execute(f"SELECT DISTINCT workspace_id FROM {t}")).fetchall()  # noqa: S608
                assert {r[0] for r in rows} <= {a}, t
            cur = await conn.execute("UPDATE drawers SET importance = 0.01 WHERE workspace_id = %s", (b,))
            assert cur.rowcount == 0, "another workspace's rows cannot be changed"
            cur = await conn.execute("DELETE FROM drawers WHERE workspace_id = %s", (b,))
            assert cur.rowcount == 0, "nor deleted"
            # The full-text helper (security definer, for the GIN index) keeps the same rule.
            q = ("SELECT count(*) FROM palace_text_candidates(%s, to_tsquery('english', 'lesson'), '{lesson}', 100,"
                 " 10)")
            assert (await (await conn.execute(q, (a,))).fetchone()) == (1,)
            assert (await (await conn.execute(q, (b,))).fetchone()) == (0,)
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            async with workspace_tx(pool, a) as conn:
                await conn.execute(
                    "INSERT INTO sessions (workspace_id, session_id, message_count) VALUES (%s, 'x', 0)", (b,))
        async with pool.connection() as conn:
            # No workspace named at all: nothing is visible.
            assert (await (await conn.execute("SELECT count(*) FROM drawers")).fetchone()) == (0,)
        async with maintenance_tx(pool) as conn:
            rows = await (await conn.execute(
                "SELECT DISTINCT workspace_id FROM drawers WHERE workspace_id = ANY(%s)", ([a, b],))).fetchall()
            assert {r[0] for r in rows} == {a, b}, "the maintenance role spans workspaces"
    finally:
        await pool.close()
    assert stack.sql("SELECT min(importance) > 0.01 FROM drawers WHERE workspace_id = %s", (b,))[0][0]


def _ids_of(stack: Stack, workspace: str) -> set[str]:
    return {r[0] for r in stack.sql("SELECT id FROM drawers WHERE workspace_id = %s", (workspace,))}


def _check(stack: Stack, client: TestClient, keys: dict[str, str], call: dict[str, Any]) -> None:
    target, holder, op = call["target"], call["key"], call["op"]
    headers = {} if holder is None else {"Authorization": f"Bearer {keys.get(holder, 'pk_' + holder + '_forged')}"}
    episodes = call.get("episodes", False)
    if op == "search_post":
        r = client.post("/v1/search", json={"workspace_id": target, "query": call["query"], "k": call["k"],
                                             "include_episodes": episodes}, headers=headers)
    elif op == "search_get":
        r = client.get("/v1/search", params={"workspace_id": target, "q": call["query"], "k": call["k"],
                                             "include_episodes": episodes}, headers=headers)
    elif op == "stats":
        r = client.get(f"/v1/workspaces/{target}/stats", headers=headers)
    else:
        body = session(target, f"p-{uuid.uuid4().hex[:8]}", [f"{call['query']} noted for later by {target}"])
        r = client.post("/v1/sessions", json=body, headers=headers)
    if holder is None or holder not in keys:
        assert r.status_code == 401, (call, r.status_code, r.text)
        return
    if holder != target:
        assert r.status_code == 403, (call, r.status_code, r.text)
        return
    assert r.status_code in (200, 202), (call, r.status_code, r.text)
    if op.startswith("search"):
        hits = r.json()["hits"]
        assert r.json()["workspace_id"] == target
        foreign = {h["id"] for h in hits} - _ids_of(stack, target)
        assert not foreign, f"{call}: hits from another workspace: {foreign}"
        if not episodes:
            assert r.json()["episodes"] is None
        else:
            found = r.json()["episodes"]
            own = {e[0] for e in stack.sql("SELECT id FROM episodes WHERE workspace_id = %s", (target,))}
            assert {e["episode_id"] for e in found} <= own, f"{call}: another workspace's episode"
            cited = {d for e in found for d in e["drawer_ids"]} - _ids_of(stack, target)
            assert not cited, f"{call}: an episode cites another workspace's drawers: {cited}"
    elif op == "stats":
        body = r.json()
        truth = stack.sql("SELECT count(*) FROM sessions WHERE workspace_id = %s", (target,))[0][0]
        assert body["workspace_id"] == target and body["sessions"] <= truth


def test_random_api_calls_never_cross_workspaces(stack: Stack) -> None:
    spaces = _seed(stack, 3)
    keys = {w: api_key_for(stack, w, "property-test") for w in spaces}
    stranger = ws()  # a workspace with no key and no data
    cfg = Settings(database_url=stack.database_url, nats_url=stack.nats_url, api_auth=True)
    call = st.fixed_dictionaries({
        "op": st.sampled_from(["search_post", "search_get", "stats", "write"]),
        "target": st.sampled_from([*spaces, stranger]),
        "key": st.one_of(st.none(), st.sampled_from([*spaces, stranger])),
        "query": st.lists(st.sampled_from([*WORDS, "lesson", "case", "tuesday", "door"]), min_size=1,
                          max_size=4).map(" ".join),
        "k": st.integers(1, 10),
        "episodes": st.booleans(),
    })
    with TestClient(create_app(cfg), base_url="http://localhost") as client:

        @settings(max_examples=120, deadline=None, derandomize=True,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
        @given(calls=st.lists(call, min_size=1, max_size=4))
        def run(calls: list[dict[str, Any]]) -> None:
            for c in calls:
                _check(stack, client, keys, c)

        run()
    # Writes that were allowed land only in their own workspace.
    for w in spaces:
        stack.wait_processed(w, len(_ids_of(stack, w)), timeout=90)
        leaked = stack.sql("SELECT count(*) FROM drawers WHERE workspace_id = %s AND content LIKE %s "
                           "AND content NOT LIKE %s", (w, "% noted for later by %", f"% noted for later by {w}"))
        assert leaked[0][0] == 0
