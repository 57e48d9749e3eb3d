"""What routers depend on: the process's settings, pool, broker and recaller, and the caller.

A router module (``APIRouter``) declares what it needs with these ``Annotated`` types and is included in
``create_app``; nothing here is built per request except the caller. Authentication lives in one
place: ``CallerDep`` resolves the bearer key once, and ``Caller.authorize`` or ``WorkspacePath`` turn
"this key may only reach its own workspace" into a 403.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, HTTPException, Path, Request
from faststream.nats import NatsBroker
from psycopg_pool import AsyncConnectionPool

from shared.config import Settings
from shared.db.apikeys import workspace_for_key
from shared.db.tenancy import key_lookup_tx
from shared.recall import Recaller
from shared.security import key_id_of

__all__ = [
    "AUTHENTICATED",
    "WORKSPACE_PATTERN",
    "BrokerDep",
    "Caller",
    "CallerDep",
    "PoolDep",
    "RecallerDep",
    "SettingsDep",
    "WorkspacePath",
    "bearer_token",
    "mark_authenticated",
]

WORKSPACE_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}$"
# Set in the request's state once its key authenticated (REST or MCP): the rate limiter counts a key as
# one that works only then, not for any answer other than 401 (a made-up key sent to a route that never
# asks for one, /openapi.json, would otherwise pass as known and skip the limit on unrecognised keys).
AUTHENTICATED = "palace_authenticated"


def mark_authenticated(scope: Any) -> None:
    """Record in the ASGI scope's state (shared by every copy of the scope) that its key authenticated."""
    scope.setdefault("state", {})[AUTHENTICATED] = True


def _settings(request: Request) -> Settings:
    return request.app.state.settings  # type: ignore[no-any-return]


def _started(request: Request, name: str) -> Any:
    """A connection the lifespan opens; 503 rather than a crash if a request ever comes before it."""
    value = getattr(request.app.state, name, None)
    if value is None:
        raise HTTPException(503, "the API is starting: connections are not open yet")
    return value


def _pool(request: Request) -> AsyncConnectionPool:
    return _started(request, "pool")  # type: ignore[no-any-return]


def _broker(request: Request) -> NatsBroker:
    return _started(request, "broker")  # type: ignore[no-any-return]


def _recaller(request: Request) -> Recaller:
    return _started(request, "recaller")  # type: ignore[no-any-return]


SettingsDep = Annotated[Settings, Depends(_settings)]
PoolDep = Annotated[AsyncConnectionPool, Depends(_pool)]
BrokerDep = Annotated[NatsBroker, Depends(_broker)]
RecallerDep = Annotated[Recaller, Depends(_recaller)]


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, else None."""
    scheme, _, token = (authorization or "").partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


@dataclass(frozen=True)
class Caller:
    """Who is calling. With authentication on, ``workspace_id`` is the one workspace the key may use;
    with it off, ``workspace_id`` is None and every workspace is reachable (loopback or an explicitly
    trusted network only: see ``unsafe_bind_reason``)."""

    workspace_id: str | None
    key_id: str | None = None

    def authorize(self, workspace_id: str) -> str:
        """``workspace_id`` when this caller may use it, else 403."""
        if self.workspace_id is not None and self.workspace_id != workspace_id:
            raise HTTPException(403, "this API key belongs to another workspace")
        return workspace_id


async def _caller(request: Request, settings: SettingsDep) -> Caller:
    if not settings.api_auth:
        return Caller(workspace_id=None)
    key = bearer_token(request.headers.get("authorization"))
    if key is None:
        raise HTTPException(401, "missing bearer API key (Authorization: Bearer <key>)",
                            headers={"WWW-Authenticate": "Bearer"})
    key_id = key_id_of(key)
    owner = None
    if key_id is not None:
        async with key_lookup_tx(_pool(request), key_id) as conn:
            owner = await workspace_for_key(conn, key)
    if owner is None:
        raise HTTPException(401, "invalid or revoked API key", headers={"WWW-Authenticate": "Bearer"})
    mark_authenticated(request.scope)
    return Caller(workspace_id=owner, key_id=key_id)


CallerDep = Annotated[Caller, Depends(_caller)]


async def _workspace_path(
    caller: CallerDep,
    workspace_id: Annotated[str, Path(pattern=WORKSPACE_PATTERN, description="Workspace (tenant) id.")],
) -> str:
    return caller.authorize(workspace_id)


WorkspacePath = Annotated[str, Depends(_workspace_path)]
"""A ``{workspace_id}`` path parameter the caller is allowed to use (401/403 otherwise)."""
