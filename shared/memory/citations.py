"""Citation pointers and snippets: how a result is shown and referred to.

A citation is ``wing/room/<first 12 hex of the drawer id>``: short enough for an agent to write
instead of quoting the memory, stable because drawer ids are content-derived (shared/ids.py), and
unambiguous in practice (48 bits: a collision among 100k drawers of one workspace has a probability
around 2e-5, and ``short_id`` is resolved within one workspace only).
"""

from __future__ import annotations

import re

__all__ = ["SHORT_ID_LEN", "cite", "short_id", "snippet"]

SHORT_ID_LEN = 12
_WS = re.compile(r"\s+")


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
