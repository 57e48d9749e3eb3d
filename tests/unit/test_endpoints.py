"""Where the servers are: only what a command needs must be configured or running."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from shared.config import Settings
from shared.endpoints import StackNotRunning, resolve_urls


def _settings(tmp_path: Path, **env: str | None) -> Settings:
    return Settings(devstack_dir=tmp_path, **env)  # type: ignore[arg-type]


def test_a_database_only_command_needs_no_nats_url(tmp_path: Path) -> None:
    s = _settings(tmp_path, database_url="postgresql://db/palace", nats_url=None)
    assert resolve_urls(s, nats=False) == ("postgresql://db/palace", "")
    with pytest.raises(StackNotRunning) as e:
        resolve_urls(s)
    assert "PALACE_NATS_URL" in str(e.value) and "PALACE_DATABASE_URL" not in str(e.value)


def test_a_bus_only_command_needs_no_database_url(tmp_path: Path) -> None:
    s = _settings(tmp_path, database_url=None, nats_url="nats://bus:4222")
    assert resolve_urls(s, database=False) == ("", "nats://bus:4222")
    with pytest.raises(StackNotRunning, match="PALACE_DATABASE_URL"):
        resolve_urls(s)


def _stack(tmp_path: Path, nats_pid: int, postmaster_pid: int | None) -> None:
    (tmp_path / "stack.json").write_text(json.dumps({"database_url": "postgresql://local/palace",
                                                     "nats_url": "nats://127.0.0.1:4222", "nats_pid": nats_pid}))
    if postmaster_pid is not None:
        (tmp_path / "pg" / "data").mkdir(parents=True, exist_ok=True)
        (tmp_path / "pg" / "data" / "postmaster.pid").write_text(f"{postmaster_pid}\n/some/dir\n")


def test_the_running_embedded_stack_fills_in_what_is_not_configured(tmp_path: Path) -> None:
    _stack(tmp_path, os.getpid(), os.getpid())  # processes that run: this one
    s = _settings(tmp_path, database_url="postgresql://db/palace", nats_url=None)
    assert resolve_urls(s) == ("postgresql://db/palace", "nats://127.0.0.1:4222")
    assert resolve_urls(_settings(tmp_path, database_url=None, nats_url=None)) == (
        "postgresql://local/palace", "nats://127.0.0.1:4222")
    with pytest.raises(StackNotRunning, match="PALACE_DATABASE_URL / PALACE_NATS_URL"):
        resolve_urls(_settings(tmp_path / "nowhere", database_url=None, nats_url=None))


def test_a_state_file_that_outlived_its_servers_is_not_a_running_stack(tmp_path: Path) -> None:
    """After a kill or a reboot every command retried the dead addresses for minutes, then a traceback."""
    gone = 2**22 + 12345  # above the default pid_max: no process has it
    _stack(tmp_path, gone, gone)
    with pytest.raises(StackNotRunning, match="PALACE_DATABASE_URL / PALACE_NATS_URL"):
        resolve_urls(_settings(tmp_path, database_url=None, nats_url=None))
    _stack(tmp_path, os.getpid(), None)  # NATS runs, PostgreSQL's data dir has no postmaster
    with pytest.raises(StackNotRunning, match="no PALACE_DATABASE_URL and"):
        resolve_urls(_settings(tmp_path, database_url=None, nats_url=None))
