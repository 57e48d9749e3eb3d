"""Edited messages: which positions are edits, which are earlier revisions coming back (pure)."""

from __future__ import annotations

from typing import Any

from shared.events import SessionCompleted
from shared.ids import content_hash
from shared.memory.filing import plan_session
from shared.memory.revisions import KnownMessage, sort_revisions

A = "We moved the staging database to eu-west-1 last week."
B = "The release train leaves every second Thursday at noon."
B2 = "The release train leaves every second Friday at noon."
C = "Great, I'll put the Friday slot in the team calendar."


def _plan(texts: list[str]) -> Any:
    return plan_session(SessionCompleted.model_validate({
        "workspace_id": "w", "session_id": "s",
        "messages": [{"role": "user" if i % 2 == 0 else "assistant", "content": t, "name": f"p{i % 2}"}
                     for i, t in enumerate(texts)]}))


def _known(texts: list[str], earlier: dict[int, list[str]] | None = None) -> dict[int, KnownMessage]:
    earlier = earlier or {}
    return {i: KnownMessage(content_hash(t), frozenset(content_hash(e) for e in earlier.get(i, [])))
            for i, t in enumerate(texts)}


def test_a_session_never_stored_or_published_again_unchanged_is_written_as_planned() -> None:
    plan = _plan([A, B, C])
    for known in ({}, _known([A, B, C]), _known([A, B])):  # new, a repeat, a repeat with a turn appended
        r = sort_revisions(plan, known)
        assert (r.edited, r.stale, r.recontext) == ([], frozenset(), [])
        assert r.plan is plan


def test_new_words_at_a_position_are_an_edit_and_the_next_turn_takes_them_as_its_context() -> None:
    plan = _plan([A, B2, C])
    r = sort_revisions(plan, _known([A, B, C]))
    assert [m.content for m in r.edited] == [B2] and r.edited_seqs == [1] and not r.stale
    # The edited message's row is written as a revision, not by the plain insert; its drawer is planned.
    assert [m.seq for m in r.plan.messages] == [0, 2]
    assert [d.content for d in r.plan.drawers] == [A, B2, C]
    (did, seq, ctx), = r.recontext
    assert seq == 2 and did == next(d.id for d in plan.drawers if d.content == C) and ctx == f"p1: {B2}"


def test_words_a_position_held_before_are_an_earlier_revision_and_nothing_of_them_is_written() -> None:
    # B2 replaced B: the first event delivered again (a redelivery, a re-drive, a replay) must not undo it.
    plan = _plan([A, B, C])
    r = sort_revisions(plan, _known([A, B2, C], earlier={1: [B]}))
    assert r.edited == [] and r.stale == frozenset({1}) and r.recontext == []
    assert [m.seq for m in r.plan.messages] == [0, 2]
    assert [d.content for d in r.plan.drawers] == [A, C]
    assert {s.seq for s in r.plan.sources} == {0, 2}


def test_an_edit_into_noise_gives_the_next_turn_the_turn_before_as_its_context() -> None:
    plan = _plan([A, "ok", C])
    r = sort_revisions(plan, _known([A, B, C]))
    assert r.edited_seqs == [1] and r.edited[0].is_noise
    assert [d.content for d in r.plan.drawers] == [A, C]
    (_, seq, ctx), = r.recontext
    assert seq == 2 and ctx == f"p0: {A}"


def test_a_drawer_also_cut_from_a_current_message_stays_when_its_stale_sighting_goes() -> None:
    plan = _plan([A, B, A])
    r = sort_revisions(plan, _known([A, B2, B], earlier={2: [A]}))  # seq 2 said A once, B now
    assert r.stale == frozenset({2}) and r.edited_seqs == [1]
    assert [d.content for d in r.plan.drawers] == [A, B]
    assert sorted((s.seq, s.drawer_id == plan.drawers[0].id) for s in r.plan.sources) == [(0, True), (1, False)]


def test_the_sessions_message_count_counts_edited_and_stale_messages() -> None:
    plan = _plan([A, B2, C, "new turn at the end, nothing like the others"])
    r = sort_revisions(plan, _known([A, B, C]))
    assert r.message_count == 4 and len(r.plan.messages) == 3
    stale = sort_revisions(_plan([A, B, C]), _known([A, B2, C], earlier={1: [B]}))
    assert stale.message_count == 3
