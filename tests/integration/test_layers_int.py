"""The memory layers, scored search, auto-inject and access statistics against the real stack."""

from __future__ import annotations

import asyncio
import time

import httpx
import psycopg
import pytest
from psycopg import sql

from shared.access import AccessLog
from shared.db.layers import essential_query
from shared.db.pool import open_pool
from shared.db.tenancy import workspace_tx
from shared.layers import IDENTITY_MAX, L1_BUDGET, L2_BUDGET, MORE_MARKER
from tests.integration.helpers import Stack, session, wait_for, ws

TEXTS = [
    "We decided to run the billing service on PostgreSQL with pgvector, not a separate vector store.",
    "Sounds like a plan, I'll draft the migration checklist tonight.",
    "My partner Ana is training for the Berlin marathon in September, five runs a week.",
    "The nightly export job keeps failing with a timeout error on the S3 upload.",
    "I prefer short answers with code examples over long explanations.",
]
SIGNALS = {"vector", "full_text", "speaker", "time_window", "neighbours", "session", "graph", "importance",
           "recency", "diversity"}


def _post(stack: Stack, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{stack.api_url}{path}", json=body, timeout=30)


@pytest.fixture(scope="module")
def seeded(stack: Stack) -> str:
    w = ws()
    stack.publish(session(w, "s1", TEXTS[:3]))
    stack.publish(session(w, "s2", TEXTS[3:]))
    stack.wait_processed(w, len(TEXTS))
    return w


def test_identity_is_kept_whole_or_refused(stack: Stack, seeded: str) -> None:
    url = f"{stack.api_url}/v1/workspaces/{seeded}/identity"
    # A workspace that never had one (the seeded one may have got it from another test first).
    assert httpx.get(f"{stack.api_url}/v1/workspaces/{ws()}/identity", timeout=10).status_code == 404
    text = "I am Atlas, the billing team's assistant. " * 9
    assert len(text) <= IDENTITY_MAX
    r = httpx.put(url, json={"text": text}, timeout=10)
    assert r.status_code == 200, r.text
    too_long = "x" * (IDENTITY_MAX + 1)
    r = httpx.put(url, json={"text": too_long}, timeout=10)
    assert r.status_code == 422 and "400" in r.text
    got = httpx.get(url, timeout=10).json()
    assert got["text"] == text.strip(), "the refused write changed nothing, and nothing was cut"


def test_wake_up_is_identity_then_essential_story_within_budget(stack: Stack, seeded: str) -> None:
    httpx.put(f"{stack.api_url}/v1/workspaces/{seeded}/identity", json={"text": "I am Atlas."}, timeout=10)
    r = _post(stack, "/v1/wake_up", {"workspace_id": seeded})
    assert r.status_code == 200, r.text
    w = r.json()
    assert w["identity"] == "I am Atlas." and w["text"].startswith("I am Atlas.\n\n## L1")
    assert len(w["essential"]) <= L1_BUDGET and not w["truncated"]
    assert len(w["drawers"]) == len(TEXTS)
    imps = [d["importance"] for d in w["drawers"]]
    for d in w["drawers"]:
        assert d["citation"] == f"{d['wing']}/{d['room']}/{d['id'][:12]}"
        assert d["snippet"] in w["essential"] and len(d["snippet"]) <= 200
    assert max(imps) == w["drawers"][0]["importance"]
    # the same call gives the same text (stable order)
    assert _post(stack, "/v1/wake_up", {"workspace_id": seeded}).json()["essential"] == w["essential"]
    # every drawer returned is counted as accessed, in the background
    ids = [d["id"] for d in w["drawers"]]
    wait_for(lambda: stack.sql("SELECT count(*) FROM drawers WHERE workspace_id = %s AND id = ANY(%s)"
                               " AND access_count >= 2 AND last_accessed_at IS NOT NULL", (seeded, ids))[0][0]
             == len(ids), 15, "access counts of the woken drawers")


def test_layers_hold_their_budgets_with_much_to_show(stack: Stack) -> None:
    w = ws()
    # Thirty distinct decisions (not near-duplicates of one another, which cluster would merge).
    topics = ["billing", "search", "ingest", "auth", "exports", "alerts", "backups", "mobile", "pricing", "docs"]
    owners = ["Maria", "Jon", "Aiko"]
    long = [f"Decision {i}: the {topics[i % 10]} work goes to {owners[i % 3]}'s team in sprint {i}; "
            f"{'they keep a runbook and a weekly review' if i % 2 else 'an error budget and paging rota come first'}, "
            f"{['because the last outage hurt', 'so the roadmap stays honest', 'as agreed at the offsite'][i % 3]}, "
            f"and {['Postgres', 'Redis', 'Kafka', 'S3', 'NATS'][i % 5]} stays the store of record for it "
            f"until {['March', 'June', 'September', 'December'][i % 4]} {2027 + i // 10}." for i in range(30)]
    stack.publish(session(w, "big", long))
    stack.wait_processed(w, 30)
    wake = _post(stack, "/v1/wake_up", {"workspace_id": w}).json()
    assert wake["identity"] is None
    assert len(wake["essential"]) <= L1_BUDGET and wake["truncated"]
    assert wake["essential"].endswith(MORE_MARKER) and 0 < len(wake["drawers"]) < 15
    room = wake["drawers"][0]["room"]
    rec = _post(stack, "/v1/recall", {"workspace_id": w, "room": room}).json()
    assert len(rec["text"]) <= L2_BUDGET and all(len(d["snippet"]) <= 300 for d in rec["drawers"])
    assert rec["truncated"] and rec["text"].endswith(MORE_MARKER)
    assert all(d["room"] == room for d in rec["drawers"])
    assert _post(stack, "/v1/recall", {"workspace_id": w, "wing": "no-such-wing"}).json()["drawers"] == []
    # A name is read as drawers are filed under it (trimmed); one longer than a filed name can be is refused.
    padded = _post(stack, "/v1/recall", {"workspace_id": w, "room": f"  {room} "}).json()
    assert [d["id"] for d in padded["drawers"]] == [d["id"] for d in rec["drawers"]] != []
    too_long = httpx.post(f"{stack.api_url}/v1/recall", json={"workspace_id": w, "wing": "w" * 101}, timeout=30)
    assert too_long.status_code == 422


def test_search_scores_are_0_1_in_order_cited_and_explained(stack: Stack, seeded: str) -> None:
    hits = stack.search(seeded, "Which database does billing use?", k=5)
    assert "PostgreSQL with pgvector" in hits[0]["content"]
    scores = [h["score"] for h in hits]
    assert scores == sorted(scores, reverse=True) and all(0 <= s <= 1 for s in scores)
    assert scores[0] >= 0.3
    for h in hits:
        e = h["explanation"]
        assert set(e) >= SIGNALS and e["graph"] == 0
        assert abs(sum(e[s] for s in SIGNALS) - h["score"]) < 1e-6
        assert h["citation"] == f"{h['wing']}/{h['room']}/{h['id'][:12]}"
    assert hits[0]["explanation"]["vector"] > 0 and hits[0]["explanation"]["full_text"] > 0


def test_inject_skips_trivial_messages_and_irrelevant_ones(stack: Stack, seeded: str) -> None:
    for msg in ("ok thanks!", "yes", "sounds good to me"):
        r = _post(stack, "/v1/inject", {"workspace_id": seeded, "message": msg}).json()
        assert r["block"] == "" and r["skipped"] == "trivial" and r["match_count"] == 0, msg
    r = _post(stack, "/v1/inject", {"workspace_id": seeded,
                                    "message": "How should I configure TLS certificates for a Kubernetes ingress?"})
    r = r.json()
    assert r["block"] == "" and r["skipped"] == "no_match" and r["top_score"] < 0.3, r


def test_inject_puts_relevant_memories_in_a_block_within_its_token_budget(stack: Stack, seeded: str) -> None:
    from shared.inject import approx_tokens

    msg = "Remind me which database we chose for the billing service"
    r = _post(stack, "/v1/inject", {"workspace_id": seeded, "message": msg}).json()
    assert r["skipped"] is None and r["injected_count"] >= 1 and r["match_count"] >= r["injected_count"]
    assert r["top_score"] >= 0.3
    assert r["block"].startswith("<memory_context>") and r["block"].endswith("</memory_context>")
    assert "PostgreSQL with pgvector" in r["block"]
    assert approx_tokens(r["block"]) == r["tokens"] <= 200
    small = _post(stack, "/v1/inject", {"workspace_id": seeded, "message": msg, "token_budget": 40}).json()
    assert small["tokens"] <= 40 and small["injected_count"] == 1
    strict = _post(stack, "/v1/inject", {"workspace_id": seeded, "message": msg, "threshold": 1.0}).json()
    assert strict["block"] == "" and strict["skipped"] == "no_match"


async def test_access_writes_are_batched_skip_locked_rows_and_never_wait_for_a_busy_pool(stack: Stack) -> None:
    seeded = ws()  # a workspace nothing else reads meanwhile (the API flushes its own access counts)
    await asyncio.to_thread(stack.publish, session(seeded, "s1", TEXTS))
    await asyncio.to_thread(stack.wait_processed, seeded, len(TEXTS))
    pool = await open_pool(stack.database_url, name="test-access", max_size=1)
    try:
        async with workspace_tx(pool, seeded) as conn:
            ids = [r[0] for r in await (await conn.execute(
                "SELECT id FROM drawers WHERE workspace_id = %s ORDER BY id", (seeded,))).fetchall()]
            before = dict(await (await conn.execute(
                "SELECT id, access_count FROM drawers WHERE workspace_id = %s", (seeded,))).fetchall())
        log = AccessLog(pool, interval_s=3600, acquire_timeout_s=0.2, max_pending=len(ids) - 1)
        for _ in range(3):
            log.note(seeded, ids)  # coalesced: one pending entry per drawer, the last one dropped
        assert log.pending == len(ids) - 1 and log.dropped == 3
        # The pool's only connection is busy: flushing gives up at once and keeps the increments.
        async with pool.connection():
            t0 = time.monotonic()
            assert await log.flush() == 0
            assert time.monotonic() - t0 < 5 and log.pending == len(ids) - 1
        # A row locked by another transaction is skipped, not waited for, and retried later.
        locker = await open_pool(stack.database_url, name="test-locker", max_size=1)
        try:
            async with workspace_tx(locker, seeded) as other:
                await other.execute("SELECT 1 FROM drawers WHERE workspace_id = %s AND id = %s FOR UPDATE",
                                    (seeded, ids[0]))
                t0 = time.monotonic()
                assert await log.flush() == len(ids) - 2
                assert time.monotonic() - t0 < 5 and log.pending == 1
            assert await log.flush() == 1 and log.pending == 0
        finally:
            await locker.close()
        async with workspace_tx(pool, seeded) as conn:
            after = dict(await (await conn.execute(
                "SELECT id, access_count FROM drawers WHERE workspace_id = %s", (seeded,))).fetchall())
        assert {i: after[i] - before[i] for i in ids} == {**{i: 3 for i in ids[:-1]}, ids[-1]: 0}
    finally:
        await pool.close()


async def test_layer_and_access_statements_use_indexes(stack: Stack, seeded: str) -> None:
    from shared.db.access import _SQL as ACCESS_SQL

    pool = await open_pool(stack.database_url, name="test-plans", max_size=1)
    try:
        async with workspace_tx(pool, seeded) as conn:
            await conn.execute("SET LOCAL enable_seqscan = off")
            plan = "\n".join(r[0] for r in await (await conn.execute(
                sql.SQL("EXPLAIN ") + essential_query(), {"ws": seeded, "fetch": 60, "n": 400})).fetchall())
            # Which index depends on the statistics of everything else in the shared test database; a
            # sequential scan of the table is what must never show (test_plans_int checks the index at size).
            assert "Index" in plan and "Seq Scan" not in plan, plan
            plan = "\n".join(r[0] for r in await (await conn.execute(
                "EXPLAIN " + ACCESS_SQL, {"ids": ["a"], "n": [1], "at": [None], "ws": seeded})).fetchall())
            assert "Index" in plan and "Seq Scan" not in plan, plan
    finally:
        await pool.close()


def test_layer_routes_need_the_workspace_key(stack: Stack, seeded: str) -> None:
    from fastapi.testclient import TestClient

    from services.api.app import create_app
    from shared.config import Settings
    from tests.integration.helpers import api_key_for

    other = ws()
    key = api_key_for(stack, seeded)
    settings = Settings(database_url=stack.database_url, nats_url=stack.nats_url, api_auth=True)
    calls = [("put", "/v1/workspaces/{w}/identity", {"text": "I am Atlas."}),
             ("get", "/v1/workspaces/{w}/identity", None), ("post", "/v1/wake_up", {}), ("post", "/v1/recall", {}),
             ("post", "/v1/inject", {"message": "which database did we choose for billing"})]
    with TestClient(create_app(settings), base_url="http://localhost") as client:
        for method, path, body in calls:
            for target, headers, want in ((seeded, {}, 401), (other, {"Authorization": f"Bearer {key}"}, 403),
                                          (seeded, {"Authorization": f"Bearer {key}"}, 200)):
                kw = {} if body is None else {"json": body if "{w}" in path else {**body, "workspace_id": target}}
                r = client.request(method, path.format(w=target), headers=headers, **kw)
                assert r.status_code == want, (method, path, target, r.status_code, r.text)


async def test_essential_story_is_the_importance_order_even_after_decay(stack: Stack) -> None:
    """L1 walks the index by importance_peak (an upper bound of importance, migration 0034), so drawers that
    decayed below their peak must neither hide a more important drawer nor outrank one; decay's rewrites
    of importance stay HOT until a drawer's peak has to come down."""
    from shared.db.layers import drawers_by_importance

    w = ws()
    insert = """INSERT INTO drawers (workspace_id, id, content, content_hash, state, importance, filed_at, dedup_bands)
                SELECT %s, %s || g, 'drawer ' || g, md5(%s || g), 'processed', %s, now() - g * interval '1 minute',
                       '{}'
                  FROM generate_series(1, %s) g"""
    with psycopg.connect(stack.database_url) as conn:
        conn.execute(insert, (w, "decayed-", "d", 5.0, 200))
        conn.execute(insert, (w, "fresh-", "f", 4.0, 2000))
        conn.execute(insert, (w, "low-", "l", 1.0, 2000))
        conn.commit()
        hot = "SELECT pg_stat_get_xact_tuples_hot_updated('drawers'::regclass)"  # this transaction's
        hot_updates = 0
        for _ in range(3):  # 5 x 0.9^3 = 3.645: below the fresh drawers, still within the peak's slack
            conn.execute("UPDATE drawers SET importance = importance * 0.9 WHERE workspace_id = %s"
                         " AND id LIKE 'decayed-%%'", (w,))
            hot_updates += conn.execute(hot).fetchone()[0]  # type: ignore[index]
            conn.commit()
        # As many as the pages' free space allows (all 200 rows share a few pages); a changed indexed
        # value would make none of them HOT.
        assert hot_updates >= 200, hot_updates
        peaks = conn.execute("SELECT min(importance_peak), max(importance_peak) FROM drawers"
                             " WHERE workspace_id = %s AND id LIKE 'decayed-%%'", (w,)).fetchone()
        assert peaks == (5.0, 5.0)
        bad = conn.execute("SELECT count(*) FROM drawers WHERE workspace_id = %s AND NOT"
                           " (importance <= importance_peak AND importance_peak <= importance * 1.5 + 1e-6)",
                           (w,)).fetchone()
        assert bad == (0,)
    want_sql = ("SELECT id FROM drawers WHERE workspace_id = %s AND deleted_at IS NULL AND state <> 'merged'"
                " ORDER BY importance DESC, coalesce(occurred_at, filed_at) DESC, id LIMIT %s")
    pool = await open_pool(stack.database_url, name="test-essential", max_size=1)
    try:
        for limit in (15, 3):
            async with workspace_tx(pool, w) as conn:
                got = [r.id for r in await drawers_by_importance(conn, w, limit=limit)]
            assert got == [r[0] for r in stack.sql(want_sql, (w, limit))]
            assert all(i.startswith("fresh-") for i in got)
        # A fourth step takes the decayed drawers below their peak's slack: the peak comes down with them.
        stack.sql("UPDATE drawers SET importance = importance * 0.9 WHERE workspace_id = %s AND id LIKE 'decayed-%%'"
                  " RETURNING 1", (w,))
        assert stack.sql("SELECT count(*) FROM drawers WHERE workspace_id = %s AND id LIKE 'decayed-%%'"
                         " AND importance_peak = importance", (w,)) == [(200,)]
        # A rise raises the peak: a restored importance puts a decayed drawer first again.
        stack.sql("UPDATE drawers SET importance = 5 WHERE workspace_id = %s AND id = 'decayed-7' RETURNING 1", (w,))
        async with workspace_tx(pool, w) as conn:
            got = [r.id for r in await drawers_by_importance(conn, w, limit=15)]
        assert got[0] == "decayed-7" and got == [r[0] for r in stack.sql(want_sql, (w, 15))]
    finally:
        await pool.close()


def test_a_citation_reads_back_to_its_drawer(stack: Stack, seeded: str) -> None:
    from urllib.parse import quote

    hit = stack.search(seeded, "which database did we choose for billing", k=1)[0]
    base = f"{stack.api_url}/v1/workspaces/{seeded}/palace/citations/"
    for ref in (hit["citation"], hit["id"], f"[{hit['citation']}]"):
        r = httpx.get(base + quote(ref, safe="/"), timeout=10)
        assert r.status_code == 200, r.text
        assert (r.json()["drawer_id"], r.json()["citation"], r.json()["content"]) == (
            hit["id"], hit["citation"], hit["content"])
        assert r.json()["sessions"], "with its provenance, as the drawer page shows it"
    missing = httpx.get(base + "decisions/billing/0123456789ab", timeout=10)
    assert missing.status_code == 404 and missing.json()["error"] == "not_found"
    assert httpx.get(base + "decisions/billing/zzz", timeout=10).status_code == 400
    other = ws()
    assert httpx.get(f"{stack.api_url}/v1/workspaces/{other}/palace/citations/{hit['citation']}",
                     timeout=10).status_code == 404, "resolved within the caller's workspace only"
    # Two drawers sharing the short id: the citation is ambiguous (409, naming both), the whole id is not.
    twins = ["abcdef012345" + "0" * 20, "abcdef012345" + "1" * 20]
    for i, did in enumerate(twins):
        stack.sql("INSERT INTO drawers (workspace_id, id, content, content_hash, state, wing, room)"
                  " VALUES (%s, %s, %s, md5(%s), 'processed', 'w', %s) RETURNING 1",
                  (other, did, f"twin {i}", did, f"r{i}"))
    both = httpx.get(f"{stack.api_url}/v1/workspaces/{other}/palace/citations/x/y/abcdef012345", timeout=10)
    assert both.status_code == 409 and all(t in both.text for t in twins)
    # The citation's room tells them apart; so does the whole id.
    for i, did in enumerate(twins):
        for ref in (f"w/r{i}/abcdef012345", did):
            r = httpx.get(f"{stack.api_url}/v1/workspaces/{other}/palace/citations/{ref}", timeout=10)
            assert r.status_code == 200 and r.json()["drawer_id"] == did, r.text


async def test_inject_counts_as_recalled_only_what_it_showed(stack: Stack) -> None:
    """Recency ranking, decay and prune read a drawer's access time and count: auto-inject runs before
    every turn, and counting every near-miss it searched (not shown) kept irrelevant drawers fresh."""
    from shared.access import access_log
    from shared.inject import inject
    from shared.recall import Recaller

    w = ws()
    texts = ["The billing service runs on PostgreSQL 16 in the Frankfurt region.",
             "The billing service database is backed up nightly to object storage.",
             "The billing service on-call rotation changes every Monday morning."]
    await asyncio.to_thread(stack.publish, session(w, "s1", texts))
    await asyncio.to_thread(stack.wait_processed, w, len(texts))
    pool = await open_pool(stack.database_url, name="test-inject-touch", max_size=2, role=stack.settings.db_role)
    try:
        out = await inject(Recaller(pool, None), w, "Which database does the billing service use?",
                           token_budget=48, threshold=0.0)
        assert out.injected_count == 1 and out.match_count == len(texts), out
        await access_log(pool).flush()
        async with workspace_tx(pool, w) as conn:
            counts = dict(await (await conn.execute(
                "SELECT citation_id, access_count FROM (SELECT id AS citation_id, access_count FROM drawers"
                " WHERE workspace_id = %s) d", (w,))).fetchall())
    finally:
        await pool.close()
    shown = out.citations[0].rsplit("/", 1)[1]
    assert {i for i, n in counts.items() if n} == {i for i in counts if i.startswith(shown)}, counts
