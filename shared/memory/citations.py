"""Citation pointers and snippets: how a result is shown and referred to.

A citation is ``wing/room/<first 12 hex of the drawer id>``: short enough for an agent to write
instead of quoting the memory, stable because drawer ids are content-derived (shared/ids.py), and
unambiguous in practice (48 bits: a collision among 100k drawers of one workspace has a probability
around 2e-5, and ``short_id`` is resolved within one workspace only).

``parse_citation`` reads one back (or a bare drawer id, or a longer prefix of it) so every interface
can accept a citation wherever it accepts a drawer id; the lookup itself is
``shared.db.drawer_admin.drawers_by_id_prefix``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["ID_LEN", "MIN_PREFIX_LEN", "SHORT_ID_LEN", "CitationRef", "cite", "parse_citation", "short_id", "snippet"]

SHORT_ID_LEN = 12
# The shortest id prefix accepted: shorter ones would match many drawers of a large workspace.
MIN_PREFIX_LEN = 8
ID_LEN = 32
_WS = re.compile(r"\s+")
_PAIRS = {"[": "]", "(": ")", "<": ">", "`": "`", "'": "'", '"': '"'}
_HEX = re.compile(rf"[0-9a-f]{{{MIN_PREFIX_LEN},{ID_LEN}}}")


@dataclass(frozen=True, slots=True)
class CitationRef:
    """A drawer reference as a caller wrote it: an id prefix (the whole id, or the citation's short id)
    and, from a citation, the wing and room it was filed in when it was cited."""

    id_prefix: str
    wing: str | None = None
    room: str | None = None


def parse_citation(ref: str) -> CitationRef:
    """Read ``wing/room/short-id`` (as ``cite`` writes it, also with the whole id), a bare drawer id or
    a prefix of one of at least ``MIN_PREFIX_LEN`` hex digits. Wing names may hold ``/``: the last
    segment is the id and the one before it the room. Surrounding whitespace and a pair of brackets or quotes (as an
    agent may quote ``[wing/room/id]``) are ignored; ValueError says what is wrong otherwise."""
    text = ref.strip()
    while len(text) > 1 and _PAIRS.get(text[0]) == text[-1]:
        text = text[1:-1].strip()
    parts = text.split("/")
    prefix = parts[-1].lower()
    if not _HEX.fullmatch(prefix):
        raise ValueError(f"not a drawer reference: {ref!r} (expected wing/room/<id>, a drawer id, or at least "
                         f"{MIN_PREFIX_LEN} hex digits of one)")
    if len(parts) == 1:
        return CitationRef(prefix)
    if len(parts) == 2 or not all(parts[:-1]):
        raise ValueError(f"not a citation: {ref!r} (expected wing/room/<id>)")
    return CitationRef(prefix, wing="/".join(parts[:-2]), room=parts[-2])


def short_id(drawer_id: str) -> str:
    return drawer_id[:SHORT_ID_LEN]


def cite(wing: str, room: str, drawer_id: str) -> str:
    """The citation pointer of a drawer."""
    return f"{wing}/{room}/{short_id(drawer_id)}"


def snippet(text: str, limit: int) -> str:
    """``text`` with whitespace collapsed, at most ``limit`` characters; a cut one ends in "…",
    at a word boundary when one is near (within the last fifth)."""
    if limit <= 0:
        return ""
    flat = _WS.sub(" ", text).strip()
    if len(flat) <= limit:
        return flat
    if limit == 1:
        return "…"
    cut = flat[: limit - 1]
    space = cut.rfind(" ")
    if space >= int(limit * 0.8):
        cut = cut[:space]
    return cut.rstrip() + "…"
