"""Planning a session: noise stays raw-only, long messages chunk, repeats collapse to one drawer."""

from shared.events import SessionCompleted
from shared.memory.filing import plan_session


def _event(messages: list[dict], **kw: object) -> SessionCompleted:
    return SessionCompleted.model_validate({"workspace_id": "w", "session_id": "s", "messages": messages, **kw})


def test_noise_is_kept_raw_but_not_filed() -> None:
    plan = plan_session(_event([{"role": "user", "content": "hi"},
                                {"role": "user", "content": "I adopted a cat named Miso."}]))
    assert len(plan.messages) == 2 and plan.messages[0].is_noise
    assert [d.content for d in plan.drawers] == ["I adopted a cat named Miso."]


def test_long_message_becomes_several_drawers_with_provenance() -> None:
    long = " ".join(f"Sentence number {i} talks about the migration plan." for i in range(40))
    plan = plan_session(_event([{"role": "user", "content": long}]))
    assert len(plan.drawers) > 1
    assert {s.seq for s in plan.sources} == {0}
    assert [s.chunk_index for s in plan.sources] == list(range(len(plan.drawers)))


def test_repeat_within_session_is_one_drawer_two_sources() -> None:
    plan = plan_session(_event([{"role": "user", "content": "We chose Postgres for storage."}] * 2))
    assert len(plan.drawers) == 1 and len(plan.sources) == 2


def test_filing_location_from_metadata_or_agent() -> None:
    p1 = plan_session(_event([{"role": "user", "content": "We chose Postgres."}], metadata={"wing": "orion"}))
    p2 = plan_session(_event([{"role": "user", "content": "We chose Postgres."}], agent_id="atlas"))
    assert p1.drawers[0].wing == "orion" and p2.drawers[0].wing == "atlas"


def test_same_content_same_ids_across_plans() -> None:
    e = _event([{"role": "user", "content": "We chose Postgres for storage."}])
    assert [d.id for d in plan_session(e).drawers] == [d.id for d in plan_session(e).drawers]


def test_system_and_tool_messages_are_not_filed() -> None:
    plan = plan_session(_event([{"role": "system", "content": "You are a helpful assistant with tools."},
                                {"role": "tool", "content": "{\"result\": \"forty two degrees\"}"}]))
    assert plan.drawers == [] and len(plan.messages) == 2
