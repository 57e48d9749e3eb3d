"""The fault suite: publish many sessions while killing services and restarting the servers, then
prove that every session was stored exactly once and nothing good was dead-lettered.

``make fault`` runs it at full size (10,000 sessions); ``tests/integration/test_fault_suite_int.py``
runs a reduced version inside ``make test``. It starts its own embedded stack (``.devstack-fault``),
so it never disturbs a developer's stack; the embedding endpoint is the local OpenAI-compatible
test server (tests/openai_stub.py), the one component we stand in for, so that the run measures the
pipeline's reliability rather than a CPU-bound model.

The last line printed is exactly::

    published=N stored=N lost=N duplicates=N dead_lettered=N drain_s=X

counted in sessions: *stored* sessions have every planned drawer and message present exactly once
with the published content hash; *lost* sessions miss one; *duplicates* counts sessions with any
row stored twice; *dead_lettered* counts dead letters of the run; *drain_s* is the time from the
end of publishing (every fault falls inside the publishing window, so this is after the last fault)
until every drawer was processed and every consumer had caught up.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import signal
import sys
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import nats
import nats.errors
import nats.js.errors
import psycopg
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from palace_dev.supervisor import Supervisor, free_port_block
from palace_sdk._events import publish_encoded
from shared.config import Settings
from shared.events import SessionCompleted
from shared.memory.filing import plan_session
from tests.openai_stub import StubState, serve_stub
from tests.own_stack_env import own_stack_env

__all__ = ["SuiteConfig", "SuiteResult", "run_suite"]

KILLABLE = ["ingest", "embed", "classify", "cluster", "enrich", "maintain"]
WORDS = (
    "river lantern copper meadow violin harbor orchard glacier tundra saffron comet falcon marble velvet "
    "canyon thistle beacon ember quartz willow cobalt prairie lagoon cinder juniper mosaic nectar pebble "
    "summit timber walnut zephyr amber basil cedar dune fjord garnet hazel iris jasper kelp lotus maple "
    "nimbus opal pine quill raven sierra tulip umber vale wren yarrow zinnia atlas bramble cairn delta"
).split()
console = Console(width=None if sys.stdout.isatty() else 150)


@dataclass
class SuiteConfig:
    events: int = 10_000
    workspaces: int = 8
    rate: float = 60.0  # sessions published per second
    kills: int = 6
    pg_restarts: int = 1
    nats_restarts: int = 1
    seed: int = 7
    devstack_dir: Path = Path(".devstack-fault")
    drain_timeout_s: float = 1800.0
    services: list[str] = field(default_factory=lambda: [*KILLABLE])


@dataclass
class SuiteResult:
    published: int
    stored: int
    lost: int
    duplicates: int
    dead_lettered: int
    drain_s: float
    faults: list[tuple[float, str]]
    details: dict[str, int]

    def line(self) -> str:
        return (f"published={self.published} stored={self.stored} lost={self.lost} "
                f"duplicates={self.duplicates} dead_lettered={self.dead_lettered} drain_s={self.drain_s:.1f}")

    @property
    def ok(self) -> bool:
        """Every session stored once, nothing dead-lettered, and the pipeline finished its work: drained,
        and no drawer left failed (a drawer counted as done whatever its state hid a pipeline that broke)."""
        return (self.published == self.stored and not (self.lost or self.duplicates or self.dead_lettered)
                and self.details.get("drained", 1) == 1 and not self.details.get("drawers_failed", 0))


def make_sessions(cfg: SuiteConfig, run_id: str) -> list[SessionCompleted]:
    """Deterministic sessions of 1–4 distinct turns each, spread over ``cfg.workspaces`` workspaces."""
    rng = random.Random(cfg.seed)
    out = []
    for i in range(cfg.events):
        ws = f"fault-{run_id}-{i % cfg.workspaces}"
        msgs = []
        for j in range(rng.randint(1, 4)):
            text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 16)))
            msgs.append({"role": "user" if j % 2 == 0 else "assistant", "content": f"{text} (note {i}.{j})"})
        out.append(SessionCompleted.model_validate({
            "event_id": f"fault-{run_id}-{i}", "workspace_id": ws, "session_id": f"s{i}", "agent_id": "fault",
            "messages": msgs, "started_at": "2026-11-01T10:00:00Z", "completed_at": "2026-11-01T10:05:00Z",
        }))
    return out


async def _publish_all(nats_url: str, sessions: list[SessionCompleted], rate: float, progress: Progress) -> int:
    """Publish at ``rate``; a publish that fails (server restarting) is retried until JetStream acks it.
    ``Nats-Msg-Id`` makes those retries idempotent in the stream, and ingest is idempotent anyway."""
    async def quiet(e: Exception) -> None:  # the restart is deliberate: no traceback per reconnect try
        pass

    nc = await nats.connect(nats_url, max_reconnect_attempts=-1, reconnect_time_wait=0.5, error_cb=quiet)
    task = progress.add_task("publish", total=len(sessions))
    t0 = time.monotonic()
    try:
        for i, ev in enumerate(sessions):
            delay = t0 + i / rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            data = ev.model_dump_json().encode()
            for attempt in range(600):
                try:
                    await publish_encoded(nc, ev, data, None, ack_wait_s=5.0)
                    break
                except Exception:
                    await asyncio.sleep(min(2.0, 0.1 * (attempt + 1)))
            else:
                raise RuntimeError(f"could not publish {ev.event_id}")
            progress.advance(task)
    finally:
        await nc.close()
    return len(sessions)


def _faults_thread(sup: Supervisor, cfg: SuiteConfig, window_s: float, log: list[tuple[float, str]],
                   done: threading.Event, t0: float) -> None:
    """Fire the faults at random moments inside the publishing window."""
    rng = random.Random(cfg.seed + 1)
    plan = [("kill", rng.choice(cfg.services)) for _ in range(cfg.kills)]
    plan += [("postgres", "")] * cfg.pg_restarts + [("nats", "")] * cfg.nats_restarts
    times = sorted(rng.uniform(0.1, 0.9) * window_s for _ in plan)
    rng.shuffle(plan)
    for at, (kind, name) in zip(times, plan, strict=True):
        while time.monotonic() - t0 < at:
            time.sleep(0.05)
        assert sup.stack is not None
        if kind == "kill":
            # Kill a running process: one still down from an earlier kill would make this a no-op.
            deadline = time.monotonic() + 30
            while sup.children[name].proc.poll() is not None and time.monotonic() < deadline:
                time.sleep(0.1)
            pid = sup.children[name].proc.pid
            sup.kill(name, signal.SIGKILL)
            log.append((time.monotonic() - t0, f"SIGKILL {name} (pid {pid})"))
        elif kind == "postgres":
            sup.stack.restart_postgres()
            log.append((time.monotonic() - t0, "restart PostgreSQL"))
        else:
            sup.stack.restart_nats()
            log.append((time.monotonic() - t0, "restart NATS"))
    done.set()


async def _consumers_idle(nats_url: str, settings: Settings) -> bool:
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        consumers = await js.consumers_info(settings.stream_name)
        return all((c.num_pending or 0) == 0 and (c.num_ack_pending or 0) == 0 for c in consumers)
    finally:
        await nc.close()


async def _dlq_count(nats_url: str, settings: Settings) -> int:
    nc = await nats.connect(nats_url)
    try:
        info = await nc.jetstream().stream_info(settings.dlq_stream_name)
        return int(info.state.messages)
    except nats.js.errors.NotFoundError:
        return 0  # no dead letter was ever written
    finally:
        await nc.close()


def _verify(db_url: str, sessions: list[SessionCompleted], settings: Settings) -> tuple[int, int, int, dict[str, int]]:
    """Compare what is stored with what was published: (stored, lost, duplicates) in sessions."""
    spaces = sorted({s.workspace_id for s in sessions})
    with psycopg.connect(db_url) as conn:  # the embedded superuser: a cross-workspace audit
        drawers = conn.execute(
            "SELECT workspace_id, id, content_hash, state FROM drawers WHERE workspace_id = ANY(%s)", (spaces,)
        ).fetchall()
        msgs = conn.execute(
            "SELECT workspace_id, session_id, seq, content_hash FROM messages WHERE workspace_id = ANY(%s)",
            (spaces,)).fetchall()
        srcs = conn.execute(
            "SELECT workspace_id, session_id, seq, drawer_id FROM drawer_sources WHERE workspace_id = ANY(%s)",
            (spaces,)).fetchall()
    by_drawer = Counter((w, h) for w, _i, h, _s in drawers)
    drawer_hash = {(w, i): h for w, i, h, _s in drawers}
    states = Counter(s for *_x, s in drawers)
    msg_count = Counter((w, s, q) for w, s, q, _h in msgs)
    msg_hash = {(w, s, q): h for w, s, q, h in msgs}
    src = defaultdict(list)
    for w, s, q, d in srcs:
        src[(w, s, q)].append(d)
    stored = lost = dups = 0
    for ev in sessions:
        plan = plan_session(ev, chunk_chars=settings.chunk_chars, chunk_overlap=settings.chunk_overlap,
                            min_chars=settings.min_chars)
        w = ev.workspace_id
        missing = any(msg_hash.get((w, ev.session_id, m.seq)) != m.content_hash for m in plan.messages)
        missing |= any(drawer_hash.get((w, d.id)) != d.content_hash for d in plan.drawers)
        missing |= any(d.drawer_id not in src.get((w, ev.session_id, d.seq), []) for d in plan.sources)
        twice = any(msg_count[(w, ev.session_id, m.seq)] > 1 for m in plan.messages)
        twice |= any(by_drawer[(w, d.content_hash)] > 1 for d in plan.drawers)
        twice |= any(len(src.get((w, ev.session_id, d.seq), [])) > 1 for d in plan.sources)
        lost += missing
        dups += twice
        stored += not missing and not twice
    details = {"drawers": len(drawers), "messages": len(msgs), **{f"drawers_{k}": v for k, v in states.items()}}
    return stored, lost, dups, details


def run_suite(cfg: SuiteConfig, extra_env: dict[str, str] | None = None) -> SuiteResult:
    """Run the whole suite on a fresh embedded stack; returns the figures (also printed)."""
    run_id = f"{int(time.time()) % 100000}"
    saved = dict(os.environ)
    stub = StubState()
    try:
        with serve_stub(stub) as stub_url:
            # The product's defaults, whatever a test session left in the environment (tests/own_stack_env.py).
            clean = own_stack_env()
            os.environ.clear()
            os.environ.update(clean)
            os.environ.update({
                "PALACE_DEVSTACK_DIR": str(cfg.devstack_dir), "PALACE_EMBED_BASE_URL": stub_url,
                "PALACE_EMBED_MODEL": "stub-hash-384", "PALACE_ACK_WAIT_S": "15", "PALACE_LOG_JSON": "true",
                "PALACE_SHUTDOWN_GRACE_S": "5", **(extra_env or {}),
            })
            settings = Settings()
            from palace_dev.devstack import DevStack

            DevStack(settings.devstack_dir).stop()
            shutil.rmtree(settings.devstack_dir, ignore_errors=True)
            sup = Supervisor(settings, services=cfg.services, log_dir=Path(settings.devstack_dir) / "logs",
                             metrics_base_port=free_port_block(40, start=Settings().metrics_port + 1))
            try:
                return _run(cfg, sup, settings, run_id)
            finally:
                sup.stop()
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _run(cfg: SuiteConfig, sup: Supervisor, settings: Settings, run_id: str) -> SuiteResult:
    sup.start_servers()
    sup.start_services()
    sup.wait_healthy()
    sessions = make_sessions(cfg, run_id)
    dlq_before = asyncio.run(_dlq_count(sup.nats_url, settings))
    window = cfg.events / cfg.rate
    fault_log: list[tuple[float, str]] = []
    faults_done = threading.Event()
    stop_poll = threading.Event()

    def poll() -> None:
        while not stop_poll.is_set():
            sup.poll()
            time.sleep(0.2)

    t0 = time.monotonic()
    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    faulter = threading.Thread(target=_faults_thread, args=(sup, cfg, window, fault_log, faults_done, t0),
                               daemon=True)
    faulter.start()
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console) as progress:
        published = asyncio.run(_publish_all(sup.nats_url, sessions, cfg.rate, progress))
        faulter.join()
        last_fault = time.monotonic()
        expected = sum(len(plan_session(s, chunk_chars=settings.chunk_chars, chunk_overlap=settings.chunk_overlap,
                                        min_chars=settings.min_chars).drawers) for s in sessions)
        task = progress.add_task("drain (drawers processed)", total=expected)
        spaces = sorted({s.workspace_id for s in sessions})
        deadline = time.monotonic() + cfg.drain_timeout_s
        drained = False
        while time.monotonic() < deadline:
            try:
                with psycopg.connect(sup.database_url, connect_timeout=3) as conn:
                    row = conn.execute(
                        "SELECT count(*) FILTER (WHERE state <> 'raw'), count(*) FILTER (WHERE state = 'raw')"
                        " FROM drawers WHERE workspace_id = ANY(%s)", (spaces,)).fetchone()
                done, raw = (row or (0, 0))
                progress.update(task, completed=done)
                if done >= expected and raw == 0 and asyncio.run(_consumers_idle(sup.nats_url, settings)):
                    drained = True
                    break
            except (psycopg.Error, OSError, nats.errors.Error):
                pass
            time.sleep(1.0)
        drain_s = time.monotonic() - last_fault
    # A service killed last may still be waiting out its restart backoff when the backlog is drained (one it
    # was not needed for): the restarts are counted once every service runs again.
    restart_deadline = time.monotonic() + 60.0
    while time.monotonic() < restart_deadline and any(c.proc.poll() is not None for c in sup.children.values()):
        time.sleep(0.2)
    stop_poll.set()
    poller.join()
    stored, lost, dups, details = _verify(sup.database_url, sessions, settings)
    dead = asyncio.run(_dlq_count(sup.nats_url, settings)) - dlq_before
    details["drained"] = int(drained)
    details["service_restarts"] = sum(c.restarts for c in sup.children.values())
    return SuiteResult(published, stored, lost, dups, dead, drain_s if drained else float("nan"), fault_log, details)


def _report(cfg: SuiteConfig, r: SuiteResult) -> None:
    t = Table(title=f"Fault suite: {cfg.events} sessions in {cfg.workspaces} workspaces at {cfg.rate:g}/s")
    t.add_column("t (s)", justify="right")
    t.add_column("fault")
    for at, what in r.faults:
        t.add_row(f"{at:.1f}", what)
    console.print(t)
    f = Table(title="Outcome")
    f.add_column("figure")
    f.add_column("value", justify="right")
    for k, v in [("published", r.published), ("stored", r.stored), ("lost", r.lost), ("duplicates", r.duplicates),
                 ("dead_lettered", r.dead_lettered), ("drain_s", f"{r.drain_s:.1f}"), *r.details.items()]:
        f.add_row(k, str(v))
    console.print(f)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--events", type=int, default=10_000)
    ap.add_argument("--workspaces", type=int, default=8)
    ap.add_argument("--rate", type=float, default=60.0, help="sessions published per second")
    ap.add_argument("--kills", type=int, default=6, help="SIGKILLs of random services (at least 5)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--env", action="append", default=[], metavar="PALACE_KEY=VALUE",
                    help="a setting for the suite's services (repeatable): the suite runs with the product's\n"
                         "defaults, whatever PALACE_ variables the calling shell holds")
    a = ap.parse_args()
    if bad := [kv for kv in a.env if "=" not in kv or not kv.startswith("PALACE_")]:
        ap.error(f"--env takes PALACE_KEY=VALUE: {', '.join(bad)}")
    extra = dict(kv.split("=", 1) for kv in a.env)
    cfg = SuiteConfig(events=a.events, workspaces=a.workspaces, rate=a.rate, kills=a.kills, seed=a.seed)
    r = run_suite(cfg, extra_env=extra)
    _report(cfg, r)
    print(r.line(), flush=True)
    sys.exit(0 if r.ok else 1)


if __name__ == "__main__":
    main()
