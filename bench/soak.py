"""Soak: publish ``session.completed`` at a fixed rate for a fixed time, faster than the pipeline
can keep up, and watch memory and backpressure.

Why this shape: a pipeline slower than its publishers must keep the backlog in JetStream, not in
its processes. Each service's in-flight work is bounded (``max_ack_pending``, fetch and embedding
batch sizes), so its memory should stay flat however long the backlog grows, and once publishing
stops every event must still end up stored and processed. The bench checks exactly that:

* every service's RSS (with its children) once a second: peak, the median over the first and over
  the last quarter of the publishing window, and a verdict ("flat" or "grew X%");
* every durable consumer's most un-acked messages (``num_ack_pending``, bounded by
  ``PALACE_MAX_ACK_PENDING``) and longest backlog (``num_pending``) seen;
* after publishing, a drain until every expected drawer is processed, then published vs stored.

By default the embed service uses the bundled local model and the rate is set a little above what
it sustains on 2 cores. ``--slow-embedder-ms N`` points it instead at a local OpenAI-compatible
stub (``tests/openai_stub.py``, on 127.0.0.1) that waits N ms per request, with
``--embed-batch`` texts per request: the embedder then sustains about embed_batch / N texts per
second whatever the machine, so the overload is deliberate and reproducible.

    .venv/bin/python bench/soak.py [--rate 6] [--duration 120] [--messages-per-session 4]
    .venv/bin/python bench/soak.py --slow-embedder-ms 500 --embed-batch 8 --rate 5
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import psutil
import psycopg
from _common import (
    BENCH_STACK,
    LOCOMO_DEV,
    REPO,
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
    write_results,
)
from rich.table import Table

from shared.config import Settings
from shared.events import Message, SessionCompleted
from shared.memory.filing import plan_session

SERVICES = ["ingest", "embed", "classify", "cluster", "enrich", "maintain", "api"]
MB = 1024 * 1024


# ------------------------------------------------------------------------------------- workload
class Workload:
    """Events built on demand: session i holds M consecutive turns (LoCoMo when available, else
    generated sentences); later laps get a suffix so no two sessions share a text."""

    def __init__(self, settings: Settings, workspace: str, per_session: int) -> None:
        self.settings, self.workspace, self.per_session = settings, workspace, per_session
        if LOCOMO_DEV.exists():
            turns, _ = load_locomo()
            self.turns = [(t.speaker, t.text) for t in turns]
            self.source = str(LOCOMO_DEV.name)
        else:
            self.turns = [("ana" if i % 2 else "ben",
                           f"Ticket {i}: the {('api', 'db', 'queue', 'cache')[i % 4]} node in rack {i % 37} "
                           f"was rebooted after {i % 11 + 2} alerts about {('disk', 'memory', 'latency')[i % 3]}.")
                          for i in range(3000)]
            self.source = "generated"
        self.expected: set[str] = set()

    def event(self, i: int) -> tuple[bytes, dict[str, str]]:
        """(payload, de-duplication headers) of session i; records the drawers ingest will file for it."""
        msgs = []
        for j in range(self.per_session):
            k = i * self.per_session + j
            speaker, text = self.turns[k % len(self.turns)]
            lap = k // len(self.turns)
            msgs.append(Message(role="user" if j % 2 == 0 else "assistant", name=speaker,
                                content=text if lap == 0 else f"{text} (lap {lap + 1})"))
        ev = SessionCompleted(workspace_id=self.workspace, session_id=f"soak-{i:06d}", messages=msgs,
                              metadata={"source": "bench/soak.py"})
        plan = plan_session(ev, chunk_chars=self.settings.chunk_chars, chunk_overlap=self.settings.chunk_overlap,
                            min_chars=self.settings.min_chars)
        self.expected.update(d.id for d in plan.drawers)
        return ev.model_dump_json(exclude_none=True).encode(), ev.dedup_headers()


# ------------------------------------------------------------------------------------- sampling
@dataclass
class Samples:
    """What the sampler saw, one entry per second."""

    t: list[float] = field(default_factory=list)
    rss: dict[str, list[float]] = field(default_factory=dict)  # MB, per process group, aligned with t
    consumers: dict[str, dict[str, int]] = field(default_factory=dict)  # durable -> maxima
    consumer_last: dict[str, dict[str, int]] = field(default_factory=dict)
    restarts: dict[str, int] = field(default_factory=dict)


def rss_mb(pid: int) -> float | None:
    """RSS of a process and all its children, in MB (None if it is gone)."""
    try:
        p = psutil.Process(pid)
        total = p.memory_info().rss
        for c in p.children(recursive=True):
            with contextlib.suppress(psutil.Error):
                total += c.memory_info().rss
        return total / MB
    except psutil.Error:
        return None


def process_groups(sup: Any) -> dict[str, int]:
    """Service name -> pid, plus nats-server (it holds the backlog, so its memory matters too)."""
    out = {name: child.proc.pid for name, child in sup.children.items()}
    if sup.stack is not None:
        with contextlib.suppress(TypeError, ValueError):
            out["nats-server"] = int(sup.stack.read_state().get("nats_pid"))
    return out


async def sample_once(sup: Any, js: Any, settings: Settings, t0: float, s: Samples) -> None:
    s.t.append(time.perf_counter() - t0)
    for name, pid in process_groups(sup).items():
        v = rss_mb(pid)
        s.rss.setdefault(name, []).append(float("nan") if v is None else v)
    with contextlib.suppress(Exception):
        for info in await asyncio.wait_for(js.consumers_info(settings.stream_name), 5):
            name = info.name
            m = s.consumers.setdefault(name, {"max_ack_pending": 0, "max_pending": 0, "max_redelivered": 0})
            m["max_ack_pending"] = max(m["max_ack_pending"], info.num_ack_pending or 0)
            m["max_pending"] = max(m["max_pending"], info.num_pending or 0)
            m["max_redelivered"] = max(m["max_redelivered"], info.num_redelivered or 0)
            s.consumer_last[name] = {"ack_pending": info.num_ack_pending or 0, "pending": info.num_pending or 0}
    sup.poll()  # a service that died is restarted, and the restart is counted below
    s.restarts = {n: c.restarts for n, c in sup.children.items()}


async def db_counts(conn: psycopg.AsyncConnection[Any], workspace: str) -> dict[str, int]:
    cur = await conn.execute(
        """SELECT (SELECT count(*) FROM sessions WHERE workspace_id = %(w)s),
                  count(*), count(*) FILTER (WHERE state = 'raw'), count(*) FILTER (WHERE state = 'processed'),
                  count(*) FILTER (WHERE state = 'merged'), count(*) FILTER (WHERE state = 'failed'),
                  count(*) FILTER (WHERE embedding IS NOT NULL)
             FROM drawers WHERE workspace_id = %(w)s""", {"w": workspace})
    row = await cur.fetchone()
    assert row is not None
    keys = ["sessions", "drawers", "raw", "processed", "merged", "failed", "embedded"]
    return dict(zip(keys, (int(x) for x in row), strict=True))


# ------------------------------------------------------------------------------------------- run
async def soak(sup: Any, settings: Settings, work: Workload, args: argparse.Namespace) -> dict[str, Any]:
    """Publish at the rate for the duration while sampling; then drain, still sampling."""
    import nats

    from shared.bus import _nats_options  # the credentials the services use

    total = int(args.rate * args.duration)
    nc = await nats.connect(sup.nats_url.split(","), **_nats_options(settings))
    js = nc.jetstream()
    s = Samples()
    published = 0
    late: list[float] = []
    failures: list[str] = []
    try:
        async with await psycopg.AsyncConnection.connect(sup.database_url, autocommit=True) as conn:
            t0 = time.perf_counter()
            inflight = asyncio.Semaphore(64)

            async def pub(i: int) -> None:
                nonlocal published
                body, headers = work.event(i)
                async with inflight:
                    try:
                        await js.publish("session.completed", body, headers=headers,
                                         stream=settings.stream_name, timeout=30)
                        published += 1
                    except Exception as e:
                        failures.append(repr(e)[:200])

            async def publisher() -> None:
                tasks = []
                for i in range(total):
                    due = t0 + i / args.rate
                    delay = due - time.perf_counter()
                    if delay > 0:
                        await asyncio.sleep(delay)
                    else:
                        late.append(-delay)
                    tasks.append(asyncio.create_task(pub(i)))
                await asyncio.gather(*tasks)

            pub_task = asyncio.create_task(publisher())
            next_sample = t0
            counts: dict[str, int] = {}
            while not pub_task.done():
                await sample_once(sup, js, settings, t0, s)
                next_sample += args.sample_s
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(pub_task), max(0.0, next_sample - time.perf_counter()))
            await pub_task
            t_pub = time.perf_counter() - t0
            n_pub_samples = len(s.t)
            counts = await db_counts(conn, work.workspace)
            console.print(f"published {published}/{total} events in {t_pub:.1f} s; backlog now: "
                          + ", ".join(f"{k} {v['pending']}" for k, v in sorted(s.consumer_last.items())
                                      if v["pending"]))

            # Drain: until every expected drawer exists and none is raw, and the consumers are empty.
            drained = False
            deadline = time.perf_counter() + args.drain_timeout
            while time.perf_counter() < deadline:
                await sample_once(sup, js, settings, t0, s)
                counts = await db_counts(conn, work.workspace)
                empty = all(v["pending"] == 0 and v["ack_pending"] == 0 for v in s.consumer_last.values())
                if counts["drawers"] >= len(work.expected) and counts["raw"] == 0 and empty:
                    drained = True
                    break
                await asyncio.sleep(args.sample_s)
            t_end = time.perf_counter() - t0
    finally:
        await nc.close()
    return {"samples": s, "published": published, "planned": total, "publish_failures": failures,
            "publish_s": t_pub, "late_max_s": max(late, default=0.0), "late_count": len(late),
            "drained": drained, "drain_s": t_end - t_pub, "total_s": t_end, "counts": counts,
            "publish_samples": n_pub_samples}


def memory_summary(s: Samples, n_pub: int, threshold_pct: float) -> dict[str, dict[str, Any]]:
    """Per process: peak, first vs last quarter (medians) of the publishing window, verdict."""
    out: dict[str, dict[str, Any]] = {}
    q = max(1, n_pub // 4)
    for name, series in s.rss.items():
        vals = [v for v in series if v == v]  # drop NaN (process briefly gone)
        pub = [v for v in series[:n_pub] if v == v]
        if not vals or not pub:
            continue
        first, last = statistics.median(pub[:q]), statistics.median(pub[-q:])
        growth = (last - first) / first * 100 if first else 0.0
        verdict = "flat" if growth < threshold_pct else f"grew {growth:.0f}%"
        out[name] = {"peak_mb": max(vals), "first_quarter_median_mb": first, "last_quarter_median_mb": last,
                     "growth_pct": growth, "verdict": verdict, "drain_peak_mb": max(vals[len(pub):], default=None)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=float, default=None,
                    help="session.completed events per second (default 6; 5 with --slow-embedder-ms)")
    ap.add_argument("--duration", type=float, default=120.0, help="seconds of publishing")
    ap.add_argument("--messages-per-session", type=int, default=4, help="turns per session")
    ap.add_argument("--slow-embedder-ms", type=float, default=0.0,
                    help="use a local OpenAI-compatible stub that waits this long per request")
    ap.add_argument("--embed-batch", type=int, default=None,
                    help="texts per embedding request (default: PALACE_EMBED_BATCH; 8 with --slow-embedder-ms)")
    ap.add_argument("--drain-timeout", type=float, default=300.0, help="seconds to wait for the backlog to drain")
    ap.add_argument("--sample-s", type=float, default=1.0, help="seconds between samples")
    ap.add_argument("--growth-threshold", type=float, default=10.0,
                    help="RSS growth (%%, last vs first quarter) still called flat")
    ap.add_argument("--keep", action="store_true", help="keep the run's workspace in the database")
    args = ap.parse_args()
    if args.rate is None:
        args.rate = 5.0 if args.slow_embedder_ms else 6.0
    if args.rate <= 0 or args.duration <= 0 or args.duration * args.rate > 1_000_000:
        raise SystemExit("--rate and --duration must be positive (and at most a million events in all)")

    prepare_process()
    with bench_lock():
        _run(args)


def _run(args: argparse.Namespace) -> None:
    """One run, under the stack lock (see ``bench_lock``)."""
    load_at_start = warn_if_busy()
    from palace_dev.supervisor import Supervisor

    run_id = uuid.uuid4().hex[:8]
    workspace = f"bench-soak-{run_id}"
    api_port = free_port_block(1, start=29100, stop=39000)
    env: dict[str, str] = {}
    stub_ctx: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()
    stub = None
    if args.slow_embedder_ms:
        sys.path.insert(0, str(REPO))  # tests/ is not an installed package
        from tests.openai_stub import StubState, serve_stub

        stub = StubState(dim=bench_settings().embed_dim, delay_s=args.slow_embedder_ms / 1000, keep_inputs=False)
        stub_ctx = serve_stub(stub)
    with stub_ctx as stub_url:
        if stub_url:
            env = {"PALACE_EMBED_BASE_URL": stub_url, "PALACE_EMBED_MODEL": "stub-hash-slow"}
        if args.embed_batch or args.slow_embedder_ms:
            env["PALACE_EMBED_BATCH"] = str(args.embed_batch or 8)
        settings = bench_settings(api_port=api_port)
        work = Workload(settings, workspace, args.messages_per_session)
        embedder = (f"stub, {args.slow_embedder_ms:.0f} ms/request × {env['PALACE_EMBED_BATCH']} texts"
                    if stub_url else settings.embed_model)
        console.print(f"[bold]bench/soak[/bold] run {run_id}: {args.rate:g} events/s × {args.duration:g} s × "
                      f"{args.messages_per_session} messages ({work.source}) → {workspace}; embedder: {embedder}; "
                      f"max_ack_pending {settings.max_ack_pending}, fetch_batch {settings.fetch_batch}")
        sup = Supervisor(settings, services=list(SERVICES), log_dir=BENCH_STACK / "logs",
                         metrics_base_port=free_port_block(8), env=env)
        result: dict[str, Any] = {}
        stale: list[str] = []
        try:
            with console.status("starting PostgreSQL and NATS ..."):
                stale = start_servers(sup)
            owned = settings.database_url is None
            settle_drawers(sup.database_url, owned=owned)
            sup.start_services()
            with console.status(f"waiting for {', '.join(SERVICES)} to report healthy ..."):
                sup.wait_healthy()
            with console.status(f"publishing for {args.duration:g} s, then draining (up to {args.drain_timeout:g} s)"
                                " ..."):
                result = asyncio.run(soak(sup, settings, work, args))
            if not args.keep:
                asyncio.run(cleanup_workspace(sup.database_url, workspace))
                settle_drawers(sup.database_url, owned=owned, min_dead=0)
        finally:
            with console.status("stopping services and servers ..."):
                sup.stop()
    report(args, settings, work, result, stale, load_at_start, run_id, embedder, stub)


def report(args: argparse.Namespace, settings: Settings, work: Workload, result: dict[str, Any], stale: list[str],
           load_at_start: float, run_id: str, embedder: str, stub: Any) -> None:
    s: Samples = result["samples"]
    mem = memory_summary(s, result["publish_samples"], args.growth_threshold)
    c = result["counts"]
    expected = len(work.expected)
    nothing_dropped = (result["published"] == result["planned"] and c["sessions"] == result["published"]
                       and c["drawers"] == expected and c["raw"] == 0 and c["failed"] == 0)
    bounded = all(m["max_ack_pending"] <= settings.max_ack_pending for m in s.consumers.values())
    restarts = {n: r for n, r in s.restarts.items() if r}
    out = {
        "bench": "soak", "run_id": run_id, "workspace": work.workspace,
        "config": {"rate_events_per_s": args.rate, "duration_s": args.duration,
                   "messages_per_session": args.messages_per_session, "slow_embedder_ms": args.slow_embedder_ms,
                   "embedder": embedder, "embed_batch": settings.embed_batch if not args.slow_embedder_ms
                   else int(args.embed_batch or 8), "max_ack_pending": settings.max_ack_pending,
                   "fetch_batch": settings.fetch_batch, "services": SERVICES, "text_source": work.source,
                   "sample_s": args.sample_s, "growth_threshold_pct": args.growth_threshold},
        "stale_migrations": stale,
        "publish": {"planned": result["planned"], "published": result["published"],
                    "failures": result["publish_failures"][:20], "seconds": result["publish_s"],
                    "late_max_s": result["late_max_s"], "late_count": result["late_count"]},
        "drain": {"drained": result["drained"], "seconds": result["drain_s"], "total_s": result["total_s"]},
        "stored": {**c, "expected_drawers": expected},
        "nothing_dropped": nothing_dropped, "ack_pending_bounded": bounded, "restarts": restarts,
        "memory_mb": mem, "consumers": s.consumers,
        "stub": {"calls": stub.calls, "max_in_flight": stub.max_in_flight} if stub is not None else None,
        "series": {"t_s": [round(t, 2) for t in s.t],
                   "rss_mb": {k: [round(v, 1) for v in vs] for k, vs in s.rss.items()}},
        "machine": {**machine_info(), "loadavg_1m_at_start": load_at_start},
    }
    path = write_results("soak", out)

    t = Table(title=f"soak — memory per process (MB, RSS incl. children), {args.rate:g} events/s × "
                    f"{args.duration:g} s; quarters of the publishing window")
    for col in ("process", "peak", "first quarter", "last quarter", "peak while draining", "verdict"):
        t.add_column(col, justify="left" if col in ("process", "verdict") else "right")
    for name, m in mem.items():
        colour = "green" if m["verdict"] == "flat" else "yellow"
        drain_peak = "-" if m["drain_peak_mb"] is None else f"{m['drain_peak_mb']:.0f}"
        t.add_row(name, f"{m['peak_mb']:.0f}", f"{m['first_quarter_median_mb']:.0f}",
                  f"{m['last_quarter_median_mb']:.0f}", drain_peak, f"[{colour}]{m['verdict']}")
    console.print(t)
    ct = Table(title=f"soak — JetStream consumers (limit max_ack_pending = {settings.max_ack_pending})")
    for col in ("durable", "max un-acked (num_ack_pending)", "max backlog (num_pending)", "redelivered"):
        ct.add_column(col, justify="left" if col == "durable" else "right")
    for name, m in sorted(s.consumers.items()):
        ct.add_row(name, str(m["max_ack_pending"]), f"{m['max_pending']:,}", str(m["max_redelivered"]))
    console.print(ct)
    tt = Table(title="soak — published vs stored")
    tt.add_column("measure")
    tt.add_column("value", justify="right")
    tt.add_row("events published (JetStream acked) / planned", f"{result['published']:,} / {result['planned']:,}")
    tt.add_row("publishing took (most behind schedule)", f"{result['publish_s']:.1f} s ({result['late_max_s']:.2f} s)")
    tt.add_row("sessions stored", f"{c['sessions']:,}")
    tt.add_row("drawers expected / stored", f"{expected:,} / {c['drawers']:,}")
    tt.add_row("drawers processed · merged · raw · failed",
               f"{c['processed']:,} · {c['merged']:,} · {c['raw']:,} · {c['failed']:,}")
    tt.add_row("drain after publishing stopped", f"{result['drain_s']:.1f} s"
               + ("" if result["drained"] else "  [red]NOT DRAINED"))
    tt.add_row("service restarts", json.dumps(restarts) if restarts else "none")
    tt.add_row("[bold]nothing dropped", "[bold green]yes" if nothing_dropped else "[bold red]NO")
    tt.add_row("[bold]un-acked work within max_ack_pending", "[bold green]yes" if bounded else "[bold red]NO")
    console.print(tt)
    console.print(f"results: {path.relative_to(path.parents[2])}")
    if not (nothing_dropped and bounded and result["drained"]):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
