"""Probes and metrics: ``/livez``, ``/readyz`` (``/healthz`` is its old name), ``/metrics``.

Liveness and readiness answer different questions. An orchestrator restarts a process whose liveness
fails, so ``/livez`` checks only that this process answers: a database or NATS outage must not get
every api replica restarted at once, which would fix nothing. ``/readyz`` checks the dependencies, so
traffic goes elsewhere while they are away, and says which one failed. The probes answer anyone (no
key, no rate limit): the failure's detail (hosts, user names in a connection error) goes to the log,
the answer names only the dependency and the kind of error.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

from services.api.errors import error_body
from shared.db.pool import ping
from shared.logging import get_logger

__all__ = ["OPS_PATHS", "router"]

OPS_PATHS = ("/livez", "/readyz", "/healthz", "/metrics", "/metrics/")
_CHECK_TIMEOUT_S = 2.0

router = APIRouter(tags=["ops"])
log = get_logger("palace.api")


def _failed(dependency: str, e: Exception) -> str:
    log.warning("readiness_check_failed", dependency=dependency, error=repr(e)[:500])
    return f"unreachable ({type(e).__name__}; the api's log has the detail)"


@router.get("/livez")
async def livez() -> dict[str, str]:
    """The process and its event loop answer. Touches neither the database nor NATS."""
    return {"status": "ok"}


_STARTING = "not connected yet: the api is starting"


async def _database(request: Request) -> str | None:
    pool = getattr(request.app.state, "pool", None)
    if pool is None:
        return _STARTING
    try:
        async with pool.connection(timeout=_CHECK_TIMEOUT_S) as conn:
            await asyncio.wait_for(ping(conn), _CHECK_TIMEOUT_S)
    except Exception as e:
        return _failed("database", e)
    return None


async def _nats(request: Request) -> str | None:
    broker = getattr(request.app.state, "broker", None)
    if broker is None:
        return _STARTING
    try:
        ok = await broker.ping(timeout=_CHECK_TIMEOUT_S / 2)
    except Exception as e:
        return _failed("nats", e)
    return None if ok else "not connected"


async def _ready(request: Request) -> Any:
    db_error, nats_error = await asyncio.gather(_database(request), _nats(request))
    checks = {"database": db_error is None, "nats": nats_error is None}
    reasons = {"database": db_error, "nats": nats_error}
    if getattr(request.app.state, "recaller", None) is None:  # connected, still loading the embedding model
        reasons["startup"] = "the api is starting"
    failed = [name for name, reason in reasons.items() if reason is not None]
    if not failed:
        return checks
    body = error_body(503, {"failed": failed, **{n: reasons[n] for n in failed}})
    return JSONResponse({**body, **checks}, status_code=503)


@router.get("/readyz", responses={503: {"description": "A dependency is unreachable; the body names it."}})
async def readyz(request: Request) -> Any:
    """Ready for traffic: the database answers and NATS is connected. 503 names what failed."""
    return await _ready(request)


@router.get("/healthz", responses={503: {"description": "Same as /readyz."}})
async def healthz(request: Request) -> Any:
    """Alias of ``/readyz``, kept for existing probes and scripts."""
    return await _ready(request)


@router.get("/metrics", include_in_schema=False)
@router.get("/metrics/", include_in_schema=False)
async def metrics() -> Response:
    """Prometheus text format, served directly (no redirect between /metrics and /metrics/)."""
    return Response(generate_latest(REGISTRY), media_type=CONTENT_TYPE_LATEST)
