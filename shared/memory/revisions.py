"""Edited messages: what a session published again with different words at a position means (pure).

A chat platform that lets people edit a message publishes the session again, under the same session id,
with the new text at the same position (seq). Stored messages are never overwritten in place: the text a
position held moves to ``message_revisions`` and the new text becomes the current revision, so nothing
that was said is lost and what the palace files always has its raw text stored.

Which text is current does not depend on the order events arrive in: an incoming text is an edit only
when the position has never held it. Text the position held before is an earlier revision coming back (a
redelivery, a re-drive from the dead-letter subject, a replay of every event): nothing of it is written
again, so replaying the events changes nothing and an old event cannot undo an edit. The price: an edit
back to a text the position held before is not applied either (without an edit time from the platform,
the two cannot be told apart).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from shared.memory.filing import MessageRow, SessionPlan

__all__ = ["KnownMessage", "Revisions", "sort_revisions"]


@dataclass(frozen=True, slots=True)
class KnownMessage:
    """A stored position: the hash of its current text and of every text it held before."""

    current: str
    earlier: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class Revisions:
    """What to write for a session already (partly) stored.

    edited: messages whose text is new at their position; they become the current revision.
    stale: positions whose incoming text is an earlier revision; nothing of them is written.
    plan: the plan without the stale messages, their drawers and sightings (a drawer also cut from a
        current message stays), and without the edited messages' rows (written as revisions instead).
    recontext: (drawer id, seq, context) of the first chunk of each turn after an edited one: stored
        with the old words as its context, it takes the new ones (and is embedded again).
    """

    edited: list[MessageRow]
    stale: frozenset[int]
    plan: SessionPlan
    recontext: list[tuple[str, int, str]] = field(default_factory=list)

    @property
    def edited_seqs(self) -> list[int]:
        return [m.seq for m in self.edited]

    @property
    def message_count(self) -> int:
        """The session's messages, the edited and stale ones included (the plan leaves them out)."""
        return len(self.plan.messages) + len(self.edited) + len(self.stale)


def sort_revisions(plan: SessionPlan, known: Mapping[int, KnownMessage]) -> Revisions:
    """Sort the plan's messages against what their positions hold (``known``; absent: never stored)."""
    edited: list[MessageRow] = []
    stale: set[int] = set()
    for m in plan.messages:
        k = known.get(m.seq)
        if k is None or m.content_hash == k.current:
            continue
        if m.content_hash in k.earlier:
            stale.add(m.seq)
        else:
            edited.append(m)
    if not edited and not stale:
        return Revisions([], frozenset(), plan)
    rewritten = {m.seq for m in edited}
    sources = [s for s in plan.sources if s.seq not in stale]
    kept = {s.drawer_id for s in sources}
    drawers = [d for d in plan.drawers if d.id in kept]
    messages = [m for m in plan.messages if m.seq not in stale and m.seq not in rewritten]
    # The turn after an edited one was embedded with the old words as its context (filing.plan_session).
    # The next turn that is not noise, whether the edited one is noise now or was before.
    spoken = sorted(m.seq for m in plan.messages if not m.is_noise)
    after = {nxt for r in rewritten if (nxt := next((q for q in spoken if q > r), None)) is not None}
    recontext = [(d.id, d.seq, d.context) for d in drawers if d.seq in after and d.context is not None]
    return Revisions(edited, frozenset(stale), SessionPlan(plan.event, plan.session_hash, messages, drawers, sources),
                     recontext)
