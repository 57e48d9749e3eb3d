"""``/v1`` recall and write endpoints: search, publish a session, workspace stats."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query
from pydantic import BaseModel, Field

from services.api.deps import WORKSPACE_PATTERN, BrokerDep, CallerDep, PoolDep, RecallerDep, SettingsDep, WorkspacePath
from services.api.errors import ERROR_RESPONSES
from shared.bus import publish_event, session_limit_problem
from shared.db.quality import store_counts
from shared.db.search import SearchHit
from shared.db.tenancy import workspace_tx
from shared.events import SessionCompleted
from shared.events.models import WorkspaceId
from shared.limits import EPISODES_K_MAX, SEARCH_K_MAX
from shared.recall import EPISODE_DRAWERS, RecalledEpisode

__all__ = ["router"]

router = APIRouter(prefix="/v1", responses=ERROR_RESPONSES)


class SearchRequest(BaseModel):
    workspace_id: WorkspaceId
    query: str = Field(min_length=1, max_length=4000, description="What to recall.")
    k: int = Field(10, ge=1, le=SEARCH_K_MAX, description="How many drawers to return.")
    include_episodes: bool = Field(False, description="Also return the nearest session episodes (summaries of "
                                   "whole conversations) in `episodes`, ranked on their own; the drawer hits "
                                   "are the same either way.")
    episodes_k: int = Field(3, ge=1, le=EPISODES_K_MAX, description="How many episodes at most, with include_episodes.")


class EpisodeOut(BaseModel):
    """A session's episode: what the conversation was about, and the drawers that hold it."""

    episode_id: str
    session_id: str = Field(description="The session the episode summarises.")
    score: float = Field(description="0–1 relevance: the episode embedding's cosine to the query on the same "
                         "band as a drawer's vector signal: what a hit's `dense` would be for that cosine.")
    cosine: float = Field(description="The raw cosine similarity.")
    abstract: str = Field(description="L0: about 200 characters, made without an LLM.")
    summary: str = Field(description="The session's summary (the LLM's when one is configured).")
    topics: list[str]
    started_at: datetime | None
    completed_at: datetime | None
    agent_id: str | None
    user_id: str | None
    drawers: list[str] = Field(description=f"Citations (wing/room/short id) of the session's drawers in "
                               f"conversation order, at most {EPISODE_DRAWERS}: read one whole with "
                               "GET /v1/workspaces/{workspace_id}/palace/citations/{citation} (the SDK's get, MCP's "
                               "memory_get_drawer).")
    drawer_ids: list[str] = Field(description="The same drawers' ids.")
    drawer_count: int = Field(description="How many live drawers the session has.")

    @classmethod
    def of(cls, e: RecalledEpisode) -> EpisodeOut:
        return cls.model_validate(e, from_attributes=True)


class SearchResponse(BaseModel):
    workspace_id: str
    query: str
    hits: list[SearchHit] = Field(description="Best first by `score`, each drawer's 0–1 relevance on the same "
                                  "scale for every query and workspace (a threshold can use it: auto-inject's is "
                                  "PALACE_INJECT_THRESHOLD). `dense` (the vector match, on a fixed cosine band) and "
                                  "`text` (the full-text match) are the two signals on 0–1; `explanation` says "
                                  "what each signal added.")
    episodes: list[EpisodeOut] | None = Field(None, description="With include_episodes: the nearest built, "
                                              "unexpired episodes, best first (null otherwise).")


class Accepted(BaseModel):
    event_id: str
    subject: str
    duplicate: bool = Field(False, description="JetStream already held an event with this id in this workspace "
                            "(published within PALACE_DUPLICATE_WINDOW_S): this one was not stored again. A "
                            "session re-sent with other turns needs another event_id.")


@router.post("/search", response_model=SearchResponse, tags=["recall"])
async def search(caller: CallerDep, req: SearchRequest, r: RecallerDep) -> SearchResponse:
    """Hybrid recall (dense + full text, fused) within one workspace."""
    caller.authorize(req.workspace_id)
    found = await r.recall(req.workspace_id, req.query, req.k, episodes=req.episodes_k if req.include_episodes else 0)
    return SearchResponse(workspace_id=req.workspace_id, query=req.query, hits=found.hits,
                          episodes=None if found.episodes is None else [EpisodeOut.of(e) for e in found.episodes])


@router.get("/search", response_model=SearchResponse, tags=["recall"])
async def search_get(
    caller: CallerDep,
    r: RecallerDep,
    workspace_id: Annotated[str, Query(pattern=WORKSPACE_PATTERN)],
    q: Annotated[str, Query(min_length=1, max_length=4000)],
    k: Annotated[int, Query(ge=1, le=SEARCH_K_MAX)] = 10,
    include_episodes: bool = False,
    episodes_k: Annotated[int, Query(ge=1, le=EPISODES_K_MAX)] = 3,
) -> SearchResponse:
    """Same as POST /v1/search, for quick checks from a browser or curl."""
    return await search(caller, SearchRequest(workspace_id=workspace_id, query=q, k=k,
                                              include_episodes=include_episodes, episodes_k=episodes_k), r)


@router.post("/sessions", response_model=Accepted, status_code=202, tags=["write"])
async def post_session(caller: CallerDep, event: SessionCompleted, broker: BrokerDep,
                       settings: SettingsDep) -> Accepted:
    """Publish a completed session to the bus (JetStream acks it durably before we answer). A session
    ingest would refuse (too many messages, or an event over the size limit once published) is refused
    here instead of accepted and dead-lettered."""
    caller.authorize(event.workspace_id)
    if problem := session_limit_problem(event, settings):
        raise HTTPException(422, problem)
    duplicate = await publish_event(broker, settings, event)  # EventTooLarge: 413 (services.api.errors)
    return Accepted(event_id=event.event_id or "", subject=event.subject, duplicate=duplicate)


@router.get("/workspaces/{workspace_id}/stats", tags=["recall"])
async def stats(workspace_id: WorkspacePath, pool: PoolDep) -> dict[str, Any]:
    """Drawer counts by state and memory type, and session/message counts."""
    async with workspace_tx(pool, workspace_id) as conn:
        counts = await store_counts(conn, workspace_id)
    return {"workspace_id": workspace_id, **counts}
