"""Pipeline throughput with the model taken out: how many conversation messages a second the bus, the
database and the services carry, per stage and end to end, with one and with two replicas per service.

Embedding is the hashing embedder (``PALACE_EMBED_PROVIDER=hash``: real lexical vectors at almost no
cost), so what is measured is Palace itself. Every service but the api runs (ingest, embed, classify,
cluster, enrich, and maintain, which builds a workspace's vector index once it outgrows exact scans).
Sessions are published as fast as JetStream acks them; a stage's rate is the run's messages over the
time from the first publish until that stage's durable consumer had acked all it
was given, and end to end is published → every stage drained (every drawer classified, clustered and
its session's episode and entities built: nothing left behind in any queue). The configurations run
one after the other, each on a new database, as a new user's is, and a fresh workspace. ``--reuse`` keeps
the last database instead: its tables have statistics from earlier runs, which a new one does not, so
its figures are not the ones a new user sees (docs/scale.md, "Columns autovacuum has not reached yet").
PostgreSQL's CPU is split by the service whose connection spent it (``application_name``), which is where
the cost per message is.

The last line is ``end_to_end_msg_per_s=N replicas=R`` for the better configuration.

    .venv/bin/python bench/pipeline.py [--sessions 1000] [--messages-per-session 10]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import re
import time
import uuid
from pathlib import Path
from typing import Any

# maintain runs here, as it does in production (it builds the vector index that cluster asks for once the
# workspace outgrows exact scans), so this bench keeps a stack of its own: the other benches' stack holds
# the 1M-drawer search database, which maintain would decay and index as well.
os.environ.setdefault("PALACE_BENCH_STACK", ".devstack-pipeline")

from _common import (
    BENCH_STACK,
    bench_lock,
    bench_settings,
    cleanup_workspace,
    console,
    free_port_block,
    load_locomo,
    machine_info,
    prepare_process,
    settle_drawers,
    start_servers,
    warn_if_busy,
    wipe_bench_stack,
    write_results,
)
from ingest import build_workload, cpu_seconds, run_pipeline
from rich.table import Table

SERVICES = ["ingest", "embed", "classify", "cluster", "enrich", "maintain"]
# Upstream first: a drain check that finds a stage idle after the stages feeding it were idle cannot
# miss an event they published in between (each publishes before it acks what it handled).
STAGES = ["ingest", "embed", "classify", "enrich", "enrich-episode", "cluster", "enrich-kg", "cluster-entities"]


def pg_cpu_by_service(database_url: str) -> dict[str, float]:
    """CPU seconds so far of each PostgreSQL backend, summed by the connecting service (application_name
    'palace-<service>'); other backends (this bench's own polling, autovacuum, ...) under 'other'."""
    import psutil
    import psycopg

    with psycopg.connect(database_url, autocommit=True) as conn:
        rows = conn.execute("SELECT pid, application_name FROM pg_stat_activity").fetchall()
    out: dict[str, float] = {}
    for pid, app in rows:
        name = app.removeprefix("palace-") if app and app.startswith("palace-") else "other"
        try:
            t = psutil.Process(pid).cpu_times()
        except psutil.Error:
            continue
        out[name] = out.get(name, 0.0) + t.user + t.system
    return out


def log_statements(database_url: str, on: bool) -> None:
    """Have PostgreSQL log every statement with the service that sent it (``--round-trips``), or stop."""
    import psycopg

    with psycopg.connect(database_url, autocommit=True) as conn:
        if on:
            conn.execute("ALTER SYSTEM SET log_min_duration_statement = 0")
            conn.execute("ALTER SYSTEM SET log_line_prefix = '%a|'")
        else:
            conn.execute("ALTER SYSTEM RESET log_min_duration_statement")
            conn.execute("ALTER SYSTEM RESET log_line_prefix")
        conn.execute("SELECT pg_reload_conf()")


_LOGGED = re.compile(r"^palace-([\w-]+)\|LOG:  duration: [\d.]+ ms  (?:execute|statement)")


def count_round_trips(log: Path, offset: int) -> dict[str, int]:
    """Statements each service sent, from the server log past ``offset``. One line per protocol-level
    execution: a string of several statements (simple protocol) is one, as it is one round trip."""
    counts: dict[str, int] = {}
    with log.open("rb") as f:
        f.seek(offset)
        for raw in f:
            m = _LOGGED.match(raw.decode("utf-8", "replace"))
            if m:
                counts[m.group(1)] = counts.get(m.group(1), 0) + 1
    return counts


def cpu_total(cpu_seconds: dict[str, float]) -> float:
    """Every process's CPU together ("postgres" already holds its exited backends' "postgres_exited")."""
    return sum(v for k, v in cpu_seconds.items() if k != "postgres_exited")


def run_config(settings: Any, turns: list[Any], args: argparse.Namespace, replicas: int) -> dict[str, Any]:
    """One configuration on its own stack start: services up, publish, wait, measure, stop."""
    from palace_dev.supervisor import Supervisor

    workspace = f"bench-pipeline-{uuid.uuid4().hex[:8]}"
    work = build_workload(turns, settings, args.sessions, args.messages_per_session, args.seed, workspace)
    services = [x for x in SERVICES if x != "maintain" or not args.no_maintain]
    sup = Supervisor(settings, services=services, replicas=replicas, log_dir=BENCH_STACK / "logs",
                     metrics_base_port=free_port_block(40), env={"PALACE_EMBED_PROVIDER": "hash"})
    logging = False  # the server logs every statement (--round-trips)
    try:
        with console.status("starting PostgreSQL and NATS ..."):
            if not args.reuse and settings.database_url is None:
                wipe_bench_stack()  # a new database for each configuration: what a new user's first hour sees
            start_servers(sup)
        settle_drawers(sup.database_url, owned=settings.database_url is None)
        log_offset = 0
        if args.round_trips:
            if sup.stack is None:
                raise SystemExit("--round-trips reads the bench's own PostgreSQL log: unset PALACE_DATABASE_URL")
            log_statements(sup.database_url, True)
            logging = True
            log_offset = sup.stack.pg_log.stat().st_size
        sup.start_services()
        with console.status(f"{replicas} replica(s) of {', '.join(services)}: waiting for them to be ready ..."):
            sup.wait_healthy()

        def dead() -> list[str]:
            return [n for n, c in sup.children.items() if c.proc.poll() is not None]

        cpu0, pg0, wall0 = cpu_seconds(sup), pg_cpu_by_service(sup.database_url), time.perf_counter()
        result = asyncio.run(run_pipeline(settings, sup.nats_url, sup.database_url, work, args.timeout,
                                          args.publish_concurrency, dead, drain=STAGES))
        cpu1, pg1, wall1 = cpu_seconds(sup), pg_cpu_by_service(sup.database_url), time.perf_counter()
        result["cpu_seconds"] = {k: cpu1[k] - cpu0[k] for k in cpu1 if k in cpu0}
        result["postgres_cpu_seconds_by_service"] = {k: round(v - pg0.get(k, 0.0), 2) for k, v in pg1.items()}
        result["cpu_wall_s"] = wall1 - wall0
        if args.round_trips:
            log_statements(sup.database_url, False)
            logging = False
            result["round_trips"] = count_round_trips(sup.stack.pg_log, log_offset)
        if not args.keep:
            asyncio.run(cleanup_workspace(sup.database_url, workspace))
    finally:
        if logging:  # cut short: the bench server must not go on logging every statement
            with contextlib.suppress(Exception):
                log_statements(sup.database_url, False)
        with console.status("stopping services ..."):
            sup.stop()

    def rate(seconds: float | None) -> float:
        return work.messages / seconds if seconds else 0.0

    return {
        "replicas": replicas, "messages": work.messages, "drawers": result["expected_drawers"],
        "completed": result["completed"],
        "rates_msg_per_s": {
            "publish": rate(result["publish_s"]),
            "ingest (all filed)": rate(result["all_filed_s"]),
            "embed (all embedded)": rate(result["all_embedded_s"]),
            "classify (all processed)": rate(result["end_to_end_s"] if result["completed"] else None),
            **{f"{d} (drained)": rate(result["drained_s"].get(d)) for d in STAGES},
        },
        "end_to_end_msg_per_s": rate(result["all_drained_s"]) if result["completed"] else 0.0,
        "cpu_ms_per_message": 1000 * cpu_total(result["cpu_seconds"]) / work.messages,
        "cores_busy": cpu_total(result["cpu_seconds"]) / result["cpu_wall_s"] if result["cpu_wall_s"] else 0.0,
        "pipeline": result,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=int, default=1000, help="session.completed events per configuration")
    ap.add_argument("--messages-per-session", type=int, default=10, help="turns per session")
    ap.add_argument("--seed", type=int, default=0, help="picks where in LoCoMo the turns start")
    ap.add_argument("--replicas", default="1,2", help="configurations to measure, e.g. 1,2")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for every drawer")
    ap.add_argument("--publish-concurrency", type=int, default=64, help="JetStream publishes in flight")
    ap.add_argument("--keep", action="store_true",
                    help="keep the runs' workspaces in the database (to study plans; each configuration starts "
                         "on a new database unless --reuse)")
    ap.add_argument("--reuse", action="store_true",
                    help="run on the bench's database as earlier runs left it instead of a new one per configuration "
                         "(its tables then have statistics a new user's do not)")
    ap.add_argument("--no-maintain", action="store_true",
                    help="without maintain: no vector index is built, so cluster scans the workspace exactly")
    ap.add_argument("--round-trips", action="store_true",
                    help="count the statements (round trips) each service sends per session instead: PostgreSQL "
                         "logs every statement, which slows the run, so its rates are not reported")
    args = ap.parse_args()
    prepare_process()
    with bench_lock():
        _run(args)


def _run(args: argparse.Namespace) -> None:
    load_at_start = warn_if_busy()
    settings = bench_settings(embed_provider="hash")
    turns, _ = load_locomo()
    random.seed(args.seed)
    configs = [int(r) for r in args.replicas.split(",") if r.strip()]
    console.print(f"[bold]bench/pipeline[/bold]: {args.sessions} sessions × {args.messages_per_session} messages "
                  f"per configuration, replicas {configs}, hashing embedder")
    runs = [run_config(settings, turns, args, r) for r in configs]
    if args.round_trips:
        _report_round_trips(args, runs)
        return
    best = max(runs, key=lambda r: r["end_to_end_msg_per_s"])
    out = {"bench": "pipeline", "config": vars(args), "runs": runs, "best_replicas": best["replicas"],
           "machine": {**machine_info(), "loadavg_1m_at_start": load_at_start}}
    path = write_results("pipeline", out)

    t = Table(title=f"pipeline throughput, messages/s ({out['machine']['cpus']} cores, hashing embedder)")
    t.add_column("stage")
    for r in runs:
        t.add_column(f"{r['replicas']} replica(s)", justify="right")
    for stage in runs[0]["rates_msg_per_s"]:
        t.add_row(stage, *(f"{r['rates_msg_per_s'][stage]:,.0f}" for r in runs))
    t.add_row("[bold]end to end (published → every stage drained)",
              *(f"[bold]{r['end_to_end_msg_per_s']:,.0f}" + ("" if r["completed"] else " [red]INCOMPLETE")
                for r in runs))
    console.print(t)
    c = Table(title="CPU seconds per process group during each run")
    c.add_column("process")
    for r in runs:
        c.add_column(f"{r['replicas']} replica(s)", justify="right")
    def group(process: str) -> str:  # "embed-2" is a replica of embed; nats-server stays itself
        return process if process == "nats-server" else process.partition("-")[0]

    names = sorted({group(n) for r in runs for n in r["pipeline"]["cpu_seconds"]})
    for name in names:
        c.add_row(name, *(f"{sum(v for k, v in r['pipeline']['cpu_seconds'].items() if group(k) == name):.1f}"
                          for r in runs))
    pg_names = sorted({n for r in runs for n in r["pipeline"]["postgres_cpu_seconds_by_service"]})
    for name in pg_names:
        c.add_row(f"  postgres for {name}",
                  *(f"{r['pipeline']['postgres_cpu_seconds_by_service'].get(name, 0.0):.1f}" for r in runs))
    c.add_row("[bold]PostgreSQL ms per message",
              *(f"[bold]{1000 * r['pipeline']['cpu_seconds'].get('postgres', 0.0) / r['messages']:.1f}" for r in runs))
    # What the run's throughput was bounded by: the CPU a message cost, every process together (the bench's
    # own publisher and poller aside), and the rate at which that would keep every core busy. A goal above
    # that rate needs less work per message, not more concurrency. A run cut short has no such rate.
    cores = out["machine"]["cpus"]
    c.add_row("[bold]all processes, ms per message", *(f"[bold]{r['cpu_ms_per_message']:.2f}" for r in runs))
    c.add_row(f"cores busy (of {cores})", *(f"{r['cores_busy']:.2f}" for r in runs))
    c.add_row(f"[bold]msg/s at {cores} cores busy at this cost",
              *(f"[bold]{1000 * cores / r['cpu_ms_per_message']:,.0f}" if r["completed"] else "–" for r in runs))
    console.print(c)
    console.print(f"results: {path.relative_to(path.parents[2])}")
    print(f"end_to_end_msg_per_s={best['end_to_end_msg_per_s']:.0f} replicas={best['replicas']}")


def _report_round_trips(args: argparse.Namespace, runs: list[dict[str, Any]]) -> None:
    """Round trips per session by service: a count that the machine's speed does not move, so two versions
    compare on it run by run where their throughputs differ by less than the machine's noise."""
    per = [{k: v / args.sessions for k, v in r["pipeline"]["round_trips"].items()} for r in runs]
    out = {"bench": "round_trips", "config": vars(args), "runs": [
        {"replicas": r["replicas"], "sessions": args.sessions, "messages_per_session": args.messages_per_session,
         "completed": r["completed"], "statements": r["pipeline"]["round_trips"]} for r in runs],
        "machine": machine_info()}
    path = write_results("round_trips", out)
    t = Table(title=f"round trips to PostgreSQL per session of {args.messages_per_session} messages")
    t.add_column("service")
    for r in runs:
        t.add_column(f"{r['replicas']} replica(s)", justify="right")
    for name in sorted({n for p in per for n in p}):
        t.add_row(name, *(f"{p.get(name, 0.0):.1f}" for p in per))
    pipeline = [sum(v for k, v in p.items() if k != "maintain") for p in per]
    t.add_row("[bold]the pipeline (all but maintain)", *(f"[bold]{v:.1f}" for v in pipeline))
    console.print(t)
    console.print(f"results: {path.relative_to(path.parents[2])}")
    print(f"round_trips_per_session={pipeline[0]:.1f} messages_per_session={args.messages_per_session}")


if __name__ == "__main__":
    main()
