"""Semantic extraction in the enrich service against real NATS and PostgreSQL: one published
session.completed gives entities and facts valid from when they were said, with provenance,
confidences and drawer counts; replaying the episode changes nothing; with an LLM (the local
OpenAI-compatible stub) a good answer is used, a partial one kept in part with warnings, and a
failing or malformed one falls back to the patterns without losing the episode."""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import nats
import pytest

from shared.ids import stable_id
from shared.memory.kg import entity_id
from tests.integration.helpers import Stack, wait_for, ws
from tests.openai_stub import ChatStub, StubState, serve_stub

TURNS = [
    ("Caroline", "2023-05-08T13:56:00Z", "Hey Melanie! I went to a LGBTQ support group yesterday, so powerful."),
    ("Melanie", "2023-05-08T13:57:00Z", "That's great, Caroline! My daughter Sara and I visited the Grand Canyon."),
    ("Caroline", "2023-05-08T13:58:00Z", "This necklace is a gift from my grandma in my home country, Sweden."),
    ("Melanie", "2023-05-08T13:59:00Z", "Ok, talk soon!"),
]


def _session(w: str, sid: str = "s1") -> dict[str, Any]:
    return {"workspace_id": w, "session_id": sid, "agent_id": "agent-1", "user_id": "user-1",
            "messages": [{"role": "user", "name": who, "content": text, "created_at": at} for who, at, text in TURNS],
            "started_at": TURNS[0][1], "completed_at": TURNS[-1][1], "metadata": {}}


def _kg_idle(stack: Stack) -> bool:
    async def go() -> bool:
        nc = await nats.connect(stack.nats_url)
        try:
            info = await nc.jetstream().consumer_info(stack.settings.stream_name, "enrich-kg")
            return not (info.num_pending or info.num_ack_pending)
        finally:
            await nc.close()
    return asyncio.run(go())


def _snapshot(stack: Stack, w: str) -> dict[str, Any]:
    q = {
        "entities": "SELECT id, name, entity_type, mention_count, confidence FROM entities WHERE workspace_id = %s"
                    " ORDER BY id",
        "mentions": "SELECT entity_id, drawer_id, confidence FROM entity_mentions WHERE workspace_id = %s"
                    " ORDER BY 1, 2",
        "triples": "SELECT id, subject_id, predicate, object_id, valid_from, confidence, source_drawer, source_episode,"
                   " source_session, source_seq FROM triples WHERE workspace_id = %s ORDER BY id",
        "evidence": "SELECT triple_id, drawer_id, said_at FROM triple_evidence WHERE workspace_id = %s ORDER BY 1, 2",
        "drawers": "SELECT id, seq, entity_count, triple_count FROM drawers WHERE workspace_id = %s ORDER BY seq",
    }
    return {k: stack.sql(v, (w,)) for k, v in q.items()}


def _facts(snap: dict[str, Any], w: str) -> set[tuple[str, str, str]]:
    names = {r[0]: r[1] for r in snap["entities"]}
    return {(names[r[1]], r[2], names[r[3]]) for r in snap["triples"]}


def test_one_session_gives_facts_valid_from_when_they_were_said(stack: Stack) -> None:
    w = ws()
    stack.publish(_session(w))
    episode_id = stable_id("episode", w, "s1")
    wait_for(lambda: stack.sql("SELECT 1 FROM triples WHERE workspace_id = %s AND predicate = 'from'", (w,)), 90,
             "the extracted facts")
    wait_for(lambda: _kg_idle(stack), 30, "enrich-kg idle")
    snap = _snapshot(stack, w)
    facts = _facts(snap, w)
    assert {("Caroline", "attended", "LGBTQ support group"), ("Melanie", "has_child", "Sara"),
            ("Melanie", "visited", "Grand Canyon"), ("Caroline", "from", "Sweden")} <= facts
    drawers = {r[1]: r for r in snap["drawers"]}
    for tid, _, _, _, valid_from, conf, drawer, episode, session_id, seq in snap["triples"]:
        # valid_from is the message's time (2023), never the time enrich ran.
        assert valid_from == datetime.fromisoformat(TURNS[seq][1]), (tid, valid_from)
        assert (episode, session_id) == (episode_id, "s1") and drawers[seq][0] == drawer
        assert 0 < conf <= 1
    # Every fact has its evidence row; the drawers count their mentions and facts.
    assert {(r[0], r[1]) for r in snap["evidence"]} == {(r[0], r[6]) for r in snap["triples"]}
    for did, _, ents, trips in snap["drawers"]:
        assert ents == sum(1 for m in snap["mentions"] if m[1] == did)
        assert trips == sum(1 for e in snap["evidence"] if e[1] == did)
    assert drawers[0][3] >= 1 and drawers[2][3] >= 2
    # Entities: ids from the normalised name, the speakers as people, confidence the mentions' mean.
    ents = {r[1]: r for r in snap["entities"]}
    assert ents["Sweden"][0] == entity_id(w, "sweden")
    assert ents["Caroline"][2] == "person"
    for eid, _, _, count, conf in snap["entities"]:
        mine = [m[2] for m in snap["mentions"] if m[0] == eid]
        assert count == len(mine)
        if mine:
            assert conf == pytest.approx(sum(mine) / len(mine), abs=1e-5)

    # Replaying the episode (a new event id, so the stream takes it) changes nothing.
    ev = stack.sql("SELECT summary, abstract, topics FROM episodes WHERE workspace_id = %s", (w,))[0]
    stack.publish({"event_id": "replay-kg-1", "workspace_id": w, "episode_id": episode_id, "session_id": "s1",
                   "summary": ev[0], "abstract": ev[1], "topics": list(ev[2])}, "episodic.created")
    wait_for(lambda: _kg_idle(stack), 30, "enrich-kg idle after the replay")
    assert _snapshot(stack, w) == snap


def test_facts_said_again_later_keep_their_start_and_average_their_confidence(stack: Stack) -> None:
    w = ws()
    stack.publish(_session(w, "s1"))
    wait_for(lambda: stack.sql("SELECT 1 FROM triples WHERE workspace_id = %s AND predicate = 'from'", (w,)), 90,
             "the first session's facts")
    later = _session(w, "s2")
    later["messages"] = [{**m, "created_at": "2023-06-01T10:00:00Z"} for m in later["messages"]]
    later["messages"][2]["content"] = "I'm from Sweden, you know. My grandma still lives there."
    stack.publish(later)
    tid = stack.sql("SELECT id FROM triples WHERE workspace_id = %s AND predicate = 'from'", (w,))[0][0]
    wait_for(lambda: stack.sql("SELECT count(*) FROM triple_evidence WHERE workspace_id = %s AND triple_id = %s",
                               (w, tid))[0][0] == 2, 90, "a second sighting of the fact")
    rows = stack.sql("SELECT valid_from, confidence, (SELECT avg(confidence) FROM triple_evidence e"
                     " WHERE e.workspace_id = t.workspace_id AND e.triple_id = t.id) FROM triples t"
                     " WHERE workspace_id = %s AND predicate = 'from'", (w,))
    assert len(rows) == 1  # one fact, not one per session
    valid_from, conf, mean = rows[0]
    assert valid_from == datetime(2023, 5, 8, 13, 58, tzinfo=UTC)  # when it was first said
    assert conf == pytest.approx(float(mean), abs=1e-5)


# --- with an LLM ---------------------------------------------------------------------------------


def _swap_enrich(stack: Stack, env: dict[str, str]) -> None:
    sup = stack.supervisor
    child = sup.children.pop("enrich", None)
    if child is not None:
        child.proc.send_signal(signal.SIGTERM)
        child.proc.wait(30)
    sup.env = env
    sup.spawn("enrich")
    sup.wait_healthy(120)


@pytest.fixture(scope="module")
def llm(stack: Stack) -> Iterator[ChatStub]:
    state = StubState()
    saved_env = dict(stack.supervisor.env)
    with serve_stub(state) as url:
        _swap_enrich(stack, {**saved_env, "PALACE_LLM_BASE_URL": url, "PALACE_LLM_MODEL": "stub-chat",
                             "PALACE_LLM_TIMEOUT_S": "2", "PALACE_LLM_ATTEMPTS": "2"})
        try:
            yield state.chat
        finally:
            _swap_enrich(stack, saved_env)


def _history(stack: Stack, w: str) -> list[tuple[Any, ...]]:
    return stack.sql("SELECT reason, new_value FROM memory_history WHERE workspace_id = %s AND action = 'KG_EXTRACT'",
                     (w,))


def _redeliver_episode(stack: Stack, w: str) -> None:
    """The workspace's episodic.created again, as JetStream redelivers it after an ack lost past the commit."""
    from shared.events import EpisodicCreated
    from shared.ids import event_id_for

    (eid, sid, summary, abstract, topics, source_hash), = stack.sql(
        "SELECT id, session_id, summary, abstract, topics, source_hash FROM episodes WHERE workspace_id = %s", (w,))
    stack.redeliver(EpisodicCreated(event_id=event_id_for("episodic.created", eid, source_hash or ""), workspace_id=w,
                                    episode_id=eid, session_id=sid, summary=summary, abstract=abstract,
                                    topics=list(topics)), "enrich")


@pytest.mark.parametrize("mode", ["ok", "partial", "malformed", "fail500"])
def test_llm_extraction_and_its_failures(stack: Stack, llm: ChatStub, mode: str) -> None:
    llm.extract_mode, llm.extract_calls = mode, 0
    w = ws()
    stack.publish(_session(w))
    wait_for(lambda: stack.sql("SELECT 1 FROM triples WHERE workspace_id = %s", (w,)), 90, "extracted facts")
    wait_for(lambda: _kg_idle(stack), 30, "enrich-kg idle")
    assert llm.extract_calls >= 1
    snap = _snapshot(stack, w)
    facts = _facts(snap, w)
    assert stack.sql("SELECT count(*) FROM episodes WHERE workspace_id = %s", (w,))[0][0] == 1
    if mode in ("ok", "partial"):
        # The model's graph: its relation names, normalised; valid from the message's time.
        assert {("Caroline", "talked_about", "Melanie"), ("Melanie", "talked_about", "Caroline"),
                ("Caroline", "talked_about", "Sweden")} <= facts
        assert all(r[2] == "talked_about" for r in snap["triples"])
        assert {r[4] for r in snap["triples"]} <= {datetime.fromisoformat(t[1]) for t in TURNS}
    else:
        # Its failure keeps the patterns' graph, and says so.
        assert ("Caroline", "from", "Sweden") in facts
    hist = _history(stack, w)
    if mode == "ok":
        # The model's reading is noted, with what it stored, and a redelivered event does not ask it again.
        assert len(hist) == 1 and hist[0][0] is None and hist[0][1]["tier"] == "llm"
        assert set(hist[0][1]["entity_ids"]) == {r[0] for r in snap["entities"]}
        calls = llm.extract_calls
        _redeliver_episode(stack, w)
        assert llm.extract_calls == calls and _snapshot(stack, w) == snap
    else:
        assert len(hist) == 1 and hist[0][1]["tier"] == ("llm" if mode == "partial" else "patterns")
        assert ("more than 50 entities" in hist[0][0]) if mode == "partial" else ("LLM extraction failed" in hist[0][0])
    if mode == "partial":
        assert len(snap["mentions"]) <= 50 and "Nowhere" not in {r[1] for r in snap["entities"]}
    used = stack.sql("SELECT coalesce(sum(calls_ok), 0) + coalesce(sum(calls_failed), 0) FROM llm_usage"
                     " WHERE workspace_id = %s AND purpose = 'extract'", (w,))[0][0]
    assert used >= 1
    json.dumps(hist, default=str)


@pytest.mark.parametrize("mode", ["ok", "malformed", "fail500"])
def test_episode_summary_is_the_llms_and_extractive_when_it_fails(stack: Stack, llm: ChatStub, mode: str) -> None:
    from shared.memory.episodes import summarize_session
    from tests.openai_stub import summary_of

    llm.summary_mode, llm.summary_calls = mode, 0
    w = ws()
    stack.publish(_session(w))
    wait_for(lambda: stack.sql("SELECT 1 FROM episodes WHERE workspace_id = %s AND status = 'ready'", (w,)), 90,
             "the episode")
    summary, abstract = stack.sql("SELECT summary, abstract FROM episodes WHERE workspace_id = %s", (w,))[0]
    kept = [(who, text) for who, _, text in TURNS]
    extractive = summarize_session(kept)
    assert llm.summary_calls >= 1
    assert summary == (summary_of([{"speaker": who} for who, _ in kept]) if mode == "ok" else extractive.summary)
    assert abstract == extractive.abstract  # the L0 abstract never comes from the model
    used = stack.sql("SELECT coalesce(sum(calls_ok), 0), coalesce(sum(calls_failed), 0) FROM llm_usage"
                     " WHERE workspace_id = %s AND purpose = 'episode'", (w,))[0]
    assert (used[0] >= 1) if mode in ("ok", "malformed") else (used[1] >= 1)
