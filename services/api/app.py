"""The HTTP API (FastAPI; OpenAPI at /docs and /openapi.json)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

import uvicorn
from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.responses import JSONResponse
from prometheus_client import make_asgi_app
from pydantic import BaseModel, Field

from services._runtime import QuietServer
from services.api.routes_palace import router as palace_router
from services.mcp.server import McpHttpEndpoint
from shared.bus import build_broker, ensure_streams, publish_event
from shared.config import Settings
from shared.db.apikeys import workspace_for_key
from shared.db.migrate import apply_migrations
from shared.db.pool import open_pool
from shared.db.search import SearchHit
from shared.db.tenancy import key_lookup_tx, workspace_tx
from shared.endpoints import resolve_urls
from shared.events import SessionCompleted
from shared.events.models import WorkspaceId
from shared.logging import configure_logging, get_logger
from shared.palace_graph import PalaceGraph
from shared.palace_ops import PalaceOps
from shared.recall import Recaller
from shared.security import key_id_of

__all__ = ["create_app", "main"]

log = get_logger("palace.api")


class SearchRequest(BaseModel):
    workspace_id: WorkspaceId
    query: str = Field(min_length=1, max_length=4000, description="What to recall.")
    k: int = Field(10, ge=1, le=50, description="How many drawers to return.")


class SearchResponse(BaseModel):
    workspace_id: str
    query: str
    hits: list[SearchHit] = Field(description="Best first. `dense` and `text` are the two signals, each "
                                  "min-max normalised over the candidates; `score` is the fused rank.")


class Accepted(BaseModel):
    event_id: str
    subject: str


def _recaller(request: Request) -> Recaller:
    return request.app.state.recaller  # type: ignore[no-any-return]


RecallerDep = Annotated[Recaller, Depends(_recaller)]


async def _authorize(request: Request, workspace_id: str) -> None:
    """With PALACE_API_AUTH, a request may only touch the workspace its bearer key belongs to."""
    settings: Settings = request.app.state.settings
    if not settings.api_auth:
        return
    header = request.headers.get("authorization", "")
    scheme, _, key = header.partition(" ")
    if scheme.lower() != "bearer" or not key:
        raise HTTPException(401, "missing bearer API key", headers={"WWW-Authenticate": "Bearer"})
    key = key.strip()
    key_id = key_id_of(key)
    owner = None
    if key_id is not None:
        async with key_lookup_tx(request.app.state.pool, key_id) as conn:
            owner = await workspace_for_key(conn, key)
    if owner is None:
        raise HTTPException(401, "invalid API key", headers={"WWW-Authenticate": "Bearer"})
    if owner != workspace_id:
        raise HTTPException(403, "this API key belongs to another workspace")


def create_app(settings: Settings) -> FastAPI:
    """Build the API; servers are connected in the lifespan, once."""
    state: dict[str, Any] = {}
    mcp_endpoint = McpHttpEndpoint(settings, lambda: state["pool"])

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        from shared.adapters import build_embedder

        db_url, nats_url = resolve_urls(settings)
        await asyncio.to_thread(apply_migrations, db_url, settings.embed_dim)
        pool = await open_pool(db_url, name="api", min_size=settings.db_pool_min, max_size=settings.db_pool_max,
                               role=settings.db_role)
        embedder = build_embedder(settings)
        warm = getattr(embedder, "warm_up", None)
        if warm is not None:
            await warm()
        broker = build_broker(settings, "api", nats_url)
        await broker.connect()
        await ensure_streams(broker, settings)
        recaller = Recaller(pool, embedder, vector_index_min=settings.vector_index_min_drawers)
        state.update(pool=pool, broker=broker, recaller=recaller)
        app.state.recaller = state["recaller"]
        app.state.pool = pool
        mcp = mcp_endpoint.attach(PalaceOps(settings=settings, pool=pool, recaller=state["recaller"], broker=broker,
                                            graph=PalaceGraph(pool)))
        async with mcp.session_manager.run():
            yield
        await state["recaller"].drain()
        await broker.stop()
        await pool.close()
        await embedder.aclose()

    app = FastAPI(
        title="Palace", version="0.1.0", lifespan=lifespan,
        description="Long-term memory for AI agents: recall before every turn, raw-first writes.",
    )
    app.state.settings = settings
    app.mount("/metrics", make_asgi_app())
    # MCP over streamable HTTP; each request is bound to its bearer key's workspace (services/mcp).
    app.router.add_route("/mcp", mcp_endpoint, methods=["GET", "POST", "DELETE"], include_in_schema=False)
    app.include_router(palace_router)  # the palace browser: /v1/workspaces/{ws}/palace/... and the page at /ui

    @app.middleware("http")
    async def limit_body(request: Request, call_next: Any) -> Any:
        size = request.headers.get("content-length")
        if size is not None and (not size.isdigit() or int(size) > settings.max_request_bytes):
            return JSONResponse({"detail": f"request body over {settings.max_request_bytes} bytes"}, 413)
        return await call_next(request)

    @app.get("/healthz", tags=["ops"])
    async def healthz() -> dict[str, bool]:
        """Liveness and readiness: the database answers and the bus is connected."""
        try:
            async with state["pool"].connection(timeout=2) as conn:
                await conn.execute("SELECT 1")
        except Exception as e:
            raise HTTPException(503, f"database: {e!r}") from None
        conn_ok = state["broker"]._connection is not None and state["broker"]._connection.is_connected
        if not conn_ok:
            raise HTTPException(503, "nats disconnected")
        return {"database": True, "nats": True}

    @app.post("/v1/search", response_model=SearchResponse, tags=["recall"])
    async def search(req: SearchRequest, r: RecallerDep, request: Request) -> SearchResponse:
        """Hybrid recall (dense + full text, fused) within one workspace."""
        await _authorize(request, req.workspace_id)
        hits = await r.search(req.workspace_id, req.query, req.k)
        return SearchResponse(workspace_id=req.workspace_id, query=req.query,
                              hits=hits)

    @app.get("/v1/search", response_model=SearchResponse, tags=["recall"])
    async def search_get(
        r: RecallerDep,
        request: Request,
        workspace_id: Annotated[str, Query(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}$")],
        q: Annotated[str, Query(min_length=1, max_length=4000)],
        k: Annotated[int, Query(ge=1, le=50)] = 10,
    ) -> SearchResponse:
        """Same as POST /v1/search, for quick checks from a browser or curl."""
        return await search(SearchRequest(workspace_id=workspace_id, query=q, k=k), r, request)

    @app.post("/v1/sessions", response_model=Accepted, status_code=202, tags=["write"])
    async def post_session(event: SessionCompleted, request: Request) -> Accepted:
        """Publish a completed session to the bus (JetStream acks it durably before we answer)."""
        await _authorize(request, event.workspace_id)
        await publish_event(state["broker"], settings, event)
        return Accepted(event_id=event.event_id or "", subject=event.subject)

    @app.get("/v1/workspaces/{workspace_id}/stats", tags=["recall"])
    async def stats(workspace_id: str, request: Request) -> dict[str, Any]:
        """Drawer counts by state and memory type, and session/message counts."""
        await _authorize(request, workspace_id)
        async with workspace_tx(state["pool"], workspace_id) as conn:
            by_state = dict(await (await conn.execute(
                "SELECT state, count(*) FROM drawers WHERE workspace_id = %s GROUP BY state", (workspace_id,)
            )).fetchall())
            by_type = dict(await (await conn.execute(
                "SELECT coalesce(memory_type, 'unclassified'), count(*) FROM drawers WHERE workspace_id = %s"
                " GROUP BY 1", (workspace_id,)
            )).fetchall())
            row = await (await conn.execute(
                "SELECT (SELECT count(*) FROM sessions WHERE workspace_id = %s),"
                " (SELECT count(*) FROM messages WHERE workspace_id = %s)", (workspace_id, workspace_id)
            )).fetchone()
        assert row is not None
        return {"workspace_id": workspace_id, "sessions": row[0], "messages": row[1],
                "drawers_by_state": by_state, "drawers_by_type": by_type}

    return app


def main() -> None:
    settings = Settings()
    configure_logging(settings.log_level, settings.log_json)
    server = QuietServer(uvicorn.Config(create_app(settings), host=settings.api_host, port=settings.api_port,
                                        log_level="warning", timeout_graceful_shutdown=int(settings.shutdown_grace_s)))

    async def run() -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, lambda: setattr(server, "should_exit", True))
        with contextlib.suppress(asyncio.CancelledError):
            await server.serve()

    asyncio.run(run())
