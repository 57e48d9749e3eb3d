"""Dreaming against the real stack: an agent/user pair's episodes become long-term drawers in the
dreaming wing (through ingest, like any producer's), once per threshold, with several runners at once,
with the LLM answering well, partly, badly, slowly or not at all (a local OpenAI-compatible server)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from shared.bus import build_broker
from shared.config import Settings
from shared.db.pool import open_pool
from shared.dreaming import dream_pair
from shared.lifecycle import JOBS, JobRun, run_job
from tests.integration.helpers import Stack, session, wait_for, ws
from tests.openai_stub import ChatStub, StubState, serve_stub


@pytest.fixture(scope="module")
def chat() -> Iterator[tuple[ChatStub, str]]:
    state = StubState()
    with serve_stub(state) as url:
        yield state.chat, url


class Runner:
    """What the maintain service (or `palace maintain dreaming`) holds: a pool and a bus connection."""

    def __init__(self, stack: Stack) -> None:
        self.stack = stack

    async def __aenter__(self) -> Runner:
        s = self.stack.settings
        self.pool = await open_pool(self.stack.database_url, name="test-dreaming", max_size=4, role=s.db_role)
        self.broker = build_broker(s, "test-dreaming", self.stack.nats_url)
        await self.broker.connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.broker.stop()
        await self.pool.close()

    def run(self, holder: str, **overrides: Any) -> JobRun:
        s: Settings = self.stack.settings.model_copy(update=overrides)
        return JobRun("dreaming", self.pool, s, holder, broker=self.broker)

    async def job(self, holder: str, **overrides: Any) -> dict[str, int] | None:
        s = self.stack.settings.model_copy(update=overrides)
        return await run_job(JOBS["dreaming"], pool=self.pool, settings=s, holder=holder, broker=self.broker,
                             manual=True)


@pytest.fixture
async def runner(stack: Stack) -> AsyncIterator[Runner]:
    async with Runner(stack) as r:
        yield r


def _episodes(stack: Stack, w: str, agent: str, user: str, n: int, start: int = 0) -> list[str]:
    """Built, announced episodes of the pair (as enrich leaves them), oldest first."""
    base = datetime(2026, 10, 1, tzinfo=UTC)
    ids = []
    for i in range(start, start + n):
        eid = f"ep-{uuid.uuid4().hex[:12]}"
        when = base + timedelta(days=i)
        stack.sql(
            """INSERT INTO episodes (workspace_id, id, session_id, agent_id, user_id, summary, abstract, topics,
                                     status, started_at, completed_at, announced_at)
               VALUES (%s, %s, %s, %s, %s, %s, %s, %s, 'ready', %s, %s, now()) RETURNING 1""",
            (w, eid, f"s-{eid}", agent, user, f"user: We planned the trip to Kyoto, part {i}, window seat again.",
             f"user: We planned the trip to Kyoto, part {i}.", ["kyoto", "trip", f"part{i}"], when, when))
        ids.append(eid)
    return ids


def _runs(stack: Stack, w: str) -> list[tuple[Any, ...]]:
    return stack.sql("SELECT id, agent_id, user_id, episode_ids, status, source, drawer_ids, warnings"
                     " FROM dreaming_runs WHERE workspace_id = %s ORDER BY claimed_at", (w,))


def _promoted(stack: Stack, w: str) -> set[str]:
    return {r[0] for r in stack.sql("SELECT id FROM episodes WHERE workspace_id = %s AND promoted_at IS NOT NULL",
                                    (w,))}


async def test_five_sessions_are_dreamt_into_the_dreaming_wing_once(stack: Stack, runner: Runner) -> None:
    """Through the pipeline: five sessions of one pair become five episodes, then one consolidated
    drawer (no LLM: the extractive note) with provenance; a pair below the threshold waits."""
    w = ws()
    texts = ["We booked the flight to Kyoto for the spring; I want a window seat again.",
             "The Kyoto hotel is near the station, which matters because of the early trains."]
    for i in range(5):
        await asyncio.to_thread(stack.publish, session(w, f"s{i}", [*texts, f"Day {i}: the temple visit moved."],
                                                       agent_id="agent-d", user_id="user-d"))
    for i in range(4):
        await asyncio.to_thread(stack.publish, session(w, f"x{i}", texts, agent_id="agent-x", user_id="user-d"))
    await asyncio.to_thread(wait_for, lambda: stack.sql(
        "SELECT count(*) FROM episodes WHERE workspace_id = %s AND announced_at IS NOT NULL", (w,))[0][0] == 9,
        120, "nine episodes")
    pair_d = {r[0] for r in stack.sql("SELECT id FROM episodes WHERE workspace_id = %s AND agent_id = 'agent-d'"
                                      " AND user_id = 'user-d'", (w,))}
    assert len(pair_d) == 5

    counts = await runner.job("test")
    assert counts is not None and counts["runs"] >= 1
    (run,) = _runs(stack, w)
    rid, agent, user, episode_ids, status, source, drawer_ids, warnings = run
    assert (agent, user, set(episode_ids), status, source, warnings) == ("agent-d", "user-d", pair_d, "done",
                                                                          "extractive", [])
    assert _promoted(stack, w) == pair_d
    # Raw first, through ingest: the drawers exist once ingest filed the published session.
    rows = await asyncio.to_thread(wait_for, lambda: stack.sql(
        "SELECT id, wing, room, content, metadata, state FROM drawers WHERE workspace_id = %s"
        " AND session_id = %s AND state = 'processed'", (w, f"dreaming:{rid}")), 60, "the dreaming drawers")
    assert {r[0] for r in rows} == set(drawer_ids)
    assert {(r[1], r[2]) for r in rows} == {("dreaming", "consolidated")}
    content = "\n".join(r[3] for r in rows)
    assert "Consolidated memory of 5 sessions" in content and "Recurring topics:" in content
    assert all(set(r[4]["message"]["episode_ids"]) == pair_d for r in rows)
    hist = stack.sql("SELECT new_value FROM memory_history WHERE workspace_id = %s AND action = 'DREAM'", (w,))
    assert len(hist) == 1 and set(hist[0][0]["episodes"]) == pair_d
    hits = await asyncio.to_thread(stack.search, w, "Kyoto window seat trip consolidated sessions", 10)
    assert any(h["id"] in drawer_ids for h in hits)

    # Its own output is never dreamt about: the dreaming session's episode does not count.
    await asyncio.to_thread(wait_for, lambda: stack.sql(
        "SELECT 1 FROM episodes WHERE workspace_id = %s AND session_id = %s AND status = 'ready'",
        (w, f"dreaming:{rid}")), 60, "the dreaming session's episode")
    again = await dream_pair(runner.run("test", dreaming_debounce_s=0), w, "agent-d", "user-d")
    assert again == {"outcome": "below_threshold"}
    assert await dream_pair(runner.run("test"), w, "agent-x", "user-d") == {"outcome": "below_threshold"}
    assert len(_runs(stack, w)) == 1


async def test_the_next_threshold_waits_for_the_debounce(stack: Stack, runner: Runner) -> None:
    w = ws()
    first = _episodes(stack, w, "a", "u", 5)
    assert (await dream_pair(runner.run("t"), w, "a", "u"))["outcome"] == "done"
    second = _episodes(stack, w, "a", "u", 6, start=5)
    assert await dream_pair(runner.run("t"), w, "a", "u") == {"outcome": "debounced"}
    r = await dream_pair(runner.run("t", dreaming_debounce_s=0, dreaming_max_episodes=10), w, "a", "u")
    assert r["outcome"] == "done" and r["episodes"] == 6
    runs = _runs(stack, w)
    assert [set(x[3]) for x in runs] == [set(first), set(second)]
    assert _promoted(stack, w) == set(first) | set(second)


async def test_two_concurrent_runners_consolidate_a_threshold_once(stack: Stack, runner: Runner,
                                                                   chat: tuple[ChatStub, str]) -> None:
    stub, url = chat
    w = ws()
    eps = _episodes(stack, w, "a", "u", 5)
    # A slow LLM keeps the first runner inside its run while the second arrives.
    stub.dreaming, stub.slow_s = "slow", 1.5
    llm = {"llm_base_url": url, "llm_model": "stub-chat", "llm_timeout_s": 5.0, "llm_attempts": 1}
    results = await asyncio.gather(dream_pair(runner.run("replica-a", **llm), w, "a", "u"),
                                   dream_pair(runner.run("replica-b", **llm), w, "a", "u"))
    assert sorted(r["outcome"] for r in results) == ["busy", "done"], results
    (run,) = _runs(stack, w)
    assert set(run[3]) == set(eps) and run[4] == "done" and run[5] == "llm"
    assert _promoted(stack, w) == set(eps)
    # Run again (the job, under its lease): the threshold was consolidated, nothing more happens.
    assert await runner.job("replica-b") is not None
    assert len(_runs(stack, w)) == 1
    await asyncio.to_thread(wait_for, lambda: stack.sql(
        "SELECT count(*) FROM drawers WHERE workspace_id = %s AND wing = 'dreaming'", (w,))[0][0] == 2, 60,
        "the two dreamt drawers")
    assert stack.sql("SELECT count(*) FROM sessions WHERE workspace_id = %s", (w,))[0][0] == 1


@pytest.mark.parametrize(("mode", "source", "memories", "warned"), [
    ("ok", "llm", ["The user keeps planning trips (5 sessions).", "The user prefers window seats on long flights."],
     ""),
    ("partial", "llm", ["The user keeps planning trips (5 sessions).", "The user owns a red bicycle."], "no content"),
    ("malformed", "extractive", None, ""),
    ("slow", "extractive", None, "LLM unavailable"),
    ("fail500", "extractive", None, "LLM unavailable"),
])
async def test_llm_answers_good_partial_malformed_slow_and_failing(
        stack: Stack, runner: Runner, chat: tuple[ChatStub, str], mode: str, source: str,
        memories: list[str] | None, warned: str) -> None:
    stub, url = chat
    stub.dreaming, stub.slow_s = mode, 6.0  # twice the timeout: a busy machine cannot make "ok" look "slow"
    w = ws()
    eps = _episodes(stack, w, "a", "u", 5)
    llm = {"llm_base_url": url, "llm_model": "stub-chat", "llm_timeout_s": 3.0, "llm_attempts": 1}
    r = await dream_pair(runner.run("t", **llm), w, "a", "u")
    assert r["outcome"] == "done" and r["source"] == source
    (run,) = _runs(stack, w)
    stored = stack.sql("SELECT memories FROM dreaming_runs WHERE workspace_id = %s", (w,))[0][0]
    if memories is not None:
        assert [m["content"] for m in stored] == memories
        if mode == "partial":
            # The invented episode id is dropped; the memory is kept, citing the whole run.
            assert stored[1]["episode_ids"] == sorted(eps) and stored[1]["kind"] == "fact"
    else:
        assert len(stored) == 1 and stored[0]["content"].startswith("Consolidated memory of 5 sessions")
    assert (warned in " ".join(run[7])) if warned else (mode == "malformed") == bool(run[7])
    assert _promoted(stack, w) == set(eps)
    usage = stack.sql("SELECT coalesce(sum(calls_ok), 0), coalesce(sum(calls_failed), 0) FROM llm_usage"
                      " WHERE workspace_id = %s AND purpose = 'dreaming'", (w,))[0]
    assert usage == ((1, 0) if mode in ("ok", "partial", "malformed") else (0, 1))
    await asyncio.to_thread(wait_for, lambda: stack.sql(
        "SELECT count(*) FROM drawers WHERE workspace_id = %s AND wing = 'dreaming'", (w,))[0][0] == len(stored),
        60, "the dreamt drawers")
    meta = stack.sql("SELECT metadata FROM drawers WHERE workspace_id = %s AND wing = 'dreaming'", (w,))
    assert meta and all(m[0]["message"]["dreaming_run"] == run[0] for m in meta)


async def test_due_pairs_and_a_claim_read_the_partial_index(stack: Stack, runner: Runner) -> None:
    w = ws()
    _episodes(stack, w, "a", "u", 3)
    async with runner.pool.connection() as conn:
        await conn.execute("SET enable_seqscan = off")  # plans on the shared test database, not its size
        for sql, params in [
            ("SELECT workspace_id, coalesce(agent_id, ''), coalesce(user_id, ''), count(*) FROM episodes"
             " WHERE promoted_at IS NULL AND status = 'ready' AND session_id NOT LIKE 'dreaming:%%'"
             " GROUP BY 1, 2, 3 HAVING count(*) >= 5", ()),
            ("SELECT id FROM episodes WHERE workspace_id = %s AND coalesce(agent_id, '') = 'a'"
             " AND coalesce(user_id, '') = 'u' AND promoted_at IS NULL AND status = 'ready'"
             " AND session_id NOT LIKE 'dreaming:%%' ORDER BY completed_at, id LIMIT 10", (w,)),
        ]:
            plan = "\n".join(r[0] for r in await (await conn.execute("EXPLAIN " + sql, params)).fetchall())
            # An index, never a scan of every episode (which index wins on a near-empty shared test
            # table is the planner's coin toss; the partial one is what it takes at any real size).
            assert "Seq Scan" not in plan, plan
        await conn.rollback()


async def test_forgetting_a_session_forgets_what_dreaming_made_of_it(stack: Stack, runner: Runner) -> None:
    """The run consolidated the forgotten session's episode: its record, its drawers (filed through
    ingest in the dreaming wing) and the content of its audit row go; the pair's other episodes become
    unpromoted (the next run consolidates them without it); the proof looks for all of it and can fail."""
    from shared.forget import Scope, Targets, forget, verify

    w = ws()
    eps = _episodes(stack, w, "a", "u", 5)
    assert (await dream_pair(runner.run("t"), w, "a", "u"))["outcome"] == "done"
    (rid, *_), = _runs(stack, w)
    dreamt = await asyncio.to_thread(wait_for, lambda: stack.sql(
        "SELECT id FROM drawers WHERE workspace_id = %s AND session_id = %s AND state = 'processed'",
        (w, f"dreaming:{rid}")), 60, "the dreaming drawers")
    session_of = stack.sql("SELECT session_id FROM episodes WHERE workspace_id = %s AND id = %s", (w, eps[2]))[0][0]
    stack.sql("INSERT INTO sessions (workspace_id, session_id, event_id, message_count, content_hash)"
              " VALUES (%s, %s, 'e', 0, 'h') RETURNING 1", (w, session_of))
    scope = Scope(w, "session", session_of)
    before = await verify(runner.pool, stack.settings, stack.nats_url, scope, Targets(episode_ids={eps[2]}))
    assert (before["dreaming_runs"], before["dreaming_history"]) == (1, 1)
    assert before["dreaming_drawers"] == len(dreamt) >= 1

    r = await forget(runner.pool, stack.settings, stack.nats_url, scope, requested_by="test")
    assert r.counts["dreaming_runs"] == 1 and r.counts["drawers"] == len(dreamt)
    assert r.counts["episodes_unpromoted"] == 4
    left = await verify(runner.pool, stack.settings, stack.nats_url, scope, r.targets)
    assert not any(left.values()), {k: v for k, v in left.items() if v}
    assert _runs(stack, w) == []
    assert stack.sql("SELECT count(*) FROM drawers WHERE workspace_id = %s AND wing = 'dreaming'", (w,)) == [(0,)]
    assert stack.sql("SELECT count(*) FROM sessions WHERE workspace_id = %s AND session_id = %s",
                     (w, f"dreaming:{rid}")) == [(0,)]
    assert stack.sql("SELECT reason, new_value FROM memory_history WHERE workspace_id = %s AND action = 'DREAM'",
                     (w,)) == [(None, None)]
    assert _promoted(stack, w) == set()
    assert {e for (e,) in stack.sql("SELECT id FROM episodes WHERE workspace_id = %s", (w,))} == set(eps) - {eps[2]}
    # The next run consolidates what is left once the pair has enough again; the forgotten one never.
    more = _episodes(stack, w, "a", "u", 1, start=5)
    r2 = await dream_pair(runner.run("t", dreaming_debounce_s=0), w, "a", "u")
    assert r2["outcome"] == "done" and r2["episodes"] == 5
    (run2,) = _runs(stack, w)
    assert set(run2[3]) == (set(eps) - {eps[2]}) | set(more)


async def test_a_claim_takes_no_episode_of_a_forgotten_session_or_pair(stack: Stack, runner: Runner) -> None:
    """Tombstones written (a forget under way) before the claim: it takes none of the forgotten."""
    w = ws()
    eps = _episodes(stack, w, "a", "u", 5)
    session_of = stack.sql("SELECT session_id FROM episodes WHERE workspace_id = %s AND id = %s", (w, eps[0]))[0][0]
    stack.sql("INSERT INTO forget_tombstones (workspace_id, kind, value, forget_id) VALUES (%s, 'session', %s, 'f')"
              " RETURNING 1", (w, session_of))
    assert await dream_pair(runner.run("t"), w, "a", "u") == {"outcome": "below_threshold"}
    stack.sql("INSERT INTO forget_tombstones (workspace_id, kind, value, forget_id) VALUES (%s, 'user', 'u', 'f')"
              " RETURNING 1", (w,))
    _episodes(stack, w, "a", "u", 2, start=5)
    assert await dream_pair(runner.run("t"), w, "a", "u") == {"outcome": "forgotten"}
    assert _runs(stack, w) == []
