"""Batches of episodes extracted side by side (enrich-kg without a model runs several batches at once,
each in one transaction) against real PostgreSQL and NATS: batches that name the same new entities in
opposite orders finish without a deadlock, so none waits out ``deadlock_timeout`` and runs again, and
what they store is what storing the episodes one by one stores."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from shared.events import EpisodicCreated, SessionCompleted
from shared.ids import stable_id
from tests.integration.helpers import Stack, ws

ROUNDS = 6


def _session(w: str, sid: str, names: list[str]) -> SessionCompleted:
    text = " ".join(f"I met {n} at the harbour yesterday, on the {sid} trip." for n in names)
    return SessionCompleted.model_validate({
        "workspace_id": w, "session_id": sid, "agent_id": "agent-1", "user_id": "user-1",
        "messages": [{"role": "user", "name": "Jon", "content": text, "created_at": "2024-03-01T10:00:00Z"}],
        "started_at": "2024-03-01T10:00:00Z", "completed_at": "2024-03-01T10:05:00Z", "metadata": {}})


def _episode(w: str, sid: str) -> EpisodicCreated:
    eid = stable_id("episode", w, sid)
    return EpisodicCreated(event_id=stable_id("test-episode", eid), workspace_id=w, episode_id=eid, session_id=sid,
                           summary="s", abstract="a")


def test_batches_naming_the_same_new_entities_in_opposite_orders_do_not_deadlock(
    stack: Stack, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from services._runtime import Deps
    from services.enrich import handlers
    from shared.bus import build_broker
    from shared.db.pool import open_pool
    from shared.db.sessions import store_session
    from shared.db.tenancy import workspace_tx
    from shared.memory.filing import plan_session

    w = ws()
    s = stack.settings
    # Round r: batch one stores A_r then B_r (sessions a < b), batch two B_r then A_r (sessions c < d).
    rounds = [(f"Quorlan{r}x", f"Ardithe{r}x") for r in range(ROUNDS)]
    sessions = {}
    for r, (a, b) in enumerate(rounds):
        sessions |= {f"r{r}-a": [a], f"r{r}-b": [b], f"r{r}-c": [b], f"r{r}-d": [a]}
    attempts: list[int] = []
    real_retry = handlers.retry_conflicts

    def counted() -> AsyncIterator[Any]:
        async def each() -> AsyncIterator[Any]:
            async for attempt in real_retry():
                attempts.append(1)
                yield attempt
        return each()

    monkeypatch.setattr(handlers, "retry_conflicts", counted)

    async def go() -> None:
        pool = await open_pool(stack.database_url, name="test-kg-batch", max_size=4, role=s.db_role)
        broker = build_broker(s, "enrich", stack.nats_url)
        await broker.connect()
        try:
            for sid, names in sessions.items():
                async with workspace_tx(pool, w) as conn:
                    await store_session(conn, plan_session(_session(w, sid, names)))
                    # Never announced, so raw for good: touched in the future, lest the stack's maintain
                    # re-drive them as stuck and classify's writes to them meet this test's transactions.
                    await conn.execute("UPDATE drawers SET updated_at = now() + interval '1 day'"
                                       " WHERE workspace_id = %s AND session_id = %s", (w, sid))
            deps = Deps(s, "enrich", pool, broker)
            for r in range(ROUNDS):
                one = [_episode(w, f"r{r}-a"), _episode(w, f"r{r}-b")]
                two = [_episode(w, f"r{r}-c"), _episode(w, f"r{r}-d")]
                await asyncio.gather(handlers.extract_episodes(deps, one), handlers.extract_episodes(deps, two))
        finally:
            await broker.stop()
            await pool.close()

    asyncio.run(go())
    # Each batch: one transaction for its episodes, one for its entities' counts; nothing run twice.
    assert len(attempts) == 2 * 2 * ROUNDS, f"{len(attempts) - 4 * ROUNDS} transactions ran again"
    for a, b in rounds:
        rows = stack.sql(
            "SELECT e.name, e.mention_count FROM entities e WHERE e.workspace_id = %s AND e.name = ANY(%s)"
            " ORDER BY e.name", (w, [a, b]))
        assert rows == sorted([(a, 2), (b, 2)]), rows
        aliases = stack.sql("SELECT count(*) FROM entity_aliases WHERE workspace_id = %s AND alias = ANY(%s)",
                            (w, [a, b]))
        assert aliases == [(2,)]
