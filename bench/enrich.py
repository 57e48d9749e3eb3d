"""Enrich throughput: how many sessions a second semantic extraction (``episodic.created`` → entities,
facts, ``entity.upserted``) gets through, without an LLM and with the local OpenAI-compatible test
server answering every call after a fixed latency; and the offline extractor's precision/recall.

LoCoMo-dev's sessions (real speakers, message times from each session's date) are ingested once
through every service (hashing embedder), until each has its episode and its graph. Then, per
configuration, the workspace's graph is emptied and every session's ``episodic.created`` is
published again (fresh event ids); the rate is sessions over the time from the first publish until
the enrich-kg consumer has acked them all. The LLM configuration restarts enrich with
``PALACE_LLM_BASE_URL`` on the test server (``tests/openai_stub.py``), in this process.

    .venv/bin/python bench/enrich.py [--latency 0.5] [--sessions 0 (all)] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import statistics
import sys
import time
import uuid
from datetime import UTC, datetime
from typing import Any

import psycopg
from _common import (
    BENCH_STACK,
    LOCOMO_DEV,
    REPO,
    bench_lock,
    bench_settings,
    console,
    free_port_block,
    machine_info,
    prepare_process,
    settle_drawers,
    start_servers,
    warn_if_busy,
    write_results,
)
from kg_extract import measure as measure_extractor
from rich.table import Table

from shared.events import EpisodicCreated, SessionCompleted

SERVICES = ["ingest", "embed", "classify", "cluster", "enrich"]


def locomo_sessions(workspace: str, limit: int) -> list[dict[str, Any]]:
    """session.completed payloads, one per LoCoMo-dev session, message times from the session's date."""
    out = []
    for conv in json.loads(LOCOMO_DEV.read_text()):
        for sess in conv["sessions"]:
            when = datetime.strptime(sess["date_time"], "%I:%M %p on %d %B, %Y").replace(tzinfo=UTC).isoformat()
            sid = f"{conv['sample_id']}-{sess['session_id']}"
            out.append({"event_id": f"bench-enrich-{workspace}-{sid}", "workspace_id": workspace, "session_id": sid,
                        "agent_id": "bench", "user_id": conv["sample_id"], "started_at": when, "completed_at": when,
                        "metadata": {}, "messages": [{"role": "user", "name": t["speaker"], "content": t["text"],
                                                      "created_at": when} for t in sess["turns"]]})
    return out[:limit] if limit else out


async def _publish(nats_url: str, settings: Any, subject: str, bodies: list[tuple[bytes, dict[str, str]]]) -> None:
    import nats

    from shared.bus import _nats_options

    nc = await nats.connect(nats_url.split(","), **_nats_options(settings))
    try:
        js = nc.jetstream()
        sem = asyncio.Semaphore(64)

        async def pub(body: bytes, headers: dict[str, str]) -> None:
            async with sem:
                await js.publish(subject, body, headers=headers, stream=settings.stream_name, timeout=30)

        await asyncio.gather(*(pub(b, m) for b, m in bodies))
    finally:
        await nc.close()


async def _consumer_idle(nats_url: str, settings: Any, durable: str) -> bool:
    import nats

    from shared.bus import _nats_options

    nc = await nats.connect(nats_url.split(","), **_nats_options(settings))
    try:
        info = await nc.jetstream().consumer_info(settings.stream_name, durable)
        return not (info.num_pending or info.num_ack_pending)
    finally:
        await nc.close()


def _wait(pred: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.1)


def _sql(database_url: str, query: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    with psycopg.connect(database_url, autocommit=True) as conn:
        return conn.execute(query, params).fetchall()  # type: ignore[arg-type]


def _clear_graph(database_url: str, workspace: str) -> None:
    """Empty the workspace's graph (entities take their mentions and aliases; triples their evidence)."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("DELETE FROM triples WHERE workspace_id = %s", (workspace,))
        conn.execute("DELETE FROM entities WHERE workspace_id = %s", (workspace,))
        conn.execute("UPDATE drawers SET entity_count = 0, triple_count = 0 WHERE workspace_id = %s", (workspace,))


def _restart_enrich(sup: Any, env: dict[str, str]) -> None:
    child = sup.children.pop("enrich", None)
    if child is not None:
        child.proc.send_signal(signal.SIGTERM)
        child.proc.wait(30)
    sup.env = env
    sup.spawn("enrich")
    sup.wait_healthy(120)


def measure_round(sup: Any, settings: Any, workspace: str, episodes: list[tuple[Any, ...]], tag: str,
                  timeout: float) -> dict[str, Any]:
    """Empty the graph, publish every episode's episodic.created again, time until enrich-kg acked all."""
    _clear_graph(sup.database_url, workspace)
    bodies = []
    for eid, sid, summary, abstract, topics in episodes:
        ev = {"event_id": f"bench-{tag}-{eid}", "workspace_id": workspace, "episode_id": eid, "session_id": sid,
              "summary": summary, "abstract": abstract, "topics": list(topics)}
        bodies.append((json.dumps(ev).encode(), EpisodicCreated.model_validate(ev).dedup_headers()))
    seen = len(_handled())
    t0 = time.perf_counter()
    asyncio.run(_publish(sup.nats_url, settings, "episodic.created", bodies))
    _wait(lambda: asyncio.run(_consumer_idle(sup.nats_url, settings, "enrich-kg")), timeout, "enrich-kg to drain")
    dt = time.perf_counter() - t0
    ents, facts = _sql(sup.database_url, "SELECT (SELECT count(*) FROM entities WHERE workspace_id = %(w)s),"
                       " (SELECT count(*) FROM triples WHERE workspace_id = %(w)s)", {"w": workspace})[0]  # type: ignore[arg-type]
    batches = _handled()[seen:]
    ms = [m for m, _ in batches]
    return {"sessions": len(episodes), "seconds": round(dt, 3), "sessions_per_s": round(len(episodes) / dt, 2),
            "entities": int(ents), "facts": int(facts), "handled": sum(n for _, n in batches),
            "batches": len(batches), "handler_ms_p50": round(statistics.median(ms), 1) if ms else None,
            "handler_ms_p95": round(sorted(ms)[int(0.95 * (len(ms) - 1))], 1) if ms else None}


def _handled() -> list[tuple[float, int]]:
    """Every enrich-kg batch the service logged as handled so far, in order: (ms in the handler, episodes).
    A round's are those after the count taken before it (its episodes come in batches of up to
    PALACE_FETCH_BATCH, one "handled" line each)."""
    out = []
    for path in sorted((BENCH_STACK / "logs").glob("enrich*.log")):
        for line in path.read_text(errors="replace").splitlines():
            if '"enrich-kg"' not in line or '"handled"' not in line:
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if rec.get("event") == "handled" and rec.get("consumer") == "enrich-kg":
                out.append((float(rec["ms"]), int(rec.get("messages", 1))))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=int, default=0, help="LoCoMo-dev sessions to use (0: all)")
    ap.add_argument("--latency", type=float, default=0.5, help="seconds the test server takes per LLM call")
    ap.add_argument("--rounds", type=int, default=2, help="measurements per configuration (the median is shown)")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for a stage")
    args = ap.parse_args()
    prepare_process()
    with bench_lock():
        _run(args)


def _run(args: argparse.Namespace) -> None:
    from palace_dev.supervisor import Supervisor

    sys.path.insert(0, str(REPO))  # tests/ is not an installed package
    from tests.openai_stub import StubState, serve_stub

    load_at_start = warn_if_busy()
    settings = bench_settings(embed_provider="hash")
    workspace = f"bench-enrich-{uuid.uuid4().hex[:8]}"
    sessions = locomo_sessions(workspace, args.sessions)
    turns = sum(len(s["messages"]) for s in sessions)
    console.print(f"[bold]bench/enrich[/bold]: {len(sessions)} LoCoMo-dev sessions ({turns} turns), "
                  f"LLM latency {args.latency}s, {args.rounds} round(s) per configuration")
    sup = Supervisor(settings, services=list(SERVICES), log_dir=BENCH_STACK / "logs",
                     metrics_base_port=free_port_block(40), env={"PALACE_EMBED_PROVIDER": "hash"})
    base_env = dict(sup.env)
    state = StubState()
    state.chat.extract_delay_s = args.latency
    runs: dict[str, list[dict[str, Any]]] = {}
    try:
        with console.status("starting PostgreSQL and NATS ..."):
            start_servers(sup)
        settle_drawers(sup.database_url, owned=settings.database_url is None)
        sup.start_services()
        with console.status("services starting ..."):
            sup.wait_healthy()
        with console.status(f"ingesting {len(sessions)} sessions until each has its episode ..."):
            asyncio.run(_publish(sup.nats_url, settings, "session.completed",
                                 [(json.dumps(s).encode(), SessionCompleted.model_validate(s).dedup_headers())
                                  for s in sessions]))
            _wait(lambda: _sql(sup.database_url, "SELECT count(*) FROM episodes WHERE workspace_id = %s"
                               " AND announced_at IS NOT NULL", (workspace,))[0][0] >= len(sessions),
                  args.timeout, "every episode")
            _wait(lambda: asyncio.run(_consumer_idle(sup.nats_url, settings, "enrich-kg")), args.timeout,
                  "the first extraction")
        episodes = _sql(sup.database_url, "SELECT id, session_id, summary, abstract, topics FROM episodes"
                        " WHERE workspace_id = %s ORDER BY session_id", (workspace,))
        with serve_stub(state) as url:
            llm_env = {**base_env, "PALACE_LLM_BASE_URL": url, "PALACE_LLM_MODEL": "stub-chat",
                       "PALACE_LLM_TIMEOUT_S": str(max(5.0, args.latency * 4)), "PALACE_LLM_ATTEMPTS": "1"}
            # Alternate the configurations round by round, so drift in the machine's load hits both.
            for r in range(args.rounds):
                configs = (("no LLM (patterns)", base_env), (f"LLM test server, {args.latency}s a call", llm_env))
                for c, (name, env) in enumerate(configs):
                    with console.status(f"round {r + 1}: {name} ..."):
                        _restart_enrich(sup, env)
                        # A tag of its own per round and configuration: JetStream drops a repeated msg id.
                        runs.setdefault(name, []).append(
                            measure_round(sup, settings, workspace, episodes, f"r{r}c{c}", args.timeout))
        calls = state.chat.extract_calls
        _clear_graph(sup.database_url, workspace)
        with psycopg.connect(sup.database_url, autocommit=True) as conn:
            for table in ("drawers", "sessions", "episodes", "embedding_cache", "memory_history", "llm_usage"):
                conn.execute(f"DELETE FROM {table} WHERE workspace_id = %s", (workspace,))  # noqa: S608
    finally:
        with console.status("stopping services ..."):
            sup.stop()

    quality = measure_extractor()
    summary = {name: {"sessions_per_s_median": statistics.median(x["sessions_per_s"] for x in rs), "rounds": rs}
               for name, rs in runs.items()}
    out = {"bench": "enrich", "config": vars(args), "sessions": len(sessions), "turns": turns,
           "consumer_concurrency": settings.consumer_concurrency, "llm_calls": calls, "throughput": summary,
           "extractor": {k: v for k, v in quality.items() if k != "detail"},
           "machine": {**machine_info(), "loadavg_1m_at_start": load_at_start}}
    path = write_results("enrich", out)

    t = Table(title=f"enrich: episodic.created → graph, {len(sessions)} LoCoMo-dev sessions "
                    f"({out['machine']['cpus']} cores, 1 replica, {settings.consumer_concurrency} in flight)")
    for col in ("configuration", "sessions/s (median)", "rounds (sessions/s)", "batches",
                "handler ms a batch p50 / p95", "entities", "facts"):
        t.add_column(col)
    for name, v in summary.items():
        rounds = ", ".join(f"{x['sessions_per_s']:.2f}" for x in v["rounds"])
        last = v["rounds"][-1]
        t.add_row(name, f"{v['sessions_per_s_median']:.2f}", rounds, str(last["batches"]),
                  f"{last['handler_ms_p50']} / {last['handler_ms_p95']}", str(last["entities"]), str(last["facts"]))
    console.print(t)
    q = Table(title=f"offline extractor vs {quality['turns']} hand-labelled turns "
                    "(tests/data/kg_labels_locomo_dev.json)")
    for col in ("measure", "precision", "recall", "F1"):
        q.add_column(col)
    for k, v in quality["overall"].items():
        q.add_row(k, f"{v['precision']:.3f}", f"{v['recall']:.3f}", f"{v['f1']:.3f}")
    console.print(q)
    console.print(f"results: {path.relative_to(path.parents[2])}")
    names = list(summary)
    print(f"enrich_sessions_per_s_no_llm={summary[names[0]]['sessions_per_s_median']:.2f} "
          f"enrich_sessions_per_s_llm={summary[names[1]]['sessions_per_s_median']:.2f} latency_s={args.latency}")


if __name__ == "__main__":
    main()
