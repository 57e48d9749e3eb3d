"""What the SDK returns: typed views of the API's JSON answers.

Each model ignores fields it does not know, so a client keeps working against a newer server that
adds fields; the fields here are the ones the API documents (OpenAPI at ``/docs``).
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "Accepted",
    "Deleted",
    "Drawer",
    "Episode",
    "Explanation",
    "Fact",
    "FactAdded",
    "Facts",
    "FactsEnded",
    "Hit",
    "Identity",
    "Injection",
    "KgStats",
    "LayerDrawer",
    "Published",
    "Recall",
    "SearchResult",
    "WakeUp",
]


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class Explanation(_Model):
    """Each signal's share of a hit's score (they add up to it)."""

    vector: float = 0.0
    full_text: float = 0.0
    speaker: float = 0.0
    time_window: float = 0.0
    neighbours: float = 0.0
    session: float = 0.0
    graph: float = 0.0
    importance: float = 0.0
    recency: float = 0.0
    diversity: float = 0.0


class Hit(_Model):
    """One recalled memory: ``score`` is a 0–1 relevance; hits come best first."""

    id: str
    content: str
    score: float
    citation: str = Field(description="wing/room/short id: cite this instead of quoting.")
    wing: str
    room: str
    memory_type: str | None = None
    speaker: str | None = None
    session_id: str | None = None
    occurred_at: datetime | None = None
    explanation: Explanation | None = None


class Episode(_Model):
    """A session's episode returned by ``search(..., include_episodes=True)``: what a whole conversation
    was about. ``score`` is a 0–1 relevance (the cosine on the band of a hit's vector signal); ``drawers``
    are the citations of its drawers in conversation order (the first 20), each readable with ``get``."""

    episode_id: str
    session_id: str
    score: float
    cosine: float
    abstract: str
    summary: str
    topics: list[str] = Field(default_factory=list)
    started_at: datetime | None = None
    completed_at: datetime | None = None
    agent_id: str | None = None
    user_id: str | None = None
    drawers: list[str] = Field(default_factory=list)
    drawer_ids: list[str] = Field(default_factory=list)
    drawer_count: int = 0


class SearchResult(_Model):
    workspace_id: str
    query: str
    hits: list[Hit]
    episodes: list[Episode] | None = Field(None, description="Only with include_episodes: best first.")


class LayerDrawer(_Model):
    id: str
    citation: str
    wing: str
    room: str
    snippet: str
    importance: float
    memory_type: str | None = None
    occurred_at: datetime | None = None


class WakeUp(_Model):
    """L0 identity + L1 essential story; ``text`` is what goes at the start of an agent's context."""

    workspace_id: str
    wing: str | None = None
    identity: str | None = None
    essential: str
    drawers: list[LayerDrawer]
    truncated: bool
    text: str


class Recall(_Model):
    """L2: the most important drawers of a wing and/or room."""

    workspace_id: str
    wing: str | None = None
    room: str | None = None
    drawers: list[LayerDrawer]
    truncated: bool
    text: str


class Injection(_Model):
    """Auto-inject's answer: ``block`` is empty when nothing is injected and ``skipped`` says why."""

    block: str
    tokens: int
    match_count: int
    injected_count: int
    top_score: float
    skipped: Literal["trivial", "no_match", "budget"] | None = None
    citations: list[str] = Field(default_factory=list)
    threshold: float | None = None  # the relevance a memory needed (servers before it was reported: None)


class Drawer(_Model):
    """One drawer whole, as a citation (or its id) names it, with where it is filed and its state."""

    drawer_id: str
    citation: str
    content: str
    wing: str
    room: str
    hall: str | None = None
    memory_type: str | None = None
    importance: float | None = None
    speaker: str | None = None
    state: str | None = None
    occurred_at: datetime | None = None
    filed_at: datetime | None = None


class Identity(_Model):
    workspace_id: str
    text: str
    updated_at: datetime


class Accepted(_Model):
    """A memory durably queued; the pipeline files it within seconds under ``drawer_ids``. ``status``:
    'accepted' (new), 'exists' (the same text is already filed, where wing/room say) or 'restored' (it had
    been deleted and is back)."""

    status: str
    drawer_ids: list[str]
    event_id: str
    session_id: str
    wing: str
    room: str | None = None
    hall: str | None = None


class Deleted(_Model):
    drawer_id: str
    deleted: bool
    history_event_id: str


class Published(_Model):
    """A ``session.completed`` stored by JetStream. ``duplicate``: the same event id was already stored."""

    event_id: str
    stream: str
    seq: int
    duplicate: bool = False


class Fact(_Model):
    """One temporal triple: subject --predicate--> object, holding from ``valid_from`` through ``valid_to``."""

    id: str
    subject: str
    predicate: str
    object: str
    valid_from: datetime | None = None
    valid_to: datetime | None = None
    current: bool
    direction: Literal["outgoing", "incoming"] | None = None
    confidence: float = 1.0
    source_drawer: str | None = None
    source_session: str | None = None
    created_at: datetime | None = None


class Facts(_Model):
    workspace_id: str
    entity: str | None = None
    as_of: str | None = None
    facts: list[Fact]


class FactAdded(_Model):
    fact: Fact
    created: bool = Field(description="False when the same fact already held then (nothing written).")
    subject_created: bool = False
    object_created: bool = False


class FactsEnded(_Model):
    workspace_id: str
    ended: list[Fact]


class KgStats(_Model):
    entities: int
    triples: int
    current_facts: int
    expired_facts: int
    mentions: int = 0
    relationship_types: dict[str, int] = Field(default_factory=dict)
