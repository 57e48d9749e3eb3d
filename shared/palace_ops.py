"""What an agent interface can do to one workspace's palace: the operations behind the MCP tools
(and any other interface that wants the same meanings).

Every method takes the workspace explicitly and runs in a workspace-scoped transaction, so the
caller's binding (an API key, a configured workspace) is the only thing that decides whose memory
is reached. Writes of new memory go the pipeline's raw-first way: a ``session.completed`` event is
published to JetStream (acknowledged durably before we answer), and ingest stores the raw message
and files the drawer exactly as it does for any producer. Deletion is a soft delete, audited in
memory_history and reversible.
"""

from __future__ import annotations

import asyncio
import re
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from faststream.nats import NatsBroker
from psycopg_pool import AsyncConnectionPool
from pydantic import BaseModel, Field, ValidationError

from shared.bus import publish_event
from shared.config import Settings
from shared.db.drawer_admin import (
    DrawerSummary,
    Placement,
    diary_entries,
    drawer_placements,
    drawers_by_id_prefix,
    restore_drawer,
    similar_drawers,
    soft_delete_drawer,
)
from shared.db.drawers import drawers_by_id
from shared.db.episodes import reopen_episodes_of
from shared.db.forget import forgotten_session_drawers, writer_tx
from shared.db.identity import get_identity, set_identity
from shared.db.lifecycle import restore_batch
from shared.db.tenancy import workspace_tx
from shared.endpoints import resolve_urls
from shared.events import Message, SessionCompleted
from shared.faults import is_transient
from shared.forget import Scope
from shared.forget import forget as forget_scope
from shared.forget import verify as verify_scope
from shared.ids import content_hash, drawer_id, stable_id
from shared.logging import get_logger
from shared.memory.citations import ID_LEN, cite, parse_citation
from shared.memory.dedup import decide
from shared.memory.filing import plan_session
from shared.palace_graph import PalaceGraph
from shared.recall import Recaller

__all__ = [
    "IDENTITY_MAX_CHARS",
    "Accepted",
    "AmbiguousReference",
    "Deleted",
    "DrawerNotFound",
    "DrawerOut",
    "Duplicate",
    "Forgotten",
    "Hit",
    "IdentityOut",
    "OperationError",
    "PalaceOps",
    "Status",
    "drawer_ref_id",
    "resolve_drawer",
]

IDENTITY_MAX_CHARS = 400  # L0's budget, never truncated: longer text is refused, not cut
DIARY_WING = "diary"
_HEX_ID = re.compile(r"[0-9a-f]+")
# How long an add waits for the database to say whether its text is already filed, deleted or forgotten
# before it answers "accepted" without knowing (an add is durable once NATS has the event).
_ADD_CHECK_S = 2.0

log = get_logger("palace.ops")


class OperationError(ValueError):
    """A request the palace refuses, with a reason the caller can act on."""


class DrawerNotFound(OperationError):
    """No live drawer of the workspace matches a drawer id or citation."""


class AmbiguousReference(OperationError):
    """A short id or prefix that several live drawers of the workspace share."""


class Status(BaseModel):
    drawers: int = Field(description="Live drawers (not deleted, not merged).")
    wings: int
    rooms: int
    tunnels: int = Field(description="Rooms filed under more than one wing.")
    identity: str | None = Field(description="The L0 identity text, if set.")


class Hit(BaseModel):
    drawer_id: str
    citation: str = Field(description="wing/room/short id: cite this instead of quoting (memory_get_drawer "
                          "reads it back).")
    score: float = Field(description="Relevance 0–1, on the scale memory_inject's threshold uses "
                         f"({Settings.model_fields['inject_threshold'].default} by default): every search returns "
                         "its best hits, and one well under that is usually unrelated to the query.")
    content: str
    wing: str
    room: str
    memory_type: str | None
    speaker: str | None
    occurred_at: datetime | None
    session_id: str | None


class EpisodeHit(BaseModel):
    """A session's episode returned by search: what a whole conversation was about."""

    session_id: str
    score: float = Field(description="0–1 relevance of the episode to the query (cosine on the same band as a "
                         "drawer's vector signal).")
    abstract: str = Field(description="About 200 characters: the gist of the session.")
    summary: str
    topics: list[str]
    started_at: datetime | None
    completed_at: datetime | None
    agent_id: str | None
    user_id: str | None
    drawers: list[str] = Field(description="Citations of the session's drawers in conversation order (the first "
                               "20): memory_get_drawer reads each whole.")
    drawer_count: int = Field(description="How many drawers the session has.")


class Duplicate(BaseModel):
    drawer_id: str
    citation: str | None = Field(None, description="wing/room/short id (None while the same text is not filed yet).")
    similarity: float = Field(description="Cosine similarity of the embeddings, 1.0 for the exact same text (not "
                              "the 0-1 relevance of search).")
    duplicate: bool = Field(False, description="The same memory: the exact text, or the same words but for filler "
                            "(the pipeline's own twin rule). A similar one that says something else (another "
                            "value, a negation) is not: add the new text, it is an update.")
    content: str
    wing: str | None
    room: str


class Accepted(BaseModel):
    status: Literal["accepted", "exists", "restored"] = Field(description=(
        "'accepted': new, durably queued; ingest files it within seconds, then it is embedded and classified. "
        "'exists': the same text is already remembered, where wing/room say (not moved). 'restored': the same "
        "text had been deleted; it is back where it was filed (audited as a RESTORE)."))
    drawer_ids: list[str] = Field(description="The drawer ids (deterministic from the content).")
    event_id: str
    session_id: str
    wing: str = Field(description="Where it is filed: the wing asked for, or where the same text already is.")
    room: str | None = Field(description="None: classification files it in the room of its memory type.")
    hall: str | None


class Deleted(BaseModel):
    drawer_id: str
    deleted: bool = Field(description="False when no live drawer has this id (unknown or already deleted).")
    history_event_id: str


class Forgotten(BaseModel):
    forget_id: str = Field(description="The audit record of this forget (who asked, what scope, counts).")
    scope: str = Field(description="What was forgotten: 'workspace', or kind:value (user, agent, session, drawer).")
    counts: dict[str, int] = Field(description="Rows or events removed per store.")
    remaining: dict[str, int] | None = Field(None, description="With verify: what is left per place (all zero: "
                                             "nothing remains).")


class IdentityOut(BaseModel):
    identity: str
    previous: str | None


class DrawerOut(BaseModel):
    drawer_id: str
    citation: str = Field(description="wing/room/short id: cite this instead of quoting.")
    content: str
    wing: str
    room: str
    hall: str | None
    memory_type: str | None
    written_at: datetime | None = Field(description="When it was said or written.")
    filed_at: datetime

    @classmethod
    def of(cls, d: DrawerSummary) -> DrawerOut:
        return cls(drawer_id=d.id, citation=cite(d.wing, d.room, d.id), content=d.content, wing=d.wing, room=d.room,
                   hall=d.hall,
                   memory_type=d.memory_type, written_at=d.occurred_at, filed_at=d.filed_at)


async def resolve_drawer(pool: AsyncConnectionPool, ws: str, ref: str) -> DrawerSummary:
    """The live drawer a drawer id or citation (``wing/room/short id``) names, in this workspace only.

    Raises OperationError when ``ref`` is neither, DrawerNotFound when no live drawer matches and
    AmbiguousReference when several do (a prefix shared by more than one id: the citation's wing
    and room decide between them when they can)."""
    try:
        parsed = parse_citation(ref)
    except ValueError as e:
        raise OperationError(str(e)) from None
    async with workspace_tx(pool, ws) as conn:
        found = await drawers_by_id_prefix(conn, ws, parsed.id_prefix, limit=5)
    if len(found) > 1 and parsed.room is not None:
        found = [d for d in found if (d.wing, d.room) == (parsed.wing, parsed.room)] or found
    if not found:
        raise DrawerNotFound(f"no live drawer matches {ref.strip()!r} in this workspace (unknown, deleted or "
                             "forgotten)")
    if len(found) > 1:
        raise AmbiguousReference(f"{ref.strip()!r} matches several drawers: "
                                 + ", ".join(cite(d.wing, d.room, d.id) + f" ({d.id})" for d in found)
                                 + "; give the whole drawer id")
    return found[0]


async def drawer_ref_id(pool: AsyncConnectionPool, ws: str, ref: str) -> str:
    """The drawer id a reference names: a whole id as it is (a deleted drawer can still be named by it),
    a citation or short id resolved among the live drawers (``resolve_drawer``). A whole id in capitals is
    the same id: taken as it was, it named no drawer, and a forget by it removed nothing and said so."""
    whole = ref.strip().lower()
    if len(whole) == ID_LEN and _HEX_ID.fullmatch(whole):
        return whole
    return (await resolve_drawer(pool, ws, ref)).id


@dataclass
class PalaceOps:
    """The shared servers a process holds (pool, embedder via the recaller, bus) and the graph cache."""

    settings: Settings
    pool: AsyncConnectionPool
    recaller: Recaller
    broker: NatsBroker
    graph: PalaceGraph
    actor: str = "mcp"

    # ----------------------------------------------------------------------------- reads
    async def status(self, ws: str) -> Status:
        tax = await self.graph.taxonomy(ws)
        stats = await self.graph.stats(ws)
        async with workspace_tx(self.pool, ws) as conn:
            identity = await get_identity(conn, ws)
        return Status(drawers=tax.total, wings=stats.wings, rooms=stats.rooms, tunnels=stats.tunnels,
                      identity=identity)

    async def search(self, ws: str, query: str, limit: int) -> list[Hit]:
        return (await self.search_with_episodes(ws, query, limit, 0))[0]

    async def search_with_episodes(self, ws: str, query: str, limit: int,
                                   episodes: int) -> tuple[list[Hit], list[EpisodeHit] | None]:
        """The hits, and the ``episodes`` nearest episodes when that is above 0 (None otherwise)."""
        found = await self.recaller.recall(ws, query, limit, episodes=episodes)
        hits = [Hit(drawer_id=h.id, citation=h.citation, score=round(h.score, 4), content=h.content,
                    wing=h.wing, room=h.room, memory_type=h.memory_type, speaker=h.speaker,
                    occurred_at=h.occurred_at, session_id=h.session_id) for h in found.hits]
        if found.episodes is None:
            return hits, None
        return hits, [EpisodeHit(session_id=e.session_id, score=e.score, abstract=e.abstract, summary=e.summary,
                                 topics=e.topics, started_at=e.started_at, completed_at=e.completed_at,
                                 agent_id=e.agent_id, user_id=e.user_id, drawers=e.drawers,
                                 drawer_count=e.drawer_count) for e in found.episodes]

    async def check_duplicate(self, ws: str, content: str, threshold: float, limit: int) -> list[Duplicate]:
        """Drawers holding this text: near-duplicates by embedding, nearest first, and the exact same
        text (same drawer id) even before it has been embedded."""
        exact_id = drawer_id(ws, content_hash(content))
        near: list[DrawerSummary] = []
        if self.recaller.embedder is not None:
            vec = (await self.recaller.embedder.embed_documents([content]))[0]
            small = (await self.graph.taxonomy(ws)).total <= self.recaller.params.exact_max
            async with workspace_tx(self.pool, ws) as conn:
                near = await similar_drawers(conn, ws, vec, threshold=threshold, limit=limit, exact=small)
        def same(d: DrawerSummary) -> bool:  # by its words: curation may have rewritten the drawer of this id
            return d.id == exact_id and content_hash(d.content) == content_hash(content)

        def twin(d: DrawerSummary) -> bool:
            return same(d) or decide(content, [(d.id, d.similarity or 0.0, d.content)], threshold).action == "MERGE"

        out = [Duplicate(drawer_id=d.id, citation=cite(d.wing, d.room, d.id),
                         similarity=1.0 if same(d) else round(d.similarity or 0.0, 4),
                         duplicate=twin(d), content=d.content, wing=d.wing, room=d.room) for d in near]
        if all(d.id != exact_id for d in near):
            async with workspace_tx(self.pool, ws) as conn:
                out[:0] = [Duplicate(drawer_id=d.id, similarity=1.0, duplicate=True, content=d.content, wing=None,
                                     room=d.room) for d in await drawers_by_id(conn, ws, [exact_id])
                           if content_hash(d.content) == content_hash(content)]
        return sorted(out, key=lambda d: -d.similarity)[:limit]

    async def resolve(self, ws: str, ref: str) -> DrawerSummary:
        """The live drawer a drawer id or citation names (``resolve_drawer``)."""
        return await resolve_drawer(self.pool, ws, ref)

    async def drawer_id(self, ws: str, ref: str) -> str:
        """The drawer id a reference names (``drawer_ref_id``)."""
        return await drawer_ref_id(self.pool, ws, ref)

    async def get_drawer(self, ws: str, ref: str) -> DrawerOut:
        """One live drawer by id or citation, whole (see ``resolve``)."""
        return DrawerOut.of(await self.resolve(ws, ref))

    async def diary_read(self, ws: str, agent: str, limit: int) -> list[DrawerOut]:
        async with workspace_tx(self.pool, ws) as conn:
            return [DrawerOut.of(d) for d in await diary_entries(conn, ws, agent, limit)]

    # ----------------------------------------------------------------------------- writes
    async def add_drawer(
        self, ws: str, content: str, *, wing: str | None = None, room: str | None = None, hall: str | None = None,
        agent: str | None = None, kind: str = "drawer",
    ) -> Accepted:
        """Publish the memory as a one-message ``session.completed`` (raw first, like any producer).

        The session id derives from the content and where it is filed, so retrying the same call is
        recognised by JetStream's de-duplication and by ingest's upserts: no second drawer.
        """
        metadata: dict[str, Any] = {"source": self.actor, "kind": kind}
        metadata.update({k: v for k, v in (("wing", wing), ("room", room), ("hall", hall)) if v})
        digest = stable_id(kind, content_hash(content), wing or "", room or "", hall or "")
        session_id = f"{self.actor}:{kind}:{digest}"
        now = datetime.now(UTC)
        try:
            event = SessionCompleted(
                workspace_id=ws, session_id=session_id, agent_id=agent,
                messages=[Message(role="user", content=content, created_at=now)],
                started_at=now, completed_at=now, metadata=metadata,
            )
        except ValidationError as e:  # what ingest would dead-letter after a 202
            raise OperationError("; ".join(str(err["msg"]).removeprefix("Value error, ")
                                           for err in e.errors(include_url=False))) from None
        s = self.settings
        plan = plan_session(event, chunk_chars=s.chunk_chars, chunk_overlap=s.chunk_overlap, min_chars=s.min_chars)
        if not plan.drawers:
            raise OperationError(f"nothing to file: the text is empty or noise (under {s.min_chars} characters "
                                 "or only filler)")
        ids = [d.id for d in plan.drawers]
        # The same text is the same drawer: say where it already is, and whether it was deleted or forgotten,
        # instead of "accepted" for words that search would never return (ingest files a new sighting only).
        # Read before publishing (once published, ingest may file it first), and only as long as it takes:
        # an add needs NATS, not PostgreSQL, so a database that is down or slow leaves the answer "accepted".
        gone, gone_drawers, placed = False, set[str](), dict[str, Placement]()
        try:
            async with asyncio.timeout(_ADD_CHECK_S), writer_tx(self.pool, ws) as conn:
                gone, gone_drawers = await forgotten_session_drawers(conn, ws, session_id=session_id, user_id=None,
                                                                     agent_id=agent, drawer_ids=ids)
                placed = await drawer_placements(conn, ws, ids)
        except Exception as e:  # the check is advisory (ingest checks forgets again): only a failure of ours raises
            if not (isinstance(e, TimeoutError) or is_transient(e)):
                raise
            log.warning("add_check_skipped", workspace=ws, error=repr(e)[:200])
        # Only a drawer that still holds these words is "the same text" (curation may have rewritten it).
        hashes = {d.id: d.content_hash for d in plan.drawers}
        placed = {i: p for i, p in placed.items() if p.content_hash == hashes[i]}
        if gone or gone_drawers:
            raise OperationError("this text (or its agent) was forgotten on request, and a forget is permanent: "
                                 "it is not filed again")
        await publish_event(self.broker, s, event)
        status: Literal["accepted", "exists", "restored"] = "exists" if len(placed) == len(ids) else "accepted"
        deleted = [i for i in ids if i in placed and placed[i].deleted]
        if deleted:
            event_id = f"{self.actor}-restore:{uuid.uuid4().hex}"  # each restore audited, as each delete is
            async with workspace_tx(self.pool, ws) as conn:
                # Archived by prune: back as `palace restore` brings it, importance raised to the prune
                # threshold (or the next prune archives it again); deleted otherwise: back as it was.
                for did in deleted:  # asked for again: back, audited, and in its sessions' episodes again
                    if await restore_batch(conn, ws, drawer_ids=[did], limit=1, actor=self.actor,
                                           importance_floor=s.prune_importance_below, event_id=event_id,
                                           reason="the same text was added again") \
                            or await restore_drawer(conn, ws, did, actor=self.actor, event_id=event_id,
                                                    reason="the same text was added again"):
                        await reopen_episodes_of(conn, ws, did, change=event_id, due_after_s=s.episode_wait_s)
                        status = "restored"
        first = plan.drawers[0]
        where = placed.get(first.id)
        wing, room, hall = (where.wing, where.room, where.hall) if where else (first.wing, first.room or None,
                                                                              first.hall)
        return Accepted(status=status, drawer_ids=ids, event_id=event.event_id or "", session_id=session_id,
                        wing=wing, room=room, hall=hall)

    async def delete_drawer(self, ws: str, drawer_id_: str, reason: str | None = None) -> Deleted:
        """Soft-delete by drawer id or citation. A whole id is taken as it is (deleting it again, or an
        unknown one, answers ``deleted=False``); a citation or prefix is resolved first (``resolve``)."""
        drawer_id_ = await self.drawer_id(ws, drawer_id_)
        event_id = f"{self.actor}-delete:{uuid.uuid4().hex}"
        async with workspace_tx(self.pool, ws) as conn:
            done = await soft_delete_drawer(conn, ws, drawer_id_, actor=self.actor, event_id=event_id, reason=reason)
            if done:  # its sessions' episodes quote it: rebuilt without it
                await reopen_episodes_of(conn, ws, drawer_id_, change=event_id,
                                         due_after_s=self.settings.episode_wait_s)
        return Deleted(drawer_id=drawer_id_, deleted=done, history_event_id=event_id)

    async def restore_drawer(self, ws: str, drawer_id_: str) -> bool:
        event_id = f"{self.actor}-restore:{uuid.uuid4().hex}"
        async with workspace_tx(self.pool, ws) as conn:
            done = await restore_drawer(conn, ws, drawer_id_, actor=self.actor, event_id=event_id)
            if done:  # and with it again
                await reopen_episodes_of(conn, ws, drawer_id_, change=event_id,
                                         due_after_s=self.settings.episode_wait_s)
            return done

    async def forget(self, ws: str, kind: str, value: str, *, verify: bool = False,
                     requested_by: str | None = None) -> Forgotten:
        """Forget a drawer (by id or citation), session, user, agent or the whole workspace (kind
        'workspace', value '*') everywhere it lives (shared/forget.py): irreversible, audited with
        ``requested_by`` (default ``actor``) as who asked, idempotent."""
        if kind == "drawer":
            value = await self.drawer_id(ws, value)
        try:
            scope = Scope(ws, kind, value)
        except ValueError as e:
            raise OperationError(str(e)) from None
        db_url, nats_url = resolve_urls(self.settings)
        result = await forget_scope(self.pool, self.settings, nats_url, scope,
                                    requested_by=requested_by or self.actor, database_url=db_url)
        remaining = await verify_scope(self.pool, self.settings, nats_url, scope, result.targets) if verify else None
        return Forgotten(forget_id=result.forget_id, scope="workspace" if kind == "workspace" else f"{kind}:{value}",
                         counts=result.counts, remaining=remaining)

    async def set_identity(self, ws: str, text: str) -> IdentityOut:
        text = text.strip()
        if not text:
            raise OperationError("identity text is empty")
        if len(text) > IDENTITY_MAX_CHARS:
            raise OperationError(f"identity is {len(text)} characters; L0 holds at most {IDENTITY_MAX_CHARS} and "
                                 "is never truncated: shorten it")
        async with workspace_tx(self.pool, ws) as conn:
            previous, _ = await set_identity(conn, ws, text, actor=self.actor,
                                          event_id=f"{self.actor}-identity:{uuid.uuid4().hex}")
        return IdentityOut(identity=text, previous=previous)

    async def diary_write(self, ws: str, agent: str, entry: str, topic: str | None = None) -> Accepted:
        return await self.add_drawer(ws, entry, wing=DIARY_WING, room=topic or "journal", hall=agent, agent=agent,
                                     kind="diary")
