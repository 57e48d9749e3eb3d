"""GET /v1/workspaces/{ws}/quality: the memory-quality report over HTTP (same as ``palace quality``)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Request

from shared.db.quality import quality_report
from shared.db.tenancy import workspace_tx

__all__ = ["router"]

router = APIRouter()


@router.get("/v1/workspaces/{workspace_id}/quality", tags=["quality"])
async def quality(
    workspace_id: Annotated[str, Path(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}$")], request: Request,
) -> dict[str, Any]:
    """Drawers by type and tier, noise dropped, near-duplicates merged, superseded, failed with reasons,
    audited actions, LLM cost."""
    from services.api.app import _authorize  # the app module imports this router: resolve at call time

    await _authorize(request, workspace_id)
    async with workspace_tx(request.app.state.pool, workspace_id) as conn:
        return await quality_report(conn, workspace_id)
