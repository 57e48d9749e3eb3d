"""Subscribers of the classify service."""

from __future__ import annotations

from nats.aio.msg import Msg

from services._runtime import Deps
from shared.bus import decode_event, publish_event
from shared.db.drawers import drawers_by_id, save_classifications
from shared.db.tenancy import workspace_tx
from shared.events import DrawerClassified, DrawerEmbedded
from shared.ids import event_id_for
from shared.memory.classify import classify
from shared.metrics import DRAWERS

__all__ = ["DURABLE", "register"]

DURABLE = "classify"


def register(deps: Deps) -> None:
    s = deps.settings

    @deps.handle(DURABLE)
    async def on_drawer_embedded(body: bytes, raw: Msg) -> None:
        """drawer.embedded → (classify, then commit) → drawer.classified."""
        ev: DrawerEmbedded = decode_event(DrawerEmbedded, body, s)
        async with workspace_tx(deps.pool, ev.workspace_id) as conn:
            # 'failed' too: maintain gives up on drawers raw for too long, even when their events were
            # only queued behind a backlog; when the work does arrive, it completes them.
            rows = [r for r in await drawers_by_id(conn, ev.workspace_id, ev.drawer_ids)
                    if r.state in ("raw", "failed")]
        outcomes = []
        for r in rows:
            c = classify(r.content)
            outcomes.append({"id": r.id, "memory_type": c.memory_type, "confidence": c.confidence,
                             "importance": c.importance, "tier": "heuristic"})
        if outcomes:
            async with workspace_tx(deps.pool, ev.workspace_id) as conn:
                await save_classifications(conn, ev.workspace_id, outcomes, event_id=ev.event_id, actor="classify")
        DRAWERS.labels(deps.service, "processed").inc(len(outcomes))
        await publish_event(deps.broker, s, DrawerClassified(
            event_id=event_id_for("drawer.classified", ev.event_id), workspace_id=ev.workspace_id,
            session_id=ev.session_id, drawer_ids=ev.drawer_ids,
        ))
