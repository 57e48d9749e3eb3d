"""GET /v1/workspaces/{ws}/quality: the memory-quality report over HTTP (same as ``palace quality``)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from services.api.deps import PoolDep, WorkspacePath
from shared.db.quality import quality_report
from shared.db.tenancy import workspace_tx

__all__ = ["router"]

router = APIRouter()


@router.get("/v1/workspaces/{workspace_id}/quality", tags=["quality"])
async def quality(workspace_id: WorkspacePath, pool: PoolDep) -> dict[str, Any]:
    """Drawers by type and tier, noise dropped, near-duplicates merged, superseded, failed with reasons,
    audited actions, LLM cost."""
    async with workspace_tx(pool, workspace_id) as conn:
        return await quality_report(conn, workspace_id)
