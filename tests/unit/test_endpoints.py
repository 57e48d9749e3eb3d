"""Where the servers are: only what a command needs must be configured or running."""

from __future__ import annotations

import json
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


def test_the_running_embedded_stack_fills_in_what_is_not_configured(tmp_path: Path) -> None:
    (tmp_path / "stack.json").write_text(json.dumps({"database_url": "postgresql://local/palace",
                                                     "nats_url": "nats://127.0.0.1:4222"}))
    s = _settings(tmp_path, database_url="postgresql://db/palace", nats_url=None)
    assert resolve_urls(s) == ("postgresql://db/palace", "nats://127.0.0.1:4222")
    with pytest.raises(StackNotRunning, match="PALACE_DATABASE_URL / PALACE_NATS_URL"):
        resolve_urls(_settings(tmp_path / "nowhere", database_url=None, nats_url=None))
