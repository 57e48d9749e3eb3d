"""An embed batch that computed its vectors in a space `palace reembed` switched away from meanwhile saves
nothing: its transaction is rolled back and the batch runs again in the active space (real PostgreSQL)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from shared.events import DrawerCreated, SessionCompleted
from tests.integration.helpers import Stack, session, ws

pytestmark = pytest.mark.integration


class _Raw:
    """What the batch handler reads of a NATS message: its data and whether it was acked."""

    def __init__(self, data: bytes) -> None:
        self.data, self._ackd = data, False

    async def ack(self) -> None:
        self._ackd = True


def test_a_batch_embedded_in_a_space_switched_away_from_is_rolled_back_and_runs_again(
        stack: Stack, monkeypatch: pytest.MonkeyPatch) -> None:
    from services._runtime import Deps
    from services.embed import handlers
    from shared.adapters.space_embedder import SpaceEmbedder, SpaceSwitched
    from shared.bus import build_broker
    from shared.consumers import consumer_for
    from shared.db.pool import open_pool
    from shared.db.sessions import store_session
    from shared.db.tenancy import workspace_tx
    from shared.memory.filing import plan_session

    w, s = ws(), stack.settings
    event = SessionCompleted.model_validate(session(w, "s1", ["The greenhouse heater starts below four degrees."]))

    async def go() -> tuple[bool, list[tuple[Any, ...]]]:
        pool = await open_pool(stack.database_url, name="test-space-guard", max_size=2, role=s.db_role)
        broker = build_broker(s, "embed", stack.nats_url)
        await broker.connect()
        embedder = await SpaceEmbedder.open(s, pool)
        try:
            async with workspace_tx(pool, w) as conn:
                stored = await store_session(conn, plan_session(event))
                # Never announced: touched in the future, lest the stack's maintain re-drive it as stuck.
                await conn.execute("UPDATE drawers SET updated_at = now() + interval '1 day' WHERE workspace_id = %s",
                                   (w,))
            deps = Deps(s, "embed", pool, broker, embedder=embedder)
            handlers.register(deps)
            on_created = deps.handlers[consumer_for("embed", DrawerCreated.subject).durable]
            body = DrawerCreated(event_id="guard", workspace_id=w, session_id="s1",
                                 drawer_ids=stored.raw).model_dump_json().encode()
            real = handlers.pin_space

            async def pinned_before_the_switch(e: Any) -> tuple[Any, str | None]:
                current, _ = await real(e)
                return current, "a-space-switched-away-from"

            monkeypatch.setattr(handlers, "pin_space", pinned_before_the_switch)
            refused = False
            try:
                await on_created([body], [_Raw(body)])
            except SpaceSwitched:
                refused = True
            after_switch = stack.sql("SELECT embedding IS NULL FROM drawers WHERE workspace_id = %s", (w,))
            monkeypatch.setattr(handlers, "pin_space", real)
            await on_created([body], [_Raw(body)])
            return refused, after_switch
        finally:
            await embedder.aclose()
            await broker.stop()
            await pool.close()

    refused, after_switch = asyncio.run(go())
    assert refused and after_switch == [(True,)], "nothing saved from the former space"
    assert stack.sql("SELECT embedding IS NOT NULL, embedding_model FROM drawers WHERE workspace_id = %s",
                     (w,))[0][0], "embedded again, in the active space"
