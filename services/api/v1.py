"""``/v1`` recall and write endpoints: search, publish a session, workspace stats."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from pydantic import BaseModel, Field

from services.api.deps import WORKSPACE_PATTERN, BrokerDep, CallerDep, PoolDep, RecallerDep, SettingsDep, WorkspacePath
from services.api.errors import ERROR_RESPONSES
from shared.bus import publish_event
from shared.db.quality import store_counts
from shared.db.search import SearchHit
from shared.db.tenancy import workspace_tx
from shared.events import SessionCompleted
from shared.events.models import WorkspaceId

__all__ = ["router"]

router = APIRouter(prefix="/v1", responses=ERROR_RESPONSES)


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


@router.post("/search", response_model=SearchResponse, tags=["recall"])
async def search(caller: CallerDep, req: SearchRequest, r: RecallerDep) -> SearchResponse:
    """Hybrid recall (dense + full text, fused) within one workspace."""
    caller.authorize(req.workspace_id)
    hits = await r.search(req.workspace_id, req.query, req.k)
    return SearchResponse(workspace_id=req.workspace_id, query=req.query, hits=hits)


@router.get("/search", response_model=SearchResponse, tags=["recall"])
async def search_get(
    caller: CallerDep,
    r: RecallerDep,
    workspace_id: Annotated[str, Query(pattern=WORKSPACE_PATTERN)],
    q: Annotated[str, Query(min_length=1, max_length=4000)],
    k: Annotated[int, Query(ge=1, le=50)] = 10,
) -> SearchResponse:
    """Same as POST /v1/search, for quick checks from a browser or curl."""
    return await search(caller, SearchRequest(workspace_id=workspace_id, query=q, k=k), r)


@router.post("/sessions", response_model=Accepted, status_code=202, tags=["write"])
async def post_session(caller: CallerDep, event: SessionCompleted, broker: BrokerDep,
                       settings: SettingsDep) -> Accepted:
    """Publish a completed session to the bus (JetStream acks it durably before we answer)."""
    caller.authorize(event.workspace_id)
    await publish_event(broker, settings, event)
    return Accepted(event_id=event.event_id or "", subject=event.subject)


@router.get("/workspaces/{workspace_id}/stats", tags=["recall"])
async def stats(workspace_id: WorkspacePath, pool: PoolDep) -> dict[str, Any]:
    """Drawer counts by state and memory type, and session/message counts."""
    async with workspace_tx(pool, workspace_id) as conn:
        counts = await store_counts(conn, workspace_id)
    return {"workspace_id": workspace_id, **counts}
