"""The HTTP API (FastAPI; OpenAPI at /docs and /openapi.json).

``create_app`` builds the application: connections in the lifespan, the JSON error handlers, the
middleware (request metrics, rate limit, body limit) and the routers. A new group of endpoints is an
``APIRouter`` in its own module, using the dependencies of ``services.api.deps`` (``CallerDep`` for
the caller's workspace), added to ``ROUTERS``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import uvicorn
from fastapi import APIRouter, FastAPI
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from psycopg_pool import AsyncConnectionPool

from services._runtime import QuietServer
from services.api import ops, routes_drawers, routes_forget, routes_kg, routes_memory, routes_palace, routes_quality, v1
from services.api.errors import install_error_handlers
from services.api.middleware import BodyLimit, LoopbackHostOnly, RateLimit, RequestMetrics
from services.api.tracing import TraceMiddleware
from services.mcp.server import McpHttpEndpoint
from shared.bus import build_broker, ensure_streams
from shared.config import Settings
from shared.db.apikeys import store_api_key
from shared.db.migrate import apply_migrations
from shared.db.pool import open_pool, wait_for_database
from shared.endpoints import resolve_urls
from shared.logging import configure_logging, get_logger
from shared.palace_graph import PalaceGraph
from shared.palace_ops import PalaceOps
from shared.recall import Recaller
from shared.security import is_loopback_host, key_id_of, parse_bootstrap_keys, unsafe_bind_reason

__all__ = ["ROUTERS", "create_app", "main"]

log = get_logger("palace.api")

ROUTERS: list[APIRouter] = [ops.router, v1.router, routes_memory.router, routes_quality.router, routes_forget.router,
                              routes_drawers.router, routes_kg.router, routes_palace.router]


async def bootstrap_keys(settings: Settings, pool: AsyncConnectionPool) -> None:
    """Store the keys of PALACE_API_BOOTSTRAP_KEYS (hashed; repeat starts change nothing)."""
    if settings.api_bootstrap_keys is None:
        return
    for workspace, key in parse_bootstrap_keys(settings.api_bootstrap_keys.get_secret_value()):
        outcome = await store_api_key(pool, workspace, key, name="bootstrap")
        if outcome == "revoked":
            log.warning("api_bootstrap_key_revoked", workspace_id=workspace, key_id=key_id_of(key))
        else:
            log.info("api_bootstrap_key", workspace_id=workspace, key_id=key_id_of(key), outcome=outcome)


Closers = list[tuple[str, Callable[[], Awaitable[object]]]]


async def _connect(app: FastAPI, settings: Settings, closers: Closers) -> None:
    """Open everything requests need, publishing each on ``app.state`` as it comes up; ``closers``
    collects what to close at shutdown, so a start interrupted half-way still closes what it opened."""
    from shared.adapters.space_embedder import SpaceEmbedder

    db_url, nats_url = resolve_urls(settings)
    await wait_for_database(db_url)
    await asyncio.to_thread(apply_migrations, db_url, settings.embed_dim)
    pool = await open_pool(db_url, name="api", min_size=settings.db_pool_min, max_size=settings.db_pool_max,
                           role=settings.db_role)
    closers.append(("database", pool.close))
    await bootstrap_keys(settings, pool)
    app.state.pool = pool
    broker = build_broker(settings, "api", nats_url)
    closers.append(("nats", broker.stop))
    await broker.connect()
    await ensure_streams(broker, settings)
    app.state.broker = broker
    embedder = await SpaceEmbedder.open(settings, pool)  # follows the active space (palace reembed)
    closers.append(("embedder", embedder.aclose))
    recaller = Recaller.from_settings(pool, embedder, settings)
    closers.append(("recaller", recaller.drain))
    app.state.recaller = recaller
    # MCP over streamable HTTP (services/mcp): its session manager runs as long as the api does.
    palace_ops = PalaceOps(settings=settings, pool=pool, recaller=recaller, broker=broker, graph=PalaceGraph(pool))
    mcp = app.state.mcp_endpoint.attach(palace_ops)
    app.state.ops = dataclasses.replace(palace_ops, actor="api")  # REST writes are audited as the api's
    closers.append(("mcp", await _serve_mcp(mcp.session_manager)))
    log.info("api_ready", host=settings.api_host, port=settings.api_port)


async def _serve_mcp(manager: StreamableHTTPSessionManager) -> Callable[[], Awaitable[object]]:
    """Run the MCP session manager in a task of its own; returns what stops it.

    Its ``run()`` is an anyio task group, which must be left by the task that entered it: entered in
    the background start-up task and left by the lifespan at shutdown, it raised instead of closing the
    open sessions."""
    started, stop = asyncio.Event(), asyncio.Event()

    async def serve() -> None:
        async with manager.run():
            started.set()
            await stop.wait()

    task = asyncio.create_task(serve(), name="mcp-sessions")
    waiter = asyncio.create_task(started.wait())
    await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
    if not started.is_set():
        waiter.cancel()
        await task  # it ended before it started: raise its error here, where start-up reports it

    async def close() -> None:
        stop.set()
        await task

    return close


def create_app(settings: Settings, *,
               on_start_failure: Callable[[BaseException], None] | None = None) -> FastAPI:
    """Build the API; servers are connected in the lifespan, once.

    Without ``on_start_failure`` the lifespan waits for every connection before serving (tests, embedding
    in another app). With it (``main``), the api serves at once and connects in the background: ``/livez``
    answers while the database or NATS is still unreachable and ``/readyz`` says which one, so an
    orchestrator waits for readiness instead of restarting a process that is merely waiting. A start that
    fails for good (the database never came, a key clash) calls ``on_start_failure``.
    """

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if settings.api_bootstrap_keys is not None:
            parse_bootstrap_keys(settings.api_bootstrap_keys.get_secret_value())  # malformed: fail before connecting
        closers: Closers = []
        task: asyncio.Task[None] | None = None
        if on_start_failure is None:
            await _connect(app, settings, closers)
        else:
            report = on_start_failure

            def done(t: asyncio.Task[None]) -> None:
                if not t.cancelled() and t.exception() is not None:
                    exc = t.exception()
                    assert exc is not None
                    log.error("api_start_failed", error=f"{type(exc).__name__}: {exc}", exc_info=exc)
                    report(exc)

            task = asyncio.create_task(_connect(app, settings, closers))
            task.add_done_callback(done)
        yield
        if task is not None and not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        # Each step on its own, last opened first: a dependency already gone (NATS down at shutdown) must
        # not keep the rest open.
        for step, close in reversed(closers):
            try:
                await close()
            except Exception as e:
                log.warning("api_shutdown_step_failed", step=step, error=f"{type(e).__name__}: {e}")

    app = FastAPI(
        title="Palace", version="0.1.0", lifespan=lifespan,
        description="Long-term memory for AI agents: recall before every turn, raw-first writes. Errors are "
                    '`{"error": <code>, "detail": <reason>}`; with authentication on, send '
                    "`Authorization: Bearer <key>`.",
    )
    app.state.settings = settings
    app.state.mcp_endpoint = McpHttpEndpoint(settings, lambda: app.state.pool)
    install_error_handlers(app)
    # Added innermost first: metrics see every answer, including the limiters' 429 and 413.
    app.add_middleware(BodyLimit, limit=settings.max_request_bytes)
    app.add_middleware(RateLimit, settings=settings, exempt=ops.OPS_PATHS)
    app.add_middleware(RequestMetrics)
    app.add_middleware(TraceMiddleware, settings=settings)
    if not settings.api_auth and not settings.api_allow_unauthenticated_bind:
        app.add_middleware(LoopbackHostOnly)
    for router in ROUTERS:
        app.include_router(router)
    # MCP over streamable HTTP; each request is bound to its bearer key's workspace (services/mcp).
    app.router.add_route("/mcp", app.state.mcp_endpoint, methods=["GET", "POST", "DELETE"], include_in_schema=False)
    return app


def main() -> None:
    settings = Settings()
    configure_logging(settings.log_level, settings.log_json)
    refusal = unsafe_bind_reason(settings.api_host, settings.api_auth, settings.api_allow_unauthenticated_bind)
    if refusal is not None:
        log.error("api_not_started", reason=refusal)
        sys.exit(f"palace api: {refusal}")
    if not settings.api_auth and not is_loopback_host(settings.api_host):
        log.warning("api_listening_without_authentication", host=settings.api_host)
    failed: list[BaseException] = []

    def start_failed(exc: BaseException) -> None:
        failed.append(exc)
        server.should_exit = True

    app = create_app(settings, on_start_failure=start_failed)
    server = QuietServer(uvicorn.Config(app, host=settings.api_host, port=settings.api_port,
                                        log_level="warning", timeout_graceful_shutdown=int(settings.shutdown_grace_s)))

    async def run() -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, lambda: setattr(server, "should_exit", True))
        with contextlib.suppress(asyncio.CancelledError):
            await server.serve()

    asyncio.run(run())
    if failed:
        sys.exit(f"palace api: start failed: {type(failed[0]).__name__}: {failed[0]}")
