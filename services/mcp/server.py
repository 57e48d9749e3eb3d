"""The Palace MCP server (official ``mcp`` SDK), over stdio (``palace mcp``) and streamable HTTP
(mounted by the api service at ``/mcp``).

A connection is bound to exactly one workspace and no tool takes a workspace argument:
- stdio: ``PALACE_MCP_WORKSPACE``, fixed for the life of the process;
- HTTP: the ``Authorization: Bearer <API key>`` of each request, always required (whatever
  PALACE_API_AUTH says: without a key there is no workspace to bind), looked up the way the REST
  API does and handed to the tools through the request's ASGI state.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from psycopg_pool import AsyncConnectionPool
from starlette.types import Receive, Scope, Send

from services.api.deps import mark_authenticated
from services.mcp.arguments import refuse_unknown_arguments
from services.mcp.tools import TOOLS, Binding
from shared.bus import build_broker, ensure_streams
from shared.config import Settings
from shared.db.apikeys import workspace_for_key
from shared.db.pool import open_pool
from shared.db.tenancy import key_lookup_tx
from shared.palace_graph import PalaceGraph
from shared.palace_ops import PalaceOps
from shared.recall import Recaller
from shared.security import key_id_of

__all__ = ["INSTRUCTIONS", "McpHttpEndpoint", "PalaceMCPServer", "build_server", "open_ops", "run_stdio"]

INSTRUCTIONS = (
    "Palace is this agent's long-term memory. Drawers hold verbatim memories, filed in wings (people, "
    "projects, agents) and rooms (topics). Start a session with memory_wake_up (who you are and the "
    "essential story); before each answer, memory_inject gives the memories relevant to the user's message, "
    "or nothing; recall with memory_search and cite hits by their citation (include_episodes=true adds "
    "summaries of the past conversations that match, to see a memory in context). memory_add_drawer stores a "
    "text once and says when it is already there. Everything you see and write belongs to one workspace."
)

WORKSPACE_STATE_KEY = "palace_workspace"
KEY_STATE_KEY = "palace_key_id"


class PalaceMCPServer(MCPServer):
    """An MCPServer that carries the binding its tools read (``services.mcp.tools.bound``)."""

    def __init__(self, binding: Binding, **kwargs: Any) -> None:
        super().__init__(name="palace", instructions=INSTRUCTIONS, version="0.1.0", **kwargs)
        self.palace_binding = binding
        for spec in TOOLS:
            self.add_tool(spec.fn, name=spec.name, annotations=spec.annotations, structured_output=True)
            tool = self._tool_manager.get_tool(spec.name)
            assert tool is not None
            refuse_unknown_arguments(tool)


def build_server(binding: Binding) -> PalaceMCPServer:
    return PalaceMCPServer(binding, log_level="WARNING")


def fixed_workspace(workspace_id: str) -> Callable[[Context], str]:
    def resolve(_: Context) -> str:
        return workspace_id

    return resolve


def request_key(ctx: Context) -> str | None:
    """Who asks, as the audit names it (as REST does): the API key McpHttpEndpoint authenticated."""
    request = ctx.request_context.request
    key_id = (getattr(request, "scope", {}).get("state") or {}).get(KEY_STATE_KEY)
    return f"api-key:{key_id}" if key_id else None


def request_workspace(ctx: Context) -> str:
    """The workspace McpHttpEndpoint authenticated for this HTTP request."""
    request = ctx.request_context.request
    state = getattr(request, "scope", {}).get("state") or {}
    ws = state.get(WORKSPACE_STATE_KEY)
    if not ws:
        raise ToolError("this connection is not bound to a workspace")
    return str(ws)


@asynccontextmanager
async def open_ops(settings: Settings, database_url: str, nats_url: str, *, name: str = "mcp") -> AsyncIterator[
        PalaceOps]:
    """The servers a stand-alone MCP process needs (the api builds its PalaceOps from its own)."""
    from shared.adapters.space_embedder import SpaceEmbedder

    pool = await open_pool(database_url, name=name, min_size=1, max_size=min(settings.db_pool_max, 4),
                           role=settings.db_role)
    embedder = await SpaceEmbedder.open(settings, pool)  # follows the active space (palace reembed)
    broker = build_broker(settings, name, nats_url)
    # The same search settings as the api (cosine band, graph deadline), not the library defaults.
    recaller = Recaller.from_settings(pool, embedder, settings)
    try:
        await broker.connect()
        await ensure_streams(broker, settings)
        yield PalaceOps(settings=settings, pool=pool, recaller=recaller, broker=broker, graph=PalaceGraph(pool))
    finally:
        await recaller.drain()
        await broker.stop()
        await pool.close()
        await embedder.aclose()


async def run_stdio(settings: Settings, workspace_id: str, database_url: str, nats_url: str) -> None:
    async with open_ops(settings, database_url, nats_url) as ops:
        await build_server(Binding(ops, fixed_workspace(workspace_id))).run_stdio_async()


class McpHttpEndpoint:
    """ASGI endpoint for ``/mcp``: authenticates the bearer key, then hands the request to the MCP
    session manager with the key's workspace in the request state. Stateless (no server-side MCP
    session), so any api replica can answer any request."""

    def __init__(self, settings: Settings, pool: Callable[[], AsyncConnectionPool]) -> None:
        self.settings = settings
        self._pool = pool
        self.server: PalaceMCPServer | None = None

    def attach(self, ops: PalaceOps) -> PalaceMCPServer:
        """Build the server for this process's operations (called from the api lifespan)."""
        self.server = build_server(Binding(ops, request_workspace, request_key))
        self.server.streamable_http_app(
            streamable_http_path="/", stateless_http=True, json_response=True, host=self.settings.api_host,
            max_request_body_size=self.settings.max_request_bytes,
        )
        return self.server

    async def _workspace_of(self, scope: Scope) -> tuple[str, str] | None:
        """The workspace and key id of the request's API key, None when it has no valid one."""
        headers = dict(scope.get("headers") or [])
        scheme, _, key = headers.get(b"authorization", b"").decode("latin-1").partition(" ")
        key = key.strip()
        key_id = key_id_of(key) if scheme.lower() == "bearer" and key else None
        if key_id is None:
            return None
        async with key_lookup_tx(self._pool(), key_id) as conn:
            ws = await workspace_for_key(conn, key)
        return (ws, key_id) if ws is not None else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.server is None:
            await _json(send, 503, {"detail": "MCP is not ready"})
            return
        found = await self._workspace_of(scope)
        if found is None:
            await _json(send, 401, {"detail": "MCP needs 'Authorization: Bearer <API key>' of a workspace"},
                        [(b"www-authenticate", b"Bearer")])
            return
        ws, key_id = found
        mark_authenticated(scope)  # in the state the rate limiter holds, before this copy of it
        scope = {**scope, "state": {**(scope.get("state") or {}), WORKSPACE_STATE_KEY: ws, KEY_STATE_KEY: key_id}}
        await self.server.session_manager.handle_request(scope, receive, send)


async def _json(send: Send, status: int, body: dict[str, Any],
                extra: list[tuple[bytes, bytes]] | None = None) -> None:
    data = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()),
                            *(extra or [])]})
    await send({"type": "http.response.body", "body": data})

