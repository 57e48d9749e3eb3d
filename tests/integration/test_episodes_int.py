"""Episodes are built once their session's drawers are embedded, exactly once, and replays change nothing."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import nats
import numpy as np
import psycopg
import pytest

from shared.consumers import CONSUMERS
from shared.db.episodes import SessionDrawers
from shared.ids import stable_id
from tests.integration.helpers import Stack, session, wait_for, ws

TURNS = [
    "Maria and Tomás decided to move the Orion launch to Lisbon in March, after the budget review.",
    "I feel relieved that the Orion launch is finally settled; the Lisbon office can host the team.",
    "We still need to book the venue and tell the marketing team about the new date.",
    "Tomás will draft the announcement for the Orion launch by Friday and share it with Maria.",
]


def _enrich_idle(stack: Stack) -> bool:
    async def go() -> bool:
        nc = await nats.connect(stack.nats_url)
        try:
            js = nc.jetstream()
            # Every consumer: a replayed session.completed still in ingest would reach enrich later.
            for durable in [c.durable for c in CONSUMERS]:
                info = await js.consumer_info(stack.settings.stream_name, durable)
                if info.num_pending or info.num_ack_pending:
                    return False
            return True
        finally:
            await nc.close()
    return asyncio.run(go())


async def test_one_episode_per_session_built_after_its_drawers_are_embedded(stack: Stack) -> None:
    w = ws()
    announced: list[dict[str, Any]] = []

    async def seen(msg: Any) -> None:
        body = json.loads(msg.data)
        if body["workspace_id"] == w:
            announced.append(body)

    # A plain subscription sees every episodic.created published, without holding the stream's messages.
    nc = await nats.connect(stack.nats_url)
    await nc.subscribe("episodic.created", cb=seen)
    try:
        await asyncio.to_thread(stack.publish, session(w, "s1", TURNS))
        row = await asyncio.to_thread(wait_for, lambda: stack.sql(
            "SELECT id, status, summary, abstract, topics, embedding::real[], expires_at, announced_at, created_at"
            " FROM episodes WHERE workspace_id = %s AND announced_at IS NOT NULL", (w,)), 60, "an announced episode")
        assert len(row) == 1
        eid, status, summary, abstract, topics, embedding, expires_at, _, _ = row[0]
        assert status == "ready" and "Orion" in summary
        assert 0 < len(abstract) <= 200 and "orion" in topics
        assert expires_at - datetime.now(UTC) > timedelta(days=89)
        # Built from every drawer's vector: it is the normalised mean of the session's drawer embeddings.
        assert embedding is not None
        vecs = [np.asarray(r[0]) for r in stack.sql(
            "SELECT d.embedding::real[] FROM drawers d WHERE d.workspace_id = %s AND d.session_id = 's1'", (w,))]
        assert len(vecs) == len(TURNS) and all(v is not None for v in vecs)
        mean = np.mean(vecs, axis=0)
        assert np.allclose(np.asarray(embedding), mean / np.linalg.norm(mean), atol=1e-5)
        await asyncio.to_thread(wait_for, lambda: announced, 10, "episodic.created")
        assert [e["episode_id"] for e in announced] == [eid]

        # Replays: the session itself, its session.stored and its drawer.embedded (no de-duplication
        # ids, so the stream takes every copy) change nothing and announce nothing again.
        drawer_ids = [r[0] for r in stack.sql("SELECT id FROM drawers WHERE workspace_id = %s", (w,))]
        await asyncio.to_thread(stack.publish, session(w, "s1", TURNS))
        await asyncio.to_thread(stack.publish, {
            "event_id": "replay-1", "workspace_id": w, "session_id": "s1", "message_count": len(TURNS),
            "drawer_ids": drawer_ids}, "session.stored")
        await asyncio.to_thread(stack.publish, {
            "event_id": "replay-2", "workspace_id": w, "session_id": "s1", "drawer_ids": drawer_ids},
            "drawer.embedded")
        await asyncio.sleep(1.0)
        await asyncio.to_thread(wait_for, lambda: _enrich_idle(stack), 30, "enrich to drain the replays")
        after = stack.sql("SELECT id, status, summary, abstract, topics, embedding::real[], expires_at, announced_at,"
                          " created_at FROM episodes WHERE workspace_id = %s", (w,))
        assert after == row
        assert [e["episode_id"] for e in announced] == [eid]
    finally:
        await nc.close()


def test_drawers_embedded_while_the_episode_opens_still_complete_it(
    stack: Stack, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The lost wake-up: session.stored reads its drawers unembedded; before its transaction commits they
    are embedded and their drawer.embedded is handled, which cannot see the episode yet. The episode is
    built all the same, at once, not after the sweep's ``episode_wait_s``."""
    from services._runtime import Deps
    from services.enrich import handlers
    from shared.bus import build_broker
    from shared.consumers import consumer_for
    from shared.db.pool import open_pool
    from shared.db.sessions import store_session
    from shared.db.tenancy import workspace_tx
    from shared.events import DrawerEmbedded, SessionCompleted, SessionStored
    from shared.memory.filing import plan_session

    w, s = ws(), stack.settings
    event = SessionCompleted.model_validate(session(w, "s1", TURNS[:2]))
    handled: list[str] = []

    async def go() -> None:
        pool = await open_pool(stack.database_url, name="test-episode-race", max_size=4, role=s.db_role)
        broker = build_broker(s, "enrich", stack.nats_url)
        await broker.connect()
        try:
            async with workspace_tx(pool, w) as conn:
                stored = await store_session(conn, plan_session(event))
                # Never announced: touched in the future, lest the stack's maintain re-drive them as stuck.
                await conn.execute("UPDATE drawers SET updated_at = now() + interval '1 day'"
                                   " WHERE workspace_id = %s", (w,))
            deps = Deps(s, "enrich", pool, broker)
            handlers.register(deps)
            on_stored = deps.handlers[consumer_for("enrich", SessionStored.subject).durable]
            on_embedded = deps.handlers[consumer_for("enrich", DrawerEmbedded.subject).durable]
            real = handlers.episode_progress

            async def embedded_meanwhile(conn: Any, workspace_id: str, episode_id: str) -> Any:
                progress = await real(conn, workspace_id, episode_id)
                if progress is not None and progress.unembedded and not handled:
                    async with workspace_tx(pool, w) as other:
                        await other.execute("UPDATE drawers SET embedding = %s::vector WHERE workspace_id = %s",
                                            ("[" + ",".join(["0.05"] * s.embed_dim) + "]", w))
                    await on_embedded(DrawerEmbedded(event_id="race", workspace_id=w, drawer_ids=stored.raw)
                                      .model_dump_json().encode(), None)
                    handled.append(episode_id)
                return progress

            monkeypatch.setattr(handlers, "episode_progress", embedded_meanwhile)
            await on_stored(SessionStored(event_id="stored", workspace_id=w, session_id="s1", message_count=2,
                                          drawer_ids=stored.raw).model_dump_json().encode(), None)
        finally:
            await broker.stop()
            await pool.close()

    asyncio.run(go())
    assert handled, "the drawers were embedded between the episode's first read and its commit"
    rows = stack.sql("SELECT status, announced_at IS NOT NULL FROM episodes WHERE workspace_id = %s", (w,))
    assert rows == [("ready", True)], rows


def test_an_episode_whose_drawers_never_embed_is_built_after_the_wait(stack: Stack) -> None:
    """A drawer that is never embedded (embedding keeps failing) does not hold its episode back
    forever: the enrich sweep builds it from what there is, without any event."""
    w = ws()
    text = "The Kestrel migration is blocked until the vendor ships the new firmware image."
    with psycopg.connect(stack.database_url, autocommit=True) as admin:
        admin.execute("INSERT INTO sessions (workspace_id, session_id, event_id, message_count, content_hash)"
                      " VALUES (%s, 's1', 'ev', 1, 'h')", (w,))
        admin.execute("INSERT INTO drawers (workspace_id, id, content, content_hash, session_id, seq, retry_count)"
                      " VALUES (%s, %s, %s, 'c', 's1', 0, 3)", (w, "d" * 32, text))
        admin.execute("INSERT INTO drawer_sources (workspace_id, drawer_id, session_id, seq) VALUES (%s, %s, 's1', 0)",
                      (w, "d" * 32))
        admin.execute("INSERT INTO episodes (workspace_id, id, session_id, summary, abstract, status, source_hash,"
                      " pending_since) VALUES (%s, %s, 's1', '', '', 'pending', 'x', now() - interval '1 hour')",
                      (w, stable_id("episode", w, "s1")))
    summary, embedding = wait_for(lambda: stack.sql(
        "SELECT summary, embedding FROM episodes WHERE workspace_id = %s AND announced_at IS NOT NULL", (w,)),
        30, "the overdue episode")[0]
    assert "Kestrel" in summary and embedding is None


async def test_episodes_are_searchable_by_embedding_until_they_expire(stack: Stack) -> None:
    from shared.db.episodes import search_episodes
    from shared.db.pool import open_pool
    from shared.db.tenancy import workspace_tx

    w = ws()
    await asyncio.to_thread(stack.publish, session(w, "s1", TURNS[:2]))
    await asyncio.to_thread(stack.publish, session(w, "s2", ["The quarterly tax filing is due on the 15th; "
                                                             "Ana will collect the receipts from accounting."]))
    rows = await asyncio.to_thread(wait_for, lambda: (r := stack.sql(
        "SELECT id, session_id, embedding::real[] FROM episodes WHERE workspace_id = %s AND status = 'ready'"
        " ORDER BY session_id", (w,))) and len(r) == 2 and r, 60, "two episodes")
    by_session = {sid: (eid, np.asarray(v, dtype=np.float32)) for eid, sid, v in rows}
    pool = await open_pool(stack.database_url, name="test-episodes", max_size=1)
    try:
        async with workspace_tx(pool, w) as c:
            hits = await search_episodes(c, w, by_session["s2"][1], k=5)
        assert [h.session_id for h in hits] == ["s2", "s1"]
        assert hits[0].score > 0.999 and hits[0].score > hits[1].score and "tax" in hits[0].summary
        async with workspace_tx(pool, ws()) as c:
            assert await search_episodes(c, w, by_session["s2"][1]) == []  # another workspace sees none
        with psycopg.connect(stack.database_url, autocommit=True) as admin:
            admin.execute("UPDATE episodes SET expires_at = now() - interval '1 day'"
                          " WHERE workspace_id = %s AND session_id = 's2'", (w,))
        async with workspace_tx(pool, w) as c:
            assert [h.session_id for h in await search_episodes(c, w, by_session["s2"][1])] == ["s1"]
    finally:
        await pool.close()


def _search(stack: Stack, w: str, query: str, **kw: Any) -> dict[str, Any]:
    r = httpx.post(f"{stack.api_url}/v1/search", json={"workspace_id": w, "query": query, "k": 5, **kw}, timeout=30)
    r.raise_for_status()
    return r.json()  # type: ignore[no-any-return]


def _ranked(hits: list[dict[str, Any]]) -> list[tuple[str, str, float]]:
    return [(h["id"], h["citation"], round(h["score"], 3)) for h in hits]


TAX = "The quarterly tax filing is due on the 15th; Ana will collect the receipts from accounting."


def test_search_returns_the_sessions_episodes_on_request(stack: Stack) -> None:
    """include_episodes adds the nearest built, unexpired episodes of the workspace, scored on the drawers'
    band and citing their drawers; the drawer hits are the same with or without; default output has none."""
    w, other = ws(), ws()
    stack.publish(session(w, "s1", TURNS[:2]))
    stack.publish(session(w, "s2", [TAX]))
    stack.publish(session(other, "s2", [TAX]))  # the same words elsewhere: its episode would match best
    wait_for(lambda: stack.sql("SELECT count(*) FROM episodes WHERE workspace_id = ANY(%s) AND status = 'ready'"
                               " AND embedding IS NOT NULL", ([w, other],))[0][0] == 3, 60, "three episodes")
    question = "When is the quarterly tax filing due?"

    plain = _search(stack, w, question)
    assert plain["episodes"] is None and plain["hits"]
    both = _search(stack, w, question, include_episodes=True)
    assert _ranked(both["hits"]) == _ranked(plain["hits"]), "episodes never change the drawer ranking"
    eps = both["episodes"]
    assert [e["session_id"] for e in eps] == ["s2", "s1"], "best first; never another workspace's"
    assert [e["episode_id"] for e in eps] == [stable_id("episode", w, "s2"), stable_id("episode", w, "s1")]
    top = eps[0]
    assert "tax" in top["summary"].lower() and 0 < len(top["abstract"]) <= 200 and top["topics"]
    assert (top["agent_id"], top["user_id"]) == ("agent-1", "user-1")
    assert top["started_at"].startswith("2026-11-01T10:00") and top["completed_at"].startswith("2026-11-01T10:30")
    assert 1.0 >= top["score"] >= eps[1]["score"] >= 0.0 and top["cosine"] > eps[1]["cosine"]
    # The score is the cosine on the drawers' vector band (0.78 → 0, 0.90 → 1 by default, clipped).
    lo, hi = stack.settings.recall_cos_floor, stack.settings.recall_cos_ceiling
    for e in eps:
        assert abs(e["score"] - min(1.0, max(0.0, (e["cosine"] - lo) / (hi - lo)))) < 1e-3
    # Its citations are the session's drawers, and resolve to them.
    s2_drawers = [r[0] for r in stack.sql("SELECT drawer_id FROM drawer_sources WHERE workspace_id = %s"
                                          " AND session_id = 's2'", (w,))]
    assert top["drawer_ids"] == s2_drawers and top["drawer_count"] == 1 and len(top["drawers"]) == 1
    read = httpx.get(f"{stack.api_url}/v1/workspaces/{w}/palace/citations/{top['drawers'][0]}", timeout=30)
    assert read.status_code == 200 and read.json()["content"] == TAX
    assert eps[1]["drawer_count"] == 2 and len(eps[1]["drawers"]) == 2

    # GET takes the same options; episodes_k bounds the list and is itself bounded.
    got = httpx.get(f"{stack.api_url}/v1/search", params={"workspace_id": w, "q": question, "include_episodes": True,
                                                          "episodes_k": 1}, timeout=30)
    assert got.status_code == 200 and [e["session_id"] for e in got.json()["episodes"]] == ["s2"]
    assert httpx.post(f"{stack.api_url}/v1/search", json={"workspace_id": w, "query": question,
                                                           "include_episodes": True, "episodes_k": 500},
                      timeout=30).status_code == 422

    # Expired and unbuilt episodes are not returned.
    with psycopg.connect(stack.database_url, autocommit=True) as admin:
        admin.execute("UPDATE episodes SET expires_at = now() - interval '1 second'"
                      " WHERE workspace_id = %s AND session_id = 's2'", (w,))
    assert [e["session_id"] for e in _search(stack, w, question, include_episodes=True)["episodes"]] == ["s1"]
    with psycopg.connect(stack.database_url, autocommit=True) as admin:
        admin.execute("UPDATE episodes SET status = 'pending' WHERE workspace_id = %s AND session_id = 's1'", (w,))
    assert _search(stack, w, question, include_episodes=True)["episodes"] == []
    assert [e["session_id"] for e in _search(stack, other, question, include_episodes=True)["episodes"]] == ["s2"]


def test_a_deleted_turn_leaves_its_episode_and_comes_back_with_a_restore(stack: Stack) -> None:
    """The extractive summary quotes turns: deleting one takes the episode out of search at once, and it
    comes back rebuilt without the turn (a new episodic.created); a restore puts the turn back in it."""
    w = ws()
    secret = "The spare key to the Orion office is taped under the third drawer of Maria's desk."
    stack.publish(session(w, "s1", [TURNS[0], secret, TURNS[3]]))
    eid = stable_id("episode", w, "s1")
    summary = "SELECT status, summary FROM episodes WHERE workspace_id = %s AND id = %s"

    def built() -> str | None:
        rows = stack.sql(summary, (w, eid))
        return rows[0][1] if rows and rows[0][0] == "ready" else None

    assert "spare key" in wait_for(built, 60, "the episode")
    (did,) = stack.sql("SELECT id FROM drawers WHERE workspace_id = %s AND content = %s", (w, secret))[0]
    question = "Where is the spare key to the Orion office?"
    assert [e["session_id"] for e in _search(stack, w, question, include_episodes=True)["episodes"]] == ["s1"]
    r = httpx.delete(f"{stack.api_url}/v1/workspaces/{w}/palace/drawers/{did}", timeout=30)
    assert r.status_code == 200 and r.json()["deleted"]
    assert all("spare key" not in e["summary"] for e in _search(stack, w, question, include_episodes=True)["episodes"])
    rebuilt = wait_for(built, 60, "the episode rebuilt without the deleted turn")
    assert "spare key" not in rebuilt and "Orion launch" in rebuilt
    assert httpx.post(f"{stack.api_url}/v1/workspaces/{w}/palace/drawers/{did}/restore", timeout=30).json()["restored"]
    wait_for(lambda: "spare key" in (built() or ""), 60, "the episode rebuilt with the restored turn")


async def test_episode_citations_stay_in_their_workspace(stack: Stack) -> None:
    """Under row-level security a transaction of one workspace reads none of another's episodes or
    drawers, even when it names that workspace."""
    from shared.db.episodes import search_episodes, session_drawers
    from shared.db.pool import open_pool
    from shared.db.tenancy import workspace_tx

    w = ws()
    await asyncio.to_thread(stack.publish, session(w, "s1", [TAX]))
    vec = (await asyncio.to_thread(wait_for, lambda: stack.sql(
        "SELECT embedding::real[] FROM episodes WHERE workspace_id = %s AND status = 'ready'"
        " AND embedding IS NOT NULL", (w,)), 60, "an episode"))[0][0]
    pool = await open_pool(stack.database_url, name="test-episodes", max_size=1)
    try:
        async with workspace_tx(pool, w) as c:
            assert [h.session_id for h in await search_episodes(c, w, np.asarray(vec))] == ["s1"]
            assert (await session_drawers(c, w, ["s1"]))["s1"].total == 1
        async with workspace_tx(pool, ws()) as c:
            assert await search_episodes(c, w, np.asarray(vec)) == []
            assert (await session_drawers(c, w, ["s1"]))["s1"] == SessionDrawers([], 0)
    finally:
        await pool.close()


def test_episode_search_plan_is_bounded_by_its_index(stack: Stack) -> None:
    """At a size where a sequential scan would show (tens of thousands of episodes over many workspaces,
    statistics up to date), recall's episode statement reads one workspace's most recent built episodes
    through the partial index of migration 0043, as the application role under row-level security."""
    from shared.db.episodes import _SEARCH_SQL, EPISODE_SCAN_MAX

    target = ws()
    others = [ws() for _ in range(19)]
    dim = stack.settings.embed_dim
    emb = "[" + ",".join(["0.05"] * dim) + "]"
    everyone = [target, *others]
    # More built episodes than the scan's cap in the workspace searched: where the bound matters, and
    # where reading the index in order beats sorting the workspace's rows by a margin the planner never
    # misses (with fewer than the cap, the two plans cost about the same and either may be picked).
    big = EPISODE_SCAN_MAX + 1_000
    with psycopg.connect(stack.database_url, autocommit=True) as admin:
        try:
            # promoted: dreaming leaves them alone; announced: the enrich sweep too.
            admin.execute(
                """INSERT INTO episodes (workspace_id, id, session_id, summary, abstract, status, embedding,
                                         completed_at, promoted_at, announced_at)
                   SELECT w, md5(w || g), 'plan-' || g, 'summary', 'abstract',
                          CASE WHEN g %% 10 = 0 THEN 'pending' ELSE 'ready' END, %s::vector,
                          now() - g * interval '1 minute', now(), now()
                     FROM unnest(%s::text[]) w,
                          generate_series(1, CASE WHEN w = %s THEN %s ELSE 1500 END) g""",
                (emb, everyone, target, big))
            admin.execute("ANALYZE episodes")
            with psycopg.connect(stack.database_url) as conn:
                conn.execute("SET ROLE palace_app")
                conn.execute("SELECT set_config('palace.workspace_id', %s, false)", (target,))
                params = {"q": emb, "ws": target, "k": 5, "scan": EPISODE_SCAN_MAX}
                plan = json.dumps(conn.execute("EXPLAIN (FORMAT JSON) " + _SEARCH_SQL, params).fetchall()[0][0])
                rows = conn.execute(_SEARCH_SQL, params).fetchall()
            assert "episodes_searchable" in plan and '"Seq Scan"' not in plan, plan
            assert len(rows) == 5 and {r[1] for r in rows} <= {f"plan-{g}" for g in range(1, big + 1) if g % 10}
        finally:
            admin.execute("DELETE FROM episodes WHERE workspace_id = ANY(%s)", (everyone,))
