"""The embedded stack recovers from a crash: no orphaned servers, no stale locks, data kept."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import psutil
import psycopg

from palace_dev.devstack import DevStack


def test_restart_after_sigkill_recovers_and_keeps_data(tmp_path: Path) -> None:
    st = DevStack(tmp_path / "stack")
    info = st.start()
    try:
        with psycopg.connect(info.database_url, autocommit=True) as c:
            c.execute("CREATE TABLE keep (v text)")
            c.execute("INSERT INTO keep VALUES ('survives')")
        pg_pid = st._postmaster_pid()
        nats_pid = info.nats_pid
        assert pg_pid and nats_pid
        # A crash: both servers SIGKILLed; postgres backends may linger as orphans.
        os.kill(pg_pid, signal.SIGKILL)
        os.kill(nats_pid, signal.SIGKILL)
        psutil.Process(nats_pid).wait(5)
        info2 = st.start()
        assert st.pg_alive() and st.nats_alive()
        assert info2.nats_pid != nats_pid
        with psycopg.connect(info2.database_url) as c:
            assert c.execute("SELECT v FROM keep").fetchone() == ("survives",)
        # And a second start while running restarts cleanly rather than failing on locks.
        st.start()
        assert st.pg_alive() and st.nats_alive()
    finally:
        st.stop()
    assert not st.pg_alive() and not st.nats_alive()
    assert not st._pg_leftovers()


def test_a_stack_another_process_runs_is_not_restarted_under_it(tmp_path: Path) -> None:
    """A second `palace up`, `palace demo` or `palace stack start` in the same checkout restarted the
    servers of the one running (its services lost them mid-flight) and, on its way out, stopped them."""
    import subprocess
    import sys

    root = tmp_path / "stack"
    st = DevStack(root)
    info = st.start()  # this process runs it
    try:
        env = {**os.environ, "PALACE_DEVSTACK_DIR": str(root)}
        env.pop("PALACE_DATABASE_URL", None)
        env.pop("PALACE_NATS_URL", None)
        done = subprocess.run([sys.executable, "-m", "services.cli", "stack", "start"], env=env, capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 1 and f"run by process {os.getpid()}" in " ".join(done.stdout.split()), done
        assert st.pg_alive() and st.nats_alive() and st._postmaster_pid() == DevStack(root)._postmaster_pid()
        assert DevStack(root).info() == info, "the same servers, untouched"
    finally:
        st.stop()


def test_a_nats_port_taken_while_the_stack_was_down_is_replaced(tmp_path: Path) -> None:
    """The saved port is reused so a restart keeps its URL; when another process took it meanwhile, every
    start failed ("nats-server exited") until someone edited the state file or deleted the data."""
    import socket

    st = DevStack(tmp_path / "stack")
    first = st.start().nats_url
    st.stop()
    port = int(first.rsplit(":", 1)[1])
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", port))
        squatter.listen()
        try:
            again = st.start().nats_url
            assert again != first and st.nats_alive()
        finally:
            st.stop()
