"""Dreaming (GoClaw): consolidate an agent/user pair's episodes into long-term memories (pure logic).

The LLM, when configured, is asked for the durable facts across the episodes (preferences, project
facts, recurring patterns, decisions), each with the episodes it comes from; its answer is validated
strictly and what is valid is kept. Without an LLM, or when it fails or answers nothing usable, the
extractive fallback writes one consolidated note: the span of sessions, the topics that recur, and
each episode's abstract with its date, so nothing depends on a model being there.

The memories are published as one ``session.completed`` (raw first, like any producer), whose id
derives from the run: a retried run publishes the same session, and ingest's upserts and JetStream's
de-duplication make it one set of drawers.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from shared.events import Message, SessionCompleted
from shared.ids import event_id_for, stable_id
from shared.memory.llm_labels import LlmParseError, outer_json_object, strip_wrappers

__all__ = [
    "DREAMING_WING",
    "KINDS",
    "MAX_MEMORIES",
    "EpisodeIn",
    "Memory",
    "build_messages",
    "extractive",
    "parse_synthesis",
    "run_id",
    "session_event",
    "session_id_of",
]

DREAMING_WING = "dreaming"
DREAMING_ROOM = "consolidated"
SESSION_PREFIX = "dreaming:"  # its own output is never dreamt about (migration 0030's index skips it)
KINDS = ("preference", "project_fact", "pattern", "decision", "fact")
MAX_MEMORIES = 20
MAX_MEMORY_CHARS = 1500

_SYSTEM = (
    "You consolidate an assistant's episodic memory into long-term memory. You get JSON with the "
    "summaries of several past sessions with one user. Extract the durable facts worth remembering "
    "across sessions: user preferences, project facts, recurring patterns, key decisions. Ignore "
    "small talk and anything true only in one moment. Answer with JSON only: "
    '{"memories": [{"content": "<one self-contained statement>", "kind": "preference|project_fact|'
    'pattern|decision|fact", "episode_ids": ["<ids of the episodes it comes from>"]}]}. '
    f"At most {MAX_MEMORIES} memories."
)


@dataclass(frozen=True)
class EpisodeIn:
    """What a run reads of an episode."""

    id: str
    session_id: str
    summary: str
    abstract: str
    topics: list[str]
    when: datetime | None


@dataclass(frozen=True)
class Memory:
    content: str
    kind: str
    episode_ids: list[str]

    def as_json(self) -> dict[str, Any]:
        return {"content": self.content, "kind": self.kind, "episode_ids": self.episode_ids}

    @classmethod
    def of(cls, d: dict[str, Any]) -> Memory:
        return cls(str(d["content"]), str(d["kind"]), [str(i) for i in d["episode_ids"]])


def run_id(workspace_id: str, agent_id: str, user_id: str, episode_ids: list[str]) -> str:
    """One id per (pair, set of episodes): the same threshold reached is the same run everywhere."""
    return stable_id("dreaming", workspace_id, agent_id, user_id, *sorted(episode_ids))


def session_id_of(run: str) -> str:
    return f"{SESSION_PREFIX}{run}"


def build_messages(episodes: list[EpisodeIn]) -> list[dict[str, str]]:
    payload = {"episodes": [{"id": e.id, "date": e.when.date().isoformat() if e.when else None,
                             "summary": e.summary, "topics": e.topics} for e in episodes]}
    return [{"role": "system", "content": _SYSTEM},
            {"role": "user", "content": json.dumps(payload, ensure_ascii=False)}]


def parse_synthesis(text: str, episode_ids: list[str]) -> tuple[list[Memory], list[str]]:
    """The valid memories of an answer and a warning per thing dropped. Raises ``LlmParseError`` when
    the answer holds no memories object at all (the caller falls back to the extractive note)."""
    data = outer_json_object(strip_wrappers(text))
    if not isinstance(data, dict) or not isinstance(data.get("memories"), list):
        raise LlmParseError(f"no memories in answer: {strip_wrappers(text)[:120]!r}")
    known = set(episode_ids)
    out: list[Memory] = []
    warnings: list[str] = []
    seen: set[str] = set()
    for i, m in enumerate(data["memories"]):
        if len(out) >= MAX_MEMORIES:
            warnings.append(f"more than {MAX_MEMORIES} memories: the rest dropped")
            break
        content = m.get("content") if isinstance(m, dict) else None
        if not isinstance(content, str) or not content.strip():
            warnings.append(f"memory {i}: no content")
            continue
        content = " ".join(content.split())
        if len(content) > MAX_MEMORY_CHARS:
            warnings.append(f"memory {i}: longer than {MAX_MEMORY_CHARS} characters, cut")
            content = content[:MAX_MEMORY_CHARS].rsplit(" ", 1)[0]
        if content.casefold() in seen:
            continue
        seen.add(content.casefold())
        kind = m.get("kind") if m.get("kind") in KINDS else "fact"
        ids = m.get("episode_ids")
        cited = [str(x) for x in ids if str(x) in known] if isinstance(ids, list) else []
        if isinstance(ids, list) and len(cited) < len(ids):
            warnings.append(f"memory {i}: unknown episode ids dropped")
        out.append(Memory(content, kind, cited or sorted(known)))
    return out, warnings


def extractive(episodes: list[EpisodeIn]) -> list[Memory]:
    """The no-LLM consolidation: one note with the sessions' span, recurring topics and abstracts."""
    if not episodes:
        return []
    dated = [e.when for e in episodes if e.when]
    span = (f" ({min(dated).date().isoformat()} to {max(dated).date().isoformat()})" if dated else "")
    counts = Counter(t for e in episodes for t in dict.fromkeys(e.topics))
    recurring = [t for t, n in counts.most_common(10) if n >= 2]
    lines = [f"Consolidated memory of {len(episodes)} sessions{span}."]
    if recurring:
        lines.append("Recurring topics: " + ", ".join(recurring) + ".")
    for e in episodes:
        text = e.abstract or e.summary[:200]
        if text:
            lines.append(f"- {e.when.date().isoformat() + ': ' if e.when else ''}{text}")
    return [Memory("\n".join(lines), "pattern", [e.id for e in episodes])]


def session_event(workspace_id: str, run: str, agent_id: str, user_id: str, memories: list[Memory],
                  source: str, at: datetime | None = None,
                  episode_times: Mapping[str, datetime] | None = None) -> SessionCompleted:
    """The run's memories as one session.completed: one message per memory, filed in the dreaming
    wing, each message naming the episodes it consolidates (kept on its drawer's metadata). A memory is
    dated when the latest episode it consolidates happened (``episode_times``), not when the run dreamt
    it: what is read from it later (a fact's valid_from, a time window in recall) is about then."""
    now = at or datetime.now(UTC)
    times = episode_times or {}

    def said(m: Memory) -> datetime:
        return max((times[i] for i in m.episode_ids if i in times), default=now)

    return SessionCompleted(
        event_id=event_id_for("dreaming", workspace_id, run), workspace_id=workspace_id,
        session_id=session_id_of(run), agent_id=agent_id or None, user_id=user_id or None,
        messages=[Message(role="assistant", content=m.content, created_at=said(m),
                          metadata={"dreaming_run": run, "kind": m.kind, "episode_ids": m.episode_ids})
                  for m in memories],
        started_at=now, completed_at=now,
        metadata={"wing": DREAMING_WING, "room": DREAMING_ROOM, "source": "dreaming", "kind": "dreaming",
                  "dreaming_run": run, "dreaming_source": source},
    )
