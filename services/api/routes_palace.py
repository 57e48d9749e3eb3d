"""The palace browser: read endpoints for wings → rooms → drawers, a drawer's provenance and history,
soft delete and restore, and the static page (``/ui``) that uses them.

Every endpoint takes the workspace from its path and passes the caller through the API's bearer-key
check first (``WorkspacePath``), so with authentication on a key can only browse its own workspace;
every read runs in a workspace transaction (row-level security) and is capped
(shared/db/palace_browse.py).
"""

from __future__ import annotations

import base64
import binascii
import json
from datetime import datetime
from pathlib import Path as FsPath
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Path, Query, Request
from fastapi.staticfiles import StaticFiles
from psycopg_pool import AsyncConnectionPool
from pydantic import BaseModel, Field

from services.api.deps import BrokerDep, PoolDep, RecallerDep, SettingsDep, WorkspacePath
from services.api.errors import ERROR_RESPONSES
from shared.db import palace_browse as pb
from shared.db.tenancy import workspace_tx
from shared.memory.citations import cite
from shared.palace_graph import PalaceGraph
from shared.palace_ops import AmbiguousReference, DrawerNotFound, OperationError, PalaceOps

__all__ = ["STATIC_DIR", "router"]

STATIC_DIR = FsPath(__file__).with_name("static")
PAGE_MAX = 100  # drawers per page
SOURCES_MAX = 20  # sightings of one drawer shown
SESSIONS_MAX = 3  # sessions whose messages are shown
CONTEXT_TURNS = 2  # messages shown before and after the ones a drawer came from
MESSAGES_MAX = 40  # per session
HISTORY_MAX = 50
ACTOR = "browser"

api = APIRouter(prefix="/v1/workspaces/{workspace_id}/palace", tags=["palace browser"], responses=ERROR_RESPONSES)


def _graph(request: Request, pool: PoolDep) -> PalaceGraph:
    """One taxonomy cache per api process (shared/palace_graph.py), made on first use."""
    graph: PalaceGraph | None = getattr(request.app.state, "palace_graph", None)
    if graph is None:
        graph = request.app.state.palace_graph = PalaceGraph(pool)
    return graph


GraphDep = Annotated[PalaceGraph, Depends(_graph)]


def _ops(settings: SettingsDep, pool: PoolDep, recaller: RecallerDep, broker: BrokerDep, graph: GraphDep) -> PalaceOps:
    """Palace operations as the browser: deletes and restores are audited with actor 'browser'."""
    return PalaceOps(settings=settings, pool=pool, recaller=recaller, broker=broker, graph=graph, actor=ACTOR)


OpsDep = Annotated[PalaceOps, Depends(_ops)]


# ------------------------------------------------------------------------------------------ models
class RoomOut(BaseModel):
    room: str
    drawers: int


class WingOut(BaseModel):
    wing: str
    drawers: int
    rooms: list[RoomOut]


class TaxonomyOut(BaseModel):
    workspace_id: str
    drawers: int = Field(description="Live drawers (not deleted, not merged).")
    wings: list[WingOut] = Field(description="In name order, each with its rooms in name order.")


class DrawerItem(BaseModel):
    drawer_id: str
    citation: str = Field(description="wing/room/short id, as search hits cite it.")
    content: str
    wing: str
    room: str
    hall: str | None
    memory_type: str | None
    importance: float
    speaker: str | None
    occurred_at: datetime | None
    filed_at: datetime


class DrawerPage(BaseModel):
    wing: str
    room: str
    drawers: list[DrawerItem] = Field(description="Newest filed first.")
    next: str | None = Field(description="Pass as `after` for the next page; null on the last page.")


class SourceOut(BaseModel):
    session_id: str
    seq: int = Field(description="The message's position in its session.")
    chunk_index: int
    char_start: int = Field(description="Where the drawer's text starts in that message.")
    char_end: int
    revision: int | None = Field(None, description="None while the message still says the drawer; else the "
                                 "revision of the message it was cut from, edited since.")


class MessageOut(BaseModel):
    seq: int
    role: str
    name: str | None
    content: str
    created_at: datetime | None
    is_noise: bool
    revision: int = Field(0, description="How many times the message was edited (0: as first published); the "
                          "earlier texts are kept in message_revisions.")
    is_source: bool = Field(description="The drawer was filed from this message.")


class SessionOut(BaseModel):
    session_id: str
    agent_id: str | None
    user_id: str | None
    started_at: datetime | None
    completed_at: datetime | None
    message_count: int
    received_at: datetime
    messages: list[MessageOut] = Field(description="The source messages with up to "
                                       f"{CONTEXT_TURNS} turns around them, in order.")


class HistoryOut(BaseModel):
    id: str
    action: str
    actor: str
    reason: str | None
    old_value: Any
    new_value: Any
    event_id: str | None
    created_at: datetime


class DrawerDetailOut(DrawerItem):
    state: str
    summary: str | None
    role: str | None
    agent_id: str | None
    source: str
    access_count: int
    last_accessed_at: datetime | None
    deleted_at: datetime | None = Field(description="Set when soft-deleted (restorable).")
    superseded_by: str | None
    sources: list[SourceOut]
    sessions: list[SessionOut]
    history: list[HistoryOut] = Field(description="memory_history, newest first.")


class DeleteOut(BaseModel):
    drawer_id: str
    deleted: bool = Field(description="False when no live drawer has this id (unknown or already deleted).")
    history_event_id: str


class RestoreOut(BaseModel):
    drawer_id: str
    restored: bool = Field(description="False when the drawer is not deleted (or unknown).")


# ------------------------------------------------------------------------------------------ cursors
def _cursor(d: pb.DrawerRow) -> str:
    raw = json.dumps([d.filed_at.isoformat(), d.id]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _parse_cursor(after: str) -> tuple[datetime, str]:
    try:
        at, did = json.loads(base64.urlsafe_b64decode(after + "=" * (-len(after) % 4)))
        return datetime.fromisoformat(at), str(did)
    except (ValueError, TypeError, binascii.Error):
        raise HTTPException(400, "invalid page cursor `after`: pass the `next` of the previous page") from None


def _item(d: pb.DrawerRow) -> dict[str, Any]:
    return {"drawer_id": d.id, "citation": cite(d.wing, d.room, d.id), "content": d.content, "wing": d.wing,
            "room": d.room, "hall": d.hall, "memory_type": d.memory_type, "importance": d.importance,
            "speaker": d.speaker, "occurred_at": d.occurred_at, "filed_at": d.filed_at}


# ------------------------------------------------------------------------------------------ routes
@api.get("/taxonomy", response_model=TaxonomyOut)
async def taxonomy(ws: WorkspacePath, graph: GraphDep) -> TaxonomyOut:
    """Wings → rooms with their live drawer counts (cached per workspace until its layout changes)."""
    tax = await graph.taxonomy(ws)
    return TaxonomyOut(workspace_id=ws, drawers=tax.total, wings=[
        WingOut(wing=w, drawers=sum(rooms.values()), rooms=[RoomOut(room=r, drawers=n) for r, n in rooms.items()])
        for w, rooms in tax.wings.items()])


@api.get("/drawers", response_model=DrawerPage)
async def room_drawers(
    ws: WorkspacePath, pool: PoolDep,
    wing: Annotated[str, Query(min_length=1, max_length=200)],
    room: Annotated[str, Query(min_length=1, max_length=200)],
    limit: Annotated[int, Query(ge=1, le=PAGE_MAX)] = 25,
    after: Annotated[str | None, Query(max_length=400, description="`next` of the previous page.")] = None,
) -> DrawerPage:
    """A room's live drawers, newest filed first, one page (keyset: stable while drawers are added)."""
    cursor = _parse_cursor(after) if after else None
    async with workspace_tx(pool, ws) as conn:
        rows = await pb.room_drawers(conn, ws, wing, room, limit=limit + 1, after=cursor)
    page = rows[:limit]
    return DrawerPage(wing=wing, room=room, drawers=[DrawerItem(**_item(d)) for d in page],
                      next=_cursor(page[-1]) if len(rows) > limit else None)


@api.get("/drawers/{drawer_id}", response_model=DrawerDetailOut)
async def drawer(ws: WorkspacePath, pool: PoolDep,
                 drawer_id: Annotated[str, Path(min_length=1, max_length=200)]) -> DrawerDetailOut:
    """One drawer (deleted ones too), where it came from (the raw session and messages, the chunk
    positions) and what happened to it (memory_history)."""
    return await _detail(pool, ws, drawer_id)


@api.get("/citations/{citation:path}", response_model=DrawerDetailOut,
         responses={404: {"description": "No live drawer matches."},
                    409: {"description": "The short id is shared by several drawers: use the whole id."}})
async def cited_drawer(ws: WorkspacePath, pool: PoolDep, ops: OpsDep,
                       citation: Annotated[str, Path(min_length=1, max_length=400)]) -> DrawerDetailOut:
    """The live drawer a citation names (``wing/room/short id``, as search hits, layers and inject cite
    it; a whole drawer id works too), with its provenance and history as ``/drawers/{drawer_id}``."""
    try:
        found = await ops.resolve(ws, citation)
    except DrawerNotFound as e:
        raise HTTPException(404, str(e)) from None
    except AmbiguousReference as e:
        raise HTTPException(409, str(e)) from None
    except OperationError as e:
        raise HTTPException(400, str(e)) from None
    return await _detail(pool, ws, found.id)


async def _detail(pool: AsyncConnectionPool, ws: str, drawer_id: str) -> DrawerDetailOut:
    async with workspace_tx(pool, ws) as conn:
        d = await pb.drawer_detail(conn, ws, drawer_id)
        if d is None:
            raise HTTPException(404, f"no drawer {drawer_id!r} in this workspace")
        sources = await pb.drawer_sources(conn, ws, drawer_id, limit=SOURCES_MAX)
        seqs: dict[str, list[int]] = {}
        for s in sources:
            seqs.setdefault(s.session_id, []).append(s.seq)
        if not seqs and d.session_id is not None and d.seq is not None:
            seqs[d.session_id] = [d.seq]
        sessions: list[SessionOut] = []
        for sid, at in list(seqs.items())[:SESSIONS_MAX]:
            sess = await pb.session_of(conn, ws, sid)
            if sess is None:
                continue
            msgs = await pb.session_messages(conn, ws, sid, first_seq=min(at) - CONTEXT_TURNS,
                                             last_seq=max(at) + CONTEXT_TURNS, limit=MESSAGES_MAX)
            sessions.append(SessionOut(**vars(sess), messages=[
                MessageOut(**vars(m), is_source=m.seq in at) for m in msgs]))
        history = await pb.drawer_history(conn, ws, drawer_id, limit=HISTORY_MAX)
    base = _item(d)
    extra = {k: getattr(d, k) for k in ("state", "summary", "role", "agent_id", "source", "access_count",
                                         "last_accessed_at", "deleted_at", "superseded_by")}
    return DrawerDetailOut(**base, **extra, sources=[SourceOut(**vars(s)) for s in sources], sessions=sessions,
                     history=[HistoryOut(**vars(h)) for h in history])


@api.delete("/drawers/{drawer_id}", response_model=DeleteOut)
async def delete_drawer(
    ws: WorkspacePath, ops: OpsDep, drawer_id: Annotated[str, Path(min_length=1, max_length=200)],
    reason: Annotated[str | None, Query(max_length=500, description="Kept in the audit row.")] = None,
) -> DeleteOut:
    """Soft delete: search, layers and the taxonomy stop seeing it; audited in memory_history; restorable."""
    out = await ops.delete_drawer(ws, drawer_id, reason=reason)
    return DeleteOut(**out.model_dump())


@api.post("/drawers/{drawer_id}/restore", response_model=RestoreOut)
async def restore_drawer(ws: WorkspacePath, ops: OpsDep,
                         drawer_id: Annotated[str, Path(min_length=1, max_length=200)]) -> RestoreOut:
    """Undo a soft delete (audited as RESTORE)."""
    return RestoreOut(drawer_id=drawer_id, restored=await ops.restore_drawer(ws, drawer_id))


# What create_app includes: the endpoints above and the page, a static directory (no build step).
router = APIRouter()
router.include_router(api)
router.mount("/ui", StaticFiles(directory=STATIC_DIR, html=True), name="palace-ui")
