"""LoCoMo conversations → ``session.completed`` events, one per LoCoMo session, every turn carrying
its ``dia_id`` in the message metadata so retrieval results can be traced back to it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

__all__ = ["Conversation", "Question", "load_locomo", "parse_locomo_time", "to_events"]


@dataclass(frozen=True)
class Question:
    index: int
    question: str
    answer: str
    evidence: tuple[str, ...]
    category: int


@dataclass(frozen=True)
class Conversation:
    sample_id: str
    sessions: list[dict[str, Any]]
    questions: list[Question]

    @property
    def turns(self) -> int:
        return sum(len(s["turns"]) for s in self.sessions)


def load_locomo(path: Path) -> list[Conversation]:
    """Read a LoCoMo-format file (../shared/bench/README.md), validating what the benchmark relies on."""
    raw = json.loads(path.read_text())
    if not isinstance(raw, list):
        raise ValueError(f"{path}: expected a JSON list of conversations")
    out = []
    for conv in raw:
        qs = [Question(i, q["question"], str(q.get("answer", "")), tuple(q["evidence"]), int(q["category"]))
              for i, q in enumerate(conv["questions"]) if q.get("evidence")]
        out.append(Conversation(conv["sample_id"], conv["sessions"], qs))
    return out


def parse_locomo_time(text: str) -> datetime | None:
    """'1:56 pm on 8 May, 2023' → an aware datetime (UTC), or None if unparseable."""
    for fmt in ("%I:%M %p on %d %B, %Y", "%I:%M %p on %d %b, %Y"):
        try:
            return datetime.strptime(text.strip(), fmt).replace(tzinfo=UTC)
        except ValueError:
            continue
    return None


def to_events(conv: Conversation, workspace_id: str) -> list[dict[str, Any]]:
    """One ``session.completed`` payload per LoCoMo session, turns verbatim, speaker as ``name``."""
    speakers: list[str] = []
    for s in conv.sessions:
        for t in s["turns"]:
            if t["speaker"] not in speakers:
                speakers.append(t["speaker"])
    events = []
    for s in conv.sessions:
        start = parse_locomo_time(s.get("date_time", ""))
        msgs = []
        for i, t in enumerate(s["turns"]):
            at = (start + timedelta(seconds=30 * i)) if start else None
            msgs.append({
                "role": "user" if speakers.index(t["speaker"]) == 0 else "assistant",
                "name": t["speaker"], "content": t["text"],
                "created_at": at.isoformat() if at else None,
                "metadata": {"dia_id": t["dia_id"]},
            })
        events.append({
            "workspace_id": workspace_id, "session_id": s["session_id"], "agent_id": "locomo",
            "user_id": speakers[0] if speakers else None, "messages": msgs,
            "started_at": start.isoformat() if start else None,
            "completed_at": (start + timedelta(seconds=30 * len(msgs))).isoformat() if start else None,
            "metadata": {"date_time": s.get("date_time"), "sample_id": conv.sample_id},
        })
    return events
