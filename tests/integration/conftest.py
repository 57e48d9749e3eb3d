"""One real stack per test run: embedded PostgreSQL + pgvector and NATS JetStream (or the external
servers in PALACE_DATABASE_URL / PALACE_NATS_URL), with every service as its own process."""

from __future__ import annotations

import os
import random
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from palace_dev.devstack import DevStack
from palace_dev.supervisor import Supervisor, free_port_block
from shared.config import Settings
from tests.integration.helpers import Stack
from tests.otlp_receiver import OtlpReceiver

# Short delays so retry paths finish within a test; values a deployment would never use.
TEST_ENV = {
    "PALACE_BACKOFF_S": "[0.2, 0.5, 1.0]",
    "PALACE_MAX_DELIVER": "3",
    "PALACE_ACK_WAIT_S": "15",
    "PALACE_MAINTAIN_INTERVAL_S": "1",
    "PALACE_STUCK_AFTER_S": "3",
    "PALACE_EMBED_SPACE_CHECK_S": "1",
    "PALACE_SHUTDOWN_GRACE_S": "10",
    "PALACE_LOG_JSON": "true",
    "PALACE_DEVSTACK_DIR": ".devstack-test",
    # maintain's own dreaming runs once at start (nothing is due then); the tests run it themselves.
    "PALACE_DREAMING_EVERY_S": "86400",
    # Spans leave a service within half a second (the SDK default waits five).
    "OTEL_BSP_SCHEDULE_DELAY": "500",
}


# Health/metrics ports: each pytest-xdist worker draws from a range of its own, for its stack (below) and
# for the stacks its tests start (palace up, palace mcp's keeper, benches, fault suites: they follow
# PALACE_METRICS_PORT), so two workers starting one at the same moment never take the same block.
_PORTS = 20000 + 5000 * (int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0) % 2)
os.environ.setdefault("PALACE_METRICS_PORT", str(_PORTS + 2999))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def stack() -> Iterator[Stack]:
    saved = dict(os.environ)
    os.environ.update({k: v for k, v in TEST_ENV.items() if k not in os.environ or k == "PALACE_DEVSTACK_DIR"})
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker:  # one stack per pytest-xdist worker, each in its own directory
        os.environ["PALACE_DEVSTACK_DIR"] = f"{TEST_ENV['PALACE_DEVSTACK_DIR']}-{worker}"
    base = free_port_block(40, start=random.randrange(_PORTS, _PORTS + 2000))  # a free block, not just a random one
    os.environ["PALACE_API_PORT"] = str(_free_port())
    # Every service exports its spans to a receiver in this process, as it would to a collector.
    otlp = OtlpReceiver().start()
    os.environ["PALACE_OTLP_ENDPOINT"] = otlp.endpoint
    settings = Settings()
    if not (settings.database_url and settings.nats_url):
        # A fresh embedded stack per run: results never depend on what an earlier run left behind.
        DevStack(settings.devstack_dir).stop()
        shutil.rmtree(settings.devstack_dir, ignore_errors=True)
    log_dir = Path(settings.devstack_dir) / "logs"
    sup = Supervisor(settings, log_dir=log_dir, metrics_base_port=base)
    try:
        sup.start_servers()
        sup.start_services()
        sup.wait_healthy()
        yield Stack(settings, sup, sup.database_url, sup.nats_url, f"http://127.0.0.1:{settings.api_port}", otlp)
    finally:
        sup.stop()
        otlp.stop()
        os.environ.clear()
        os.environ.update(saved)
