"""Pattern-based entity extraction (the no-LLM fallback): capitalised names, known speakers,
technology-like tokens. Entity ids come from the normalised name, so every mention of "PostgreSQL"
in a workspace lands on one entity."""

from __future__ import annotations

import re

from shared.memory.episodes import STOPWORDS
from shared.memory.kg import entity_id, normalize_name

__all__ = ["entity_id", "extract_entities", "normalize_name"]

_CAP_SEQ = re.compile(r"\b([A-ZÀ-ÖØ-Þ][\w&'-]+(?:\s+(?:of\s+|de\s+|van\s+)?[A-ZÀ-ÖØ-Þ][\w&'-]+){0,3})")
_TECH = re.compile(r"\b([a-z]+[A-Z][A-Za-z0-9]+|[A-Za-z]+\d+[A-Za-z0-9]*|[a-z]+(?:\.js|\.py|DB|SQL))\b")
_SENT_START = re.compile(r"(?:^|[.!?]\s+|\n)$")
_NOT_NAMES = frozenset({"i", "i'm", "i've", "i'll", "i'd", "ok", "okay", "monday", "tuesday", "wednesday",
                        "thursday", "friday", "saturday", "sunday", "hey", "hi", "hello", "thanks", "yes", "no",
                        "wow", "oh", "sure", "great", "good", "nice", "so", "and", "but", "the", "that", "this"})


def extract_entities(text: str, speakers: tuple[str, ...] = ()) -> list[tuple[str, str]]:
    """(name, type) pairs found in ``text``; type is 'person' for known speakers, else 'concept'."""
    found: dict[str, tuple[str, str]] = {}
    for sp in speakers:
        if sp and re.search(rf"\b{re.escape(sp)}\b", text):
            found[normalize_name(sp)] = (sp, "person")
    for m in _CAP_SEQ.finditer(text):
        name = m.group(1).strip(".'-")
        words = name.split()
        if _SENT_START.search(text[: m.start()]) and len(words) == 1 and words[0].lower() in (STOPWORDS | _NOT_NAMES):
            continue
        if name.lower() in _NOT_NAMES or name.lower() in STOPWORDS or len(name) < 2:
            continue
        key = normalize_name(name)
        found.setdefault(key, (name, "person" if name in speakers else "concept"))
    for m in _TECH.finditer(text):
        key = normalize_name(m.group(1))
        found.setdefault(key, (m.group(1), "technology"))
    return list(found.values())
