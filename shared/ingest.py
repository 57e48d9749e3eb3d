"""What ingest writes for one ``session.completed``, in the caller's transaction (``writer_tx``).

Here, not in the handler, so the service, the benchmark and the tests that interleave two ingests run the
same steps: the forget check, then the session against what its positions already hold (edited messages:
``shared.memory.revisions``), the raw rows, and what an edit changes beyond them (``settle_edits``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from psycopg import AsyncConnection

from shared.db.episodes import reopen_episodes_of
from shared.db.forget import forgotten_session_drawers
from shared.db.sessions import (
    Settled,
    StoredSession,
    known_messages,
    revise_messages,
    settle_edits,
    store_session,
)
from shared.forget import drop_forgotten_drawers
from shared.memory.filing import SessionPlan
from shared.memory.revisions import Revisions, sort_revisions

__all__ = ["Filed", "file_session"]


@dataclass(frozen=True)
class Filed:
    """What ``file_session`` wrote: the plan as stored (without forgotten drawers and earlier revisions),
    the revisions it found, the rows stored, and what the edits changed."""

    plan: SessionPlan
    revisions: Revisions
    stored: StoredSession
    settled: Settled

    @property
    def to_announce(self) -> list[str]:
        """Every drawer of the session still raw, in the plan's order: created now, left raw by an earlier
        attempt that died before announcing them, given a new context, or brought back while raw; then those
        an edit left to another message that are to be embedded again (``Settled.repointed``)."""
        raw = (set(self.stored.raw) | set(self.settled.recontexted)
               | {d for d, state in self.settled.revived if state == "raw"})
        ours = [d.id for d in self.plan.drawers if d.id in raw]
        return ours + sorted({d for d, state in self.settled.repointed if state == "raw"} - set(ours))


async def file_session(conn: AsyncConnection[Any], plan: SessionPlan, *, actor: str,
                       episode_wait_s: float) -> Filed | None:
    """Store the planned session in the caller's transaction, begun with ``writer_tx`` (ordered with forget);
    None when it (its user, agent or workspace) was forgotten and nothing was written."""
    e = plan.event
    ws, sid = e.workspace_id, e.session_id
    # Forgotten (this session, its user or agent, the workspace, or drawers one by one)? An event still in
    # flight, redelivered or re-driven from the DLQ must not bring it back (shared.db.forget).
    gone, gone_drawers = await forgotten_session_drawers(conn, ws, session_id=sid, user_id=e.user_id,
                                                         agent_id=e.agent_id, drawer_ids=[d.id for d in plan.drawers])
    if gone:
        return None
    plan = drop_forgotten_drawers(plan, gone_drawers)
    # Published before? Then a position with new words is an edit (kept as a revision), and one with words it
    # held before is an earlier revision coming back (written again: nothing).
    known = await known_messages(conn, ws, sid, [m.seq for m in plan.messages])  # under the session's lock
    revisions = sort_revisions(plan, known)
    plan = revisions.plan
    await revise_messages(conn, ws, sid, revisions.edited, event_id=e.event_id)
    stored = await store_session(conn, plan, message_count=revisions.message_count)
    created = set(stored.created)
    settled = await settle_edits(conn, ws, sid, revisions, seen_before=bool(known),
                                 existing=[d.id for d in plan.drawers if d.id not in created],
                                 sighted=stored.sighted, event_id=e.event_id, actor=actor)
    for drawer in settled.retired:  # the session's episode quotes them: rebuilt without them
        await reopen_episodes_of(conn, ws, drawer, change=e.event_id or "", due_after_s=episode_wait_s)
    return Filed(plan, revisions, stored, settled)
