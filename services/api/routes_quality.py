"""The memory-quality report and the held write proposals over HTTP (same as ``palace quality`` and
``palace proposals``)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, HTTPException, Path, Query
from faststream.nats import NatsBroker
from pydantic import BaseModel, Field

from services.api.deps import BrokerDep, PoolDep, SettingsDep, WorkspacePath
from services.api.errors import ERROR_RESPONSES
from shared.bus import announce_rewritten
from shared.config import Settings
from shared.db.proposals import ProposalNotFound, ProposalResolved, list_proposals, resolve_proposal
from shared.db.quality import quality_report
from shared.db.tenancy import workspace_tx
from shared.logging import get_logger

__all__ = ["router"]

log = get_logger("palace.api")
router = APIRouter()
ACTOR = "api"


@router.get("/v1/workspaces/{workspace_id}/quality", tags=["quality"])
async def quality(workspace_id: WorkspacePath, pool: PoolDep) -> dict[str, Any]:
    """Drawers by type and tier, noise dropped, near-duplicates merged, superseded, failed with reasons,
    audited actions, LLM cost."""
    async with workspace_tx(pool, workspace_id) as conn:
        return await quality_report(conn, workspace_id)


class ProposalOut(BaseModel):
    id: str = Field(description="The held proposal's audit id (memory_history).")
    created_at: datetime
    action: Literal["UPDATE", "DELETE"]
    target: str | None = Field(description="The drawer it would change.")
    source_drawer: str | None = Field(description="The newer drawer whose fact prompted it.")
    content: str | None = Field(description="UPDATE: the target's new text.")
    confidence: float | None
    proposed_by: str | None
    reason: str | None
    status: Literal["pending", "approved", "rejected"]
    outcome: str | None = Field(description="applied, dropped (approved but no longer applicable) or rejected.")
    resolved_by: str | None
    note: str | None
    audit_id: str | None = Field(description="The audit row the resolution wrote (revert it to undo an approval).")
    resolved_at: datetime | None


class ResolveIn(BaseModel):
    note: str | None = Field(None, max_length=500, description="Why (kept in the audit row).")


class ResolutionOut(BaseModel):
    history_id: str
    action: str
    target: str | None
    outcome: Literal["applied", "dropped", "rejected"]
    reason: str
    audit_id: str


HistoryId = Annotated[str, Path(min_length=1, max_length=64)]


@router.get("/v1/workspaces/{workspace_id}/proposals", tags=["quality"], response_model=list[ProposalOut],
            responses=ERROR_RESPONSES)
async def proposals(
    workspace_id: WorkspacePath, pool: PoolDep,
    status: Annotated[Literal["pending", "approved", "rejected", "all"], Query()] = "pending",
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
) -> list[ProposalOut]:
    """UPDATE and DELETE proposals controlled-write mode held, newest first."""
    async with workspace_tx(pool, workspace_id) as conn:
        rows = await list_proposals(conn, workspace_id, status=status, limit=limit)
    return [ProposalOut(**r) for r in rows]


async def _resolve(pool: PoolDep, workspace_id: str, history_id: str, body: ResolveIn | None,
                   approve: bool, broker: NatsBroker | None = None, settings: Settings | None = None,
                   ) -> ResolutionOut:
    try:
        async with workspace_tx(pool, workspace_id) as conn:
            out = await resolve_proposal(conn, workspace_id, history_id, approve=approve, actor=ACTOR,
                                         note=body.note if body else None)
    except ProposalNotFound as e:
        raise HTTPException(404, str(e)) from None
    except ProposalResolved as e:
        raise HTTPException(409, str(e)) from None
    if out.outcome == "applied" and out.action == "UPDATE" and out.target and broker is not None and settings:
        try:  # committed: a bus that does not answer soon leaves it to maintain's re-drive, never fails the request
            await announce_rewritten(broker, settings.model_copy(update={"dependency_wait_s": 5.0}), workspace_id,
                                     [out.target], out.audit_id)
        except Exception as e:
            log.warning("rewritten_announce_failed", workspace_id=workspace_id, drawer_id=out.target,
                        error=repr(e)[:300])
    return ResolutionOut(**vars(out))


@router.post("/v1/workspaces/{workspace_id}/proposals/{history_id}/approve", tags=["quality"],
             response_model=ResolutionOut, responses=ERROR_RESPONSES)
async def approve(workspace_id: WorkspacePath, pool: PoolDep, broker: BrokerDep, settings: SettingsDep,
                  history_id: HistoryId, body: Annotated[ResolveIn | None, Body()] = None) -> ResolutionOut:
    """Apply a held proposal as full mode would: the target's prior state is archived in the audit row
    (``palace revert`` restores it). A target that changed, went or is pinned (DELETE) is left alone and
    the approval recorded as dropped. An applied UPDATE's new words are embedded and classified again
    through the pipeline."""
    return await _resolve(pool, workspace_id, history_id, body, True, broker, settings)


@router.post("/v1/workspaces/{workspace_id}/proposals/{history_id}/reject", tags=["quality"],
             response_model=ResolutionOut, responses=ERROR_RESPONSES)
async def reject(workspace_id: WorkspacePath, pool: PoolDep, history_id: HistoryId,
                 body: Annotated[ResolveIn | None, Body()] = None) -> ResolutionOut:
    """Decline a held proposal: nothing changes, the rejection is audited."""
    return await _resolve(pool, workspace_id, history_id, body, False)
