"""Subscribers of the ingest service."""

from __future__ import annotations

from nats.aio.msg import Msg

from services._runtime import Deps
from shared.bus import Poison, decode_event, publish_event, session_limit_problem
from shared.db.forget import forgotten, writer_tx
from shared.db.kg import link_drawers
from shared.events import DrawerCreated, SessionCompleted, SessionStored
from shared.ids import event_id_for
from shared.ingest import file_session
from shared.logging import get_logger
from shared.memory.filing import plan_session
from shared.metrics import DRAWERS

__all__ = ["register"]

log = get_logger("palace.ingest")
_ANNOUNCE_CHUNK = 256


def register(deps: Deps) -> None:
    s = deps.settings

    @deps.handle(SessionCompleted)
    async def on_session_completed(body: bytes, raw: Msg) -> None:
        """session.completed → (commit raw rows) → drawer.created, session.stored."""
        event: SessionCompleted = decode_event(SessionCompleted, body, s)
        if problem := session_limit_problem(event, s):
            raise Poison(problem)
        # No per-message length limit: a long message is chunked like any other (decode_event already
        # bounded the whole event by max_event_bytes).
        plan = plan_session(event, chunk_chars=s.chunk_chars, chunk_overlap=s.chunk_overlap, min_chars=s.min_chars)
        async with writer_tx(deps.pool, event.workspace_id) as conn:
            filed = await file_session(conn, plan, actor=deps.service, episode_wait_s=s.episode_wait_s)
        if filed is None:
            log.info("forgotten_session_refused", workspace=event.workspace_id, session=event.session_id)
            return
        plan, settled = filed.plan, filed.settled
        DRAWERS.labels(deps.service, "created").inc(len(filed.stored.created))
        if filed.revisions.edited or settled.revived:
            DRAWERS.labels(deps.service, "retired").inc(len(settled.retired))
            DRAWERS.labels(deps.service, "revived").inc(len(settled.revived))
            log.info("messages_edited", workspace=event.workspace_id, session=event.session_id,
                     messages=len(filed.revisions.edited), drawers_retired=len(settled.retired),
                     drawers_revived=len(settled.revived), recontexted=len(settled.recontexted))
        all_ids = [d.id for d in plan.drawers]
        # Every drawer of the session still raw is announced, not only the new ones: if an earlier attempt
        # committed and then died before publishing, this redelivery finishes its job. In the plan's order,
        # so a redelivery that finds the same drawers raw announces them under the same event ids.
        pending = filed.to_announce
        if all_ids:
            # Inline linker: the session's drawers → the workspace's existing entities they name (no LLM,
            # never a new entity). After the raw rows are committed; idempotent, so a redelivery completes it.
            async with writer_tx(deps.pool, event.workspace_id) as conn:
                # Forgotten since the commit above? Then its drawers are gone (or going: the forget waits
                # for this transaction and sees what it wrote); nothing is linked or announced.
                if await forgotten(conn, event.workspace_id, session_id=event.session_id, user_id=event.user_id,
                                   agent_id=event.agent_id):
                    log.info("forgotten_session_refused", workspace=event.workspace_id, session=event.session_id)
                    return
                await link_drawers(conn, event.workspace_id, [(d.id, d.content) for d in plan.drawers])
        for i in range(0, len(pending), _ANNOUNCE_CHUNK):
            ids = pending[i : i + _ANNOUNCE_CHUNK]
            await publish_event(deps.broker, s, DrawerCreated(
                event_id=event_id_for("drawer.created", event.event_id or "", *ids),
                workspace_id=event.workspace_id, session_id=event.session_id, drawer_ids=ids,
            ))
        await publish_event(deps.broker, s, SessionStored(
            event_id=event_id_for("session.stored", event.event_id or ""), workspace_id=event.workspace_id,
            session_id=event.session_id, message_count=filed.revisions.message_count, drawer_ids=all_ids,
        ))
