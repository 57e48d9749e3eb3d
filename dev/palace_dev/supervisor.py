"""Run the whole stack on one machine: the embedded servers (unless external ones are configured)
and every service as its own process, restarted with backoff if it dies.

Each service is a separate OS process, as in production, so a crash or a SIGKILL of one never takes
the others down, and the fault suite can kill them one by one. Children get PDEATHSIG, so they
end with the supervisor even if it is SIGKILLed; the next start also kills any recorded leftovers.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from palace_dev.devstack import DevStack, port_available
from shared.config import Settings
from shared.db.migrate import apply_migrations
from shared.logging import get_logger

__all__ = ["ALL_SERVICES", "Supervisor", "free_port_block", "stop_on_signals"]


ALL_SERVICES = ["ingest", "embed", "classify", "cluster", "enrich", "maintain", "api"]
log = get_logger("palace.supervisor")


def free_port_block(n: int, start: int = 9101, stop: int = 60000) -> int:
    """First port p from ``start`` such that p .. p+n-1 are all free on 127.0.0.1 (each service process
    answers on base + its index, so a whole block is needed)."""
    for base in range(start, stop - n, n):
        free = True
        for port in range(base, base + n):
            with socket.socket() as sock:
                try:
                    sock.bind(("127.0.0.1", port))
                except OSError:
                    free = False
                    break
        if free:
            return base
    raise RuntimeError(f"no block of {n} free ports in {start}..{stop}")


def stop_on_signals() -> threading.Event:
    """An event set by SIGTERM or SIGINT (installed here, in the main thread): a foreground stack runs until
    it is set, then stops everything it started."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    return stop


def _die_with_parent() -> None:
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


@dataclass
class _Child:
    name: str
    proc: subprocess.Popen[bytes]
    started: float
    restarts: int = 0
    next_start: float = 0.0


@dataclass
class Supervisor:
    """Start, watch and stop the stack. ``services`` picks which services run; ``env`` is laid over
    ``os.environ`` for every child (a second stack in one process, e.g. the fault tests, must not
    change the environment the first stack's restarts inherit)."""

    settings: Settings
    services: list[str] = field(default_factory=lambda: list(ALL_SERVICES))
    replicas: int = 1  # processes per consuming service (api and maintain always run once)
    log_dir: Path | None = None
    # Health/metrics port of the first worker; None: 9101 if the block from there is free, else the first
    # free block above it (a second stack on the machine must not answer for this one's services).
    metrics_base_port: int | None = None
    stack: DevStack | None = None
    children: dict[str, _Child] = field(default_factory=dict)
    database_url: str = ""
    nats_url: str = ""
    env: dict[str, str] = field(default_factory=dict)

    def start_servers(self) -> None:
        """Start the embedded servers (recovering from a crash) or use the configured ones."""
        s = self.settings
        if s.database_url and s.nats_url:
            self.database_url, self.nats_url = s.database_url, s.nats_url
        else:
            stack = DevStack(s.devstack_dir)
            info = stack.start()
            self.stack = stack  # only a stack this supervisor started is one it stops (not another's, in use)
            self.database_url = s.database_url or info.database_url
            self.nats_url = s.nats_url or info.nats_url
        applied = apply_migrations(self.database_url, s.embed_dim)
        if applied:
            log.info("migrations_applied", applied=applied)

    def __post_init__(self) -> None:
        if self.metrics_base_port is None:
            # From PALACE_METRICS_PORT's next port (9101 by default), so that two stacks side by side (tests in
            # parallel, two checkouts) can be kept apart.
            self.metrics_base_port = free_port_block(10 * 4, start=self.settings.metrics_port + 1)

    def port_of(self, name: str) -> int:
        """The health/metrics port of a service process: the api's own port, else one per worker in
        ``ALL_SERVICES`` order from ``metrics_base_port`` (ingest 9101, embed 9102, ...); replica k of a
        service (named ``embed-2``, ...) adds 10 × (k - 1)."""
        service, _, k = name.partition("-")
        if service == "api":
            return self.settings.api_port
        assert self.metrics_base_port is not None
        return self.metrics_base_port + ALL_SERVICES.index(service) + 10 * (int(k or 1) - 1)

    def endpoints(self) -> dict[str, dict[str, object]]:
        """Where each running service answers: its pid, health (readiness) and metrics URLs."""
        out: dict[str, dict[str, object]] = {}
        for name, child in self.children.items():
            base = f"http://127.0.0.1:{self.port_of(name)}"
            out[name] = {"pid": child.proc.pid, "ready": f"{base}/readyz", "metrics": f"{base}/metrics"}
        return out

    def _env(self, name: str, index: int) -> dict[str, str]:
        env = {**os.environ, **self.env}
        env["PALACE_DATABASE_URL"] = self.database_url
        env["PALACE_NATS_URL"] = self.nats_url
        env["PALACE_METRICS_PORT"] = str(self.port_of(name))
        env["PALACE_API_PORT"] = str(self.settings.api_port)
        env.setdefault("PALACE_LOG_JSON", "true")
        return env

    def spawn(self, name: str) -> None:
        service = name.partition("-")[0]
        index = ALL_SERVICES.index(service)
        out: int | object = subprocess.DEVNULL
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            out = open(self.log_dir / f"{name}.log", "ab")  # noqa: SIM115 - owned by the child
        proc = subprocess.Popen(
            [sys.executable, "-m", f"services.{service}"], env=self._env(name, index),
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,  # type: ignore[arg-type]
            preexec_fn=_die_with_parent,
        )
        prev = self.children.get(name)
        self.children[name] = _Child(name, proc, time.monotonic(), restarts=(prev.restarts + 1) if prev else 0)
        self._record()

    def _record(self) -> None:
        if self.stack is not None:
            self.stack.write_state(service_pids={n: c.proc.pid for n, c in self.children.items()},
                                   services=self.endpoints())

    def start_services(self) -> None:
        """Spawn every service (and its replicas). Refused when the api's port is taken: another server
        answering /healthz there passed for ours, and `palace up` said ready pointing at the other one."""
        if "api" in self.services and not port_available(self.settings.api_port):
            raise RuntimeError(f"port {self.settings.api_port} is in use (another Palace, or another program): "
                               "stop it, or set PALACE_API_PORT")
        for name in self.services:
            self.spawn(name)
            if name not in ("api", "maintain"):
                for k in range(2, self.replicas + 1):
                    self.spawn(f"{name}-{k}")

    def poll(self) -> list[str]:
        """Restart services that exited, with exponential backoff. Returns names restarted."""
        restarted = []
        now = time.monotonic()
        for name, child in list(self.children.items()):
            if child.proc.poll() is None:
                continue
            if child.next_start == 0.0:
                delay = min(30.0, 0.5 * 2 ** min(child.restarts, 6)) if now - child.started < 60 else 0.5
                child.next_start = now + delay
                log.warning("service_exited", service=name, code=child.proc.returncode, restart_in_s=delay)
            elif now >= child.next_start:
                try:
                    self.spawn(name)
                except Exception:  # a failed restart is retried; it must not end the loop
                    child.next_start = now + min(30.0, 0.5 * 2 ** min(child.restarts + 1, 6))
                    log.exception("service_restart_failed", service=name, retry_in_s=child.next_start - now)
                    continue
                restarted.append(name)
        return restarted

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Send a signal to one service (used by the fault suite)."""
        with contextlib.suppress(ProcessLookupError):
            self.children[name].proc.send_signal(sig)

    def wait_healthy(self, timeout: float = 180.0) -> None:
        """Block until every started service answers its health endpoint."""
        import httpx

        deadline = time.monotonic() + timeout
        pending = set(self.children)
        while pending and time.monotonic() < deadline:
            for name in list(pending):
                with contextlib.suppress(Exception):
                    if httpx.get(f"http://127.0.0.1:{self.port_of(name)}/healthz", timeout=1).status_code == 200:
                        pending.discard(name)
                child = self.children[name]
                if child.proc.poll() is not None:
                    raise RuntimeError(f"service {name} exited with {child.proc.returncode} during start-up"
                                       + (f"; see {self.log_dir / (name + '.log')}" if self.log_dir else ""))
            time.sleep(0.3)
        if pending:
            raise RuntimeError(f"services not healthy after {timeout}s: {sorted(pending)}")

    def stop_services(self, grace: float | None = None) -> None:
        """SIGTERM every service (they drain and ack), then SIGKILL what outlives the grace period."""
        grace = self.settings.shutdown_grace_s + 5 if grace is None else grace
        for child in self.children.values():
            with contextlib.suppress(ProcessLookupError):
                child.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for child in self.children.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.proc.wait(max(0.1, deadline - time.monotonic()))
            if child.proc.poll() is None:
                child.proc.kill()
                child.proc.wait(5)
        self.children.clear()
        self._record()

    def stop(self) -> None:
        self.stop_services()
        if self.stack is not None:
            self.stack.stop()
