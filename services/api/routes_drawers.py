"""REST routes that add and forget single memories: what memory_add_drawer / memory_delete_drawer do
over MCP, with the same meanings (shared/palace_ops.py).

Adding is raw-first like every write (a ``session.completed`` is published and acknowledged by
JetStream before the 202); deleting is the audited, reversible soft delete. ``WorkspacePath``
checks the caller may touch the workspace in the path before anything is done (401/403).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Path, Query, Request
from pydantic import BaseModel, Field

from services.api.deps import WorkspacePath, _started
from services.api.errors import ERROR_RESPONSES
from shared.events.models import PlaceName
from shared.palace_ops import Accepted, Deleted, OperationError, PalaceOps

__all__ = ["router"]

router = APIRouter(prefix="/v1", tags=["write"], responses=ERROR_RESPONSES)



def _ops(request: Request) -> PalaceOps:
    return _started(request, "ops")  # type: ignore[no-any-return]


OpsDep = Annotated[PalaceOps, Depends(_ops)]


class DrawerIn(BaseModel):
    content: str = Field(min_length=1, max_length=10_000, description="The memory, verbatim.")
    wing: PlaceName | None = Field(None, description="Wing to file it under; default: the agent's wing or "
                             "'general'.")
    room: PlaceName | None = Field(None, description="Room; default: the room of its classified memory type.")
    hall: PlaceName | None = Field(None, description="Optional finer grouping inside the room.")
    agent: PlaceName | None = Field(None, description="The agent storing it (provenance).")


@router.post("/workspaces/{workspace_id}/drawers", response_model=Accepted, status_code=202,
             responses={422: {"description": "Invalid fields, or nothing to file (empty or noise)."}})
async def add_drawer(workspace_id: WorkspacePath, body: DrawerIn, ops: OpsDep) -> Accepted:
    """Store one memory verbatim: durably queued at once, filed, embedded and classified within seconds.
    The same text filed the same way is one drawer however often it is sent."""
    try:
        return await ops.add_drawer(workspace_id, body.content, wing=body.wing, room=body.room, hall=body.hall,
                                    agent=body.agent)
    except OperationError as e:
        raise HTTPException(422, str(e)) from None


@router.delete("/workspaces/{workspace_id}/drawers/{drawer_id}", response_model=Deleted,
               responses={404: {"description": "No live drawer with this id in the workspace."}})
async def delete_drawer(
    workspace_id: WorkspacePath,
    drawer_id: Annotated[str, Path(pattern=r"^[0-9a-f]{32}$")],
    ops: OpsDep,
    reason: Annotated[str | None, Query(max_length=500, description="Why it is forgotten (audited).")] = None,
) -> Deleted:
    """Forget a memory: a soft delete, out of search and listings at once, audited and reversible."""
    out = await ops.delete_drawer(workspace_id, drawer_id, reason)
    if not out.deleted:
        raise HTTPException(404, f"no live drawer {drawer_id} in this workspace (unknown or already deleted)")
    return out
