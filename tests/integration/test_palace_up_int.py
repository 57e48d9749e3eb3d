"""After a SIGKILL of `palace up`, the next `palace up` recovers; it runs until Ctrl-C and stops cleanly."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil

from tests.integration.helpers import stack_logs, wait_for
from tests.own_stack_env import own_stack_env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env(devstack: Path, api_port: int) -> dict[str, str]:
    return {**own_stack_env(PALACE_DEVSTACK_DIR=str(devstack), PALACE_API_PORT=str(api_port),
                            PALACE_SHUTDOWN_GRACE_S="5"), "COLUMNS": "80"}


def _up(devstack: Path, api_port: int) -> subprocess.Popen[bytes]:
    devstack.mkdir(parents=True, exist_ok=True)
    out = open(devstack / "up.out", "ab")  # noqa: SIM115 - owned by the child
    return subprocess.Popen([sys.executable, "-m", "services.cli", "up", "--services", "ingest,embed,classify,api",
                             "--log-dir", str(devstack / "logs")], env=_env(devstack, api_port), stdout=out,
                            stderr=subprocess.STDOUT)


def _healthy(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def _service_pids(devstack: Path) -> list[int]:
    state = json.loads((devstack / "stack.json").read_text())
    return list((state.get("service_pids") or {}).values())


def test_up_crash_recovery_then_ctrl_c(tmp_path: Path) -> None:
    devstack = tmp_path / "stack"
    port = _free_port()
    up = _up(devstack, port)
    try:
        wait_for(lambda: _healthy(port), 180, "palace up healthy", lambda: stack_logs(devstack))
        pids = _service_pids(devstack)
        assert len(pids) == 4
        # Once everything is ready, `palace up` says so, with every service's URLs and the api's and NATS's.
        def said_ready() -> str | None:
            text = (devstack / "up.out").read_text()
            return text if "ready." in text else None

        printed = wait_for(said_ready, 30, "palace up to print that it is ready")
        assert f"http://127.0.0.1:{port}" in printed and "nats://" in printed
        for name in ("ingest", "embed", "classify", "api"):
            assert name in printed
        assert printed.count("/readyz") == 4 and printed.count("/metrics") == 4
        # `palace stack status` tells whether the servers run, where, and how each service is doing.
        st = subprocess.run([sys.executable, "-m", "services.cli", "stack", "status", "--json"],
                            env=_env(devstack, port), capture_output=True, text=True, timeout=60)
        status = json.loads(st.stdout)
        assert status["postgres"] and status["nats"] and str(devstack.resolve()) in status["servers"]
        assert {n: s["state"] for n, s in status["services"].items()} == dict.fromkeys(
            ("ingest", "embed", "classify", "api"), "ready")
        human = subprocess.run([sys.executable, "-m", "services.cli", "stack", "status"],
                               env=_env(devstack, port), capture_output=True, text=True, timeout=60).stdout
        assert "running" in human and "not running" not in human and "ingest" in human

        # Crash: SIGKILL the supervisor. Its services die with it (PDEATHSIG); servers are left running,
        # and the next `palace up` takes them over.
        up.kill()
        up.wait(10)
        wait_for(lambda: not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
                                 for p in pids), 30, "services to follow the supervisor")
        up = _up(devstack, port)
        wait_for(lambda: _healthy(port), 180, "palace up after a crash", lambda: stack_logs(devstack))
        pids = _service_pids(devstack)

        # Ctrl-C: services drain and exit, servers stop, the state file forgets them.
        up.send_signal(signal.SIGINT)
        assert up.wait(60) == 0
        assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids)
        state = json.loads((devstack / "stack.json").read_text())
        assert not state.get("database_url") and not state.get("nats_pid")
        # Every step of the api's shutdown closed what it opened (the MCP sessions' task group included).
        api_log = (devstack / "logs" / "api.log").read_text()
        assert "api_ready" in api_log and "api_shutdown_step_failed" not in api_log, api_log[-2000:]
    finally:
        if up.poll() is None:
            up.kill()
        subprocess.run([sys.executable, "-m", "services.cli", "stack", "stop"],
                       env=own_stack_env(PALACE_DEVSTACK_DIR=str(devstack)), capture_output=True, timeout=120)
        time.sleep(0.5)
