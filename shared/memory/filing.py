"""From a completed session to raw rows and drawer plans (pure; ingest writes what this returns).

Each non-noise message becomes one drawer, or several when it is long (chunked verbatim). A drawer's
id is workspace + content hash, so the same text said twice in a workspace is one drawer with two
provenance rows, and a redelivered event plans exactly the same keys.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from shared.events import SessionCompleted
from shared.events.models import PLACE_NAME_MAX
from shared.ids import content_hash, drawer_id
from shared.memory.chunking import chunk_text
from shared.memory.noise import is_noise

__all__ = ["DrawerPlan", "MessageRow", "SessionPlan", "SourceRow", "embedding_text", "placement", "plan_session"]


CONTEXT_CHARS = 400


def attributed(content: str, speaker: str | None) -> str:
    return f"{speaker}: {content}" if speaker else content


def embedding_text(content: str, speaker: str | None, context: str | None = None) -> str:
    """What gets embedded for a drawer: the turn before it, then the verbatim content, attributed.

    A turn's meaning includes who said it and what it answers: recall questions name people ("When did
    Ana move?") and replies like "Yes, last May!" only make sense after their question. Measured on
    locomo-dev, dense only: turn R@10 0.17 → 0.53 on conv-26 from attribution; 0.553 → 0.611 over the
    five conversations from the preceding turn.
    """
    body = attributed(content, speaker)
    return f"{context}\n{body}" if context else body


@dataclass(frozen=True, slots=True)
class MessageRow:
    seq: int
    role: str
    name: str | None
    content: str
    content_hash: str
    created_at: datetime | None
    metadata: dict[str, object]
    is_noise: bool


@dataclass(frozen=True, slots=True)
class SourceRow:
    drawer_id: str
    seq: int
    chunk_index: int
    char_start: int
    char_end: int


@dataclass(slots=True)
class DrawerPlan:
    id: str
    content: str
    content_hash: str
    role: str
    speaker: str | None
    occurred_at: datetime | None
    wing: str
    room: str
    hall: str | None
    seq: int = 0
    context: str | None = None
    metadata: dict[str, object] = field(default_factory=dict)


@dataclass(slots=True)
class SessionPlan:
    event: SessionCompleted
    session_hash: str
    messages: list[MessageRow]
    drawers: list[DrawerPlan]
    sources: list[SourceRow]


def _label(value: object, default: str) -> str:
    if isinstance(value, str) and value.strip():
        return value.strip()[:PLACE_NAME_MAX]
    return default


def placement(metadata: Mapping[str, Any], agent_id: str | None) -> tuple[str, str, str | None]:
    """Where a session's drawers are filed: (wing, room, hall) from the session's metadata, else the
    agent's wing, else 'general'; an empty room is left to classify (by memory type)."""
    return (_label(metadata.get("wing"), _label(agent_id, "general")), _label(metadata.get("room"), ""),
            _label(metadata.get("hall"), "") or None)


def plan_session(
    event: SessionCompleted, *, chunk_chars: int = 800, chunk_overlap: int = 100, min_chars: int = 4
) -> SessionPlan:
    """Plan every row ingest writes for one ``session.completed`` event.

    Args:
        event: the validated event.
        chunk_chars: messages longer than this are chunked.
        chunk_overlap: overlap between consecutive chunks.
        min_chars: the noise filter's minimum length.
    """
    ws = event.workspace_id
    wing, room, hall = placement(event.metadata, event.agent_id)
    messages: list[MessageRow] = []
    drawers: dict[str, DrawerPlan] = {}
    sources: list[SourceRow] = []
    previous: str | None = None
    for seq, m in enumerate(event.messages):
        noise = m.role in ("system", "tool") or is_noise(m.content, min_chars)
        messages.append(
            MessageRow(seq, m.role, m.name, m.content, content_hash(m.content), m.created_at,
                       dict(m.metadata), noise)
        )
        if noise:
            continue
        context = previous
        previous = attributed(m.content, m.name)[-CONTEXT_CHARS:]
        for ch in chunk_text(m.content, chunk_chars, chunk_overlap):
            h = content_hash(ch.text)
            did = drawer_id(ws, h)
            if did not in drawers:
                drawers[did] = DrawerPlan(
                    id=did, content=ch.text, content_hash=h, role=m.role, speaker=m.name,
                    occurred_at=m.created_at or event.completed_at or event.started_at,
                    wing=wing, room=room, hall=hall, seq=seq,
                    context=context if ch.index == 0 else None,
                    metadata={"seq": seq, "chunk": ch.index, **({"message": m.metadata} if m.metadata else {})},
                )
            sources.append(SourceRow(did, seq, ch.index, ch.start, ch.end))
    session_hash = content_hash("\x1e".join(f"{r.role}\x1f{r.content}" for r in messages))
    return SessionPlan(event, session_hash, messages, list(drawers.values()), sources)
