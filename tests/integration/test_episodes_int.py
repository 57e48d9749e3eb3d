"""Episodes are built once their session's drawers are embedded, exactly once, and replays change nothing."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import nats
import numpy as np
import psycopg

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
            for durable in ("enrich", "enrich-episode"):
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
