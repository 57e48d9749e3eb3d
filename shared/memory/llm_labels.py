"""The cold path's prompt and the strict reading of its answers (no I/O here).

Models wrap JSON in ``<think>`` blocks and code fences, invent ids, misspell types and return
half-valid items. Each item is validated field by field: what is valid is kept, what is not is
dropped with a warning, so one bad triple does not cost the drawer its type. Only an answer with
no readable JSON at all is a parse failure (the caller then asks again, one drawer per call).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from shared.memory.classify import MEMORY_TYPES

__all__ = ["LlmLabel", "LlmParseError", "ParsedBatch", "build_messages", "parse_batch", "strip_wrappers"]

_SYSTEM = (
    "You curate an AI agent's long-term memory. For each memory item, answer with its memory_type (one of "
    + ", ".join(MEMORY_TYPES)
    + "), importance (0 to 5), a one-line summary, the named entities in it ({\"name\", \"type\"}) and "
    "the facts it states as triples ({\"subject\", \"predicate\", \"object\"}). Answer with JSON only: "
    "{\"items\": [{\"id\": ..., \"memory_type\": ..., \"importance\": ..., \"summary\": ..., "
    "\"entities\": [...], \"triples\": [...]}]}, one entry per item id you were given, and no other ids."
)
_THINK = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)
_FENCE = re.compile(r"```(?:json|JSON)?\s*(.*?)```", re.DOTALL)
_MAX_SUMMARY = 300
_MAX_NAME = 200


class LlmParseError(ValueError):
    """The answer holds no readable JSON object of the expected shape."""


@dataclass
class LlmLabel:
    memory_type: str
    importance: float | None
    summary: str | None
    entities: list[tuple[str, str]] = field(default_factory=list)
    triples: list[tuple[str, str, str]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


@dataclass
class ParsedBatch:
    labels: dict[str, LlmLabel]
    warnings: list[str]


def build_messages(items: list[tuple[str, str]]) -> list[dict[str, str]]:
    """Chat messages asking for labels of (id, content) items."""
    payload = json.dumps([{"id": i, "content": c} for i, c in items], ensure_ascii=False)
    return [{"role": "system", "content": _SYSTEM}, {"role": "user", "content": payload}]


def strip_wrappers(text: str) -> str:
    """The answer without reasoning blocks (closed, or an unclosed one ending in JSON) and code fences."""
    text = _THINK.sub("", text)
    if "</think>" in text.lower():  # an opening tag the template swallowed: keep what follows the close
        text = text[text.lower().rindex("</think>") + len("</think>"):]
    m = _FENCE.search(text)
    return (m.group(1) if m else text).strip()


# Control characters but tab and line breaks: a model may answer "\u0000" inside a JSON string, and PostgreSQL
# refuses NUL in text, which failed the write of every label of the event, not only the bad one.
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def _printable(v: Any) -> Any:
    """The decoded answer with control characters removed from every string in it (keys included)."""
    if isinstance(v, str):
        return _CONTROL.sub("", v)
    if isinstance(v, list):
        return [_printable(x) for x in v]
    if isinstance(v, dict):
        return {_printable(k): _printable(x) for k, x in v.items()}
    return v


def outer_json_object(body: str) -> Any:
    """The JSON between the first '{' and the last '}' of an answer's body, or None when there is none
    or it does not parse: models often wrap the object in prose. Strings come without control characters."""
    start, end = body.find("{"), body.rfind("}")
    if start < 0 or end <= start:
        return None
    try:
        return _printable(json.loads(body[start:end + 1]))
    except json.JSONDecodeError:
        return None


def _load(text: str) -> Any:
    body = strip_wrappers(text)
    try:
        return _printable(json.loads(body))
    except json.JSONDecodeError:
        start, end = body.find("{"), body.rfind("}")
        if start < 0 or end <= start:
            raise LlmParseError(f"no JSON object in answer: {body[:120]!r}") from None
        try:
            return _printable(json.loads(body[start:end + 1]))
        except json.JSONDecodeError as e:
            raise LlmParseError(f"unreadable JSON: {e}") from None


def _str(v: Any, limit: int) -> str | None:
    return v.strip()[:limit] if isinstance(v, str) and v.strip() else None


def _item(raw: dict[str, Any], did: str) -> LlmLabel | None:
    warnings: list[str] = []
    mtype = raw.get("memory_type")
    mtype = mtype.strip().lower() if isinstance(mtype, str) else None
    if mtype not in MEMORY_TYPES:
        return None
    imp = raw.get("importance")
    importance: float | None = None
    if isinstance(imp, int | float) and not isinstance(imp, bool) and 0 <= float(imp) <= 5:
        importance = float(imp)
    elif imp is not None:
        warnings.append(f"{did}: importance {imp!r} out of range, kept the heuristic's")
    summary = _str(raw.get("summary"), _MAX_SUMMARY)
    if summary is not None:
        summary = summary.splitlines()[0]
    entities: list[tuple[str, str]] = []
    for e in raw.get("entities") or []:
        name = _str(e.get("name"), _MAX_NAME) if isinstance(e, dict) else _str(e, _MAX_NAME)
        if name is None:
            warnings.append(f"{did}: dropped entity {e!r}")
            continue
        etype = (_str(e.get("type"), 40) if isinstance(e, dict) else None) or "unknown"
        entities.append((name, etype.lower()))
    triples: list[tuple[str, str, str]] = []
    for t in raw.get("triples") or []:
        parts = tuple(_str(t.get(k), _MAX_NAME) for k in ("subject", "predicate", "object")) \
            if isinstance(t, dict) else (None,)
        if len(parts) != 3 or any(p is None for p in parts):
            warnings.append(f"{did}: dropped triple {t!r}")
            continue
        triples.append(parts)  # type: ignore[arg-type]
    return LlmLabel(mtype, importance, summary, entities, triples, warnings)


def parse_batch(text: str, ids: list[str]) -> ParsedBatch:
    """Labels for the ``ids`` that the answer labels validly; everything else is a warning.

    Raises:
        LlmParseError: no JSON object with an ``items`` list (or a bare list) in the answer.
    """
    data = _load(text)
    items = data.get("items") if isinstance(data, dict) else data
    if isinstance(data, dict) and items is None and "memory_type" in data and len(ids) == 1:
        items = [{**data, "id": data.get("id", ids[0])}]  # a single-item call answered with the bare item
    if not isinstance(items, list):
        raise LlmParseError("answer has no 'items' list")
    wanted = set(ids)
    labels: dict[str, LlmLabel] = {}
    warnings: list[str] = []
    for raw in items:
        did = raw.get("id") if isinstance(raw, dict) else None
        if not isinstance(did, str) or did not in wanted:
            warnings.append(f"ignored an item with an id that was not asked for: {str(did)[:80]!r}")
            continue
        if did in labels:
            warnings.append(f"{did}: answered twice, kept the first")
            continue
        label = _item(raw, did)
        if label is None:
            warnings.append(f"{did}: invalid memory_type {raw.get('memory_type')!r}")
            continue
        labels[did] = label
    return ParsedBatch(labels, warnings)
