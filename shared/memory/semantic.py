"""Semantic extraction of a session: what each of its drawers says, as ``Sighting``s (no I/O here).

Two paths produce the same thing. Without an LLM, the pattern extractor reads each turn with the
session as context (who speaks, who is addressed, which words the session writes as names). With
one, a single call reads the whole session and answers JSON, which is validated item by item:
reasoning blocks and code fences are stripped, an entity or fact with an empty field or an unknown
turn is dropped with a warning, at most ``MAX_ENTITIES`` entities are kept, and the rest of the
answer stands. An answer with no readable JSON is a parse failure; the caller then keeps the
pattern extraction, so a failing model never costs the episode its graph.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from shared.memory.kg import MAX_NAME_CHARS, MAX_PREDICATE_CHARS, Sighting, normalize_name
from shared.memory.llm_labels import LlmParseError, outer_json_object, strip_wrappers
from shared.memory.relations import extract_graph, known_names

__all__ = ["MAX_ENTITIES", "Turn", "build_messages", "parse_answer", "pattern_sightings", "speaker_types"]

MAX_ENTITIES = 50
_MAX_TURN_CHARS = 2000

_SYSTEM = (
    "You build a knowledge graph from a conversation. Read the numbered turns and answer with JSON only: "
    '{"entities": [{"name": ..., "type": ..., "turn": N}], '
    '"triples": [{"source": ..., "relation": ..., "target": ..., "turn": N}]}. '
    "Entities are the people, pets, places, organisations, works, events and things named in a turn, as "
    "written there (without a leading article); turn is the number of the turn that names it. Triples are the "
    "facts a turn states, with pronouns resolved to names: 'I' is the turn's speaker, 'you' the person "
    "addressed. relation is a short snake_case verb (visited, attended, likes, owns, has_child, works_as, "
    f"member_of ...). At most {MAX_ENTITIES} entities. No opinions of the moment, no questions."
)


@dataclass(frozen=True)
class Turn:
    """A drawer of the session, as the extractors read it."""

    drawer_id: str
    speaker: str | None
    content: str
    said_at: datetime | None
    seq: int | None


def _addressee(speakers: Sequence[str], speaker: str | None) -> str | None:
    """"You" is the other speaker of a two-person conversation; with more, nobody in particular."""
    others = [s for s in speakers if s != speaker]
    return others[0] if len(speakers) == 2 and len(others) == 1 else None


def speaker_types(turns: Sequence[Turn]) -> dict[str, str]:
    """Normalised speaker name → 'person': what a fact's "I" stands for is a person."""
    return {normalize_name(t.speaker): "person" for t in turns if t.speaker}


def pattern_sightings(turns: Sequence[Turn], session_id: str | None) -> list[Sighting]:
    """The offline extractor over each turn, with the whole session as its context."""
    speakers = sorted({t.speaker for t in turns if t.speaker})
    known = known_names([t.content for t in turns], speakers)
    out = []
    for t in turns:
        ex = extract_graph(t.content, t.speaker, _addressee(speakers, t.speaker), speakers=speakers, known=known)
        if not ex.entities and not ex.triples:
            continue
        out.append(Sighting(
            drawer_id=t.drawer_id, said_at=t.said_at, session_id=session_id, seq=t.seq,
            entities=tuple((n, ty, c) for n, ty, c in ex.entities.values()),
            triples=tuple((x.source, x.relation, x.target, x.confidence) for x in ex.triples)))
    return out


def build_messages(turns: Sequence[Turn]) -> list[dict[str, str]]:
    """Chat messages asking for the session's graph; turns are numbered from 1 in order."""
    payload = [{"turn": i, "speaker": t.speaker or "unknown", "text": t.content[:_MAX_TURN_CHARS]}
               for i, t in enumerate(turns, start=1)]
    return [{"role": "system", "content": _SYSTEM},
            {"role": "user", "content": json.dumps(payload, ensure_ascii=False)}]


def _field(raw: dict[str, Any], key: str, limit: int) -> str | None:
    v = raw.get(key)
    if not isinstance(v, str):
        return None
    v = " ".join(v.split())
    return v if v and len(v) <= limit else None


def _turn(raw: dict[str, Any], n_turns: int) -> int | None:
    v = raw.get("turn")
    if isinstance(v, str) and v.strip().isdigit():
        v = int(v.strip())
    return v if isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= n_turns else None


def parse_answer(text: str, turns: Sequence[Turn], session_id: str | None,
                 confidence: float = 0.8) -> tuple[list[Sighting], list[str]]:
    """Sightings from the model's answer, and a warning for everything it dropped.

    Raises:
        LlmParseError: no JSON object with an entities or triples list in the answer.
    """
    data = outer_json_object(strip_wrappers(text))
    if not isinstance(data, dict) or not any(isinstance(data.get(k), list) for k in ("entities", "triples")):
        raise LlmParseError(f"no JSON object with entities or triples in the answer: {text[:120]!r}")
    warnings: list[str] = []
    ents: dict[int, dict[str, tuple[str, str, float]]] = {}
    kept = 0
    for raw in data.get("entities") or []:
        if not isinstance(raw, dict):
            warnings.append(f"dropped entity {str(raw)[:80]!r}: not an object")
            continue
        name, turn = _field(raw, "name", MAX_NAME_CHARS), _turn(raw, len(turns))
        if name is None or turn is None:
            warnings.append(f"dropped entity {str(raw)[:80]!r}: empty or overlong name, or no such turn")
            continue
        if kept >= MAX_ENTITIES:
            warnings.append(f"dropped entity {name[:80]!r}: more than {MAX_ENTITIES} entities")
            continue
        etype = (_field(raw, "type", 40) or "unknown").lower()
        if normalize_name(name) not in ents.setdefault(turn, {}):
            ents[turn][normalize_name(name)] = (name, etype, confidence)
            kept += 1
    facts: dict[int, list[tuple[str, str, str, float]]] = {}
    for raw in data.get("triples") or []:
        if not isinstance(raw, dict):
            warnings.append(f"dropped triple {str(raw)[:80]!r}: not an object")
            continue
        parts = (_field(raw, "source", MAX_NAME_CHARS), _field(raw, "relation", MAX_PREDICATE_CHARS),
                 _field(raw, "target", MAX_NAME_CHARS))
        turn = _turn(raw, len(turns))
        if any(p is None for p in parts) or turn is None:
            warnings.append(f"dropped triple {str(raw)[:80]!r}: empty source, relation or target, or no such turn")
            continue
        s, r, o = parts  # type: ignore[misc]
        facts.setdefault(turn, []).append((s, r, o, confidence))
    out = []
    for i, t in enumerate(turns, start=1):
        if i in ents or i in facts:
            out.append(Sighting(drawer_id=t.drawer_id, said_at=t.said_at, session_id=session_id, seq=t.seq,
                                entities=tuple(ents.get(i, {}).values()), triples=tuple(facts.get(i, []))))
    return out, warnings
