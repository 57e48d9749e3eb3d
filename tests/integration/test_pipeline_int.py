"""The first path end to end: session.completed → raw rows → drawers → embedded → classified → searchable."""

from __future__ import annotations

import json

from tests.integration.helpers import Stack, session, wait_for, ws

TEXTS = [
    "hi",
    "We decided to run the billing service on PostgreSQL with pgvector, not a separate vector store.",
    "Sounds like a plan, I'll draft the migration checklist tonight.",
    "My partner Ana is training for the Berlin marathon in September.",
    "The nightly export job keeps failing with a timeout error on the S3 upload.",
]


def test_session_becomes_searchable_with_expected_content(stack: Stack) -> None:
    w = ws()
    stack.publish(session(w, "s1", TEXTS))
    stack.wait_processed(w, 4)
    # Raw first: every message is stored verbatim, noise included.
    msgs = stack.sql("SELECT seq, content FROM messages WHERE workspace_id = %s ORDER BY seq", (w,))
    assert [m[1] for m in msgs] == TEXTS
    rows = stack.sql("SELECT content, state, memory_type, pipeline_tier, embedding IS NOT NULL FROM drawers"
                     " WHERE workspace_id = %s", (w,))
    assert {r[0] for r in rows} == set(TEXTS[1:]), "noise ('hi') is not filed"
    assert all(r[1] == "processed" and r[2] and r[3] == "heuristic" and r[4] for r in rows)
    hits = stack.search(w, "Which database does billing use?", k=3)
    assert "PostgreSQL with pgvector" in hits[0]["content"]
    hits = stack.search(w, "What is Ana training for?", k=3)
    assert "Berlin marathon" in hits[0]["content"]
    hits = stack.search(w, "why does the export fail", k=3)
    assert "timeout error" in hits[0]["content"]
    # Classification is audited.
    assert stack.sql("SELECT count(*) FROM memory_history WHERE workspace_id = %s AND action = 'CLASSIFY'",
                     (w,))[0][0] == 4


def test_republishing_creates_no_duplicates(stack: Stack) -> None:
    w = ws()
    ev = session(w, "s1", TEXTS)
    stack.publish(ev)
    stack.wait_processed(w, 4)
    stack.publish(ev)
    stack.publish(ev, headers={"Nats-Msg-Id": "another-id"})
    # The same text arriving in a different session is still one drawer, with two provenance rows.
    stack.publish(session(w, "s2", [TEXTS[3]]))
    wait_for(lambda: stack.sql("SELECT count(*) FROM sessions WHERE workspace_id = %s", (w,))[0][0] == 2,
             what="second session stored")
    wait_for(lambda: stack.sql("SELECT count(*) FROM drawer_sources WHERE workspace_id = %s", (w,))[0][0] == 5,
             what="provenance of the repeat")
    assert stack.sql("SELECT count(*) FROM messages WHERE workspace_id = %s", (w,))[0][0] == len(TEXTS) + 1
    assert stack.sql("SELECT count(*), count(DISTINCT content_hash) FROM drawers WHERE workspace_id = %s",
                     (w,))[0] == (4, 4)
    hits = stack.search(w, "Berlin marathon", k=10)
    assert sum("Berlin marathon" in h["content"] for h in hits) == 1


def test_long_message_is_chunked_and_all_chunks_searchable(stack: Stack) -> None:
    w = ws()
    parts = [f"Paragraph {i}: the Helios project milestone {i} covers module {i * 7} and its tests." for i in range(30)]
    parts[25] = "Paragraph 25: the secret launch code name for Helios is Blue Heron."
    stack.publish(session(w, "long", [" ".join(parts)]))
    n = wait_for(lambda: stack.sql("SELECT count(*) FROM drawers WHERE workspace_id = %s", (w,))[0][0],
                 what="chunks")
    assert n >= 3
    stack.wait_processed(w, n)
    assert all(len(r[0]) <= 800 for r in stack.sql("SELECT content FROM drawers WHERE workspace_id = %s", (w,)))
    hits = stack.search(w, "Helios launch code name", k=3)
    assert any("Blue Heron" in h["content"] for h in hits)


def test_workspaces_never_see_each_other(stack: Stack) -> None:
    a, b = ws(), ws()
    stack.publish(session(a, "s", ["Our office wifi password rotation happens every Monday at nine."]))
    stack.publish(session(b, "s", ["The quarterly roadmap review moved to the Lisbon office."]))
    stack.wait_processed(a, 1)
    stack.wait_processed(b, 1)
    for q in ["wifi password", "roadmap review Lisbon", "office"]:
        in_a, in_b = stack.search(a, q, k=10), stack.search(b, q, k=10)
        # Each finds its own (so the checks below are not met by finding nothing at all), never the other's.
        assert any("wifi" in h["content"] for h in in_a) and any("roadmap" in h["content"] for h in in_b), q
        assert not any("roadmap" in h["content"] for h in in_a) and not any("wifi" in h["content"] for h in in_b)
    assert stack.search(ws(), "office", k=10) == []


def test_episode_and_entities_follow(stack: Stack) -> None:
    w = ws()
    stack.publish(session(w, "s1", ["Maria and Tomás decided to move the Orion launch to Lisbon in March.",
                                    "I feel relieved that the Orion launch is finally settled."]))
    wait_for(lambda: stack.sql("SELECT count(*) FROM episodes WHERE workspace_id = %s AND status = 'ready'",
                               (w,))[0][0] == 1, what="episode")
    summary, topics = stack.sql("SELECT summary, topics FROM episodes WHERE workspace_id = %s", (w,))[0]
    assert "Orion" in summary and "orion" in topics
    names = wait_for(lambda: {r[0] for r in stack.sql("SELECT name FROM entities WHERE workspace_id = %s", (w,))},
                     what="entities")
    assert {"Maria", "Tomás", "Orion", "Lisbon"} <= names
    wait_for(lambda: stack.sql("SELECT max(mention_count) FROM entities WHERE workspace_id = %s AND name = 'Orion'",
                               (w,))[0][0] == 2, what="mention counts")


def test_openapi_documents_search(stack: Stack) -> None:
    import httpx

    spec = httpx.get(f"{stack.api_url}/openapi.json", timeout=10).json()
    assert "/v1/search" in spec["paths"] and "/v1/sessions" in spec["paths"]


def test_http_write_path_and_body_limit(stack: Stack) -> None:
    import httpx

    w = ws()
    ev = session(w, "http", ["I switched my team to trunk-based development."])
    r = httpx.post(f"{stack.api_url}/v1/sessions", json=ev, timeout=30)
    assert r.status_code == 202, r.text
    stack.wait_processed(w, 1)
    r = httpx.post(f"{stack.api_url}/v1/sessions", content=b"x" * (stack.settings.max_request_bytes + 1),
                   headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == 413
    r = httpx.post(f"{stack.api_url}/v1/search", json={"workspace_id": "bad ws", "query": "x"}, timeout=30)
    assert r.status_code == 422
    assert json.loads(r.text)["detail"]


def test_near_duplicates_merge_into_the_older_drawer_only(stack: Stack) -> None:
    w = ws()
    stack.publish(session(w, "s1", ["We moved the weekly sync to Thursdays at 10am."]))
    stack.wait_processed(w, 1)
    stack.publish(session(w, "s2", ["we moved the weekly sync to thursdays at 10am!",
                                    "We moved the weekly retro to Fridays at 4pm."]))
    wait_for(lambda: stack.sql("SELECT count(*) FROM drawers WHERE workspace_id = %s AND state = 'merged'",
                               (w,))[0][0] == 1, what="merge")
    rows = dict(stack.sql("SELECT content, state FROM drawers WHERE workspace_id = %s", (w,)))
    assert rows["We moved the weekly sync to Thursdays at 10am."] == "processed"
    assert rows["we moved the weekly sync to thursdays at 10am!"] == "merged"
    assert rows["We moved the weekly retro to Fridays at 4pm."] == "processed", "similar but different: kept"
    hits = stack.search(w, "when is the weekly sync", k=10)
    assert sum("weekly sync" in h["content"].lower() for h in hits) == 1
    merges = stack.sql("SELECT id, drawer_id FROM memory_history WHERE workspace_id = %s AND action = 'MERGE'", (w,))
    assert len(merges) == 1
    # Audited with its prior state, so an operator can undo it: the twin is a live drawer again.
    import os
    import subprocess
    import sys

    env = {**os.environ, "PALACE_DATABASE_URL": stack.database_url, "PALACE_NATS_URL": stack.nats_url}
    out = subprocess.run([sys.executable, "-m", "services.cli", "revert", merges[0][0], "-w", w], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert stack.sql("SELECT state, cluster_id FROM drawers WHERE workspace_id = %s AND id = %s",
                     (w, merges[0][1])) == [("processed", None)]
    assert sum("weekly sync" in h["content"].lower() for h in stack.search(w, "when is the weekly sync", k=10)) == 2


async def test_large_workspace_path_uses_hnsw_and_lexeme_pairs(stack: Stack) -> None:
    """The code path for workspaces above exact_max: HNSW candidates and pairwise full-text matching."""
    import asyncio

    from shared.adapters import build_embedder
    from shared.db.pool import open_pool
    from shared.db.search import SearchParams, hybrid_search
    from shared.db.tenancy import workspace_tx

    w = ws()
    # The helpers are synchronous (they run their own event loop): keep them off this test's loop.
    await asyncio.to_thread(stack.publish, session(w, "s1", TEXTS))
    await asyncio.to_thread(stack.wait_processed, w, 4)
    pool = await open_pool(stack.database_url, name="test", max_size=1)
    emb = build_embedder(stack.settings)
    try:
        query = "why does the nightly export fail"
        vec = await emb.embed_query(query)
        async with workspace_tx(pool, w) as conn:
            hnsw = await hybrid_search(conn, w, query, vec, SearchParams(k=3, exact_max=0), workspace_size=10**6)
            exact = await hybrid_search(conn, w, query, vec, SearchParams(k=3), workspace_size=4)
            text_only = await hybrid_search(conn, w, query, None, SearchParams(k=3, exact_max=0), workspace_size=10**6)
        assert "timeout error" in hnsw[0].content and "timeout error" in exact[0].content
        # Full text alone, with lexeme pairs: 'nightly' & 'export' both occur in the right drawer only.
        assert [h.content for h in text_only] == [TEXTS[4]]
    finally:
        await pool.close()
        await emb.aclose()


def test_a_date_in_the_query_finds_what_happened_then(stack: Stack) -> None:
    """Two near-identical memories months apart: the one inside the window the question names ranks first."""
    w = ws()

    def on(day: str, sid: str, texts: list[str]) -> dict[str, object]:
        ev = session(w, sid, texts, started_at=f"{day}T09:00:00Z", completed_at=f"{day}T09:30:00Z")
        for m in ev["messages"]:
            m["created_at"] = f"{day}T09:00:00Z"
        return ev

    stack.publish(on("2025-03-14", "march", ["I repainted the kitchen cabinets a pale green this weekend."]))
    stack.publish(on("2025-09-02", "sept", ["I repainted the kitchen cabinets a deep blue this weekend."]))
    stack.publish(on("2025-06-20", "june", ["The dentist appointment moved to the afternoon."]))
    stack.wait_processed(w, 3)
    top = stack.search(w, "What colour did I paint the kitchen cabinets in September 2025?", k=3)
    assert "deep blue" in top[0]["content"]
    top = stack.search(w, "What colour did I paint the kitchen cabinets in March 2025?", k=3)
    assert "pale green" in top[0]["content"]


def test_a_redelivery_announces_the_drawers_an_earlier_attempt_stored_but_never_announced(stack: Stack) -> None:
    """An ingest attempt that committed its rows and died before publishing leaves them raw: the event's
    redelivery stores nothing new, finds them still raw in the same statement, and announces them."""
    import asyncio

    from shared.config import Settings
    from shared.db.pool import open_pool
    from shared.db.sessions import store_session
    from shared.db.tenancy import workspace_tx
    from shared.events import SessionCompleted
    from shared.memory.filing import plan_session

    w = ws()
    body = session(w, "s-crashed", ["my cello lesson moved to thursday at five",
                                    "then I will bring the rosin and the spare strings"])
    settings = Settings()
    plan = plan_session(SessionCompleted.model_validate(body), chunk_chars=settings.chunk_chars,
                        chunk_overlap=settings.chunk_overlap, min_chars=settings.min_chars)
    ids = [d.id for d in plan.drawers]

    async def attempt() -> tuple[list[str], list[str]]:
        pool = await open_pool(stack.database_url, name="test-crashed-ingest", max_size=1)
        try:
            async with workspace_tx(pool, w) as conn:
                stored = await store_session(conn, plan)
            return stored.created, stored.raw
        finally:
            await pool.close()

    assert asyncio.run(attempt()) == (ids, ids)  # the first attempt: all new, all raw
    # Never announced: touched in the future, lest the stack's maintain re-drive them (as stuck) before the
    # second attempt looks.
    stack.sql("UPDATE drawers SET updated_at = now() + interval '1 day' WHERE workspace_id = %s RETURNING 1", (w,))
    assert asyncio.run(attempt()) == ([], ids)  # again: nothing new, all still raw (never announced)
    assert stack.sql("SELECT count(*) FROM drawer_sources WHERE workspace_id = %s", (w,)) == [(len(plan.sources),)]
    stack.publish(body)  # the redelivery, through the running ingest
    stack.wait_processed(w, len(ids))
    assert stack.sql("SELECT count(*) FROM drawers WHERE workspace_id = %s", (w,)) == [(len(ids),)]
    assert stack.sql("SELECT count(*) FROM messages WHERE workspace_id = %s", (w,)) == [(2,)]
