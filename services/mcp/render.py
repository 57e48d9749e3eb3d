"""What the model reads of a tool's answer, as text: the structured result stays for the client application.

The SDK turns a structured result into its JSON, field by field: a search of five hits was ten fields a hit
(ids, wing, room, session, types, ISO timestamps) around the five texts the model needed. Each hit is one
header line (citation, score, who, when) and its words.
"""

from __future__ import annotations

import textwrap
from datetime import datetime

from shared.inject import CLOSE, OPEN, as_data
from shared.palace_ops import EpisodeHit, Hit

__all__ = ["as_memory_block", "render_search"]

_EPISODE_DRAWERS = 5  # citations listed per conversation (all of them are in the structured result)


def as_memory_block(text: str) -> str:
    """Memories the model will keep in its context, as data: inside ``<memory_context>``, with ``&``, ``<``
    and ``>`` as entities, as memory_inject's block (a memory holds whatever was said, a forged instruction or
    a closing tag included). Empty stays empty."""
    return f"{OPEN}\n{as_data(text)}\n{CLOSE}" if text else ""


def _when(at: datetime | None) -> str | None:
    return at.strftime("%Y-%m-%d %H:%M %Z").strip() if at is not None else None


def _quoted(text: str) -> str:
    """A memory's words, every line indented: a stored text's own line breaks cannot start a line that reads
    as another hit's header (with a citation, a score and a speaker of its own choosing)."""
    return textwrap.indent(text, "    ", lambda _: True)


def render_search(query: str, hits: list[Hit], episodes: list[EpisodeHit] | None, *, threshold: float) -> str:
    """Hits best first, then the conversations, as the model should read them; ``threshold`` is the
    relevance under which a hit is usually unrelated (the deployment's inject threshold)."""
    if not hits and not episodes:
        return f"No memory matched {query!r}."
    lines = [f"Memories for {query!r}, best first (relevance 0-1; under about {threshold:g} usually unrelated):"]
    for n, h in enumerate(hits, 1):
        head = " · ".join(x for x in (h.citation, f"score {h.score:.2f}", h.speaker, _when(h.occurred_at),
                                      f"session {h.session_id}" if h.session_id else None) if x)
        lines += ["", f"[{n}] {head}", _quoted(h.content)]
    if episodes:
        lines += ["", "Past conversations, nearest first:"]
        for e in episodes:
            span = " → ".join(d for d in dict.fromkeys((_when(e.started_at), _when(e.completed_at))) if d)
            head = " · ".join(x for x in (f"session {e.session_id}", f"score {e.score:.2f}", span) if x)
            more = e.drawer_count - min(len(e.drawers), _EPISODE_DRAWERS)
            cites = ", ".join(e.drawers[:_EPISODE_DRAWERS]) + (f" and {more} more" if more > 0 else "")
            lines += ["", f"- {head}", _quoted(e.abstract), f"    memories: {cites or 'none'}"]
    return "\n".join(lines)
