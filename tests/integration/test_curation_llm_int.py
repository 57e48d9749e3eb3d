"""The classify service's three phases against real NATS and PostgreSQL, with the LLM phase on a
local OpenAI-compatible chat server that answers well, badly, slowly or not at all.

The stack's own classify and cluster processes (no LLM) are swapped for ones configured with the
stub (decisions in full mode) for this module, and put back afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import numpy as np
import psycopg
import pytest

from shared.db.centroids import load_centroids
from shared.db.pool import open_pool
from shared.db.tenancy import workspace_tx
from shared.ids import content_hash
from shared.lifecycle import JOBS, run_job
from shared.memory.centroids import nearest_type
from shared.memory.dedup import wording_bands
from shared.memory.filing import embedding_text
from tests.integration.helpers import Stack, session, wait_for, ws
from tests.openai_stub import ChatStub, StubState, serve_stub

TEXTS = [
    "Maria mentioned a decision about the Lisbon office yesterday",
    "John said the Denver trip is a task for Friday",
    "Caroline talked about Boston and her painting class",
]


def _swap(stack: Stack, env: dict[str, str], names: tuple[str, ...] = ("classify", "cluster")) -> None:
    """Restart these services of the shared stack with ``env``."""
    sup = stack.supervisor
    for name in names:
        child = sup.children.pop(name, None)
        if child is not None:
            child.proc.send_signal(signal.SIGTERM)
            child.proc.wait(30)
    sup.env = env
    for name in names:
        sup.spawn(name)
    sup.wait_healthy(120)


def test_without_llm_every_drawer_is_processed_by_the_heuristic(stack: Stack) -> None:
    w = ws()
    stack.publish(session(w, "s1", TEXTS))
    stack.wait_processed(w, len(TEXTS))
    rows = stack.sql("SELECT state, pipeline_tier, memory_type, confidence FROM drawers WHERE workspace_id = %s",
                     (w,))
    assert len(rows) == len(TEXTS)
    assert {(r[0], r[1]) for r in rows} == {("processed", "heuristic")}
    assert any(r[3] < stack.settings.heuristic_low for r in rows)  # low confidence, still processed
    assert all(r[2] for r in rows)


@pytest.fixture(scope="module")
def llm(stack: Stack) -> Iterator[ChatStub]:
    state = StubState()
    saved_env = dict(stack.supervisor.env)
    with serve_stub(state) as url:
        llm_env = {**saved_env, "PALACE_LLM_BASE_URL": url, "PALACE_LLM_MODEL": "stub-chat",
                   "PALACE_LLM_TIMEOUT_S": "6", "PALACE_LLM_ATTEMPTS": "3", "PALACE_DECISIONS_MODE": "full"}
        # A timeout of 6 s, and "slow" twice that: a good answer delayed by a busy machine (the tests below
        # delay some by 1.5–2 s on purpose) is not taken for a slow one (the exact call counts would shift).
        state.chat.slow_s = 12.0
        _swap(stack, llm_env)
        state.chat.env = llm_env  # type: ignore[attr-defined]
        try:
            yield state.chat
        finally:
            _swap(stack, saved_env)


def _reset(chat: ChatStub, mode: str = "ok", script: list[str] | None = None, decision: str = "ADD") -> None:
    chat.mode, chat.script, chat.decision = mode, list(script or []), decision
    chat.calls, chat.modes_seen, chat.items_per_call, chat.ids_per_call = 0, [], [], []


def _drawers(stack: Stack, w: str) -> list[tuple]:
    return stack.sql(
        "SELECT id, state, pipeline_tier, memory_type, importance, summary, failure_reason, content, metadata"
        " FROM drawers WHERE workspace_id = %s ORDER BY seq", (w,))


def _usage(stack: Stack, w: str) -> tuple:
    return stack.sql("SELECT coalesce(sum(calls_ok), 0), coalesce(sum(calls_failed), 0), coalesce(sum(tokens_in), 0),"
                     " coalesce(sum(tokens_out), 0) FROM llm_usage WHERE workspace_id = %s AND purpose = 'classify'",
                     (w,))[0]


def test_good_answers_label_in_one_batch_with_entities_triples_and_cost(stack: Stack, llm: ChatStub) -> None:
    _reset(llm)
    w = ws()
    stack.publish(session(w, "s1", TEXTS))
    stack.wait_processed(w, len(TEXTS))
    rows = _drawers(stack, w)
    assert [r[2] for r in rows] == ["llm"] * 3
    assert [r[3] for r in rows] == ["decision", "task", "fact"]  # the stub's labels, not the heuristic's
    assert all(r[5] for r in rows) and all(r[4] == 4 for r in rows)
    assert llm.calls == 1 and llm.items_per_call == [3]  # one batched call for the workspace's drawers
    ents = {r[0] for r in stack.sql("SELECT name FROM entities WHERE workspace_id = %s", (w,))}
    assert {"Maria", "Lisbon", "John", "Denver", "Caroline", "Boston"} <= ents
    triples = stack.sql("SELECT count(*) FROM triples WHERE workspace_id = %s", (w,))[0][0]
    assert triples == 3
    assert [r[0] for r in stack.sql("SELECT triple_count FROM drawers WHERE workspace_id = %s", (w,))] == [1, 1, 1]
    ok, failed, tin, tout = _usage(stack, w)
    assert (ok, failed) == (1, 0) and tin > 0 and tout > 0
    hist = stack.sql("SELECT reason FROM memory_history WHERE workspace_id = %s AND action = 'CLASSIFY'", (w,))
    assert len(hist) == 3 and all(h[0].startswith("llm") for h in hist)
    port = stack.supervisor.port_of("classify")
    metrics = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5, follow_redirects=True).text
    assert 'palace_llm_calls_total{outcome="ok",purpose="classify"}' in metrics
    assert 'palace_llm_tokens_total{direction="in",purpose="classify"}' in metrics


def _consumer_idle(stack: Stack, service: str, subject: str) -> bool:
    """Whether ``service``'s consumer of ``subject`` has nothing waiting and nothing in hand."""
    import nats

    from shared.consumers import consumer_for

    async def go() -> bool:
        nc = await nats.connect(stack.nats_url)
        try:
            info = await nc.jetstream().consumer_info(stack.settings.stream_name,
                                                       consumer_for(service, subject).durable)
            return not info.num_pending and not info.num_ack_pending
        finally:
            await nc.close()

    return asyncio.run(go())


def test_a_drawer_two_events_name_at_once_is_asked_about_once(stack: Stack, llm: ChatStub) -> None:
    """The same words in a second session name the same drawer while the model is still answering about it
    for the first: the second event leaves it to the first (claimed), instead of asking the model again,
    writing its second answer and counting a failure twice; both events are announced."""
    _reset(llm)
    w = ws()
    llm.latency_s = 2.0
    try:
        asked = llm.requests
        stack.publish(session(w, "s1", [TEXTS[0]]))
        wait_for(lambda: llm.requests > asked, 60, "the model asked about the drawer")
        stack.publish(session(w, "s2", [TEXTS[0]]))
        wait_for(lambda: stack.sql("SELECT count(*) FROM sessions WHERE workspace_id = %s", (w,)) == [(2,)], 60,
                 "the second session stored")
        stack.wait_processed(w, 1)
        wait_for(lambda: _consumer_idle(stack, "classify", "drawer.embedded"), 60, "both events through classify")
    finally:
        llm.latency_s = 0.0
    (did,) = [r[0] for r in _drawers(stack, w)]
    assert sum(did in ids for ids in llm.ids_per_call) == 1, llm.ids_per_call
    assert stack.sql("SELECT count(*) FROM memory_history WHERE workspace_id = %s AND action = 'CLASSIFY'",
                     (w,)) == [(1,)]
    assert stack.sql("SELECT llm_claimed_until FROM drawers WHERE workspace_id = %s", (w,)) == [(None,)]


def test_batches_never_mix_workspaces_and_cost_is_kept_per_workspace(stack: Stack, llm: ChatStub) -> None:
    _reset(llm)
    w1, w2 = ws(), ws()
    stack.publish(session(w1, "s1", TEXTS))
    stack.publish(session(w2, "s1", TEXTS[:2]))
    stack.wait_processed(w1, 3)
    stack.wait_processed(w2, 2)
    owner = {r[0]: r[1] for r in stack.sql("SELECT id, workspace_id FROM drawers WHERE workspace_id IN (%s, %s)",
                                            (w1, w2))}
    batches = [{owner[i] for i in ids} for ids in llm.ids_per_call]
    # Every call holds one workspace's drawers only. How many calls it takes depends on how the drawers
    # reach classify (usually one per workspace; a busy machine can split a workspace's into two fetches).
    assert all(len(b) == 1 for b in batches) and {next(iter(b)) for b in batches} == {w1, w2}, batches
    # Every drawer was asked about (a redelivered batch may be asked about again).
    assert {i for ids in llm.ids_per_call for i in ids} == set(owner)
    u1, u2 = _usage(stack, w1), _usage(stack, w2)
    assert u1[0] >= 1 and u2[0] >= 1 and u1[1] == u2[1] == 0
    assert u1[2] > u2[2] > 0  # the bigger batch has the longer prompt: tokens are counted per workspace


def test_maintain_exports_todays_llm_cost_per_workspace_with_bounded_labels(stack: Stack, llm: ChatStub) -> None:
    from prometheus_client import REGISTRY

    from services.maintain.app import export_llm_cost

    _reset(llm)
    w = ws()
    stack.publish(session(w, "s1", TEXTS))
    stack.wait_processed(w, len(TEXTS))
    ok, failed, tin, tout = _usage(stack, w)

    def export(top: int) -> None:
        async def go() -> None:
            pool = await open_pool(stack.database_url, name="test-cost", max_size=1, role=stack.settings.db_role)
            try:
                await export_llm_cost(pool, stack.settings.model_copy(update={"metrics_cost_workspaces": top}))
            finally:
                await pool.close()
        asyncio.run(go())

    def sample(name: str, **labels: str) -> float | None:
        return REGISTRY.get_sample_value(name, labels)

    export(10_000)
    assert sample("palace_llm_workspace_tokens_today", workspace=w, purpose="classify", direction="in") == tin
    assert sample("palace_llm_workspace_tokens_today", workspace=w, purpose="classify", direction="out") == tout
    assert sample("palace_llm_workspace_calls_today", workspace=w, purpose="classify", outcome="ok") == ok
    assert sample("palace_llm_workspace_calls_today", workspace=w, purpose="classify", outcome="error") == failed

    def total() -> int:
        return int(stack.sql("SELECT sum(tokens_in) + sum(tokens_out) FROM llm_usage WHERE day = current_date")[0][0])

    def summed_under_one_name() -> bool:
        """One workspace by name, every other one summed: nothing lost, series bounded. (The stack's cluster
        may still be costing decisions: compare only when the table did not move during the export.)"""
        before = total()
        export(1)
        samples = [s for m in REGISTRY.collect() if m.name == "palace_llm_workspace_tokens_today" for s in m.samples]
        assert len({s.labels["workspace"] for s in samples}) <= 2
        return before == total() == sum(s.value for s in samples)

    wait_for(summed_under_one_name, 30, "the gauges summing to the table")
    # ... and the maintain service itself exports them (its sweep runs every second in the test stack).
    port = stack.supervisor.port_of("maintain")
    wait_for(lambda: 'palace_llm_workspace_tokens_today{direction="in",purpose="classify"' in httpx.get(
        f"http://127.0.0.1:{port}/metrics", timeout=5, follow_redirects=True).text, 30, "maintain's cost gauges")


def test_unparseable_batch_falls_back_to_one_call_per_drawer(stack: Stack, llm: ChatStub) -> None:
    _reset(llm, "batch_broken")
    w = ws()
    stack.publish(session(w, "s1", TEXTS))
    stack.wait_processed(w, len(TEXTS))
    rows = _drawers(stack, w)
    assert [r[2] for r in rows] == ["llm"] * 3
    assert llm.items_per_call == [3, 1, 1, 1]


def test_hallucinated_ids_are_ignored_and_their_drawers_asked_again(stack: Stack, llm: ChatStub) -> None:
    _reset(llm, "hallucinated")
    w = ws()
    stack.publish(session(w, "s1", TEXTS))
    stack.wait_processed(w, len(TEXTS))
    rows = _drawers(stack, w)
    assert [r[2] for r in rows] == ["llm"] * 3 and [r[3] for r in rows] == ["decision", "task", "fact"]
    assert llm.items_per_call == [3, 1, 1, 1]
    # no drawer, entity or mention was created for an invented id
    assert stack.sql("SELECT count(*) FROM entity_mentions m WHERE workspace_id = %s AND NOT EXISTS"
                     " (SELECT 1 FROM drawers d WHERE d.workspace_id = m.workspace_id AND d.id = m.drawer_id)",
                     (w,))[0][0] == 0


def test_partial_answers_keep_what_is_valid_with_warnings(stack: Stack, llm: ChatStub) -> None:
    _reset(llm, "partial")
    w = ws()
    stack.publish(session(w, "s1", TEXTS[:1]))
    stack.wait_processed(w, 1)
    (row,) = _drawers(stack, w)
    assert (row[2], row[3]) == ("llm", "decision")
    assert row[4] != 7  # out-of-range importance dropped, the heuristic's kept
    assert len(row[8]["llm_warnings"]) == 2  # importance and the broken triple
    assert stack.sql("SELECT count(*) FROM triples WHERE workspace_id = %s", (w,))[0][0] == 1


def test_timeouts_and_429_are_retried_then_succeed(stack: Stack, llm: ChatStub) -> None:
    _reset(llm, "ok", ["slow", "fail429"])
    w = ws()
    stack.publish(session(w, "s1", TEXTS[:2]))
    stack.wait_processed(w, 2)
    assert [r[2] for r in _drawers(stack, w)] == ["llm", "llm"]
    assert llm.modes_seen[:3] == ["slow", "fail429", "ok"]
    ok, failed, _, _ = _usage(stack, w)
    assert (ok, failed) == (1, 2)


def test_server_errors_fail_the_drawer_after_three_attempts_never_deleting_it(stack: Stack, llm: ChatStub) -> None:
    _reset(llm, "fail500")
    w = ws()
    stack.publish(session(w, "s1", TEXTS[:1]))
    wait_for(lambda: [r[1] for r in _drawers(stack, w)] == ["failed"], 90, "drawer failed by the LLM phase")
    (row,) = _drawers(stack, w)
    assert row[7] == TEXTS[0]  # the raw content is intact
    assert row[6].startswith("llm: InternalServerError")
    assert row[3] is not None and row[2] == "heuristic"  # the heuristic label stands
    assert row[8]["llm_failures"] == 3
    assert llm.calls == 9  # 3 deliveries x 3 tries (5xx is transient)
    ok, failed, _, _ = _usage(stack, w)
    assert (ok, failed) == (0, 9)
    hist = stack.sql("SELECT reason FROM memory_history WHERE workspace_id = %s AND action = 'FAIL'", (w,))
    assert len(hist) == 1 and "InternalServerError" in hist[0][0]
    # The model answers again: an operator sends the failed drawer through once more, and it is labelled.
    _reset(llm)
    out = _cli(stack, "retry-failed", "-w", w)
    assert out.returncode == 0, out.stderr
    wait_for(lambda: [r[1:3] for r in _drawers(stack, w)] == [("processed", "llm")], 60, "the drawer labelled")
    (row,) = _drawers(stack, w)
    assert row[6] is None and "llm_failures" not in row[8] and llm.calls == 1
    assert "retry-failed" in out.stdout and _cli(stack, "retry-failed", "-w", w).returncode == 0  # none left


@pytest.mark.parametrize("mode", ["fail400", "fail401", "malformed"])
def test_permanent_errors_are_not_retried_within_an_attempt(stack: Stack, llm: ChatStub, mode: str) -> None:
    _reset(llm, mode)
    w = ws()
    stack.publish(session(w, "s1", TEXTS[:1]))
    wait_for(lambda: [r[1] for r in _drawers(stack, w)] == ["failed"], 90, "drawer failed by the LLM phase")
    (row,) = _drawers(stack, w)
    assert row[7] == TEXTS[0] and row[6].startswith("llm: ")
    assert llm.calls == 3  # one call per delivery: 4xx and unreadable answers are not retried in place


def _run_job(stack: Stack, name: str) -> dict[str, int]:
    async def go() -> dict[str, int] | None:
        pool = await open_pool(stack.database_url, name="test-job", max_size=2, role=stack.settings.db_role)
        try:
            return await run_job(JOBS[name], pool=pool, settings=stack.settings, holder="test", manual=True)
        finally:
            await pool.close()

    out = asyncio.run(go())
    assert out is not None, f"{name}: lease not won"
    return out


def test_centroids_job_trains_on_llm_labels_only_and_skips_an_unchanged_set(stack: Stack) -> None:
    w = ws()
    dim = stack.settings.embed_dim
    rng = np.random.default_rng(0)
    axis = {"task": 0, "fact": 1, "decision": 2}
    # 55 LLM-labelled tasks, 30 LLM-labelled facts, 25 heuristic decisions (these must not train).
    spec = [("task", "llm")] * 55 + [("fact", "llm")] * 30 + [("decision", "heuristic")] * 25
    with psycopg.connect(stack.database_url) as conn:
        for i, (t, tier) in enumerate(spec):
            v = rng.normal(scale=0.05, size=dim).astype(np.float32)
            v[axis[t]] += 1.0
            conn.execute(
                "INSERT INTO drawers (workspace_id, id, content, content_hash, embedding, state, memory_type,"
                " pipeline_tier) VALUES (%s, %s, %s, %s, %s::vector, 'processed', %s, %s)",
                (w, f"d{i}", f"text {i}", f"h{i}", str(v.tolist()), t, tier))

    def stored() -> list[tuple]:
        return stack.sql("SELECT memory_type, sample_count, source_hash, xmin::text FROM type_centroids"
                         " WHERE workspace_id = %s ORDER BY 1", (w,))

    first = _run_job(stack, "centroids")
    assert first["recomputed"] >= 1 and first["workspaces"] >= 1
    rows = stored()
    assert [(r[0], r[1]) for r in rows] == [("fact", 30), ("task", 55)]  # only the LLM-labelled drawers train
    second = _run_job(stack, "centroids")
    assert stored() == rows  # same hash: not rewritten (same xmin)
    assert second["unchanged"] >= 1
    stack.sql("UPDATE drawers SET memory_type = 'fact' WHERE workspace_id = %s AND id = 'd0' RETURNING 1", (w,))
    _run_job(stack, "centroids")
    after = stored()
    assert [(r[0], r[1]) for r in after] == [("fact", 31), ("task", 54)] and after[0][2] != rows[0][2]

    async def nearest() -> tuple:
        pool = await open_pool(stack.database_url, name="test-centroids", role=stack.settings.db_role)
        try:
            async with workspace_tx(pool, w) as conn:
                cents = await load_centroids(conn, w)
        finally:
            await pool.close()
        e = np.zeros(dim, dtype=np.float32)
        near_task, near_fact = e.copy(), e.copy()
        near_task[0], near_fact[1] = 1.0, 1.0
        ms, mc = stack.settings.centroid_min_samples, stack.settings.centroid_min_cosine
        return (nearest_type(near_task, cents, min_cosine=mc, min_samples=ms),
                nearest_type(near_fact, cents, min_cosine=mc, min_samples=ms))

    task_hit, fact_hit = asyncio.run(nearest())
    assert task_hit is not None and task_hit[0] == "task"
    assert fact_hit is None  # 31 samples: under the 50-sample rule the fact centroid has no say


def test_quality_report_over_api_and_cli(stack: Stack, llm: ChatStub) -> None:
    _reset(llm)
    w = ws()
    stack.publish(session(w, "s1", [*TEXTS, "thanks", "ok"]))
    stack.wait_processed(w, len(TEXTS))
    _reset(llm, "fail400")
    stack.publish(session(w, "s2", ["Priya said the Oslo migration is a problem for the team"]))
    wait_for(lambda: stack.sql("SELECT count(*) FROM drawers WHERE workspace_id = %s AND state = 'failed'",
                               (w,))[0][0] == 1, 90, "one failed drawer")
    r = httpx.get(f"{stack.api_url}/v1/workspaces/{w}/quality", timeout=30)
    assert r.status_code == 200
    rep = r.json()
    assert rep["drawers"]["processed"] == 3
    assert {(x["memory_type"], x["tier"], x["count"]) for x in rep["drawers"]["by_type_and_tier"]} == {
        ("decision", "llm", 1), ("task", "llm", 1), ("fact", "llm", 1)}
    assert rep["noise"] == {"messages": 6, "dropped_as_noise": 2}
    assert rep["edits"] == {"messages_edited": 0, "earlier_texts_kept": 0}
    assert rep["failed"]["count"] == 1
    (reason,) = rep["failed"]["reasons"]
    assert reason["count"] == 1 and reason["reason"].startswith("llm: BadRequestError")
    cost = {c["purpose"]: c for c in rep["llm_cost"]}["classify"]
    assert (cost["model"], cost["calls_ok"], cost["calls_failed"]) == ("stub-chat", 1, 3)
    assert cost["tokens_in"] > 0 and cost["tokens_out"] > 0
    audit = {(a["action"], a["actor"]): a["count"] for a in rep["audit"]}
    assert audit[("CLASSIFY", "classify")] == 3 and audit[("FAIL", "classify")] == 1
    assert audit[("ADD", "cluster")] == 3  # the failed drawer was never processed: no decision on it
    assert {(p["decision"], p["outcome"]) for p in rep["proposals"]} == {("ADD", "applied")}
    assert rep["held_proposals"] == {"pending": 0, "approved_applied": 0, "approved_dropped": 0, "rejected": 0}
    assert rep["near_duplicates_merged"] == 0 and rep["superseded"] == 0
    env = {**os.environ, "PALACE_DATABASE_URL": stack.database_url, "PALACE_NATS_URL": stack.nats_url}
    out = subprocess.run([sys.executable, "-m", "services.cli", "quality", "-w", w, "--json"], env=env,
                         capture_output=True, text=True, timeout=120, check=True).stdout
    assert json.loads(out) == rep
    table = subprocess.run([sys.executable, "-m", "services.cli", "quality", "-w", w], env=env,
                           capture_output=True, text=True, timeout=120, check=True).stdout
    assert "BadRequestError" in table and "stub-chat" in table
    assert httpx.get(f"{stack.api_url}/v1/workspaces/bad%20id/quality", timeout=10).status_code == 422


def _history(stack: Stack, w: str, action: str) -> list[tuple]:
    return stack.sql("SELECT id, drawer_id, reason, old_value, new_value FROM memory_history WHERE workspace_id = %s"
                     " AND action = %s ORDER BY created_at", (w, action))


def _cli(stack: Stack, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PALACE_DATABASE_URL": stack.database_url, "PALACE_NATS_URL": stack.nats_url}
    return subprocess.run([sys.executable, "-m", "services.cli", *args], env=env, capture_output=True, text=True,
                          timeout=120)


def _embedded_again(stack: Stack, w: str, did: str) -> str:
    """Wait until a drawer an UPDATE rewrote is processed again with a vector, and check that the vector was
    made from its new words (with its speaker and context, as embed makes every drawer's). Returns it."""
    wait_for(lambda: stack.sql("SELECT state, embedding IS NOT NULL FROM drawers WHERE workspace_id = %s"
                               " AND id = %s", (w, did)) == [("processed", True)], 60,
             "the rewritten drawer embedded and classified again")
    content, speaker, context, emb = stack.sql("SELECT content, speaker, context, embedding::text FROM drawers"
                                               " WHERE workspace_id = %s AND id = %s", (w, did))[0]
    made = stack.sql("SELECT embedding::text FROM embedding_cache WHERE workspace_id = %s AND content_hash = %s",
                     (w, content_hash(embedding_text(content, speaker, context))))
    assert made == [(emb,)], "the vector of its new words"
    return str(emb)


def _two_sessions(stack: Stack, llm: ChatStub, decision: str, *, pin_first: bool = False) -> tuple[str, str, str]:
    _reset(llm, decision=decision)
    w = ws()
    first, second = "Maria prefers green tea in the morning", "Maria now prefers black coffee in the morning"
    stack.publish(session(w, "s1", [first]))
    stack.wait_processed(w, 1)
    old_id = stack.sql("SELECT id FROM drawers WHERE workspace_id = %s", (w,))[0][0]
    # 'processed' is classify's mark; wait for cluster's decision on it too, or the first drawer could be
    # judged after the second exists and propose against it instead.
    wait_for(lambda: _history(stack, w, "ADD"), 60, "the first drawer's ADD decision")
    if pin_first:
        stack.sql("UPDATE drawers SET pinned = true WHERE workspace_id = %s AND id = %s RETURNING id", (w, old_id))
    stack.publish(session(w, "s2", [second]))
    stack.wait_processed(w, 2)
    wait_for(lambda: _history(stack, w, decision if decision in ("ADD", "UPDATE", "DELETE", "NONE") else "DELETE"),
             60, f"a {decision} proposal audited")
    return w, old_id, first


def test_update_in_full_mode_is_archived_and_revert_restores_the_exact_prior_state(
        stack: Stack, llm: ChatStub) -> None:
    w, old_id, first = _two_sessions(stack, llm, "UPDATE")
    (hid, drawer, reason, old_value, new_value), = _history(stack, w, "UPDATE")
    before = (np.asarray(old_value["embedding"], dtype=np.float32), old_value["content_hash"])
    new_emb = stack.sql("SELECT embedding::text FROM drawers WHERE workspace_id = %s AND id <> %s", (w, old_id))[0][0]
    assert drawer == old_id and reason.startswith("applied: stub says UPDATE")
    assert old_value["content"] == first and new_value["outcome"] == "applied"
    content, chash, emb = stack.sql("SELECT content, content_hash, embedding::text FROM drawers"
                                    " WHERE workspace_id = %s AND id = %s", (w, old_id))[0]
    assert content.startswith(first + " (now: ") and chash != before[1]
    # Its new words are embedded (and classified) again through the pipeline: neither the vector of the
    # old words nor the newer drawer's.
    emb = _embedded_again(stack, w, old_id)
    assert emb != new_emb and not np.array_equal(np.asarray(json.loads(emb), dtype=np.float32), before[0])
    bands = "SELECT dedup_bands FROM drawers WHERE workspace_id = %s AND id = %s"
    assert stack.sql(bands, (w, old_id)) == [(wording_bands(w, content),)]  # and so do the wording bands
    assert llm.decision_calls >= 1
    # The decision call is costed under its own purpose, in the table and the cluster's metrics.
    (calls_ok, calls_failed, tin, tout), = stack.sql(
        "SELECT calls_ok, calls_failed, tokens_in, tokens_out FROM llm_usage WHERE workspace_id = %s"
        " AND purpose = 'decision'", (w,))
    assert calls_ok >= 1 and calls_failed == 0 and tin > 0 and tout > 0
    metrics = httpx.get(f"http://127.0.0.1:{stack.supervisor.port_of('cluster')}/metrics", timeout=5,
                        follow_redirects=True).text
    assert 'palace_llm_calls_total{outcome="ok",purpose="decision"}' in metrics
    assert 'palace_llm_tokens_total{direction="out",purpose="decision"}' in metrics
    listed = json.loads(_cli(stack, "history", "-w", w, "--action", "update", "--json").stdout)
    assert [r["id"] for r in listed] == [hid] and "embedding" not in listed[0]["old_value"]
    out = _cli(stack, "revert", hid, "-w", w)
    assert out.returncode == 0, out.stderr
    content, chash, emb, deleted = stack.sql("SELECT content, content_hash, embedding::text, deleted_at FROM drawers"
                                             " WHERE workspace_id = %s AND id = %s", (w, old_id))[0]
    assert (content, chash, deleted) == (first, before[1], None)
    assert np.array_equal(np.asarray(json.loads(emb), dtype=np.float32), before[0])
    assert stack.sql(bands, (w, old_id)) == [(wording_bands(w, first),)]
    (rev,) = _history(stack, w, "REVERT")
    # the revert archived what it replaced, so it can be reverted in turn
    assert rev[3]["content"].startswith(first + " (now: ") and rev[4] == {"reverted": hid}
    bad = _cli(stack, "revert", "no-such-entry", "-w", w)
    assert bad.returncode == 1 and "no audit entry" in bad.stderr


def test_a_redelivered_decision_event_neither_asks_the_model_again_nor_updates_twice(
        stack: Stack, llm: ChatStub) -> None:
    """drawer.classified delivered again after its decisions committed (an ack lost), or another event naming
    the same drawer: the drawers decided on are skipped, so the model is not asked again and the UPDATE is
    not applied a second time."""
    from shared.events import DrawerClassified

    w, old_id, _ = _two_sessions(stack, llm, "UPDATE")
    ((hid, _, _, _, new_value),) = _history(stack, w, "UPDATE")
    (event_id,) = stack.sql("SELECT event_id FROM memory_history WHERE id = %s", (hid,))[0]
    source = new_value["source_drawer"]
    assert event_id.endswith(":" + source)
    before = stack.sql("SELECT content, content_hash FROM drawers WHERE workspace_id = %s AND id = %s", (w, old_id))
    calls = llm.decision_calls
    stack.redeliver(DrawerClassified(event_id=event_id.rsplit(":", 1)[0], workspace_id=w, drawer_ids=[source]),
                    "cluster")
    # And another event naming the same drawer (its sentence said again elsewhere): decided once.
    stack.redeliver(DrawerClassified(event_id="another-" + hid, workspace_id=w, drawer_ids=[source]), "cluster")
    assert llm.decision_calls == calls
    assert stack.sql("SELECT content, content_hash FROM drawers WHERE workspace_id = %s AND id = %s",
                     (w, old_id)) == before
    assert len(_history(stack, w, "UPDATE")) == 1


@contextlib.contextmanager
def _model_answering_about_a_second_drawer(stack: Stack, llm: ChatStub) -> Iterator[tuple[str, str]]:
    """A first drawer filed and decided (ADD), then a second one whose UPDATE the model is answering (in
    1.5 s, well under the 6 s timeout): yields (workspace, the first drawer's id) while it answers."""
    _reset(llm, decision="UPDATE")
    llm.decision_latency_s = 1.5
    try:
        w = ws()
        first, second = "Maria prefers green tea in the morning", "Maria now prefers black coffee in the morning"
        stack.publish(session(w, "s1", [first]))
        stack.wait_processed(w, 1)
        wait_for(lambda: _history(stack, w, "ADD"), 60, "the first drawer's decision")
        (first_id,) = stack.sql("SELECT id FROM drawers WHERE workspace_id = %s", (w,))[0]
        asked = llm.decision_requests
        stack.publish(session(w, "s2", [second]))
        wait_for(lambda: llm.decision_requests > asked, 60, "the model asked about the second drawer")
        yield w, first_id
    finally:
        llm.decision_latency_s = 0.0


def test_two_events_naming_one_drawer_at_once_decide_it_once(stack: Stack, llm: ChatStub) -> None:
    """A drawer announced twice (its sentence said again in another session, or its session re-published)
    is named by two drawer.classified events that cluster handles side by side: both read it undecided
    and ask the model. Only the first answer is written; the second finds it decided and writes nothing."""
    from shared.events import DrawerClassified

    with _model_answering_about_a_second_drawer(stack, llm) as (w, _):
        (source,) = stack.sql("SELECT id FROM drawers WHERE workspace_id = %s AND seq = 0 AND session_id = 's2'",
                              (w,))[0]
        # While cluster waits on the model for the drawer's own event, another event names it.
        stack.redeliver(DrawerClassified(event_id=f"again-{source}", workspace_id=w, drawer_ids=[source]),
                        "cluster", timeout=60)
    wait_for(lambda: _history(stack, w, "UPDATE"), 60, "the UPDATE")
    decided = stack.sql("SELECT count(*) FROM memory_history WHERE workspace_id = %s"
                        " AND new_value ->> 'source_drawer' = %s", (w, source))[0][0]
    assert decided == 1, f"{decided} decisions on one drawer"


def test_a_target_changed_while_the_model_answered_is_not_overwritten(stack: Stack, llm: ChatStub) -> None:
    """The model is shown the target's words; while it answers, the target changes (an update approved, a
    revert). Its UPDATE was judged against words that are gone: dropped and audited, the new words kept."""
    meanwhile = "Maria prefers jasmine tea in the morning"
    with _model_answering_about_a_second_drawer(stack, llm) as (w, target):
        stack.sql("UPDATE drawers SET content = %s WHERE workspace_id = %s AND id = %s RETURNING 1",
                  (meanwhile, w, target))
        (row,) = wait_for(lambda: _history(stack, w, "UPDATE"), 60, "the UPDATE audited")
    assert row[2] == "dropped: the target changed while the proposal was made", row[2]
    assert stack.sql("SELECT content FROM drawers WHERE workspace_id = %s AND id = %s", (w, target)) == [(meanwhile,)]


def test_forgetting_the_source_of_an_update_reverts_its_target_and_the_proof_sees_it(
        stack: Stack, llm: ChatStub) -> None:
    """The UPDATE is filed under its target and wrote the forgotten session's fact into it: forgetting
    the source gives the target back exactly what it held before, takes the proposal out of the audit
    trail (the prior state stays), and --verify would see a target that still held the fact."""
    from shared.forget import Scope, forget, verify
    from shared.memory.decisions import content_hash as decision_hash

    w, old_id, first = _two_sessions(stack, llm, "UPDATE")
    (hid, drawer, reason, old_value, new_value), = _history(stack, w, "UPDATE")
    assert drawer == old_id and new_value["content"] and reason and new_value["outcome"] == "applied"
    (updated,), = stack.sql("SELECT content FROM drawers WHERE workspace_id = %s AND id = %s", (w, old_id))
    assert updated.startswith(first + " (now: ") and "black coffee" in updated
    before = (old_value["content_hash"], np.asarray(old_value["embedding"], dtype=np.float32))
    # A later audited change of the target (derived from the updated text) loses its content too.
    stack.sql("INSERT INTO memory_history (workspace_id, id, drawer_id, action, actor, reason, new_value)"
              " VALUES (%s, 'later', %s, 'CLASSIFY', 'test', %s, '{\"summary\": \"black coffee\"}') RETURNING 1",
              (w, old_id, "relabelled after: " + updated))

    async def go() -> tuple[Any, dict[str, int], dict[str, int]]:
        pool = await open_pool(stack.database_url, name="test-forget", max_size=2)
        try:
            r = await forget(pool, stack.settings, stack.nats_url, Scope(w, "session", "s2"), requested_by="test")
            clean = await verify(pool, stack.settings, stack.nats_url, r.scope, r.targets)
            # The proof can fail: put the updated text back into the target and it is found.
            async with workspace_tx(pool, w) as conn:
                await conn.execute("UPDATE drawers SET content = %s, content_hash = %s WHERE workspace_id = %s"
                                   " AND id = %s", (updated, decision_hash(updated), w, old_id))
            dirty = await verify(pool, stack.settings, stack.nats_url, r.scope, r.targets)
            return r, clean, dirty
        finally:
            await pool.close()

    result, clean, dirty = asyncio.run(go())
    assert result.counts["drawers_reverted"] == 1 and result.targets.derived_hashes == {decision_hash(updated)}
    assert not any(clean.values()), {k: v for k, v in clean.items() if v}
    assert {k: v for k, v in dirty.items() if v} == {"curation_updated_drawers": 1}
    stack.sql("UPDATE drawers SET content = %s, content_hash = %s WHERE workspace_id = %s AND id = %s RETURNING 1",
              (first, before[0], w, old_id))  # as the forget left it

    # Reverted exactly (content, hash, vector), without being un-archived, re-ranked or re-pinned.
    content, chash, emb = stack.sql("SELECT content, content_hash, embedding::text FROM drawers"
                                    " WHERE workspace_id = %s AND id = %s", (w, old_id))[0]
    assert (content, chash) == (first, before[0])
    assert np.array_equal(np.asarray(json.loads(emb), dtype=np.float32), before[1])
    (_, _, reason, old_value, new_value), = _history(stack, w, "UPDATE")
    assert reason is None and new_value is None, (reason, new_value)
    assert old_value["content"] == first  # the target's own prior state: still there
    (rev,) = _history(stack, w, "REVERT")
    assert rev[1] == old_id and rev[3] is None and rev[4] == {"reverted": hid}  # audited, without content
    assert stack.sql("SELECT reason, new_value FROM memory_history WHERE workspace_id = %s AND id = 'later'",
                     (w,)) == [(None, None)]
    assert not stack.sql("SELECT id FROM memory_history WHERE workspace_id = %s AND concat(reason, old_value::text,"
                         " new_value::text) ILIKE '%%black coffee%%'", (w,))
    hits = stack.search(w, "Maria black coffee morning", k=10)
    assert [h["id"] for h in hits] == [old_id] and "coffee" not in hits[0]["content"]


def test_pinned_memories_are_never_deleted(stack: Stack, llm: ChatStub) -> None:
    w, old_id, _ = _two_sessions(stack, llm, "DELETE", pin_first=True)
    (row,) = _history(stack, w, "DELETE")
    assert row[2] == "dropped: pinned memories are never deleted" and row[3] is None
    assert stack.sql("SELECT deleted_at FROM drawers WHERE workspace_id = %s AND id = %s", (w, old_id)) == [(None,)]


@pytest.mark.parametrize(("decision", "why"), [("HALLUCINATE", "is not one of the candidates"),
                                               ("LOWCONF", "under the gate")])
def test_invalid_proposals_are_dropped_and_audited(stack: Stack, llm: ChatStub, decision: str, why: str) -> None:
    w, old_id, first = _two_sessions(stack, llm, decision)
    (row,) = _history(stack, w, "DELETE")
    assert row[2].startswith("dropped: ") and why in row[2]
    assert stack.sql("SELECT content, deleted_at FROM drawers WHERE workspace_id = %s AND id = %s",
                     (w, old_id)) == [(first, None)]


def test_shadow_mode_proposes_and_audits_but_writes_nothing(stack: Stack, llm: ChatStub) -> None:
    env = llm.env  # type: ignore[attr-defined]
    _swap(stack, {**env, "PALACE_DECISIONS_MODE": "shadow"}, ("cluster",))
    try:
        w, old_id, first = _two_sessions(stack, llm, "DELETE")
    finally:
        _swap(stack, env, ("cluster",))
    (row,) = _history(stack, w, "DELETE")
    assert row[2] == "shadow: stub says DELETE" and row[4]["outcome"] == "shadow" and row[3] is None
    assert stack.sql("SELECT content, deleted_at, state FROM drawers WHERE workspace_id = %s AND id = %s",
                     (w, old_id)) == [(first, None, "processed")]


def test_held_proposals_are_listed_approved_as_full_mode_would_or_rejected(stack: Stack, llm: ChatStub) -> None:
    env = llm.env  # type: ignore[attr-defined]
    _swap(stack, {**env, "PALACE_DECISIONS_MODE": "controlled-write"}, ("cluster",))
    try:
        w, old_id, first = _two_sessions(stack, llm, "UPDATE")
        wd, del_id, del_first = _two_sessions(stack, llm, "DELETE")
        ws_stale, stale_id, _ = _two_sessions(stack, llm, "UPDATE")
        ws_merged, merged_id, merged_first = _two_sessions(stack, llm, "UPDATE")
        ws_race, race_id, _ = _two_sessions(stack, llm, "DELETE")
        ws_gone, gone_target, gone_first = _two_sessions(stack, llm, "DELETE")
    finally:
        _swap(stack, env, ("cluster",))
    # Held: audited, nothing written.
    (held,) = _history(stack, w, "UPDATE")
    hid = held[0]
    assert held[2] == "held: stub says UPDATE" and held[3] is None and held[4]["outcome"] == "held"
    assert stack.sql("SELECT content FROM drawers WHERE workspace_id = %s AND id = %s", (w, old_id)) == [(first,)]
    before = stack.sql("SELECT content_hash, embedding::text FROM drawers WHERE workspace_id = %s AND id = %s",
                       (w, old_id))[0]
    assert held[4]["target_hash"] == before[0]

    listed = httpx.get(f"{stack.api_url}/v1/workspaces/{w}/proposals", timeout=30)
    assert listed.status_code == 200
    (p,) = listed.json()
    assert (p["id"], p["action"], p["target"], p["status"]) == (hid, "UPDATE", old_id, "pending")
    assert p["content"].startswith(first + " (now: ")
    cli = json.loads(_cli(stack, "proposals", "list", "-w", w, "--json").stdout)
    assert [r["id"] for r in cli] == [hid]
    rep = httpx.get(f"{stack.api_url}/v1/workspaces/{w}/quality", timeout=30).json()
    assert rep["held_proposals"]["pending"] == 1

    # Approve over the API: applied exactly as full mode would, prior state archived.
    r = httpx.post(f"{stack.api_url}/v1/workspaces/{w}/proposals/{hid}/approve", json={"note": "looks right"},
                   timeout=30)
    assert r.status_code == 200, r.text
    res = r.json()
    assert res["outcome"] == "applied" and res["target"] == old_id
    new_content = stack.sql("SELECT content FROM drawers WHERE workspace_id = %s AND id = %s", (w, old_id))[0][0]
    src_emb = stack.sql("SELECT embedding::text FROM drawers WHERE workspace_id = %s AND id <> %s", (w, old_id))[0][0]
    assert new_content == p["content"] and _embedded_again(stack, w, old_id) != src_emb
    applied = [h for h in _history(stack, w, "UPDATE") if h[0] != hid]
    assert [h[0] for h in applied] == [res["audit_id"]]
    assert applied[0][2].startswith("applied: ") and applied[0][3]["content"] == first
    assert applied[0][4]["approved"] == hid and applied[0][4]["note"] == "looks right"
    assert httpx.get(f"{stack.api_url}/v1/workspaces/{w}/proposals", timeout=30).json() == []
    rep = httpx.get(f"{stack.api_url}/v1/workspaces/{w}/quality", timeout=30).json()
    assert rep["held_proposals"] == {"pending": 0, "approved_applied": 1, "approved_dropped": 0, "rejected": 0}
    (done,) = httpx.get(f"{stack.api_url}/v1/workspaces/{w}/proposals", params={"status": "approved"},
                        timeout=30).json()
    assert (done["outcome"], done["resolved_by"], done["audit_id"]) == ("applied", "api", res["audit_id"])
    again = httpx.post(f"{stack.api_url}/v1/workspaces/{w}/proposals/{hid}/approve", timeout=30)
    assert again.status_code == 409 and again.json()["error"] == "conflict"
    assert httpx.post(f"{stack.api_url}/v1/workspaces/{w}/proposals/nope/reject", timeout=30).status_code == 404
    # ... and reverting the approval restores the exact prior state.
    out = _cli(stack, "revert", res["audit_id"], "-w", w)
    assert out.returncode == 0, out.stderr
    assert stack.sql("SELECT content, content_hash, embedding::text FROM drawers WHERE workspace_id = %s AND id = %s",
                     (w, old_id)) == [(first, *before)]

    # Reject over the CLI: nothing changes, audited, and it cannot be approved afterwards.
    (dheld,) = _history(stack, wd, "DELETE")
    out = _cli(stack, "proposals", "reject", dheld[0], "-w", wd, "--note", "keep it")
    assert out.returncode == 0, out.stderr
    assert "rejected" in out.stdout
    assert stack.sql("SELECT content, deleted_at FROM drawers WHERE workspace_id = %s AND id = %s",
                     (wd, del_id)) == [(del_first, None)]
    (rej,) = _history(stack, wd, "REJECT")
    assert rej[1] == del_id and rej[2] == f"rejected DELETE {dheld[0]}: keep it"
    out = _cli(stack, "proposals", "approve", dheld[0], "-w", wd)
    assert out.returncode == 1 and "resolved already" in out.stderr
    assert json.loads(_cli(stack, "proposals", "list", "-w", wd, "--status", "rejected", "--json").stdout)[0][
        "status"] == "rejected"
    rep = httpx.get(f"{stack.api_url}/v1/workspaces/{wd}/quality", timeout=30).json()
    assert rep["held_proposals"] == {"pending": 0, "approved_applied": 0, "approved_dropped": 0, "rejected": 1}

    # A target that changed after the proposal was made is left alone; the approval is recorded as dropped.
    (sheld,) = _history(stack, ws_stale, "UPDATE")
    stack.sql("UPDATE drawers SET content = 'edited by hand', content_hash = 'x' WHERE workspace_id = %s"
              " AND id = %s RETURNING 1", (ws_stale, stale_id))
    out = _cli(stack, "proposals", "approve", sheld[0], "-w", ws_stale)
    assert out.returncode == 0, out.stderr
    assert "dropped (target changed since the proposal was made)" in out.stdout
    assert stack.sql("SELECT content FROM drawers WHERE workspace_id = %s AND id = %s",
                     (ws_stale, stale_id)) == [("edited by hand",)]
    dropped = [h for h in _history(stack, ws_stale, "UPDATE") if h[0] != sheld[0]]
    assert len(dropped) == 1 and dropped[0][2] == "dropped: target changed since the proposal was made"

    # A target merged into its twin since (a pair found late) is no longer a live memory: left merged, not
    # brought back by the approval.
    (mheld,) = _history(stack, ws_merged, "UPDATE")
    stack.sql("UPDATE drawers SET state = 'merged' WHERE workspace_id = %s AND id = %s RETURNING 1",
              (ws_merged, merged_id))
    out = _cli(stack, "proposals", "approve", mheld[0], "-w", ws_merged)
    assert out.returncode == 0, out.stderr
    assert "dropped (target is merged now" in out.stdout
    assert stack.sql("SELECT state, content FROM drawers WHERE workspace_id = %s AND id = %s",
                     (ws_merged, merged_id)) == [("merged", merged_first)]

    # Approve and reject of one DELETE at the same moment: exactly one wins, the other is told so.
    (rheld,) = _history(stack, ws_race, "DELETE")
    url = f"{stack.api_url}/v1/workspaces/{ws_race}/proposals/{rheld[0]}"
    with ThreadPoolExecutor(2) as pool:
        answers = list(pool.map(lambda verb: httpx.post(f"{url}/{verb}", timeout=30), ["approve", "reject"]))
    codes = sorted(a.status_code for a in answers)
    assert codes == [200, 409], [a.text for a in answers]
    won = next(a.json() for a in answers if a.status_code == 200)
    assert stack.sql("SELECT outcome FROM proposal_resolutions WHERE workspace_id = %s", (ws_race,)) == [
        (won["outcome"],)]
    deleted = stack.sql("SELECT deleted_at IS NOT NULL FROM drawers WHERE workspace_id = %s AND id = %s",
                        (ws_race, race_id))[0][0]
    assert deleted is (won["outcome"] == "applied")
    if deleted:  # an approved DELETE is a soft delete with the prior state archived: revert brings it back
        assert _cli(stack, "revert", won["audit_id"], "-w", ws_race).returncode == 0
        assert stack.sql("SELECT deleted_at FROM drawers WHERE workspace_id = %s AND id = %s",
                         (ws_race, race_id)) == [(None,)]

    # The drawer whose fact prompted the proposal was deleted since: its fact must not act through approval.
    (gheld,) = _history(stack, ws_gone, "DELETE")
    stack.sql("UPDATE drawers SET deleted_at = now() WHERE workspace_id = %s AND id = %s RETURNING 1",
              (ws_gone, gheld[4]["source_drawer"]))
    r = httpx.post(f"{stack.api_url}/v1/workspaces/{ws_gone}/proposals/{gheld[0]}/approve", timeout=30)
    assert r.status_code == 200 and r.json()["outcome"] == "dropped"
    assert r.json()["reason"] == "the drawer that prompted it is no longer live"
    assert stack.sql("SELECT content, deleted_at FROM drawers WHERE workspace_id = %s AND id = %s",
                     (ws_gone, gone_target)) == [(gone_first, None)]
