"""`palace stack status` answers promptly when the configured servers are down: nats-py retries a first
connect forever unless told otherwise, which made the command hang printing tracebacks."""

from __future__ import annotations

import socket
import time

from typer.testing import CliRunner

from services.cli import app


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # released on close: nothing listens there


def test_status_reports_down_servers_without_hanging(monkeypatch) -> None:
    monkeypatch.setenv("PALACE_NATS_URL", f"nats://127.0.0.1:{_closed_port()}")
    monkeypatch.setenv("PALACE_DATABASE_URL", f"postgresql://palace@127.0.0.1:{_closed_port()}/palace")
    started = time.monotonic()
    result = CliRunner().invoke(app, ["stack", "status", "--json"])
    assert result.exit_code == 0, result.output
    assert time.monotonic() - started < 15
    assert '"nats": false' in result.output and '"postgres": false' in result.output
    assert "Traceback" not in result.output
