"""Event contracts: every message on the bus is one of these models.

They are the single source of the JSON Schemas in ``schemas/`` (``palace schemas`` regenerates them
and a test fails when they drift). Models forbid unknown fields, and pydantic v2 never coerces a
number into a string: a producer that sends the wrong shape gets a precise dead-letter reason
instead of a silently lossy coercion.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Annotated, Any, ClassVar, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints, model_validator

from shared.ids import session_event_id
from shared.limits import IDENTIFIER_MAX
from shared.moments import time_problem

__all__ = [
    "EVENT_MODELS",
    "MAX_EVENT_BYTES",
    "MAX_MESSAGES",
    "PLACE_NAME_MAX",
    "SCHEMA_VERSION",
    "DeadLetterInfo",
    "DrawerBatchEvent",
    "DrawerClassified",
    "DrawerCreated",
    "DrawerEmbedded",
    "EntityUpserted",
    "EpisodicCreated",
    "Event",
    "Message",
    "PlaceName",
    "SessionCompleted",
    "SessionStored",
    "msg_id_event",
    "payload_ids",
]

SCHEMA_VERSION = "1"
# The contract's limits, stated here once. The settings default to them (PALACE_MAX_MESSAGES_PER_SESSION
# may lower the message count, never raise it past what the model accepts; PALACE_MAX_EVENT_BYTES may be
# set either way, the model does not measure bytes), and the SDK checks the same before it sends.
MAX_MESSAGES = 5_000
MAX_EVENT_BYTES = 1_000_000

WorkspaceId = Annotated[
    str,
    StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}$"),
    Field(description="Tenant key. Every row and query is scoped by it. 1-128 chars of [A-Za-z0-9._:@-]."),
]
Identifier = Annotated[str, StringConstraints(min_length=1, max_length=IDENTIFIER_MAX, pattern=r"^[^\x00-\x1f]+$")]
# A wing, room or hall, as drawers are filed under it (shared.memory.filing keeps at most this many characters,
# trimmed): what a filter or a placement may name, trimmed alike, so a name that passes can also match.
PLACE_NAME_MAX = 100
PlaceName = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=PLACE_NAME_MAX,
                                             pattern=r"^[^\x00-\x1f]+$")]
DrawerIds = Annotated[
    list[Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{32}$")]],
    Field(min_length=1, max_length=1000, description="Ids of the drawers this event concerns."),
]


def _storable_time(value: datetime) -> datetime:
    if problem := time_problem(value):
        raise ValueError(problem)
    return value


# An instant the database can store and read back (shared.moments).
Moment = Annotated[datetime, AfterValidator(_storable_time)]


def _unstorable(value: Any, path: str = "") -> str | None:
    """Where ``value`` holds something PostgreSQL cannot store, and why; None when it is all storable.

    text and JSONB cannot hold U+0000, and JSONB has no NaN or Infinity (which Python's JSON parser
    accepts). Checked over the whole event, keys included, so no field can let one through into a
    handler, where the database would refuse it on every redelivery instead of it being dead-lettered
    once as invalid input.
    """
    if isinstance(value, str):
        return f"{path or '<root>'}: text contains NUL (U+0000), which PostgreSQL cannot store" \
            if "\x00" in value else None
    if isinstance(value, float) and not math.isfinite(value):
        return f"{path or '<root>'}: {value} is not a finite number, which JSONB cannot store"
    items: list[tuple[str, Any]] = []
    if isinstance(value, dict):
        for k, v in value.items():
            if isinstance(k, str) and "\x00" in k:
                return f"{path or '<root>'}: a key contains NUL (U+0000), which PostgreSQL cannot store"
            items.append((str(k), v))
    elif isinstance(value, list | tuple):
        items = [(str(i), v) for i, v in enumerate(value)]
    elif isinstance(value, BaseModel):  # an event built from models (Message), not parsed from JSON
        items = [(k, getattr(value, k)) for k in type(value).model_fields]
    for k, v in items:
        found = _unstorable(v, f"{path}.{k}" if path else k)
        if found:
            return found
    return None


class Event(BaseModel):
    """Fields every event carries."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    subject: ClassVar[str] = ""

    schema_version: Literal["1"] = Field(
        SCHEMA_VERSION, description="Contract version; consumers reject versions they do not know."
    )
    event_id: Identifier = Field(
        description="Unique id of this event; also the JetStream de-duplication id (Nats-Msg-Id)."
    )
    workspace_id: WorkspaceId

    def dedup_headers(self) -> dict[str, str]:
        """The publish headers that make JetStream store a retried publish of this event once (within
        PALACE_DUPLICATE_WINDOW_S): ``Nats-Msg-Id`` = ``<subject>:<workspace_id>/<event_id>``. The workspace
        is part of it because a producer chooses its event ids: two tenants' sessions under one id (a
        counter, a conversation id) were one message to JetStream, and the second was dropped as a
        repeat. ``/`` is never in a workspace id, so the id reads back unambiguously. Every publisher of
        an event uses them (shared.bus for the services, palace_sdk for producers); tracing reads the
        event id back (``msg_id_event``)."""
        return {"Nats-Msg-Id": f"{self.subject}:{self.workspace_id}/{self.event_id}"}

    @model_validator(mode="before")
    @classmethod
    def _storable(cls, data: Any) -> Any:
        problem = _unstorable(data)
        if problem:
            raise ValueError(problem)
        return data


def msg_id_event(subject: str, msg_id: str) -> str:
    """The event id in a ``Nats-Msg-Id`` that ``Event.dedup_headers`` wrote for ``subject``."""
    rest = msg_id.removeprefix(f"{subject}:")
    _workspace, sep, event_id = rest.partition("/")
    return event_id if sep else rest


class Message(BaseModel):
    """One conversation turn, stored verbatim."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    role: Literal["user", "assistant", "system", "tool"] = Field(description="Who produced the turn.")
    content: str = Field(
        description="Verbatim text of the turn, any length: a long turn is chunked at sentence boundaries like "
        "any other content; the whole event is bounded by PALACE_MAX_EVENT_BYTES."
    )
    created_at: Moment | None = Field(None, description="When the turn was said (ISO 8601).")
    name: Annotated[str, StringConstraints(max_length=200)] | None = Field(
        None, description="Speaker's display name, when the platform knows it."
    )
    metadata: dict[str, Any] = Field(
        default_factory=dict, description="Free producer metadata kept with the raw message."
    )


class SessionCompleted(Event):
    """``session.completed``: a producer finished a conversation session. Subject fixed by users."""

    subject: ClassVar[str] = "session.completed"

    event_id: Identifier | None = Field(  # type: ignore[assignment]
        None,
        description="Unique id; when omitted it is derived from workspace, session and content, "
        "so re-publishing the same session is recognised as a repeat.",
    )
    session_id: Identifier = Field(description="Producer's session id, unique within the workspace.")
    agent_id: Identifier | None = Field(None, description="Agent that took part in the session.")
    user_id: Identifier | None = Field(None, description="End user the session was with.")
    messages: list[Message] = Field(
        min_length=1, max_length=MAX_MESSAGES, description="The turns, in order."
    )
    started_at: Moment | None = Field(None, description="Session start (ISO 8601).")
    completed_at: Moment | None = Field(None, description="Session end (ISO 8601).")
    metadata: dict[str, Any] = Field(
        default_factory=dict,
        description="Free metadata. 'wing', 'room' and 'hall' (strings) choose where drawers are filed.",
    )

    @model_validator(mode="after")
    def _derive_event_id(self) -> SessionCompleted:
        if self.event_id is None:
            object.__setattr__(self, "event_id", session_event_id(
                self.workspace_id, self.session_id, ((m.role, m.content) for m in self.messages)))
        return self


def payload_ids(payload: Any) -> tuple[str | None, str | None]:
    """(event id, session id) of a raw event payload that may be invalid, for its dead letter.

    The event id is the payload's own, else the one ``SessionCompleted`` derives, computed whenever
    the fields it is derived from are there with the right types (even if something else in the
    payload is wrong). Either is None when the payload does not hold it.
    """
    if not isinstance(payload, dict):
        return None, None
    sid = payload.get("session_id")
    session_id = str(sid) if isinstance(sid, str | int | float) and not isinstance(sid, bool) else None
    eid = payload.get("event_id")
    if isinstance(eid, str | int) and not isinstance(eid, bool) and str(eid):
        return str(eid), session_id
    ws, msgs = payload.get("workspace_id"), payload.get("messages")
    if not (isinstance(ws, str) and isinstance(sid, str) and isinstance(msgs, list) and msgs):
        return None, session_id
    turns = [(m.get("role"), m.get("content")) for m in msgs if isinstance(m, dict)]
    if len(turns) != len(msgs) or not all(isinstance(r, str) and isinstance(c, str) for r, c in turns):
        return None, session_id
    return session_event_id(ws, sid, turns), session_id


class SessionStored(Event):
    """``session.stored``: ingest committed the raw session and its drawers."""

    subject: ClassVar[str] = "session.stored"

    session_id: Identifier
    message_count: int = Field(ge=0, description="Messages stored raw.")
    drawer_ids: list[str] = Field(description="Drawers filed from this session (after noise filtering).")


class DrawerBatchEvent(Event):
    """Base of the per-stage drawer events: a batch of drawer ids in one workspace."""

    session_id: Identifier | None = Field(None, description="Session the drawers came from, if any.")
    drawer_ids: DrawerIds


class DrawerCreated(DrawerBatchEvent):
    """``drawer.created``: drawers were written in state raw and need embedding."""

    subject: ClassVar[str] = "drawer.created"


class DrawerEmbedded(DrawerBatchEvent):
    """``drawer.embedded``: drawers have embeddings and need classification."""

    subject: ClassVar[str] = "drawer.embedded"


class DrawerClassified(DrawerBatchEvent):
    """``drawer.classified``: drawers are processed; the cluster service de-duplicates them."""

    subject: ClassVar[str] = "drawer.classified"


class EpisodicCreated(Event):
    """``episodic.created``: a session was summarised into an episode. Subject fixed by users."""

    subject: ClassVar[str] = "episodic.created"

    episode_id: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{32}$")]
    session_id: Identifier
    summary: str = Field(description="Extractive (or LLM) summary of the session.")
    abstract: str = Field(description="L0 abstract, at most 200 characters.")
    topics: list[str] = Field(default_factory=list, description="Key topics of the session.")


class EntityUpserted(Event):
    """``entity.upserted``: entities were created or refreshed. Subject fixed by users."""

    subject: ClassVar[str] = "entity.upserted"

    entity_ids: list[str] = Field(min_length=1, description="Ids of the upserted entities.")
    names: list[str] = Field(description="Display names, aligned with entity_ids.")
    source_episode_id: str | None = Field(None, description="Episode the entities were found in.")


class DeadLetterInfo(BaseModel):
    """What a dead letter records about a failed message (NATS headers on the ``dlq.*`` copy).

    The dead letter's body is the original payload byte for byte, so nothing is lost even when it
    is not valid UTF-8 or JSON, and ``palace dlq redrive`` can republish it unchanged.
    """

    model_config = ConfigDict(extra="forbid")

    schema_version: Literal["1"] = SCHEMA_VERSION
    subject: str = Field(description="Subject the message was consumed from.")
    service: str = Field(description="Service that gave up on it.")
    reason: str = Field(description="Human-readable reason.")
    error_type: str = Field(description="'invalid' (poison input) or the exception class name.")
    deliveries: int = Field(description="Delivery attempts made.")
    failed_at: datetime
    event_id: str | None = Field(
        None, description="Event id: the payload's own, or for a session.completed without one the id ingest "
        "derives (workspace, session and content); absent only when the payload holds neither.",
    )
    workspace_id: str | None = Field(None, description="Workspace, when the payload names one.")
    session_id: str | None = Field(None, description="Producer's session id, when the payload names one.")
    size: int = Field(description="Payload size in bytes.")
    stream_seq: int | None = Field(None, description="Sequence in the dead-letter stream (when listed).")


EVENT_MODELS: dict[str, type[BaseModel]] = {
    "session.completed": SessionCompleted,
    "session.stored": SessionStored,
    "drawer.created": DrawerCreated,
    "drawer.embedded": DrawerEmbedded,
    "drawer.classified": DrawerClassified,
    "episodic.created": EpisodicCreated,
    "entity.upserted": EntityUpserted,
    "dead_letter": DeadLetterInfo,
}
