"""End-to-end ingest throughput: session.completed on NATS → drawers processed in PostgreSQL.

Why this shape: the pipeline's bottleneck is (or should be) the embedding model, so the headline is
not an absolute rate (which depends on the machine) but the ratio of the pipeline's drawers/s to the
embedder's own documents/s, both measured in the same run on the same texts and the same machine.
A ratio near 1 means the bus, the database and the other stages cost almost nothing on top of the
model; a low ratio says where to look.

Only ingest, embed and classify run, so the figure is the main path (cluster, enrich, maintain and
the API would compete for the same cores without being on it).

    .venv/bin/python bench/ingest.py [--sessions 200] [--messages-per-session 10] [--seed 0]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg
from _common import (
    BENCH_STACK,
    Turn,
    bench_lock,
    bench_settings,
    cleanup_workspace,
    console,
    drawer_embed_text,
    free_port_block,
    load_locomo,
    machine_info,
    prepare_process,
    settle_drawers,
    start_servers,
    warn_if_busy,
    write_results,
)
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from shared.config import Settings
from shared.events import Message, SessionCompleted
from shared.memory.filing import plan_session

SERVICES = ["ingest", "embed", "classify"]


@dataclass
class Workload:
    workspace: str
    events: list[SessionCompleted]
    payloads: list[tuple[bytes, dict[str, str]]]  # (body, its de-duplication headers)
    messages: int
    drawer_texts: dict[str, str]  # planned drawer id -> the text the embed service embeds for it


def build_workload(turns: list[Turn], settings: Settings, sessions: int, per_session: int, seed: int,
                   workspace: str) -> Workload:
    """N sessions of M consecutive LoCoMo turns, starting at a seeded offset and cycling.

    Texts are verbatim on the first lap through the data; later laps get a ``(lap k)`` suffix so no
    two sessions carry the same text (an exact repeat is one drawer, which would shrink the work).
    """
    start = random.Random(seed).randrange(len(turns))
    events: list[SessionCompleted] = []
    drawers: dict[str, str] = {}
    for i in range(sessions):
        msgs = []
        for j in range(per_session):
            k = i * per_session + j
            t = turns[(start + k) % len(turns)]
            lap = k // len(turns)
            text = t.text if lap == 0 else f"{t.text} (lap {lap + 1})"
            msgs.append(Message(role="user" if j % 2 == 0 else "assistant", content=text, name=t.speaker))
        ev = SessionCompleted(workspace_id=workspace, session_id=f"bench-{i:06d}", messages=msgs,
                              metadata={"source": "bench/ingest.py"})
        events.append(ev)
        plan = plan_session(ev, chunk_chars=settings.chunk_chars, chunk_overlap=settings.chunk_overlap,
                            min_chars=settings.min_chars)
        for d in plan.drawers:
            drawers.setdefault(d.id, drawer_embed_text(d))
    payloads = [(ev.model_dump_json(exclude_none=True).encode(), ev.dedup_headers()) for ev in events]
    return Workload(workspace, events, payloads, sessions * per_session, drawers)


async def embedder_alone(settings: Settings, texts: list[str]) -> dict[str, Any]:
    """The embedder's own documents/s on these texts, in-process, batches of ``embed_batch``.

    Run while no service is up, so nothing competes for the cores: this is the ceiling the
    pipeline is compared against.
    """
    from shared.adapters import build_embedder

    emb = build_embedder(settings)
    try:
        warm = getattr(emb, "warm_up", None)
        if warm is not None:
            await warm()
        await emb.embed_documents(texts[: min(len(texts), settings.embed_batch)])  # first real batch: warm
        t0 = time.perf_counter()
        step = settings.embed_batch
        for i in range(0, len(texts), step):
            await emb.embed_documents(texts[i : i + step])
        dt = time.perf_counter() - t0
    finally:
        aclose = getattr(emb, "aclose", None)
        if aclose is not None:
            await aclose()
    return {"model": getattr(emb, "model_name", settings.embed_model), "docs": len(texts), "seconds": dt,
            "docs_per_s": len(texts) / dt, "batch": settings.embed_batch,
            "threads": settings.embed_threads or "all cores"}


def cpu_seconds(sup: Any) -> dict[str, float]:
    """CPU seconds (user + system) used so far by each service process, PostgreSQL (postmaster and
    its backends) and nats-server: the difference over the run shows where the cores went."""
    import psutil

    groups: dict[str, list[psutil.Process]] = {}
    for name, child in sup.children.items():
        with contextlib.suppress(psutil.Error):
            groups[name] = [psutil.Process(child.proc.pid)]
    if sup.stack is not None:
        with contextlib.suppress(psutil.Error, TypeError):
            pm = psutil.Process(sup.stack._postmaster_pid())
            groups["postgres"] = [pm, *pm.children(recursive=True)]
        with contextlib.suppress(psutil.Error, TypeError, ValueError):
            groups["nats-server"] = [psutil.Process(int(sup.stack.read_state().get("nats_pid")))]
    out: dict[str, float] = {}
    for name, procs in groups.items():
        total = 0.0
        for p in procs:
            with contextlib.suppress(psutil.Error):
                t = p.cpu_times()
                total += t.user + t.system
        out[name] = total
    if "postgres" in groups:
        # Processes that ended (autovacuum workers, closed connections) are gone from the list above; the
        # postmaster reaped them, and their CPU is in its children's times. Without it a run that leaves
        # autovacuum less work (a shorter one) looked cheaper than it was.
        with contextlib.suppress(psutil.Error):
            t = groups["postgres"][0].cpu_times()
            out["postgres_exited"] = t.children_user + t.children_system
            out["postgres"] += out["postgres_exited"]
    return out


def _nats_connect_options(settings: Settings) -> dict[str, Any]:
    """The same credentials the services use (PALACE_NATS_USER/TOKEN/CREDS/TLS_CA)."""
    try:
        from shared.bus import _nats_options  # private, but the one place these settings are mapped

        return _nats_options(settings)
    except ImportError:  # pragma: no cover - only if the helper is renamed
        return {}


async def run_pipeline(settings: Settings, nats_url: str, database_url: str, work: Workload,
                       timeout_s: float, concurrency: int, dead: Callable[[], list[str]],
                       drain: list[str] | None = None) -> dict[str, Any]:
    """Publish every event as fast as JetStream acks them, then poll until all drawers are processed
    and, when ``drain`` names durable consumers, until each of them has acked everything it was given.

    A consumer's drain time is when it last became idle (nothing pending, nothing awaiting its ack) and
    stayed so to the end: a later stage can be idle for a while only because the one before it has not
    published yet. Stops early if a drawer fails or a service process dies (``dead`` names them): a
    crashed stage would otherwise look like a slow one until the timeout.
    """
    import nats

    expected = len(work.drawer_texts)
    nc = await nats.connect(nats_url.split(","), **_nats_connect_options(settings))
    marks: dict[str, float] = {}
    idle_since: dict[str, float | None] = dict.fromkeys(drain or [])
    filed = embedded = processed = failed = 0
    died: list[str] = []
    done = False
    try:
        js = nc.jetstream()
        sem = asyncio.Semaphore(concurrency)

        async def pub(body: bytes, headers: dict[str, str]) -> None:
            async with sem:
                await js.publish("session.completed", body, headers=headers,
                                 stream=settings.stream_name, timeout=30)

        t0 = time.perf_counter()
        await asyncio.gather(*(pub(b, m) for b, m in work.payloads))
        t_pub = time.perf_counter()

        async def consumers_idle(now: float) -> bool:
            for durable in idle_since:
                info = await js.consumer_info(settings.stream_name, durable)
                if info.num_pending or info.num_ack_pending:
                    idle_since[durable] = None
                elif idle_since[durable] is None:
                    idle_since[durable] = now
            return all(v is not None for v in idle_since.values())

        sql = """SELECT count(*), count(*) FILTER (WHERE embedding IS NOT NULL),
                        count(*) FILTER (WHERE state IN ('processed', 'merged')),
                        count(*) FILTER (WHERE state = 'failed')
                   FROM drawers WHERE workspace_id = %s"""
        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
            with Progress(TextColumn("[bold]drawers processed"), BarColumn(), MofNCompleteColumn(),
                          TextColumn("filed {task.fields[filed]} · embedded {task.fields[embedded]}"),
                          TimeElapsedColumn(), console=console, transient=False) as bar:
                task = bar.add_task("pipeline", total=expected, filed=0, embedded=0)
                deadline = t0 + timeout_s
                while time.perf_counter() < deadline:
                    if "all_processed" not in marks:  # the count reads the whole workspace: only until it is done
                        cur = await conn.execute(sql, (work.workspace,))
                        row = await cur.fetchone()
                        assert row is not None
                        filed, embedded, processed, failed = (int(x) for x in row)
                    now = time.perf_counter()
                    if filed >= expected:
                        marks.setdefault("all_filed", now)
                    if embedded >= expected:
                        marks.setdefault("all_embedded", now)
                    bar.update(task, completed=processed, filed=filed, embedded=embedded)
                    died = dead()
                    if failed or died:
                        break
                    if filed >= expected and processed >= filed:
                        marks.setdefault("all_processed", now)
                        if await consumers_idle(now):
                            done = True
                            break
                    # Every half second: the count reads the whole workspace, and polled ten times a second it
                    # was as busy in PostgreSQL as the pipeline's heaviest statements (sampled pg_stat_activity).
                    await asyncio.sleep(0.5 if "all_processed" not in marks else 0.25)
    finally:
        await nc.close()
    end = marks.get("all_processed", time.perf_counter())
    drained = {k: v - t0 for k, v in idle_since.items() if v is not None} if done else {}
    return {
        "completed": done, "expected_drawers": expected, "filed": filed, "embedded": embedded,
        "processed": processed, "failed": failed, "services_died": died,
        "publish_s": t_pub - t0, "end_to_end_s": end - t0,
        "all_filed_s": marks["all_filed"] - t0 if "all_filed" in marks else None,
        "all_embedded_s": marks["all_embedded"] - t0 if "all_embedded" in marks else None,
        "drained_s": drained,
        "all_drained_s": max(drained.values()) if drained else None,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=int, default=200, help="session.completed events to publish")
    ap.add_argument("--messages-per-session", type=int, default=10, help="turns per session")
    ap.add_argument("--seed", type=int, default=0, help="picks where in LoCoMo the turns start")
    ap.add_argument("--embed-sample", type=int, default=300, help="drawer texts for the embedder-alone figure")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds to wait for every drawer")
    ap.add_argument("--publish-concurrency", type=int, default=64, help="JetStream publishes in flight")
    ap.add_argument("--keep", action="store_true", help="keep the run's workspace in the database")
    args = ap.parse_args()

    prepare_process()
    with bench_lock():
        _run(args)


def _run(args: argparse.Namespace) -> None:
    """One run, under the stack lock (see ``bench_lock``)."""
    load_at_start = warn_if_busy()
    from palace_dev.supervisor import Supervisor

    settings = bench_settings()
    turns, _ = load_locomo()
    run_id = uuid.uuid4().hex[:8]
    workspace = f"bench-ingest-{run_id}"
    work = build_workload(turns, settings, args.sessions, args.messages_per_session, args.seed, workspace)
    rng = random.Random(args.seed)
    texts = list(work.drawer_texts.values())
    sample = rng.sample(texts, min(args.embed_sample, len(texts)))
    console.print(f"[bold]bench/ingest[/bold] run {run_id}: {args.sessions} sessions × "
                  f"{args.messages_per_session} messages = {work.messages} messages → "
                  f"{len(work.drawer_texts)} planned drawers (noise filtered, chunked) in {workspace}")

    # 1. The ceiling: the embedder alone, before any service exists to compete with it (and again
    #    after everything is stopped: a difference means the machine's load changed meanwhile).
    with console.status(f"embedder alone on {len(sample)} drawer texts ..."):
        before = asyncio.run(embedder_alone(settings, sample))
    console.print(f"embedder alone: {before['docs_per_s']:.1f} docs/s ({before['model']}, batch {before['batch']})")

    # 2. The pipeline, end to end.
    sup = Supervisor(settings, services=list(SERVICES), log_dir=BENCH_STACK / "logs",
                     metrics_base_port=free_port_block(8))
    result: dict[str, Any] = {}
    stale_schema: list[str] = []
    settled: dict[str, Any] = {}
    try:
        with console.status("starting PostgreSQL and NATS ..."):
            stale_schema = start_servers(sup)
        owned = settings.database_url is None
        settled = settle_drawers(sup.database_url, owned=owned)
        sup.start_services()
        with console.status(f"waiting for {', '.join(SERVICES)} to report healthy ..."):
            sup.wait_healthy()
        console.print(f"services healthy: {', '.join(SERVICES)}; logs in {BENCH_STACK / 'logs'}")

        def dead() -> list[str]:
            return [n for n, c in sup.children.items() if c.proc.poll() is not None]

        cpu0, wall0 = cpu_seconds(sup), time.perf_counter()
        result = asyncio.run(run_pipeline(settings, sup.nats_url, sup.database_url, work, args.timeout,
                                          args.publish_concurrency, dead))
        cpu1, wall1 = cpu_seconds(sup), time.perf_counter()
        cpu = {k: cpu1[k] - cpu0[k] for k in cpu1 if k in cpu0}
        result["cpu_seconds"] = cpu
        result["cpu_wall_s"] = wall1 - wall0
        if not args.keep:
            asyncio.run(cleanup_workspace(sup.database_url, workspace))
            settle_drawers(sup.database_url, owned=owned, min_dead=0)
    finally:
        with console.status("stopping services and servers ..."):
            sup.stop()

    with console.status(f"embedder alone again on {len(sample)} drawer texts ..."):
        after = asyncio.run(embedder_alone(settings, sample))
    alone = {**before, "docs_per_s": (before["docs_per_s"] + after["docs_per_s"]) / 2,
             "docs_per_s_before": before["docs_per_s"], "docs_per_s_after": after["docs_per_s"]}
    drift = abs(before["docs_per_s"] - after["docs_per_s"]) / max(before["docs_per_s"], after["docs_per_s"])
    if drift > 0.15:
        console.print(f"[yellow]warning:[/yellow] the embedder alone ran at {before['docs_per_s']:.1f} docs/s before "
                      f"and {after['docs_per_s']:.1f} after: the machine's load changed during the run")

    e2e = result["end_to_end_s"]
    drawers_per_s = result["processed"] / e2e if e2e > 0 else 0.0
    messages_per_s = work.messages / e2e if e2e > 0 and result["completed"] else 0.0
    ratio = drawers_per_s / alone["docs_per_s"]
    out = {
        "bench": "ingest", "run_id": run_id, "workspace": workspace,
        "config": {"sessions": args.sessions, "messages_per_session": args.messages_per_session, "seed": args.seed,
                   "services": SERVICES, "embed_model": settings.embed_model, "embed_batch": settings.embed_batch,
                   "fetch_batch": settings.fetch_batch, "external_servers": bool(settings.database_url
                                                                                 or settings.nats_url)},
        "stale_migrations": stale_schema, "settled_before": settled, "messages": work.messages, "pipeline": result,
        "rates": {"messages_per_s": messages_per_s, "drawers_per_s": drawers_per_s,
                  "publish_events_per_s": args.sessions / result["publish_s"],
                  "publish_messages_per_s": work.messages / result["publish_s"]},
        "embedder_alone": alone,
        "ratio_pipeline_over_embedder": ratio,
        "machine": {**machine_info(), "loadavg_1m_at_start": load_at_start},
    }
    path = write_results("ingest", out)

    t = Table(title=f"ingest throughput — {work.messages} messages, {result['expected_drawers']} drawers "
                    f"({settings.embed_model}, {out['machine']['cpus']} cores)")
    t.add_column("measure")
    t.add_column("value", justify="right")
    t.add_row("publish (JetStream acked)", f"{out['rates']['publish_messages_per_s']:,.0f} messages/s "
              f"({result['publish_s']:.2f} s)")
    t.add_row("all drawers filed (ingest done)", _s(result["all_filed_s"]))
    t.add_row("all drawers embedded", _s(result["all_embedded_s"]))
    t.add_row("all drawers processed (end to end)", _s(e2e) + ("" if result["completed"] else "  [red]INCOMPLETE"))
    t.add_row("pipeline messages/s", f"{messages_per_s:,.1f}")
    t.add_row("pipeline drawers/s", f"{drawers_per_s:,.1f}")
    t.add_row("embedder alone docs/s (same texts, in-process; before / after)",
              f"{alone['docs_per_s']:,.1f} ({before['docs_per_s']:.1f} / {after['docs_per_s']:.1f})")
    t.add_row("[bold]ratio pipeline ÷ embedder alone", f"[bold]{ratio:.2f}")
    console.print(t)
    if result.get("cpu_seconds"):
        c = Table(title=f"where the CPU went during the pipeline ({result['cpu_wall_s']:.0f} s wall, "
                        f"{out['machine']['cpus']} cores)")
        c.add_column("process")
        c.add_column("CPU s", justify="right")
        c.add_column("cores used", justify="right")
        for name, sec in sorted(result["cpu_seconds"].items(), key=lambda kv: -kv[1]):
            c.add_row(name, f"{sec:.1f}", f"{sec / result['cpu_wall_s']:.2f}")
        console.print(c)
    console.print(f"results: {path.relative_to(path.parents[2])}")
    if not result["completed"]:
        console.print(f"[red]pipeline did not finish:[/red] {json.dumps(result)}")
        raise SystemExit(1)


def _s(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f} s"


if __name__ == "__main__":
    main()
