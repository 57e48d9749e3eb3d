"""Pure parts of forget and the job registry: scopes, plan filtering, which events a scope matches."""

from __future__ import annotations

import pytest

from shared.events import EntityUpserted, EpisodicCreated, SessionCompleted
from shared.forget import Scope, Targets, _matcher, drop_forgotten_drawers
from shared.ids import content_hash
from shared.lifecycle import JOBS
from shared.memory.filing import plan_session


def _plan() -> object:
    ev = SessionCompleted.model_validate({
        "workspace_id": "w", "session_id": "s", "messages": [
            {"role": "user", "content": "I keep the violin in the blue case"},
            {"role": "assistant", "content": "Noted, the violin lives in the blue case"},
            {"role": "user", "content": "and the bow is in the cedar drawer"}]})
    return plan_session(ev)


def test_scope_rejects_unknown_kinds_and_empty_values() -> None:
    with pytest.raises(ValueError):
        Scope("w", "planet", "x")
    with pytest.raises(ValueError):
        Scope("w", "user", "")
    with pytest.raises(ValueError):
        Scope("", "user", "u")


def test_forgotten_drawers_leave_the_plan_with_their_messages() -> None:
    plan = _plan()
    gone = plan.drawers[1].id  # type: ignore[attr-defined]
    out = drop_forgotten_drawers(plan, {gone})  # type: ignore[arg-type]
    assert gone not in {d.id for d in out.drawers}
    assert gone not in {s.drawer_id for s in out.sources}
    assert [m.seq for m in out.messages] == [0, 2]
    assert drop_forgotten_drawers(plan, set()) is plan  # type: ignore[arg-type]
    # The next turn was embedded with the forgotten one as its context: not on a redelivery.
    after = next(d for d in plan.drawers if d.seq == 2)  # type: ignore[attr-defined]
    assert "violin lives" in (after.context or "")
    assert next(d for d in out.drawers if d.seq == 2).context is None


def test_a_forgotten_chunk_takes_its_whole_message_from_a_redelivered_plan() -> None:
    """Forget deletes the whole message a forgotten chunk was cut from; the message's other chunks overlap
    the forgotten one, so a redelivered session brings back none of them."""
    long = " ".join(f"Sentence {i} of the long story about the lighthouse keeper and his logbook." for i in range(30))
    ev = SessionCompleted.model_validate({"workspace_id": "w", "session_id": "s", "messages": [
        {"role": "user", "content": "Tell me the story again please"},
        {"role": "assistant", "content": long},
        {"role": "user", "content": "Thanks, that was the part I had forgotten"}]})
    plan = plan_session(ev, chunk_chars=300, chunk_overlap=50)
    chunks = [d for d in plan.drawers if d.seq == 1]
    assert len(chunks) > 2
    out = drop_forgotten_drawers(plan, {chunks[1].id})
    assert [m.seq for m in out.messages] == [0, 2]
    assert not {d.id for d in chunks} & {d.id for d in out.drawers}
    assert {s.seq for s in out.sources} == {0, 2}
    assert next(d for d in out.drawers if d.seq == 2).context is None


def test_matcher_takes_only_the_scope_of_its_own_workspace() -> None:
    t = Targets(session_ids={"s1"}, drawer_ids={"d1", "d2"}, content_hashes={content_hash("secret words")})
    m = _matcher(Scope("w", "user", "alice"), t)
    assert m({"workspace_id": "w", "user_id": "alice", "session_id": "new"})
    assert m({"workspace_id": "w", "session_id": "s1"})
    assert m({"workspace_id": "w", "drawer_ids": ["d1", "d2"]})
    assert not m({"workspace_id": "w", "drawer_ids": ["d1", "other"]})  # others' work rides along: kept
    # An event is deleted whole: one of another user's sessions that also holds a forgotten text is kept.
    assert not m({"workspace_id": "w", "user_id": "bob", "messages": [{"content": "secret  words"}]})
    # verify of a drawer forget looks for the forgotten text wherever it is said.
    assert _matcher(Scope("w", "drawer", "d9"), t, by_content=True)({"workspace_id": "w",
                                                                     "messages": [{"content": "secret  words"}]})
    assert not m({"workspace_id": "other", "user_id": "alice", "session_id": "s1"})
    assert not m({"workspace_id": "w", "user_id": "bob", "session_id": "s2"})
    assert _matcher(Scope("w", "workspace", "*"), Targets())({"workspace_id": "w"})


def test_matcher_takes_the_events_of_an_episode_a_drawer_forget_deleted() -> None:
    """A drawer forget keeps its session (no session id to match) but deletes the episode that quotes the
    drawer: the episode's own event carries its summary, and must go from the streams too."""
    episode = "e" * 32
    created = EpisodicCreated(event_id="ev1", workspace_id="w", episode_id=episode, session_id="kept-session",
                              summary="I keep the violin in the blue case", abstract="violin", topics=["violin"])
    found = EntityUpserted(event_id="ev2", workspace_id="w", entity_ids=["x"], names=["violin"],
                           source_episode_id=episode)
    m = _matcher(Scope("w", "drawer", "d1"), Targets(drawer_ids={"d1"}, episode_ids={episode}))
    assert m(created.model_dump(mode="json"))
    assert m(found.model_dump(mode="json"))
    other = created.model_copy(update={"episode_id": "f" * 32})
    assert not m(other.model_dump(mode="json"))
    assert not _matcher(Scope("w", "drawer", "d1"), Targets(drawer_ids={"d1"}))(other.model_dump(mode="json"))


def test_every_job_is_one_registry_entry_with_a_schedule() -> None:
    from shared.config import Settings

    s = Settings()
    assert {"decay", "prune", "expire", "redrive"} <= set(JOBS)
    for name, job in JOBS.items():
        assert job.name == name and job.help and job.every_s(s) > 0
