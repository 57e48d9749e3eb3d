"""The embedded stack that ``palace mcp`` starts when nothing runs: a detached process of its own, kept
while any ``palace mcp`` uses it.

An MCP client starts one server process per session and ends it when it closes, and a user may run several
clients side by side (Claude Desktop, Claude Code, Cursor). Were the stack run by the first ``palace mcp``,
its exit would take the servers and the pipeline from under the others (the services die with their
supervisor). So the stack runs in a process no client owns; each ``palace mcp`` on the embedded stack
registers itself while it runs (a file under ``<devstack>/clients`` it holds a lock on), and the keeper stops
everything once none has been alive for ``PALACE_MCP_STACK_IDLE_S``. The keeper holds ``keeper.alive``
locked the same way: a lock, unlike a pid or a start time, cannot outlive its process or be faked by a
reused pid or a stepped clock.

Registering and deciding to stop happen under one file lock, so a client either registers before the
keeper's last look (and keeps the stack) or finds it stopped and starts another.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from palace_dev.devstack import DevStack
from shared.config import Settings
from shared.endpoints import StackNotRunning, resolve_urls
from shared.logging import configure_logging, get_logger

__all__ = ["KeeperFailed", "Registration", "live_clients", "stack_for_client", "stopping"]

log = get_logger("palace.keeper")
CLIENTS = "clients"
LOCK = "keeper.lock"
READY = "keeper.ready"
ALIVE = "keeper.alive"


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


@contextlib.contextmanager
def _try_locked(root: Path) -> Iterator[bool]:
    """``_locked`` if free now; yields False at once when another process holds it (``palace stack stop``
    holds it while it waits for this keeper to end: waiting for it here would stall both)."""
    root.mkdir(parents=True, exist_ok=True)
    with (root / LOCK).open("a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


class Registration:
    """This process's registration as a user of the stack: a file it holds a shared lock on for as long as
    it runs. Liveness is the lock, not a pid or a start time: the kernel drops it when the process ends,
    however it ends, and neither a reused pid nor a stepped clock can fake it."""

    def __init__(self, root: Path) -> None:
        d = root / CLIENTS
        d.mkdir(parents=True, exist_ok=True)
        # Locked under a temporary name, then renamed into place: the keeper never sees it unlocked.
        tmp = d / f".{os.getpid()}-{time.monotonic_ns()}"
        self._file = tmp.open("w")
        fcntl.flock(self._file, fcntl.LOCK_SH)
        self.path = d / f"{os.getpid()}-{time.monotonic_ns()}"
        tmp.rename(self.path)

    def close(self) -> None:
        self.path.unlink(missing_ok=True)
        self._file.close()


def _held(path: Path) -> bool:
    """Whether another process holds a lock on ``path`` (False: nobody, or the file is gone)."""
    try:
        with path.open("r") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(f, fcntl.LOCK_UN)
            return False
    except FileNotFoundError:
        return False


def live_clients(root: Path) -> int:
    """Registered clients still running; the files of those that are gone are removed."""
    n = 0
    for f in (root / CLIENTS).glob("[0-9]*-*"):
        if _held(f):
            n += 1
        else:
            f.unlink(missing_ok=True)
    return n


def stack_for_client(settings: Settings, services: list[str], *,
                     timeout_s: float = 300.0) -> tuple[Registration, str, str]:
    """Register this ``palace mcp`` and return (its registration, database URL, NATS URL): the running
    embedded stack's, or those of a keeper started here. Raises ``KeeperFailed`` with the keeper's log."""
    root = settings.devstack_dir
    with _locked(root):
        me = Registration(root)
        try:
            if _keeper_alive(root):
                # Running, or still starting (a client that gave up waiting for it left it so): wait for it
                # rather than start a second one on the same directory.
                _wait_ready(root, timeout_s)
            if not _unattended(root):
                with contextlib.suppress(StackNotRunning):
                    db, bus = resolve_urls(settings)
                    return me, db, bus
            db, bus = _start_keeper(settings, services, timeout_s)
        except BaseException:
            me.close()
            raise
        return me, db, bus


def _keeper_alive(root: Path) -> bool:
    """Whether a keeper process runs for this directory: it holds ``keeper.alive`` locked for its life."""
    return _held(root / ALIVE)


def _unattended(root: Path) -> bool:
    """Servers running that no live process runs the pipeline on: a keeper or ``palace up`` killed outright
    (their services end with them, their servers stay), or servers started alone (``palace stack start``).
    A client would file memories nothing processes: such a stack is started again, recovering, by a keeper.
    Not one that ``palace up``, a keeper, a demo or a test session runs (its owner is alive)."""
    st = DevStack(root)
    return bool(st.read_state().get("database_url")) and st.running_owner() is None


@contextlib.contextmanager
def stopping(root: Path, timeout_s: float = 60.0) -> Iterator[bool]:
    """``palace stack stop``: stop the keeper running the stack in ``root``, if one does (it drains its
    services and stops the servers, as when its last client goes), and hold the clients' lock until the
    block (which stops what is left) ends, so a ``palace mcp`` starting meanwhile waits, then finds nothing
    running and starts afresh instead of taking a stack being stopped. Yields whether a keeper was running."""
    import signal

    with _locked(root):
        running = _keeper_alive(root)
        if running:
            pid = DevStack(root).read_state().get("keeper_pid")
            if pid:
                with contextlib.suppress(ProcessLookupError, ValueError, TypeError):
                    os.kill(int(pid), signal.SIGTERM)  # type: ignore[call-overload]
            deadline = time.monotonic() + timeout_s
            while (_keeper_alive(root) or _still_running(pid)) and time.monotonic() < deadline:
                time.sleep(0.2)  # its lock goes as it finalises: wait for the process itself too
        yield running


def _still_running(pid: object) -> bool:
    """Whether the process ``pid`` runs (an exited one its parent has not reaped yet does not)."""
    import psutil

    try:
        return psutil.Process(int(pid)).status() != psutil.STATUS_ZOMBIE  # type: ignore[call-overload]
    except (psutil.Error, ValueError, TypeError):
        return False


def _wait_ready(root: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while _keeper_alive(root) and not (root / READY).exists():
        if time.monotonic() > deadline:
            raise KeeperFailed(f"the embedded stack was not ready within {timeout_s:.0f} s:\n{_tail(root / 'logs')}")
        time.sleep(0.2)


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
    from palace_dev.supervisor import Supervisor, stop_on_signals

    root = settings.devstack_dir
    stop = stop_on_signals()
    root.mkdir(parents=True, exist_ok=True)
    alive = (root / ALIVE).open("a")  # locked for this process's life: what clients take as "a keeper runs"
    try:
        fcntl.flock(alive, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise SystemExit(f"another keeper runs the stack in {root}") from None
    sup = Supervisor(settings, services=services, log_dir=log_dir)
    stopped = False
    DevStack(root).write_state(keeper_pid=os.getpid())
    try:
        sup.start_servers()
        sup.start_services()
        sup.wait_healthy()
        if stop.is_set():
            return  # stopped while starting: never announced ready
        (root / READY).write_text(str(os.getpid()))
        log.info("keeper_ready", services=services, idle_s=settings.mcp_stack_idle_s)
        idle_since: float | None = None
        while not stop.is_set():
            sup.poll()
            if live_clients(root):
                idle_since = None
            elif idle_since is None:
                idle_since = time.monotonic()
            elif time.monotonic() - idle_since >= settings.mcp_stack_idle_s:
                with _try_locked(root) as mine:  # a client registering now waits, then finds the stack stopped
                    if mine and not live_clients(root):
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
        st = DevStack(root)
        if st.read_state().get("keeper_pid") == os.getpid():
            st.write_state(keeper_pid=None)


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
