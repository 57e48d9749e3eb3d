"""Process runtime shared by every service: logging, database pool, broker, pull consumers, health and
metrics endpoints, consumer lag and oldest-un-acked gauges, and a graceful stop on SIGTERM/SIGINT (stop
fetching, let in-flight handlers commit and ack, hand back what was not started, then close).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import structlog
import uvicorn
from faststream.nats import NatsBroker
from nats.aio.msg import Msg
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from psycopg_pool import AsyncConnectionPool
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from shared import metrics
from shared.bus import Poison, build_broker, dead_letter, decode_event, ensure_streams, stream_usage
from shared.config import Settings
from shared.consumers import Consumer, PullConsumer, consumer_for, consumers_of, oldest_unacked_age_s
from shared.db.lifecycle import renew_lease
from shared.db.maintenance import take_lease
from shared.db.migrate import apply_migrations
from shared.db.pool import open_pool, ping, wait_for_database
from shared.db.tenancy import maintenance_tx
from shared.endpoints import resolve_urls
from shared.events import Event
from shared.logging import configure_logging, get_logger
from shared.ports import Embedder
from shared.tracing import setup_tracing

__all__ = ["Deps", "QuietServer", "WorkerSpec", "ack_once", "decode_batch", "holder_name", "leased_rounds",
           "run_worker", "serve_worker"]

E = TypeVar("E", bound=Event)


@dataclass
class Deps:
    """What handlers need, built once per process (never per message)."""

    settings: Settings
    service: str
    pool: AsyncConnectionPool
    broker: NatsBroker
    embedder: Embedder | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    handlers: dict[str, Callable[..., Awaitable[None]]] = field(default_factory=dict)
    # A durable's window set by its service for this process (how many of its batches run at once), where
    # the configuration decides it: enrich-kg's batches run side by side only while each waits on a model.
    windows: dict[str, int] = field(default_factory=dict)

    def handle(self, event: type[Event]) -> Callable[[Callable[..., Awaitable[None]]], Callable[..., Awaitable[None]]]:
        """Register this service's handler of ``event``: ``shared.consumers.CONSUMERS`` alone says through
        which durable consumer it arrives (KeyError at start-up when it declares none)."""
        if not (isinstance(event, type) and issubclass(event, Event)):
            raise TypeError(f"handle() takes the event class a handler consumes, not {event!r}: "
                            "shared.consumers.CONSUMERS alone names the durable")
        durable = consumer_for(self.service, event.subject).durable

        def register(fn: Callable[..., Awaitable[None]]) -> Callable[..., Awaitable[None]]:
            self.handlers[durable] = fn
            return fn

        return register


async def decode_batch(deps: Deps, model: type[E], bodies: list[bytes], raws: list[Msg], *,
                       dead_letters: bool = True) -> list[tuple[E, Msg]]:
    """A batch handler's events, decoded. A malformed one must not hold back (or silently ride along with)
    the good ones: it is dead-lettered with its reason and acked here, or only acked where another
    consumer of the subject is the one that dead-letters it (``dead_letters=False``).

    A message a former run of this batch already settled is left out: the loop runs a batch again in place
    while a dependency is down (``PullConsumer._call_holding``), and an item acked then (done, or
    dead-lettered) is neither redone nor acked a second time, which nats-py refuses with an error that
    would fail the whole retry."""
    events: list[tuple[E, Msg]] = []
    for raw, body in zip(raws, bodies, strict=True):
        if raw._ackd:
            continue
        try:
            events.append((decode_event(model, body, deps.settings), raw))
        except Poison as e:
            if dead_letters:
                await dead_letter(deps.broker, deps.settings, service=deps.service, raw=raw, reason=str(e),
                                  error_type="invalid")
            await raw.ack()
    return events


async def ack_once(raw: Msg) -> None:
    """Ack a message of a batch that is done, unless a retry of the batch already did."""
    if not raw._ackd:
        await raw.ack()


@dataclass
class WorkerSpec:
    """A service: its name, how it registers handlers, and what else it runs. Its consumers are those
    ``shared.consumers.CONSUMERS`` assigns to it."""

    name: str
    register: Callable[[Deps], None]
    needs_embedder: bool = False
    background: list[Callable[[Deps, asyncio.Event], Awaitable[None]]] = field(default_factory=list)

    @property
    def consumers(self) -> list[Consumer]:
        return consumers_of(self.name)


class QuietServer(uvicorn.Server):
    """uvicorn without its own signal handling: the service decides when to stop."""

    @contextlib.contextmanager
    def capture_signals(self):  # type: ignore[no-untyped-def,override]
        yield


async def metrics_endpoint(_: Request) -> Response:
    """Prometheus exposition at ``/metrics`` itself (a mounted app answers it with a 307 redirect)."""
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)


def _health_app(deps_ref: dict[str, Deps]) -> Starlette:
    async def livez(_: Request) -> JSONResponse:
        # The process and its event loop answer: nothing else. A database or NATS outage must not make
        # an orchestrator restart every pod (handlers already hold their messages until it ends).
        deps = deps_ref.get("deps")
        return JSONResponse({"service": deps.service if deps else None, "alive": True})

    async def readyz(_: Request) -> JSONResponse:
        deps = deps_ref.get("deps")
        ok = deps is not None and deps.broker._connection is not None and deps.broker._connection.is_connected
        db_ok = False
        if deps is not None:
            with contextlib.suppress(Exception):
                async with deps.pool.connection(timeout=2) as conn:
                    await ping(conn)
                    db_ok = True
        body = {"service": deps.service if deps else None, "nats": ok, "database": db_ok}
        return JSONResponse(body, status_code=200 if ok and db_ok else 503)

    return Starlette(routes=[
        Route("/livez", livez), Route("/readyz", readyz), Route("/healthz", readyz),
        Route("/metrics", metrics_endpoint), Route("/metrics/", metrics_endpoint),
    ])


def _check_port_free(host: str, port: int) -> None:
    """Fail the start when the health/metrics port is taken: serving on without it would leave the
    service unprobed, or another process answering its probes."""
    import socket

    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as e:
            raise RuntimeError(f"health/metrics port {host}:{port} is in use ({e}); set PALACE_METRICS_PORT") from e


async def _lag_loop(deps: Deps, consumers: list[Consumer], stop: asyncio.Event) -> None:
    js = deps.broker.config.connection_state.stream
    stream = deps.settings.stream_name
    while not stop.is_set():
        for c in consumers:
            with contextlib.suppress(Exception):
                info = await js.consumer_info(stream, c.durable)
                metrics.CONSUMER_PENDING.labels(deps.service, c.durable).set(info.num_pending or 0)
                metrics.CONSUMER_ACK_PENDING.labels(deps.service, c.durable).set(info.num_ack_pending or 0)
                age = await oldest_unacked_age_s(js, stream, c.durable)
                metrics.CONSUMER_OLDEST_UNACKED_AGE.labels(deps.service, c.durable).set(age)
        await stream_usage(deps.broker, deps.settings)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 5.0)


async def serve_worker(spec: WorkerSpec, settings: Settings, stop: asyncio.Event) -> None:
    """Run one service until ``stop`` is set, then drain and close."""
    log = get_logger(f"palace.{spec.name}")
    # Every line this service logs names it; every task started below inherits the binding.
    structlog.contextvars.bind_contextvars(service=spec.name)
    setup_tracing(settings, spec.name)
    db_url, nats_url = resolve_urls(settings)
    deps_ref: dict[str, Deps] = {}
    _check_port_free(settings.metrics_host, settings.metrics_port)
    http = QuietServer(uvicorn.Config(_health_app(deps_ref), host=settings.metrics_host, port=settings.metrics_port,
                                      log_level="warning", lifespan="off"))
    http_task = asyncio.create_task(http.serve())
    await wait_for_database(db_url)
    await asyncio.to_thread(apply_migrations, db_url, settings.embed_dim)
    pool = await open_pool(db_url, name=spec.name, min_size=settings.db_pool_min, max_size=settings.db_pool_max,
                           role=settings.db_role)
    embedder = None
    if spec.needs_embedder:
        from shared.adapters.space_embedder import SpaceEmbedder

        # The database's active embedding space, followed while the service runs (palace reembed).
        embedder = await SpaceEmbedder.open(settings, pool)
    broker = build_broker(settings, spec.name, nats_url)
    deps = Deps(settings=settings, service=spec.name, pool=pool, broker=broker, embedder=embedder)
    spec.register(deps)
    missing = {c.durable for c in spec.consumers} ^ set(deps.handlers)
    if missing:
        raise RuntimeError(f"{spec.name}: consumers without a handler, or handlers without a consumer: {missing}")
    await broker.connect()
    await ensure_streams(broker, settings)
    await broker.start()
    js = broker.config.connection_state.stream
    pullers = [PullConsumer(js=js, broker=broker, settings=settings, c=c, handler=deps.handlers[c.durable],
                            dead_letter=dead_letter, window=deps.windows.get(c.durable)) for c in spec.consumers]
    # Consumers get their own stop: they drain (finish, ack, hand back) before the rest shuts down.
    stop_consuming = asyncio.Event()
    consuming = [asyncio.create_task(p.run(stop_consuming), name=f"consume-{p.c.durable}") for p in pullers]
    deps_ref["deps"] = deps
    bg = [asyncio.create_task(_lag_loop(deps, spec.consumers, stop))]
    bg += [asyncio.create_task(fn(deps, stop)) for fn in spec.background]
    log.info("service_started", service=spec.name, consumers=[c.durable for c in spec.consumers],
             metrics=f"http://{settings.metrics_host}:{settings.metrics_port}/metrics")
    await stop.wait()
    log.info("service_stopping", service=spec.name)
    # Stop fetching and wait for in-flight handlers (they commit, then ack) up to the grace period.
    stop_consuming.set()
    await asyncio.gather(*consuming, return_exceptions=True)
    await broker.stop()
    for t in bg:
        t.cancel()
    await asyncio.gather(*bg, return_exceptions=True)
    await pool.close()
    if embedder is not None:
        await embedder.aclose()
    http.should_exit = True
    await http_task
    log.info("service_stopped", service=spec.name)


def run_worker(spec: WorkerSpec, settings: Settings | None = None) -> None:
    """Entry point of ``python -m services.<name>``."""
    settings = settings or Settings()
    configure_logging(settings.log_level, settings.log_json)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await serve_worker(spec, settings, stop)

    if settings.event_loop == "uvloop":
        import uvloop

        uvloop.run(main())
    else:
        asyncio.run(main())


def holder_name() -> str:
    """Who holds a lease: host and process, so an operator can tell replicas apart in ``job_leases``."""
    return f"{socket.gethostname()}:{os.getpid()}"


async def leased_rounds(deps: Deps, stop: asyncio.Event, lease: str, body: Callable[[], Awaitable[object]], *,
                        failed_event: str) -> None:
    """Run ``body`` once every ``maintain_interval_s`` on the one replica that wins ``lease`` for the round,
    until ``stop``. The lease is renewed while ``body`` runs, so a round that outlasts it (a slow LLM) is
    not run a second time by another replica meanwhile. A failed round is logged as ``failed_event`` and
    tried again next round: a sweep never kills its service."""
    every = deps.settings.maintain_interval_s
    holder = holder_name()
    log = get_logger(f"palace.{deps.service}")

    async def keep() -> None:
        """Renew until cancelled; return only once the lease is lost (a renewal that fails is tried again:
        the lease outlives two of them)."""
        while True:
            await asyncio.sleep(every / 3)
            try:
                async with maintenance_tx(deps.pool) as conn:
                    if not await renew_lease(conn, lease, holder, every):
                        log.warning("lease_lost", lease=lease, holder=holder)
                        return
            except Exception as e:
                log.warning("lease_renewal_failed", lease=lease, error=repr(e)[:300])

    while not stop.is_set():
        try:
            async with maintenance_tx(deps.pool) as conn:
                won = await take_lease(conn, lease, holder, ttl_s=every, every_s=every / 2)
            if won:
                keeper = asyncio.create_task(keep(), name=f"lease-{lease}")
                work = asyncio.create_task(body(), name=f"round-{lease}")
                try:
                    # Lost (renewals failed until it expired and another replica took it): that replica runs
                    # the round now, so this one stops rather than run it twice at once.
                    await asyncio.wait({keeper, work}, return_when=asyncio.FIRST_COMPLETED)
                    if not work.done():
                        log.warning(failed_event, error="lease lost: round stopped")
                    else:
                        work.result()
                finally:
                    for task in (work, keeper):
                        task.cancel()
                    await asyncio.gather(work, keeper, return_exceptions=True)
        except Exception as e:
            log.warning(failed_event, error=repr(e)[:300])
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), every)
