"""Subscribers of the ingest service."""

from __future__ import annotations

from nats.aio.msg import Msg
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_exponential_jitter

from services._runtime import Deps
from shared.bus import Poison, dead_letter, decode_event, publish_event
from shared.db.forget import forgotten, forgotten_drawers
from shared.db.kg import link_drawers
from shared.db.sessions import store_session, unembedded_drawer_ids
from shared.db.tenancy import WRITE_CONFLICTS, workspaces_tx
from shared.events import DrawerCreated, SessionCompleted, SessionStored
from shared.faults import is_transient
from shared.forget import drop_forgotten_drawers
from shared.ids import event_id_for
from shared.logging import get_logger
from shared.memory.filing import SessionPlan, plan_session
from shared.metrics import DRAWERS

__all__ = ["register"]

log = get_logger("palace.ingest")
_ANNOUNCE_CHUNK = 256


def _retrying() -> AsyncRetrying:
    """Run a batch's transaction again when PostgreSQL picks it as a deadlock's victim: two batches may
    insert the same drawers (one text in two sessions) in different orders. Every write is an upsert."""
    return AsyncRetrying(retry=retry_if_exception_type(WRITE_CONFLICTS), stop=stop_after_attempt(8),
                         wait=wait_exponential_jitter(multiplier=0.05, max=2.0), reraise=True)


def register(deps: Deps) -> None:
    s = deps.settings

    @deps.handle(SessionCompleted)
    async def on_session_completed(bodies: list[bytes], raws: list[Msg]) -> None:
        """session.completed (batched) → (commit raw rows) → drawer.created, session.stored."""
        events: list[tuple[SessionCompleted, Msg]] = []
        for raw, b in zip(raws, bodies, strict=True):
            try:
                ev: SessionCompleted = decode_event(SessionCompleted, b, s)
                if len(ev.messages) > s.max_messages_per_session:
                    raise Poison(f"session has {len(ev.messages)} messages; the limit is {s.max_messages_per_session}")
            except Poison as e:
                # One bad event must not hold back (or silently ride along with) the good ones.
                await dead_letter(deps.broker, s, service=deps.service, raw=raw, reason=str(e), error_type="invalid")
                await raw.ack()
                continue
            events.append((ev, raw))
        if not events:
            return
        try:
            await file_sessions([ev for ev, _ in events])
        except Exception as e:
            if is_transient(e) or len(events) == 1:
                raise  # the database is down for all of them: the loop holds, NAKs or dead-letters them
            # Something in the batch broke its transaction: each event alone, so one bad event fails only
            # itself (NAKed, then dead-lettered, by the loop); the others are committed and acked here.
            failed: Exception | None = None
            for ev, raw in events:
                try:
                    await file_sessions([ev])
                except Exception as one:
                    failed = failed or one
                else:
                    if not raw._ackd:
                        await raw.ack()
            if failed is not None:
                raise failed from None

    async def file_sessions(events: list[SessionCompleted]) -> None:
        """Commit the sessions' raw rows (one transaction for the batch, a workspace at a time), then link
        their drawers to known entities (a second one), then announce each session.

        No per-message length limit: a long message is chunked like any other (decode_event already
        bounded the whole event by max_event_bytes)."""
        order = sorted(range(len(events)), key=lambda i: events[i].workspace_id)
        planned = [plan_session(ev, chunk_chars=s.chunk_chars, chunk_overlap=s.chunk_overlap, min_chars=s.min_chars)
                   for ev in events]
        plans: dict[int, SessionPlan] = {}
        async for attempt in _retrying():
            with attempt:
                plans, created = {}, 0
                async with workspaces_tx(deps.pool) as scope:
                    for i in order:
                        ev = events[i]
                        conn = await scope(ev.workspace_id)
                        # Forgotten (this session, its user or agent, the workspace)? An event still in flight,
                        # redelivered or re-driven from the DLQ must not bring it back (shared.db.forget).
                        if await forgotten(conn, ev.workspace_id, session_id=ev.session_id, user_id=ev.user_id,
                                           agent_id=ev.agent_id):
                            log.info("forgotten_session_refused", workspace=ev.workspace_id, session=ev.session_id)
                            continue
                        plan = drop_forgotten_drawers(planned[i], await forgotten_drawers(
                            conn, ev.workspace_id, [d.id for d in planned[i].drawers]))
                        created += len(await store_session(conn, plan))
                        plans[i] = plan
        DRAWERS.labels(deps.service, "created").inc(created)
        # Inline linker: the sessions' drawers → the workspace's existing entities they name (no LLM, never
        # a new entity). After the raw rows are committed; idempotent, so a redelivery completes it.
        pending: dict[int, list[str]] = {}
        refused: set[int] = set()
        async for attempt in _retrying():
            with attempt:
                pending, refused = {}, set()
                async with workspaces_tx(deps.pool) as scope:
                    for i in order:
                        ev, plan = events[i], plans.get(i)
                        if plan is None or not plan.drawers:
                            continue
                        conn = await scope(ev.workspace_id)
                        # Forgotten since the commit above? Then its drawers are gone (or going: the forget
                        # waits for this transaction and sees what it wrote); nothing is linked or announced.
                        if await forgotten(conn, ev.workspace_id, session_id=ev.session_id, user_id=ev.user_id,
                                           agent_id=ev.agent_id):
                            log.info("forgotten_session_refused", workspace=ev.workspace_id,
                                     session=ev.session_id)
                            refused.add(i)
                            continue
                        await link_drawers(conn, ev.workspace_id, [(d.id, d.content) for d in plan.drawers])
                        # Announce every drawer of the session still raw, not only the new ones: if an earlier
                        # attempt committed and then died before publishing, this redelivery finishes its job.
                        pending[i] = await unembedded_drawer_ids(conn, ev.workspace_id, [d.id for d in plan.drawers])
        for i in sorted(set(plans) - refused):
            await announce(events[i], plans[i], pending.get(i, []))

    async def announce(ev: SessionCompleted, plan: SessionPlan, pending: list[str]) -> None:
        for j in range(0, len(pending), _ANNOUNCE_CHUNK):
            ids = pending[j : j + _ANNOUNCE_CHUNK]
            await publish_event(deps.broker, s, DrawerCreated(
                event_id=event_id_for("drawer.created", ev.event_id or "", *ids),
                workspace_id=ev.workspace_id, session_id=ev.session_id, drawer_ids=ids,
            ), caused_by=ev)
        await publish_event(deps.broker, s, SessionStored(
            event_id=event_id_for("session.stored", ev.event_id or ""), workspace_id=ev.workspace_id,
            session_id=ev.session_id, message_count=len(plan.messages), drawer_ids=[d.id for d in plan.drawers],
        ), caused_by=ev)
