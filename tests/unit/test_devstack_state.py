"""The development stack's bookkeeping survives two threads at once. The fault suite restarts NATS from
one thread (which records the new server's pid) while another restarts a killed service (which records
the service pids): both wrote `stack.json` through one shared temporary file, so one writer's rename
failed and killed the thread that restarts services, and a reader could see a half-written file and
drop every key it held. A restart that fails is retried at the next poll instead of ending the loop."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest

pytest.importorskip("palace_dev")

from palace_dev.devstack import DevStack
from palace_dev.supervisor import Supervisor
from shared.config import Settings


def test_concurrent_state_writes_keep_every_key_and_never_fail(tmp_path: Path) -> None:
    stack = DevStack(tmp_path)
    stack.write_state(database_url="postgresql://kept")
    errors: list[BaseException] = []

    def writer(k: int) -> None:
        try:
            for i in range(150):
                stack.write_state(**{f"key{k}": i})
        except BaseException as e:  # collected for the assertion
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    state = stack.read_state()
    assert state["database_url"] == "postgresql://kept"
    assert all(state[f"key{k}"] == 149 for k in range(6)), state
    assert sorted(p.name for p in tmp_path.iterdir()) == ["stack.json", "stack.lock"], "no temporary file is left"


def test_a_restart_that_fails_is_retried_at_the_next_poll(monkeypatch: pytest.MonkeyPatch) -> None:
    sup = Supervisor(Settings(), services=["maintain"])
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    from palace_dev import supervisor as mod

    sup.children["maintain"] = mod._Child("maintain", dead, started=0.0)
    calls: list[str] = []

    def flaky_spawn(name: str) -> None:
        calls.append(name)
        if len(calls) == 1:
            raise OSError("resource temporarily unavailable")
        sup.children[name] = mod._Child(name, dead, started=0.0, restarts=sup.children[name].restarts + 1)

    monkeypatch.setattr(sup, "spawn", flaky_spawn)
    sup.poll()  # notices the exit and schedules the restart
    sup.children["maintain"].next_start = 0.001
    assert sup.poll() == [] and calls == ["maintain"], "the failed restart is reported, not raised"
    sup.children["maintain"].next_start = 0.001
    assert sup.poll() == ["maintain"] and sup.children["maintain"].restarts == 1
