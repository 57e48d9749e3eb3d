"""REST routes of the temporal knowledge graph: what the memory_kg_* MCP tools do, over HTTP.

Thin adapters over shared/db/kg.py, each in one workspace-scoped transaction; ``WorkspacePath``
checks the caller's key against the workspace in the path first (401/403). Reads are GETs (as-of
query, timeline, stats); adding a fact and ending one are POSTs. A fact is never rewritten or
deleted: ending it sets ``valid_to``, so an as-of question about an earlier time still gets the old
answer. Bad input (an empty name, a date
that is not ISO 8601, an end before the start) is a 422 with the reason.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, HTTPException, Query, Response
from pydantic import BaseModel, Field

from services.api.deps import PoolDep, WorkspacePath
from services.api.errors import ERROR_RESPONSES
from shared.db import kg
from shared.db.tenancy import workspace_tx
from shared.limits import KG_FACTS_MAX
from shared.memory.kg import MAX_NAME_CHARS, MAX_PREDICATE_CHARS, Fact, KgError, KgStats, TripleAdded

__all__ = ["router"]

router = APIRouter(prefix="/v1", tags=["knowledge graph"], responses=ERROR_RESPONSES)

EntityName = Annotated[str, Query(min_length=1, max_length=MAX_NAME_CHARS, description="The entity's name (or an "
                                  "alias), e.g. 'Orion' or 'Maria'.")]
Limit = Annotated[int, Query(ge=1, le=KG_FACTS_MAX, description="Most facts to return.")]


class FactIn(BaseModel):
    subject: str = Field(min_length=1, max_length=MAX_NAME_CHARS, description="Who or what the fact is about.")
    predicate: str = Field(min_length=1, max_length=MAX_PREDICATE_CHARS,
                           description="The relation, e.g. 'uses', 'works at' (compared as words: 'works_at').")
    object: str = Field(min_length=1, max_length=MAX_NAME_CHARS, description="The other entity.")
    valid_from: str | None = Field(None, max_length=40, description="When it started holding (ISO 8601 date or time); "
                                              "default: now.")
    valid_to: str | None = Field(None, max_length=40, description="When it stopped holding, for a fact already over.")
    confidence: float = Field(1.0, ge=0.0, le=1.0)
    source_drawer: str | None = Field(None, pattern=r"^[0-9a-f]{32}$", description="The drawer that says it.")


class FactEnd(BaseModel):
    subject: str = Field(min_length=1, max_length=MAX_NAME_CHARS)
    predicate: str = Field(min_length=1, max_length=MAX_PREDICATE_CHARS)
    object: str = Field(min_length=1, max_length=MAX_NAME_CHARS)
    ended: str | None = Field(None, max_length=40, description="When it stopped holding (ISO 8601); default: now.")


class Facts(BaseModel):
    workspace_id: str
    entity: str | None
    as_of: str | None = Field(None, description="The time asked about, when one was.")
    facts: list[Fact] = Field(description="In the order they started.")


class Ended(BaseModel):
    workspace_id: str
    ended: list[Fact] = Field(description="The facts this call ended (with their new valid_to).")


_BAD: dict[int | str, dict[str, Any]] = {
    422: {"description": "Invalid input: an empty name, a time that is not ISO 8601, an end before the start."}}


@router.get("/workspaces/{workspace_id}/kg/facts", response_model=Facts, responses=_BAD)
async def query_facts(
    workspace_id: WorkspacePath, pool: PoolDep, entity: EntityName,
    as_of: Annotated[str | None, Query(max_length=40, description="Only facts that held then (ISO 8601; a date "
                                       "means that whole day); default: every fact, ended ones included.")] = None,
    direction: Literal["outgoing", "incoming", "both"] = "both",
    limit: Limit = 200,
) -> Facts:
    """An entity's relations: outgoing (it is the subject), incoming (it is the object) or both."""
    try:
        async with workspace_tx(pool, workspace_id) as conn:
            facts = await kg.query_entity(conn, workspace_id, entity, as_of=as_of, direction=direction, limit=limit)
    except KgError as e:
        raise HTTPException(422, str(e)) from None
    return Facts(workspace_id=workspace_id, entity=entity, as_of=as_of, facts=facts)


@router.get("/workspaces/{workspace_id}/kg/timeline", response_model=Facts, responses=_BAD)
async def timeline(
    workspace_id: WorkspacePath, pool: PoolDep,
    entity: Annotated[str | None, Query(min_length=1, max_length=MAX_NAME_CHARS,
                                        description="Only facts about this entity; omit for the whole graph.")] = None,
    limit: Limit = 100,
) -> Facts:
    """Every fact (about an entity, or all), in the order they started; ended ones with their end."""
    try:
        async with workspace_tx(pool, workspace_id) as conn:
            facts = await kg.entity_timeline(conn, workspace_id, entity, limit=limit)
    except KgError as e:
        raise HTTPException(422, str(e)) from None
    return Facts(workspace_id=workspace_id, entity=entity, as_of=None, facts=facts)


@router.get("/workspaces/{workspace_id}/kg/stats", response_model=KgStats)
async def stats(workspace_id: WorkspacePath, pool: PoolDep) -> KgStats:
    """Entities, facts (current and ended), mentions, and how often each relation is used."""
    async with workspace_tx(pool, workspace_id) as conn:
        return await kg.kg_stats(conn, workspace_id)


@router.post("/workspaces/{workspace_id}/kg/facts", response_model=TripleAdded, status_code=201,
             responses={200: {"description": "The same fact already held then: nothing written."}, **_BAD})
async def add_fact(workspace_id: WorkspacePath, body: FactIn, response: Response,
                   pool: PoolDep) -> TripleAdded:
    """Record subject --predicate--> object from valid_from, creating either entity when missing."""
    try:
        async with workspace_tx(pool, workspace_id) as conn:
            added = await kg.add_triple(conn, workspace_id, body.subject, body.predicate, body.object,
                                        valid_from=body.valid_from, valid_to=body.valid_to,
                                        confidence=body.confidence, source_drawer=body.source_drawer)
    except KgError as e:
        raise HTTPException(422, str(e)) from None
    if not added.created:
        response.status_code = 200
    return added


@router.post("/workspaces/{workspace_id}/kg/facts/invalidate", response_model=Ended,
             responses={404: {"description": "No current fact subject --predicate--> object."}, **_BAD})
async def invalidate_fact(workspace_id: WorkspacePath, body: FactEnd, pool: PoolDep) -> Ended:
    """End a current fact (sets valid_to; the fact is kept for as-of questions and audited)."""
    try:
        async with workspace_tx(pool, workspace_id) as conn:
            ended = await kg.invalidate_triple(conn, workspace_id, body.subject, body.predicate, body.object,
                                               ended=body.ended, actor="api")
    except KgError as e:
        raise HTTPException(422, str(e)) from None
    if not ended:
        raise HTTPException(404, f"no current fact {body.subject!r} {body.predicate!r} {body.object!r}")
    return Ended(workspace_id=workspace_id, ended=ended)
