"""The embedded stack that ``palace mcp`` starts when nothing runs: a detached process of its own, kept
while any ``palace mcp`` uses it.

An MCP client starts one server process per session and ends it when it closes, and a user may run several
clients side by side (Claude Desktop, Claude Code, Cursor). Were the stack run by the first ``palace mcp``,
its exit would take the servers and the pipeline from under the others (the services die with their
supervisor). So the stack runs in a process no client owns; each ``palace mcp`` on the embedded stack
registers itself while it runs (a file named by its pid and start time under ``<devstack>/clients``), and
the keeper stops everything once none has been alive for ``PALACE_MCP_STACK_IDLE_S``.

Registering and deciding to stop happen under one file lock, so a client either registers before the
keeper's last look (and keeps the stack) or finds it stopped and starts another.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil

from palace_dev.devstack import DevStack
from shared.config import Settings
from shared.endpoints import StackNotRunning, resolve_urls
from shared.logging import configure_logging, get_logger

__all__ = ["KeeperFailed", "live_clients", "register_client", "stack_for_client"]

log = get_logger("palace.keeper")
CLIENTS = "clients"
LOCK = "keeper.lock"
READY = "keeper.ready"


class KeeperFailed(RuntimeError):
    """The keeper could not bring the stack up (its log says why)."""


@contextlib.contextmanager
def _locked(root: Path) -> Iterator[None]:
    root.mkdir(parents=True, exist_ok=True)
    with (root / LOCK).open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _stamp(p: psutil.Process) -> str:
    """pid and start time: a pid reused by another process after a crash does not count as the client."""
    return f"{p.pid}-{p.create_time():.2f}"


def register_client(root: Path) -> Path:
    """Register this process as a user of the stack in ``root``; the caller removes the file on exit
    (a client killed outright is recognised as gone by its pid and start time)."""
    d = root / CLIENTS
    d.mkdir(parents=True, exist_ok=True)
    f = d / _stamp(psutil.Process())
    f.touch()
    return f


def live_clients(root: Path) -> int:
    """Registered clients still running; the files of those that are gone are removed."""
    n = 0
    for f in (root / CLIENTS).glob("*-*"):
        pid = f.name.split("-", 1)[0]
        try:
            alive = _stamp(psutil.Process(int(pid))) == f.name
        except (psutil.Error, ValueError):
            alive = False
        if alive:
            n += 1
        else:
            f.unlink(missing_ok=True)
    return n


def stack_for_client(settings: Settings, services: list[str], *, timeout_s: float = 300.0) -> tuple[Path, str, str]:
    """Register this ``palace mcp`` and return (its registration, database URL, NATS URL): the running
    embedded stack's, or those of a keeper started here. Raises ``KeeperFailed`` with the keeper's log."""
    root = settings.devstack_dir
    with _locked(root):
        me = register_client(root)
        if not _keeper_died(root):
            with contextlib.suppress(StackNotRunning):
                db, bus = resolve_urls(settings)
                return me, db, bus
        try:
            db, bus = _start_keeper(settings, services, timeout_s)
        except BaseException:
            me.unlink(missing_ok=True)
            raise
        return me, db, bus


def _keeper_died(root: Path) -> bool:
    """A keeper that was killed outright leaves its servers running without the pipeline (its services end
    with it): a client would file memories nothing processes. Such a stack is started again, recovering."""
    pid = DevStack(root).read_state().get("keeper_pid")
    if not pid:
        return False
    with contextlib.suppress(psutil.Error, ValueError, TypeError):
        p = psutil.Process(int(pid))  # type: ignore[call-overload]
        return not (p.is_running() and p.status() != psutil.STATUS_ZOMBIE)
    return True


def _start_keeper(settings: Settings, services: list[str], timeout_s: float) -> tuple[str, str]:
    root = settings.devstack_dir
    logs = root / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    (root / READY).unlink(missing_ok=True)
    out = (logs / "keeper.log").open("ab")
    proc = subprocess.Popen(
        [sys.executable, "-m", "palace_dev.keeper", "--services", ",".join(services), "--log-dir", str(logs)],
        stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True, close_fds=True,
    )
    out.close()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise KeeperFailed(f"the embedded stack did not start (exit {proc.returncode}):\n{_tail(logs)}")
        with contextlib.suppress(FileNotFoundError, ValueError):
            if int((root / READY).read_text()) == proc.pid:
                return resolve_urls(settings)
        time.sleep(0.2)
    proc.terminate()
    raise KeeperFailed(f"the embedded stack was not ready within {timeout_s:.0f} s:\n{_tail(logs)}")


def _tail(logs: Path, n: int = 20) -> str:
    with contextlib.suppress(OSError):
        return "\n".join((logs / "keeper.log").read_text(errors="replace").splitlines()[-n:])
    return ""


def run(settings: Settings, services: list[str], log_dir: Path) -> None:
    """The keeper itself: bring the stack up, mark it ready, and stop it once no client has been alive for
    ``PALACE_MCP_STACK_IDLE_S`` (or on SIGTERM / SIGINT)."""
    from palace_dev.supervisor import Supervisor

    root = settings.devstack_dir
    stopping = False

    def _stop(*_: Any) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    sup = Supervisor(settings, services=services, log_dir=log_dir)
    stopped = False
    DevStack(root).write_state(keeper_pid=os.getpid())
    try:
        sup.start_servers()
        sup.start_services()
        sup.wait_healthy()
        (root / READY).write_text(str(os.getpid()))
        log.info("keeper_ready", services=services, idle_s=settings.mcp_stack_idle_s)
        idle_since: float | None = None
        while not stopping:
            sup.poll()
            if live_clients(root):
                idle_since = None
            elif idle_since is None:
                idle_since = time.monotonic()
            elif time.monotonic() - idle_since >= settings.mcp_stack_idle_s:
                with _locked(root):  # a client registering now waits, then finds the stack stopped
                    if not live_clients(root):
                        log.info("keeper_idle_stop")
                        stopped = True
                        _shutdown(sup, root)
                        return
                idle_since = None
            time.sleep(0.5)
    finally:
        if not stopped:
            _shutdown(sup, root)


def _shutdown(sup: Any, root: Path) -> None:
    """Drain the services, then stop the servers; the stack is not ready from the first step."""
    (root / READY).unlink(missing_ok=True)
    try:
        sup.stop()
    finally:
        DevStack(root).write_state(keeper_pid=None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--services", required=True)
    ap.add_argument("--log-dir", type=Path, required=True)
    args = ap.parse_args()
    s = Settings()
    configure_logging(s.log_level, s.log_json)
    run(s, [n for n in args.services.split(",") if n], args.log_dir)


if __name__ == "__main__":
    main()
