"""`palace up` refuses what it cannot run before starting anything: an unknown service name (it was a
traceback with PostgreSQL and NATS left running) and an api port another server holds (that server's
/healthz answered for ours, and `palace up` said ready pointing at it)."""

from __future__ import annotations

import re
import socket

import pytest
from typer.testing import CliRunner

from services.cli import app


def test_an_unknown_service_is_refused_before_anything_starts(tmp_path: object) -> None:
    r = CliRunner().invoke(app, ["up", "--services", "ingest,embedd"], env={"PALACE_DEVSTACK_DIR": str(tmp_path)})
    flat = " ".join(re.sub(r"[│╭╮╰╯─]", " ", r.output).split())
    assert r.exit_code == 2 and "unknown service(s) embedd" in flat, r.output
    assert not list(tmp_path.iterdir()), "no server was started"  # type: ignore[attr-defined]


def test_the_api_port_taken_by_another_server_is_refused() -> None:
    pytest.importorskip("palace_dev")
    from palace_dev.supervisor import Supervisor
    from shared.config import Settings

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        sup = Supervisor(Settings(api_port=port), services=["api"])
        with pytest.raises(RuntimeError, match=f"port {port} is in use"):
            sup.start_services()
        assert not sup.children
