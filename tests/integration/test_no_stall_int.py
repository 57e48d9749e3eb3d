"""A new user's first minutes: `palace up`, then a producer in another process publishing sessions with
plain nats-py, continuously, from the moment the stack is ready. Sessions are classified within a few
seconds, and none waits anywhere near ``ack_wait`` (60 s), which a fetched-then-dropped message used to
wait out; the oldest-un-acked gauge stays low throughout. Once the producer stops, the idle stack logs nothing.

``PALACE_STALL_TEST_S`` sets how long it publishes: thirty seconds by default (sixty sessions; with one in
ten stalling, as it used to, all sixty pass by chance about twice in a thousand runs), ten minutes in
`make test-long`."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import nats
import pytest

from tests.integration.helpers import stack_logs, wait_for
from tests.own_stack_env import own_stack_env

pytestmark = pytest.mark.integration

DURATION_S = float(os.environ.get("PALACE_STALL_TEST_S", "30"))
RATE_PER_S = 2.0
# A typical session is classified within a few seconds; none may wait anywhere near the old stall (ack_wait,
# 60 s). The bound on the slowest one leaves room for a loaded 2-core machine (another suite's embedder on
# every core) without letting a stall through.
TYPICAL_LATENCY_S = 5.0
MAX_LATENCY_S = 20.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _oldest_unacked(metrics_url: str) -> float:
    try:
        text = httpx.get(metrics_url, timeout=2).text
    except httpx.HTTPError:
        return 0.0
    ages = [float(v) for v in re.findall(r"^palace_consumer_oldest_unacked_age_seconds\{[^}]*\} (\S+)$", text, re.M)]
    return max(ages, default=0.0)


async def _produce_and_watch(nats_url: str, metrics_urls: list[str]) -> tuple[dict[str, float], dict[str, float],
                                                                              float]:
    """Publish a session every 1/RATE seconds for DURATION_S; note when each one's drawers are classified."""
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    workspace = f"stall-{uuid.uuid4().hex[:8]}"
    published: dict[str, float] = {}
    classified: dict[str, float] = {}

    async def on_classified(msg: nats.aio.msg.Msg) -> None:
        body = json.loads(msg.data)
        if body.get("workspace_id") == workspace:
            classified.setdefault(body["session_id"], time.monotonic())

    # Core NATS sees every message JetStream stores on the subject: a passive observer of the pipeline.
    await nc.subscribe("drawer.classified", cb=on_classified)
    worst_age = 0.0
    start = time.monotonic()
    i = 0
    while time.monotonic() - start < DURATION_S:
        sid = f"s{i:05d}"
        event = {"workspace_id": workspace, "session_id": sid, "agent_id": "producer", "messages": [
            {"role": "user", "content": f"Session {i}: we agreed to move the nightly report to {i % 24:02d}:00 UTC."},
            {"role": "assistant", "content": f"Noted: the nightly report runs at {i % 24:02d}:00 UTC from now on."},
        ]}
        published[sid] = time.monotonic()
        await js.publish("session.completed", json.dumps(event).encode())
        i += 1
        if i % 20 == 0:
            worst_age = max([worst_age] + [await asyncio.to_thread(_oldest_unacked, u) for u in metrics_urls])
        await asyncio.sleep(max(0.0, start + i / RATE_PER_S - time.monotonic()))
    deadline = time.monotonic() + 3 * MAX_LATENCY_S
    while time.monotonic() < deadline:
        if len(classified) >= len(published):
            break
        await asyncio.sleep(0.2)
    await nc.close()
    return published, classified, worst_age


def test_sessions_from_a_plain_client_never_stall(tmp_path: Path) -> None:
    devstack, port = tmp_path / "stack", _free_port()
    # The shipped settings (ack_wait 60 s among them: a lost message would show as a 60 s wait).
    env = own_stack_env(PALACE_DEVSTACK_DIR=str(devstack), PALACE_API_PORT=str(port))
    devstack.mkdir(parents=True)
    out = open(devstack / "up.out", "ab")  # noqa: SIM115 - owned by the child
    up = subprocess.Popen([sys.executable, "-m", "services.cli", "up", "--log-dir", str(devstack / "logs")],
                          env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        def ready() -> dict[str, dict[str, str]] | None:
            state_file = devstack / "stack.json"
            if not state_file.exists():
                return None
            services = json.loads(state_file.read_text()).get("services") or {}
            if len(services) < 7:
                return None
            for ep in services.values():
                try:
                    if httpx.get(ep["metrics"].replace("/metrics", "/healthz"), timeout=1).status_code != 200:
                        return None
                except httpx.HTTPError:
                    return None
            return services  # type: ignore[no-any-return]

        services = wait_for(ready, 180, "palace up ready", lambda: stack_logs(devstack))
        nats_url = json.loads((devstack / "stack.json").read_text())["nats_url"]
        metrics_urls = [ep["metrics"] for name, ep in services.items() if name in ("ingest", "embed", "classify")]
        published, classified, worst_age = asyncio.run(_produce_and_watch(nats_url, metrics_urls))
        # Idle now: nothing may be logged on a timer (a line every few seconds buries the real ones). The last
        # sessions' later stages (cluster, the graph's consumers, maintain's jobs on what they wrote) may still
        # be finishing when the last drawer.classified is seen: the watch starts once the logs have been quiet
        # for 3 s (or after a minute: a timer more frequent than that shows in the watch all the same).
        logs = sorted((devstack / "logs").glob("*.log"))
        sizes = {p.name: p.stat().st_size for p in logs}
        quiet_by = time.monotonic() + 60
        while time.monotonic() < quiet_by:
            time.sleep(3)
            now = {p.name: p.stat().st_size for p in logs}
            if now == sizes:
                break
            sizes = now
        time.sleep(15)
        chatty = {p.name: p.read_bytes()[sizes[p.name]:].decode(errors="replace")[:300] for p in logs
                  if p.stat().st_size != sizes[p.name]}
    finally:
        up.send_signal(signal.SIGINT)
        up.wait(90)
    missing = sorted(set(published) - set(classified))
    latencies = sorted(classified[s] - published[s] for s in classified if s in published)
    summary = (f"{len(published)} sessions over {DURATION_S:.0f}s: p50 {statistics.median(latencies):.2f}s, "
               f"max {latencies[-1]:.2f}s, oldest un-acked seen {worst_age:.1f}s")
    print(summary)
    assert not missing, f"{len(missing)} sessions never classified ({missing[:5]}); {summary}"
    assert statistics.median(latencies) < TYPICAL_LATENCY_S, summary
    assert latencies[-1] < MAX_LATENCY_S, summary
    assert worst_age < MAX_LATENCY_S, summary
    assert not chatty, f"services logged while idle: {chatty}"
