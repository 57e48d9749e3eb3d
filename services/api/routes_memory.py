"""REST routes of the memory layers: identity (L0), wake-up (L0 + L1), recall (L2) and auto-inject.

Thin adapters over shared/layers.py and shared/inject.py; search (L3) stays POST /v1/search. Every
route checks the caller may touch the workspace it names (the API's bearer-key check) before reading.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, HTTPException, Path, Request
from pydantic import BaseModel, Field

from services.api.deps import PoolDep, RecallerDep, _caller
from shared.events.models import PlaceName, WorkspaceId
from shared.inject import DEFAULT_TOKEN_BUDGET, MIN_TOKEN_BUDGET, inject
from shared.layers import (
    IDENTITY_MAX,
    IdentityTooLong,
    LayerDrawer,
    get_workspace_identity,
    recall_layer,
    set_workspace_identity,
    wake_up,
)

__all__ = ["router"]

router = APIRouter(prefix="/v1", tags=["layers"])


async def _authorize(request: Request, workspace_id: str) -> None:
    """The bearer-key check every /v1 route uses (services.api.deps): 401 without a valid key, 403 on
    another workspace."""
    (await _caller(request, request.app.state.settings)).authorize(workspace_id)


WorkspacePath = Annotated[str, Path(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}$")]


class IdentityIn(BaseModel):
    text: str = Field(min_length=1, max_length=IDENTITY_MAX,
                      description=f"Who the agent is for this workspace (L0), at most {IDENTITY_MAX} characters; "
                      "never truncated, so a longer one is refused.")


class IdentityOut(BaseModel):
    workspace_id: str
    text: str
    updated_at: datetime


class DrawerOut(BaseModel):
    id: str
    citation: str = Field(description="wing/room/short id: cite this instead of quoting the memory.")
    wing: str
    room: str
    snippet: str
    importance: float
    memory_type: str | None
    occurred_at: datetime | None

    @classmethod
    def of(cls, d: LayerDrawer) -> DrawerOut:
        return cls(**d.__dict__)


class WakeUpRequest(BaseModel):
    workspace_id: WorkspaceId
    wing: PlaceName | None = Field(None, description="Only this wing's drawers in L1.")


class WakeUpResponse(BaseModel):
    workspace_id: str
    wing: str | None
    identity: str | None = Field(description="L0, or null when none was set.")
    essential: str = Field(description="L1: the most important drawers grouped by room, at most 2,000 characters.")
    drawers: list[DrawerOut] = Field(description="The drawers L1 shows, in its order.")
    truncated: bool = Field(description="L1 held more than fits; the text ends with '… (more in search)'.")
    text: str = Field(description="L0 and L1 together, ready to put into an agent's context.")


class RecallRequest(BaseModel):
    workspace_id: WorkspaceId
    wing: PlaceName | None = None
    room: PlaceName | None = None


class RecallResponse(BaseModel):
    workspace_id: str
    wing: str | None
    room: str | None
    drawers: list[DrawerOut]
    truncated: bool
    text: str = Field(description="L2: at most 10 drawers, 300 characters each, 1,200 in all.")


class InjectRequest(BaseModel):
    workspace_id: WorkspaceId
    message: str = Field(min_length=1, max_length=4000, description="The user's message, verbatim.")
    token_budget: int = Field(DEFAULT_TOKEN_BUDGET, ge=MIN_TOKEN_BUDGET, le=8000,
                              description="Most tokens the block may hold.")
    threshold: float | None = Field(None, ge=0.0, le=1.0, description="Least 0–1 relevance injected; default: the "
                                    "server's (PALACE_INJECT_THRESHOLD).")


class InjectResponse(BaseModel):
    block: str = Field(description="'<memory_context>…</memory_context>', or empty when nothing is injected.")
    tokens: int
    match_count: int = Field(description="Hits at or above the threshold.")
    injected_count: int = Field(description="Hits in the block.")
    top_score: float = Field(description="The best hit's relevance (0 without hits).")
    skipped: str | None = Field(description="Why nothing was injected: trivial, no_match or budget.")
    citations: list[str]
    threshold: float = Field(description="The 0–1 relevance a hit needed to be injected.")


@router.get("/workspaces/{workspace_id}/identity", response_model=IdentityOut,
            responses={404: {"description": "No identity set."}})
async def get_identity(workspace_id: WorkspacePath, request: Request, pool: PoolDep) -> IdentityOut:
    """L0: the workspace's identity."""
    await _authorize(request, workspace_id)
    ident = await get_workspace_identity(pool, workspace_id)
    if ident is None:
        raise HTTPException(404, "no identity set for this workspace")
    return IdentityOut(**ident.__dict__)


@router.put("/workspaces/{workspace_id}/identity", response_model=IdentityOut,
            responses={422: {"description": f"Over {IDENTITY_MAX} characters, or empty."}})
async def put_identity(workspace_id: WorkspacePath, body: IdentityIn, request: Request, pool: PoolDep) -> IdentityOut:
    """Set L0 (one per workspace; replaces the previous one)."""
    await _authorize(request, workspace_id)
    try:
        ident = await set_workspace_identity(pool, workspace_id, body.text)
    except (IdentityTooLong, ValueError) as e:
        raise HTTPException(422, str(e)) from None
    return IdentityOut(**ident.__dict__)


@router.post("/wake_up", response_model=WakeUpResponse)
async def post_wake_up(req: WakeUpRequest, request: Request, pool: PoolDep) -> WakeUpResponse:
    """L0 + L1: what an agent loads at the start of a session."""
    await _authorize(request, req.workspace_id)
    w = await wake_up(pool, req.workspace_id, req.wing)
    return WakeUpResponse(workspace_id=w.workspace_id, wing=w.wing, identity=w.identity, essential=w.essential,
                          drawers=[DrawerOut.of(d) for d in w.drawers], truncated=w.truncated, text=w.text)


@router.post("/recall", response_model=RecallResponse)
async def post_recall(req: RecallRequest, request: Request, pool: PoolDep) -> RecallResponse:
    """L2: the most important drawers of a wing and/or room."""
    await _authorize(request, req.workspace_id)
    r = await recall_layer(pool, req.workspace_id, req.wing, req.room)
    return RecallResponse(workspace_id=r.workspace_id, wing=r.wing, room=r.room,
                          drawers=[DrawerOut.of(d) for d in r.drawers], truncated=r.truncated, text=r.text)


@router.post("/inject", response_model=InjectResponse)
async def post_inject(req: InjectRequest, request: Request, r: RecallerDep) -> InjectResponse:
    """Auto-inject: a memory block for a user message within a token budget, or nothing."""
    await _authorize(request, req.workspace_id)
    i = await inject(r, req.workspace_id, req.message, token_budget=req.token_budget, threshold=req.threshold)
    return InjectResponse(**i.__dict__)
