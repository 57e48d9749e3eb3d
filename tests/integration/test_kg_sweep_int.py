"""Semantic extraction's second trigger against real NATS and PostgreSQL: a processed drawer of
importance >= 3 that no extractor read (here: its session was stored while enrich was down, so its
episode never reached extraction) is queued by classify and extracted by enrich's sweep, valid from
when it was said, with provenance to the drawer and the message, counted on the drawer, announced on
entity.upserted, exactly once; a drawer that its session's extraction read is never swept; the LLM
path (the local OpenAI-compatible stub) uses a good answer and falls back to the patterns on a
malformed or too slow one; the sweep reads a partial index."""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

import nats
import pytest

from services._runtime import Deps
from services.enrich.handlers import sweep_due_drawers
from shared.adapters.llm import LlmClient
from shared.bus import build_broker
from shared.db.extraction_queue import DUE_SQL
from shared.db.pool import open_pool
from shared.memory.kg import KG_MIN_IMPORTANCE
from tests.integration.helpers import Stack, analyze, wait_for, ws
from tests.openai_stub import ChatStub, StubState, serve_stub

# Turns 0, 1 and 4 classify at importance >= 3 (decisions, an "important" fact); 2 and 3 below it.
TURNS = [
    ("Alice", "2023-03-01T09:00:00Z", "We decided to use PostgreSQL for the billing service, and Bob agreed."),
    ("Bob", "2023-03-01T09:01:00Z", "We decided it: I am moving to Lisbon, where my sister Clara lives."),
    ("Bob", "2023-03-01T09:02:00Z", "Decision made, I visited Porto and we will open the office there."),
    ("Alice", "2023-03-01T09:03:00Z", "The weather was nice when I visited Porto with Bob."),
    ("Bob", "2023-03-01T09:04:00Z", "Important: my sister Clara works at Acme, we must always ask her first."),
]


def _session(w: str, sid: str = "s1") -> dict[str, Any]:
    return {"workspace_id": w, "session_id": sid, "agent_id": "agent-1", "user_id": "user-1",
            "messages": [{"role": "user", "name": who, "content": text, "created_at": at} for who, at, text in TURNS],
            "started_at": TURNS[0][1], "completed_at": TURNS[-1][1], "metadata": {}}


@contextmanager
def _enrich_down(stack: Stack) -> Iterator[None]:
    """enrich stopped: sessions are stored, embedded and classified, but no episode is extracted."""
    sup = stack.supervisor
    child = sup.children.pop("enrich", None)
    if child is not None:
        child.proc.send_signal(signal.SIGTERM)
        child.proc.wait(30)
    try:
        yield
    finally:
        sup.spawn("enrich")
        sup.wait_healthy(120)


def _sweep(stack: Stack, *, grace: float = 0.0, llm_url: str | None = None) -> list[dict[str, Any]]:
    """One pass of enrich's sweep, as the service runs it; returns the entity.upserted events it published."""
    async def go() -> list[dict[str, Any]]:
        s = stack.settings.model_copy(update={"kg_sweep_grace_s": grace, "llm_base_url": llm_url,
                                              "llm_model": "stub-chat", "llm_timeout_s": 2.0, "llm_attempts": 2})
        pool = await open_pool(stack.database_url, name="test-kg-sweep", max_size=2, role=s.db_role)
        broker = build_broker(s, "test-kg-sweep", stack.nats_url)
        nc = await nats.connect(stack.nats_url)
        sub = await nc.subscribe("entity.upserted")
        await broker.connect()
        try:
            deps = Deps(settings=s, service="enrich", pool=pool, broker=broker)
            await sweep_due_drawers(deps, LlmClient(s) if llm_url else None)
            events = []
            while True:
                try:
                    events.append(json.loads((await sub.next_msg(timeout=1.0)).data))
                except TimeoutError:
                    return events
        finally:
            await broker.stop()
            await nc.close()
            await pool.close()
    return asyncio.run(go())


def _snapshot(stack: Stack, w: str) -> dict[str, Any]:
    q = {
        "entities": "SELECT id, name, mention_count FROM entities WHERE workspace_id = %s ORDER BY id",
        "mentions": "SELECT entity_id, drawer_id FROM entity_mentions WHERE workspace_id = %s ORDER BY 1, 2",
        "triples": "SELECT id, subject_id, predicate, object_id, valid_from, source_drawer, source_episode,"
                   " source_session, source_seq FROM triples WHERE workspace_id = %s ORDER BY id",
        "evidence": "SELECT triple_id, drawer_id FROM triple_evidence WHERE workspace_id = %s ORDER BY 1, 2",
        "drawers": "SELECT id, seq, importance, entity_count, triple_count FROM drawers WHERE workspace_id = %s"
                   " ORDER BY seq",
    }
    return {k: stack.sql(v, (w,)) for k, v in q.items()}


def _facts(snap: dict[str, Any]) -> set[tuple[str, str, str]]:
    names = {r[0]: r[1] for r in snap["entities"]}
    return {(names[r[1]], r[2], names[r[3]]) for r in snap["triples"]}


def _queue(stack: Stack, w: str) -> dict[str, tuple[bool, bool]]:
    """drawer id → (queued, read) in drawer_extraction."""
    return {r[0]: (r[1], r[2]) for r in stack.sql(
        "SELECT drawer_id, due_at IS NOT NULL, extracted_at IS NOT NULL FROM drawer_extraction"
        " WHERE workspace_id = %s", (w,))}


def _stored_unextracted(stack: Stack, w: str) -> dict[str, Any]:
    stack.publish(_session(w))
    stack.wait_processed(w, len(TURNS), 90)
    snap = _snapshot(stack, w)
    assert snap["entities"] == [] and snap["triples"] == []  # no extractor read them
    return snap


def test_important_drawers_never_extracted_are_swept_once(stack: Stack) -> None:
    w = ws()
    with _enrich_down(stack):
        before = _stored_unextracted(stack, w)
        important = {r[0] for r in before["drawers"] if r[2] >= KG_MIN_IMPORTANCE}
        assert {r[1] for r in before["drawers"] if r[0] in important} == {0, 1, 4}, before["drawers"]
        # classify queued exactly the important ones, unread.
        assert _queue(stack, w) == {d: (True, False) for d in important}

        # Within the grace period the sweep leaves them to their session's extraction.
        assert [e for e in _sweep(stack, grace=3600) if e["workspace_id"] == w] == []
        assert _queue(stack, w) == {d: (True, False) for d in important}

        events = [e for e in _sweep(stack) if e["workspace_id"] == w]
        snap = _snapshot(stack, w)
        facts = _facts(snap)
        assert {("Bob", "travels_to", "Lisbon"), ("Bob", "has_relative", "Clara")} <= facts
        # Only the queued drawers were read: turn 2's and 3's Porto facts are not there.
        assert not any(o == "Porto" for _, _, o in facts)
        assert {m[1] for m in snap["mentions"]} <= important
        seq_of = {r[0]: r[1] for r in snap["drawers"]}
        for _, _, _, _, valid_from, drawer, episode, session_id, seq in snap["triples"]:
            assert drawer in important and episode is None and session_id == "s1" and seq == seq_of[drawer]
            assert valid_from == datetime.fromisoformat(TURNS[seq][1])  # when it was said, not now
        for did, _, _, ents, trips in snap["drawers"]:
            assert ents == sum(1 for m in snap["mentions"] if m[1] == did)
            assert trips == sum(1 for e in snap["evidence"] if e[1] == did)
        for eid, _, count in snap["entities"]:
            assert count == sum(1 for m in snap["mentions"] if m[0] == eid)
        # One entity.upserted naming every entity it touched; the queue is drained.
        assert len(events) == 1 and set(events[0]["entity_ids"]) == {r[0] for r in snap["entities"]}
        assert _queue(stack, w) == {d: (True, True) for d in important}

        # Another pass finds nothing: nothing read twice, nothing announced twice.
        assert [e for e in _sweep(stack) if e["workspace_id"] == w] == []
        assert _snapshot(stack, w) == snap

    # enrich is back: the session's episode is extracted now; the swept facts are not duplicated.
    wait_for(lambda: stack.sql("SELECT 1 FROM triples WHERE workspace_id = %s AND object_id IN"
                               " (SELECT id FROM entities WHERE workspace_id = %s AND name = 'Porto')", (w, w)),
             120, "the episode's extraction")
    after = _snapshot(stack, w)
    assert len(after["triples"]) == len(set(_facts(after)))
    assert sum(1 for f in _facts(after) if f == ("Bob", "has_relative", "Clara")) == 1
    wait_for(lambda: all(read for _, read in _queue(stack, w).values()) and len(_queue(stack, w)) == len(TURNS),
             30, "every drawer marked read by the episode's extraction")


def test_drawers_read_by_their_session_extraction_are_never_swept(stack: Stack) -> None:
    w = ws()
    stack.publish(_session(w))
    stack.wait_processed(w, len(TURNS), 90)
    wait_for(lambda: len(_queue(stack, w)) == len(TURNS) and all(r for _, r in _queue(stack, w).values()), 120,
             "the session's extraction marked its drawers read")
    snap = _snapshot(stack, w)
    assert snap["triples"]
    assert [e for e in _sweep(stack) if e["workspace_id"] == w] == []
    assert _snapshot(stack, w) == snap


@pytest.fixture(scope="module")
def chat() -> Iterator[tuple[ChatStub, str]]:
    state = StubState()
    with serve_stub(state) as url:
        yield state.chat, url


def test_llm_sweep_uses_a_good_answer_and_falls_back_on_a_malformed_or_slow_one(
        stack: Stack, chat: tuple[ChatStub, str]) -> None:
    stub, url = chat
    with _enrich_down(stack):
        w_ok = ws()
        _stored_unextracted(stack, w_ok)
        stub.extract_mode, stub.extract_calls = "ok", 0
        events = [e for e in _sweep(stack, llm_url=url) if e["workspace_id"] == w_ok]
        assert stub.extract_calls >= 1 and len(events) == 1
        snap = _snapshot(stack, w_ok)
        # The model's graph (its relation, normalised), valid from the message's time.
        assert snap["triples"] and all(r[2] == "talked_about" for r in snap["triples"])
        assert {r[4] for r in snap["triples"]} <= {datetime.fromisoformat(t[1]) for t in TURNS}
        assert stack.sql("SELECT count(*) FROM memory_history WHERE workspace_id = %s AND action = 'KG_EXTRACT'",
                         (w_ok,))[0][0] == 0
        assert stack.sql("SELECT coalesce(sum(calls_ok), 0) FROM llm_usage WHERE workspace_id = %s"
                         " AND purpose = 'extract'", (w_ok,))[0][0] >= 1

        w_bad = ws()
        _stored_unextracted(stack, w_bad)
        stub.extract_mode = "malformed"
        events = [e for e in _sweep(stack, llm_url=url) if e["workspace_id"] == w_bad]
        assert len(events) == 1
        facts = _facts(_snapshot(stack, w_bad))
        assert ("Bob", "has_relative", "Clara") in facts  # the patterns' graph stands
        hist = stack.sql("SELECT reason, new_value FROM memory_history WHERE workspace_id = %s"
                         " AND action = 'KG_EXTRACT'", (w_bad,))
        assert len(hist) == 1 and "LLM extraction failed" in hist[0][0] and hist[0][1]["tier"] == "patterns"
        assert all(read for _, read in _queue(stack, w_bad).values())

        # A model slower than the timeout: the patterns' graph, and the failure recorded.
        w_slow = ws()
        _stored_unextracted(stack, w_slow)
        stub.extract_mode, stub.extract_delay_s = "ok", 3.0
        try:
            events = [e for e in _sweep(stack, llm_url=url) if e["workspace_id"] == w_slow]
        finally:
            stub.extract_delay_s = 0.0
        assert len(events) == 1 and ("Bob", "has_relative", "Clara") in _facts(_snapshot(stack, w_slow))
        assert stack.sql("SELECT count(*) FROM memory_history WHERE workspace_id = %s AND action = 'KG_EXTRACT'"
                         " AND reason LIKE '%%LLM extraction failed%%'", (w_slow,))[0][0] == 1


def test_drawers_their_session_extraction_reads_while_the_model_answers_are_not_stored_twice(
        stack: Stack, chat: tuple[ChatStub, str]) -> None:
    """The sweep lists the queued drawers, then asks the model; their session's extraction (enrich back)
    reads and marks them meanwhile. The sweep's reading is then not stored, nor announced."""
    import threading

    stub, url = chat
    w = ws()
    with _enrich_down(stack):  # the test plays the session's extraction, at the moment it chooses
        _stored_unextracted(stack, w)
        stub.extract_mode, stub.extract_calls, stub.extract_delay_s = "ok", 0, 1.0
        events: list[dict[str, Any]] = []
        sweep = threading.Thread(target=lambda: events.extend(_sweep(stack, llm_url=url)))
        sweep.start()
        try:
            wait_for(lambda: stub.extract_calls >= 1, 30, "the sweep asking the model")
            stack.sql("UPDATE drawer_extraction SET extracted_at = now() WHERE workspace_id = %s RETURNING 1", (w,))
        finally:
            sweep.join(60)
            stub.extract_delay_s = 0.0
    assert not sweep.is_alive()
    assert [e for e in events if e["workspace_id"] == w] == []
    # No fact from the sweep (those of the episode's extraction, enrich back, name their episode).
    assert stack.sql("SELECT count(*) FROM triples WHERE workspace_id = %s AND source_episode IS NULL", (w,)) == [(0,)]


def test_the_sweep_reads_the_partial_index(stack: Stack) -> None:
    """A backlog past the sweep's batch is read in due order from the partial index, never sorted whole.
    The backlog (rows with no drawers behind them: foreign keys off for the insert) and the statistics
    taken over it are rolled back; what other tests left in the table no longer decides the plan (with a
    few dozen rows a bitmap scan and a sort of them was as cheap, and was chosen)."""
    import psycopg

    w = ws()
    with psycopg.connect(stack.database_url) as conn:
        conn.execute("SET LOCAL session_replication_role = replica")
        conn.execute("""INSERT INTO drawer_extraction (workspace_id, drawer_id, due_at)
                        SELECT %s, 'd' || i, now() - i * interval '1 second' FROM generate_series(1, 5000) i""",
                     (w,))
        conn.execute("SET LOCAL session_replication_role = DEFAULT")
        analyze(conn, "drawer_extraction")
        plan = "\n".join(r[0] for r in conn.execute("EXPLAIN " + DUE_SQL, (0.0, 500)).fetchall())
        assert "drawer_extraction_due" in plan and "Sort" not in plan, plan
        conn.rollback()
