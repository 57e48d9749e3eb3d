"""POST /v1/forget: forget a drawer, session, user, agent or whole workspace, with optional proof.

Its own router, listed in the API's ``ROUTERS``; the bearer-key check is the API's (services.api.deps).
The work is ``shared.forget``: tombstones first (nothing in flight can bring the data back), then
batches of short transactions and the JetStream streams; the answer carries the audit id and counts
per store, never content.
"""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, Request
from pydantic import BaseModel, Field, model_validator

from services.api.deps import CallerDep, PoolDep, SettingsDep
from services.api.routes_drawers import OpsDep
from shared.endpoints import resolve_urls
from shared.events.models import WorkspaceId
from shared.forget import Scope, forget, verify
from shared.limits import IDENTIFIER_MAX

__all__ = ["router"]

router = APIRouter(tags=["forget"])


class ForgetRequest(BaseModel):
    workspace_id: WorkspaceId
    user_id: str | None = Field(None, min_length=1, max_length=IDENTIFIER_MAX,
                                description="Forget everything of this user.")
    agent_id: str | None = Field(None, min_length=1, max_length=IDENTIFIER_MAX, description="... of this agent.")
    session_id: str | None = Field(None, min_length=1, max_length=IDENTIFIER_MAX,
                                   description="... of one session.")
    drawer_id: str | None = Field(None, min_length=1, max_length=IDENTIFIER_MAX,
                                  description="... of one drawer: its id, or the citation a hit carries "
                                  "(wing/room/short id).")
    all: bool = Field(False, description="Forget the whole workspace.")
    verify: bool = Field(False, description="Then search every store and stream for what was forgotten.")

    @model_validator(mode="after")
    def one_scope(self) -> ForgetRequest:
        n = sum(v is not None for v in (self.user_id, self.agent_id, self.session_id, self.drawer_id)) + self.all
        if n != 1:
            raise ValueError("give exactly one of user_id, agent_id, session_id, drawer_id or all")
        return self

    def scope(self) -> Scope:
        for kind in ("user", "agent", "session", "drawer"):
            value = getattr(self, f"{kind}_id")
            if value is not None:
                return Scope(self.workspace_id, kind, value)
        return Scope(self.workspace_id, "workspace", "*")


class ForgetResponse(BaseModel):
    forget_id: str = Field(description="The audit record (forget_audit) of this request.")
    scope: dict[str, str]
    counts: dict[str, int] = Field(description="Rows or events removed per store.")
    remaining: dict[str, int] | None = Field(None, description="With verify: what was found per place (all zero: "
                                             "nothing remains).")


@router.post("/v1/forget", response_model=ForgetResponse)
async def post_forget(req: ForgetRequest, request: Request, caller: CallerDep, pool: PoolDep,
                      settings: SettingsDep, ops: OpsDep) -> ForgetResponse:
    """Forget everywhere (idempotent; safe while the pipeline runs)."""
    caller.authorize(req.workspace_id)
    requested_by = (f"api-key:{caller.key_id}" if caller.key_id
                    else f"api:{request.client.host if request.client else 'unknown'}")
    _, nats_url = resolve_urls(settings)
    scope = req.scope()
    if scope.kind == "drawer":
        # As MCP's memory_forget: a citation or short id names the drawer; taken literally, it would
        # tombstone a string no drawer has and prove the erasure of nothing.
        scope = Scope(scope.workspace_id, "drawer", await ops.drawer_id(scope.workspace_id, scope.value))
    try:
        result = await forget(pool, settings, nats_url, scope, requested_by=requested_by)
    except ValueError as e:
        raise HTTPException(422, str(e)) from None
    remaining = await verify(pool, settings, nats_url, scope, result.targets) if req.verify else None
    return ForgetResponse(forget_id=result.forget_id, scope={"kind": scope.kind, "value": scope.value},
                          counts=result.counts, remaining=remaining)
