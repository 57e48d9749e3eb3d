"""External faults and backpressure on a real stack of its own (issue #5, points 4 and 5).

The embedding endpoint is the one thing stood in for (``tests/openai_stub.py``): down, returning
garbage, slow. Everything else is real: embedded PostgreSQL and NATS under ``.devstack-test-ext``
and the services as processes. It is a second stack because its embed service talks to the stub:
sharing the session stack's durable consumers, two embed services would take each other's work.

Settings are small on purpose: ``max_ack_pending`` 8 (the backpressure bound to check),
``ack_wait`` 3 s (shorter than one slow batch, so in-progress heartbeats must keep it from being
redelivered), ``stuck_after`` 4 s (maintain would re-drive queued drawers if it ignored the backlog).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import shutil
import signal
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import nats
import pytest

from palace_dev.devstack import DevStack
from palace_dev.supervisor import ALL_SERVICES, Supervisor, free_port_block
from shared.config import Settings
from shared.dlq import list_dead_letters, redrive
from tests.integration.conftest import TEST_ENV
from tests.integration.helpers import Stack, session, wait_for, ws
from tests.openai_stub import StubState, serve_stub

pytestmark = pytest.mark.integration

MAX_ACK_PENDING = 8
EXT_DIR = ".devstack-test-ext"
SERVICES = ["ingest", "embed", "classify", "maintain"]


@dataclass
class Ext:
    """The second stack, its stub embedder and the environment its services run with."""

    stack: Stack
    stub: StubState
    env: dict[str, str]


@contextlib.contextmanager
def _environ(overrides: dict[str, str]) -> Iterator[None]:
    saved = dict(os.environ)
    os.environ.update(overrides)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@pytest.fixture(scope="module")
def ext() -> Iterator[Ext]:
    if os.environ.get("PALACE_DATABASE_URL") or os.environ.get("PALACE_NATS_URL"):
        pytest.skip("needs an embedded stack of its own (external servers would be shared with the main stack)")
    stub = StubState()
    with serve_stub(stub) as url:
        env = {
            **TEST_ENV,
            "PALACE_DEVSTACK_DIR": EXT_DIR,
            "PALACE_EMBED_BASE_URL": url,
            "PALACE_EMBED_MODEL": "stub-hash",
            "PALACE_EMBED_TIMEOUT_S": "10",
            "PALACE_EMBED_BATCH": "2",
            "PALACE_MAX_ACK_PENDING": str(MAX_ACK_PENDING),
            "PALACE_ACK_WAIT_S": "3",
            "PALACE_STUCK_AFTER_S": "4",
        }
        with _environ(env):
            settings = Settings()
        DevStack(settings.devstack_dir).stop()
        shutil.rmtree(settings.devstack_dir, ignore_errors=True)
        sup = Supervisor(settings, services=list(SERVICES), log_dir=Path(EXT_DIR) / "logs",
                         metrics_base_port=free_port_block(40, start=Settings().metrics_port + 1), env=env)
        try:
            sup.start_servers()
            sup.start_services()
            sup.wait_healthy()
            yield Ext(Stack(settings, sup, sup.database_url, sup.nats_url, ""), stub, env)
        finally:
            sup.stop()


# ---------------------------------------------------------------------------------------- helpers
@dataclass
class ConsumerWatch:
    """Samples JetStream consumer info in a thread: the most un-acked and the most waiting seen."""

    nats_url: str
    stream: str
    durable: str
    period_s: float = 0.1
    max_ack_pending: int = 0
    max_pending: int = 0
    max_redelivered: int = 0  # un-acked messages JetStream has handed out again
    samples: int = 0
    last: Any = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> ConsumerWatch:
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)
        self._thread.start()
        wait_for(lambda: self.samples > 0, 30, f"first consumer info of {self.durable}")
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)

    async def _run(self) -> None:
        nc = await nats.connect(self.nats_url)
        try:
            js = nc.jetstream()
            while not self._stop.is_set():
                with contextlib.suppress(Exception):
                    info = await js.consumer_info(self.stream, self.durable)
                    self.max_ack_pending = max(self.max_ack_pending, info.num_ack_pending or 0)
                    self.max_pending = max(self.max_pending, info.num_pending or 0)
                    self.max_redelivered = max(self.max_redelivered, info.num_redelivered or 0)
                    self.last = info
                    self.samples += 1
                await asyncio.sleep(self.period_s)
        finally:
            await nc.close()


def _dead(stack: Stack, workspace: str) -> list[Any]:
    items = asyncio.run(list_dead_letters(stack.settings, stack.nats_url, limit=100_000))
    return [i for i in items if i.info.workspace_id == workspace]


def _states(stack: Stack, workspace: str) -> dict[str, int]:
    return dict(stack.sql("SELECT state, count(*) FROM drawers WHERE workspace_id = %s GROUP BY state", (workspace,)))


def _texts(tag: str, n: int) -> list[str]:
    """Distinct, wordy turns (exact repeats would be one drawer; the stub hashes words)."""
    return [f"{tag} note {i}: the shipment for depot {i} was rescheduled to week {i % 50} by the planner."
            for i in range(n)]


# ------------------------------------------------------------------------------------------ tests
def test_embedder_down_keeps_raw_data_and_retries_with_backoff_then_recovers(ext: Ext) -> None:
    st, stub = ext.stack, ext.stub
    w = ws()
    stub.mode = "fail"
    calls0 = stub.calls
    texts = _texts(w, 12)
    with ConsumerWatch(st.nats_url, st.settings.stream_name, "embed") as watch:
        for i in range(6):
            st.publish(session(w, f"s{i}", texts[2 * i: 2 * i + 2]))
        # Raw data is stored first, whatever the embedder does.
        wait_for(lambda: st.sql("SELECT count(*) FROM drawers WHERE workspace_id = %s", (w,))[0][0] == 12,
                 60, "12 raw drawers")
        # Retried: the embedder's own attempts, then a NAK and a redelivery that tries again.
        wait_for(lambda: stub.calls - calls0 >= 6, 90, "the embed service to retry the endpoint")
        states = _states(st, w)
        assert states == {"raw": 12}, states
        assert st.sql("SELECT count(*) FROM messages WHERE workspace_id = %s", (w,))[0][0] == 12, \
            "raw messages kept while embedding fails"
        reasons = st.sql("SELECT DISTINCT failure_reason FROM drawers WHERE workspace_id = %s", (w,))
        assert any(r[0] and "embedding failed" in r[0] and "500" in r[0] for r in reasons), reasons
        stub.mode = "ok"
        st.wait_processed(w, 12, timeout=120)
    # Backoff, not a hot loop: consecutive calls to the failing endpoint are spaced out.
    gaps = [b - a for a, b in itertools.pairwise(stub.call_times[calls0:calls0 + 6])]
    assert min(gaps) >= 0.15, gaps
    assert watch.max_ack_pending <= MAX_ACK_PENDING, watch.max_ack_pending
    row = st.sql("SELECT count(*) FILTER (WHERE embedding IS NULL), count(*) FILTER (WHERE failure_reason IS NOT NULL)"
                 " FROM drawers WHERE workspace_id = %s", (w,))[0]
    assert row == (0, 0), "every drawer embedded once the endpoint is back, its recorded failure cleared"
    # A dead letter may still appear on a badly overloaded machine (ack_wait is 3 s here), but no
    # drawer is left behind: every one ends processed.
    assert _states(st, w) == {"processed": 12}


def test_garbage_answers_are_retried_dead_lettered_failed_with_reason_and_redrivable(ext: Ext) -> None:
    st, stub = ext.stack, ext.stub
    w = ws()
    stub.mode = "garbage_nan"
    st.publish(session(w, "s", ["The release train for the mobile app now leaves every second Tuesday."]))
    dead = wait_for(lambda: [d for d in _dead(st, w) if d.info.subject == "drawer.created"], 120,
                    "drawer.created dead-lettered by embed")
    info = dead[0].info
    assert info.service == "embed" and info.error_type == "EmbeddingError", info
    assert "NaN" in info.reason and info.deliveries == st.settings.max_deliver, info
    # The drawer is not lost: still raw, with the reason recorded for whoever looks.
    row = st.sql("SELECT state, failure_reason FROM drawers WHERE workspace_id = %s", (w,))
    assert len(row) == 1 and row[0][0] == "raw" and "NaN" in row[0][1], row
    # maintain gives up on a drawer after its re-drives: mark it as re-driven that often and it is
    # failed, with the last error in its reason (never deleted).
    st.sql("UPDATE drawers SET retry_count = 3 WHERE workspace_id = %s RETURNING id", (w,))
    wait_for(lambda: _states(st, w) == {"failed": 1}, 90, "maintain to mark the drawer failed")
    reason = st.sql("SELECT failure_reason FROM drawers WHERE workspace_id = %s", (w,))[0][0]
    assert reason.startswith("still raw after 3 re-drives; last error: embedding failed: EmbeddingError") \
        and "NaN" in reason, reason
    # After the endpoint is fixed, re-driving the dead letters finishes the drawer.
    stub.mode = "ok"
    assert asyncio.run(redrive(st.settings, st.nats_url, [d.seq for d in _dead(st, w)])) >= 1
    wait_for(lambda: _states(st, w) == {"processed": 1}, 60, "the re-driven drawer processed")
    assert st.sql("SELECT failure_reason, embedding IS NOT NULL FROM drawers WHERE workspace_id = %s",
                  (w,))[0] == (None, True)


def test_slow_embedder_backlog_stays_in_jetstream_bounded_and_nothing_dropped(ext: Ext) -> None:
    st, stub = ext.stack, ext.stub
    w = ws()
    stub.mode, stub.delay_s = "ok", 0.4
    n, m = 12, 6  # more sessions than max_ack_pending; each one 3 requests (1.2 s) to embed
    texts = _texts(w, m * n)
    # A second embed replica on the same durable: an idle replica is where JetStream would hand
    # a message whose ack_wait ran out while the first one was still embedding it.
    replica = Supervisor(st.settings, services=["embed"], log_dir=Path(EXT_DIR) / "logs-replica",
                         metrics_base_port=free_port_block(40, start=Settings().metrics_port + 1), env=ext.env,
                         database_url=st.database_url, nats_url=st.nats_url)
    inputs0 = len(stub.inputs)
    try:
        replica.start_services()
        replica.wait_healthy()
        with ConsumerWatch(st.nats_url, st.settings.stream_name, "embed") as watch:
            for i in range(n):
                st.publish(session(w, f"s{i}", texts[m * i: m * i + m]))
            st.wait_processed(w, m * n, timeout=180)
    finally:
        stub.delay_s = 0.0
        replica.stop_services()
    # The backlog waited in JetStream, not in the service: un-acked work never exceeded the bound.
    assert watch.max_pending > 0, "the publisher outran the embedder, so drawer.created queued up"
    assert 0 < watch.max_ack_pending <= MAX_ACK_PENDING, watch.max_ack_pending
    assert stub.max_in_flight <= MAX_ACK_PENDING
    # Every drawer embedded, across both replicas. (Redeliveries are not bounded here: in-progress
    # heartbeats keep a batch slower than ack_wait from being handed to the idle replica — 4
    # redelivered without them, 1 with them on a quiet machine — but on an overloaded one a message
    # buffered in the client past its fetch can still time out; that costs work, never data.)
    ours = [t for t in stub.inputs[inputs0:] if w in t]
    assert len(set(ours)) == m * n, (len(set(ours)), m * n, watch.max_redelivered)
    # Nothing dropped, nothing failed, and maintain did not pile re-drives onto the backlog.
    assert st.sql("SELECT count(*), max(retry_count), count(*) FILTER (WHERE state <> 'processed')"
                  " FROM drawers WHERE workspace_id = %s", (w,))[0] == (m * n, 0, 0)
    assert st.sql("SELECT count(*) FROM sessions WHERE workspace_id = %s", (w,))[0][0] == n
    assert not _dead(st, w)


class _Proxy:
    """A TCP port on 127.0.0.1 that PostgreSQL is reached through: closed (connection refused)
    until ``open()``, then forwarding every connection to the server's unix socket."""

    def __init__(self, target_socket: Path) -> None:
        # Bound now and kept (a bound socket that does not listen refuses connections): a port released
        # until open() could be taken meanwhile, as the source port of one of the stack's connections.
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self.port = int(self._sock.getsockname()[1])
        self.target = str(target_socket)
        self.accepted = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._server: asyncio.AbstractServer | None = None

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(Exception):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        with contextlib.suppress(Exception):
            writer.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        try:
            up_r, up_w = await asyncio.open_unix_connection(self.target)
        except OSError:
            writer.close()
            return
        await asyncio.gather(self._pipe(reader, up_w), self._pipe(up_r, writer))

    def open(self) -> None:
        async def start() -> None:
            self._server = await asyncio.start_server(self._handle, sock=self._sock)

        asyncio.run_coroutine_threadsafe(start(), self._loop).result(10)

    def close(self) -> None:
        async def stop() -> None:
            if self._server is not None:
                self._server.close()

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._sock.close()  # never opened: still held here


def _readyz(port: int) -> int | None:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=10).status_code
    except httpx.HTTPError:
        return None


def test_database_unreachable_at_start_up_service_waits_then_works(ext: Ext) -> None:
    st = ext.stack
    sockets = sorted((Path(EXT_DIR) / "pg").glob(".s.PGSQL.*"))
    sockets = [s for s in sockets if not s.name.endswith(".lock")]
    assert sockets, "the embedded PostgreSQL listens on a unix socket"
    proxy = _Proxy(sockets[0].resolve())
    # enrich is not part of this stack, so the work below can only be done by the one started here.
    base = free_port_block(40, start=Settings().metrics_port + 1)
    port = base + ALL_SERVICES.index("enrich")
    sup = Supervisor(st.settings, services=["enrich"], log_dir=Path(EXT_DIR) / "logs", metrics_base_port=base,
                     env=ext.env, database_url=f"postgresql://postgres@127.0.0.1:{proxy.port}/palace",
                     nats_url=st.nats_url)
    try:
        sup.start_services()
        wait_for(lambda: _readyz(port) is not None, 60, "enrich's health endpoint")
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:  # the database refuses connections all this time
            assert not sup.poll(), "no restart"
            assert sup.children["enrich"].proc.poll() is None, "the service waits instead of exiting"
            assert _readyz(port) == 503, "not ready without its database"
            time.sleep(0.5)
        assert proxy.accepted == 0
        proxy.open()
        wait_for(lambda: _readyz(port) == 200, 60, "enrich ready once the database is reachable")
        assert proxy.accepted > 0 and sup.children["enrich"].restarts == 0
        w = ws()
        st.publish(session(w, "s", ["We moved the weekly sync with the data team to Thursday mornings."]))
        wait_for(lambda: st.sql("SELECT count(*) FROM episodes WHERE workspace_id = %s AND status = 'ready'",
                                (w,))[0][0] == 1, 60,
                 "an episode written by the enrich started without its database")
        assert sup.children["enrich"].restarts == 0 and sup.children["enrich"].proc.poll() is None
    finally:
        sup.stop_services()
        proxy.close()


def test_one_bad_text_in_an_embed_batch_fails_only_its_own_event(ext: Ext) -> None:
    """The batch's one model call fails because of one event's text: every other event of the batch is
    embedded and processed at once, and only that event is retried and dead-lettered, its drawer kept raw."""
    st, stub = ext.stack, ext.stub
    w = ws()
    stub.mode, stub.reject_marker = "ok", "REJECT-ME"
    try:
        # Embed stopped while the sessions are filed, so that its first fetch takes them as one batch.
        st.supervisor.kill("embed", signal.SIGTERM)
        st.supervisor.children["embed"].proc.wait(60)
        good = _texts("batchmate", 4)
        for i, text in enumerate(good[:2]):
            st.publish(session(w, f"g{i}", [text]))
        st.publish(session(w, "bad", ["REJECT-ME: this turn's text makes the embedding endpoint answer garbage."]))
        for i, text in enumerate(good[2:]):
            st.publish(session(w, f"h{i}", [text]))
        wait_for(lambda: sum(_states(st, w).values()) == 5, 60, "five drawers filed")
        calls0 = stub.calls
        st.supervisor.spawn("embed")
        st.supervisor.wait_healthy()
        wait_for(lambda: _states(st, w).get("processed") == 4, 90, "the four good drawers processed")
        assert stub.calls - calls0 >= 2  # the whole batch's call, then the events one by one
        # Kept, with the reason (raw, or failed once maintain has re-driven it often enough).
        bad = st.sql("SELECT state, failure_reason FROM drawers WHERE workspace_id = %s AND content LIKE %s",
                     (w, "REJECT-ME%"))
        assert len(bad) == 1 and bad[0][0] in ("raw", "failed") and "NaN" in bad[0][1], bad
        dead = wait_for(lambda: [d for d in _dead(st, w) if d.info.subject == "drawer.created"], 120,
                        "the bad event dead-lettered")
        assert all(d.info.error_type == "EmbeddingError" for d in dead), dead
        assert _states(st, w)["processed"] == 4
    finally:
        stub.reject_marker = None
