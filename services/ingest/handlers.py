"""Subscribers of the ingest service."""

from __future__ import annotations

from nats.aio.msg import Msg

from services._runtime import Deps
from shared.bus import Poison, decode_event, publish_event, session_limit_problem
from shared.db.episodes import reopen_episodes_of
from shared.db.forget import forgotten, forgotten_session_drawers, writer_tx
from shared.db.kg import link_drawers
from shared.db.sessions import known_messages, lock_session, revise_messages, settle_edits, store_session
from shared.events import DrawerCreated, SessionCompleted, SessionStored
from shared.forget import drop_forgotten_drawers
from shared.ids import event_id_for
from shared.logging import get_logger
from shared.memory.filing import plan_session
from shared.memory.revisions import sort_revisions
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
            # Forgotten (this session, its user or agent, the workspace, or drawers one by one)? An event
            # still in flight, redelivered or re-driven from the DLQ must not bring it back (shared.db.forget).
            gone, gone_drawers = await forgotten_session_drawers(
                conn, event.workspace_id, session_id=event.session_id, user_id=event.user_id,
                agent_id=event.agent_id, drawer_ids=[d.id for d in plan.drawers])
            if gone:
                log.info("forgotten_session_refused", workspace=event.workspace_id, session=event.session_id)
                return
            plan = drop_forgotten_drawers(plan, gone_drawers)
            # Published before? Then a position with new words is an edit (kept as a revision), and one
            # with words it held before is an earlier revision coming back (written again: nothing).
            await lock_session(conn, event.workspace_id, event.session_id)
            known = await known_messages(conn, event.workspace_id, event.session_id, [m.seq for m in plan.messages])
            revisions = sort_revisions(plan, known)
            plan = revisions.plan
            await revise_messages(conn, event.workspace_id, event.session_id, revisions.edited,
                                  event_id=event.event_id)
            stored = await store_session(conn, plan, message_count=revisions.message_count)
            created = set(stored.created)
            # What an edit changes beyond the messages: the old words' drawer retired, words an edit had
            # retired brought back where said again, the next turn's context (shared.db.sessions).
            settled = await settle_edits(
                conn, event.workspace_id, event.session_id, revisions, seen_before=bool(known),
                existing=[d.id for d in plan.drawers if d.id not in created], sighted=stored.sighted,
                event_id=event.event_id, actor=deps.service)
            for drawer in settled.retired:  # the session's episode quotes them: rebuilt without them
                await reopen_episodes_of(conn, event.workspace_id, drawer, change=event.event_id or "",
                                         due_after_s=s.episode_wait_s)
        DRAWERS.labels(deps.service, "created").inc(len(stored.created))
        if revisions.edited or settled.revived:
            DRAWERS.labels(deps.service, "retired").inc(len(settled.retired))
            DRAWERS.labels(deps.service, "revived").inc(len(settled.revived))
            log.info("messages_edited", workspace=event.workspace_id, session=event.session_id,
                     messages=len(revisions.edited), drawers_retired=len(settled.retired),
                     drawers_revived=len(settled.revived), recontexted=len(settled.recontexted))
        all_ids = [d.id for d in plan.drawers]
        # Every drawer of the session still raw is announced, not only the new ones: if an earlier attempt
        # committed and then died before publishing, this redelivery finishes its job. In the plan's order,
        # so a redelivery that finds the same drawers raw announces them under the same event ids.
        raw = set(stored.raw) | set(settled.recontexted) | {d for d, state in settled.revived if state == "raw"}
        pending = [i for i in all_ids if i in raw]
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
            session_id=event.session_id, message_count=revisions.message_count, drawer_ids=all_ids,
        ))
