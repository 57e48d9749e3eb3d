"""Write decisions (pure): what a new drawer's fact does to the memories it resembles.

ADD keeps it as a new memory, UPDATE rewrites a candidate with the new fact, DELETE retires a
candidate the fact makes obsolete, NONE says the store already holds it. Peers that apply such
decisions blindly lose data; here every proposal must name one of its candidates, give a reason and
clear the confidence gate, and what the mode does not allow is recorded and held, never applied.
Content is normalised and hashed as in Signet, so an exact restatement is NONE without an LLM call.
"""

from __future__ import annotations

import hashlib
import json
import re
import unicodedata
from dataclasses import dataclass
from functools import lru_cache

from shared.memory.llm_labels import LlmParseError, outer_json_object, strip_wrappers

__all__ = ["ACTIONS", "MODES", "Proposal", "build_messages", "content_hash", "normalise", "outcome_for",
           "parse_proposal", "validate"]

ACTIONS = ("ADD", "UPDATE", "DELETE", "NONE")
MODES = ("shadow", "controlled-write", "full")
_SPACE = re.compile(r"\s+")
_EDGE = re.compile(r"^[\W_]+|[\W_]+$")


@dataclass(frozen=True)
class Proposal:
    action: str
    target: str | None
    reason: str
    confidence: float
    content: str | None = None  # UPDATE: the target's new text
    source: str = "llm"  # llm | rule


def normalise(text: str) -> str:
    """NFKC, lower case, single spaces, no punctuation at either end."""
    return _EDGE.sub("", _SPACE.sub(" ", unicodedata.normalize("NFKC", text).lower()).strip())


@lru_cache(maxsize=4096)
def content_hash(text: str) -> str:
    """SHA-256 of the normalised text. Kept for recent texts: cluster compares each new drawer with
    its neighbours, and the neighbours of one session's drawers are largely the same drawers."""
    return hashlib.sha256(normalise(text).encode()).hexdigest()


_SYSTEM = (
    "You maintain an agent's long-term memory. Given a new fact and existing candidate memories (with ids), "
    "decide one action: ADD (new information), UPDATE (a candidate should be rewritten to include the new "
    "fact; give its full new text in \"content\"), DELETE (the new fact makes a candidate obsolete), or NONE "
    "(already known). Answer with JSON only: {\"action\": ..., \"target_id\": <candidate id or null>, "
    "\"reason\": \"one line\", \"confidence\": 0..1, \"content\": <for UPDATE>}."
)


def build_messages(fact: str, candidates: list[tuple[str, str]]) -> list[dict[str, str]]:
    payload = {"fact": fact, "candidates": [{"id": i, "content": c} for i, c in candidates]}
    return [{"role": "system", "content": _SYSTEM}, {"role": "user", "content": json.dumps(payload)}]


def parse_proposal(text: str) -> Proposal:
    """Raises LlmParseError when the answer holds no proposal object."""
    body = strip_wrappers(text)
    data = outer_json_object(body)
    if not isinstance(data, dict) or not isinstance(data.get("action"), str):
        raise LlmParseError(f"no decision in answer: {body[:120]!r}")
    conf = data.get("confidence")
    target = data.get("target_id")
    content = data.get("content")
    return Proposal(
        action=data["action"].strip().upper(), target=target if isinstance(target, str) else None,
        reason=data["reason"].strip()[:300] if isinstance(data.get("reason"), str) else "",
        confidence=float(conf) if isinstance(conf, int | float) and not isinstance(conf, bool) else 0.0,
        content=content.strip() if isinstance(content, str) and content.strip() else None,
    )


def validate(p: Proposal, candidate_ids: set[str], *, gate: float) -> str | None:
    """Why the proposal must be dropped, or None when it may proceed."""
    if p.action not in ACTIONS:
        return f"unknown action {p.action!r}"
    if not p.reason:
        return "no reason given"
    if p.confidence < gate:
        return f"confidence {p.confidence:.2f} under the gate {gate:.2f}"
    if p.action in ("UPDATE", "DELETE", "NONE") and p.target not in candidate_ids:
        return f"target {str(p.target)[:80]!r} is not one of the candidates"
    if p.action == "UPDATE" and not p.content:
        return "UPDATE without the new content"
    return None


def outcome_for(mode: str, action: str) -> str:
    """applied | held | shadow: what the mode lets this action do."""
    if mode == "shadow":
        return "shadow"
    if mode == "controlled-write" and action in ("UPDATE", "DELETE"):
        return "held"
    return "applied"
