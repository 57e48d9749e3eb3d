"""The memory layers an agent reads (MemPalace's stack), each within a character budget.

* L0 identity: who the agent is for this workspace, at most ``IDENTITY_MAX`` characters, set by a
  person; never truncated (a longer one is refused when it is written, so nobody loses a sentence
  they thought was kept).
* L1 essential story: the most important drawers (optionally of one wing), grouped by room.
* L2 on demand: the most important drawers of a wing and/or room.
* L3 search: hybrid recall (shared/recall.py), scored, explained and cited.

``wake_up`` = L0 + L1 (what an agent loads at the start of a session), ``recall_layer`` = L2,
``search`` = L3. Every drawer a layer returns is counted as accessed (shared/access.py), off the
read path. The rendered texts are what an agent puts into its context; the structured fields are
the same content for programs. Budgets count characters of the rendered text (``len``).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime

from psycopg_pool import AsyncConnectionPool

from shared.access import access_log
from shared.db.identity import set_identity
from shared.db.layers import LayerRow, drawers_by_importance, get_identity
from shared.db.search import SearchHit
from shared.db.tenancy import workspace_tx
from shared.limits import SEARCH_K_MAX
from shared.memory.citations import cite, short_id, snippet
from shared.recall import Recaller

__all__ = [
    "IDENTITY_MAX", "L1_BUDGET", "L1_DRAWERS", "L1_SNIPPET", "L2_BUDGET", "L2_DRAWERS", "L2_SNIPPET",
    "L3_BUDGET", "L3_DEFAULT_K", "L3_MAX_K", "MORE_MARKER", "Identity", "IdentityTooLong", "LayerDrawer",
    "Recall", "SearchLayer", "WakeUp", "get_workspace_identity", "recall_layer", "render_rooms",
    "render_search", "search", "set_workspace_identity", "wake_up",
]

IDENTITY_MAX = 400
L1_DRAWERS, L1_SNIPPET, L1_BUDGET = 15, 200, 2_000
L2_DRAWERS, L2_SNIPPET, L2_BUDGET = 10, 300, 1_200
L3_BUDGET, L3_DEFAULT_K, L3_MAX_K = 14_000, 5, SEARCH_K_MAX
MORE_MARKER = "… (more in search)"


class IdentityTooLong(ValueError):
    """An identity over ``IDENTITY_MAX`` characters: refused, never cut."""

    def __init__(self, length: int) -> None:
        super().__init__(f"identity is {length} characters; at most {IDENTITY_MAX} are kept, and an identity is "
                         "never truncated: shorten it")
        self.length = length


@dataclass(frozen=True)
class Identity:
    workspace_id: str
    text: str
    updated_at: datetime


@dataclass(frozen=True)
class LayerDrawer:
    """One drawer as a layer shows it."""

    id: str
    citation: str
    wing: str
    room: str
    snippet: str
    importance: float
    memory_type: str | None
    occurred_at: datetime | None


@dataclass(frozen=True)
class WakeUp:
    """L0 + L1. ``text`` is ``identity`` then ``essential``, separated by a blank line when both exist."""

    workspace_id: str
    wing: str | None
    identity: str | None
    essential: str  # L1 rendered, at most L1_BUDGET characters
    drawers: list[LayerDrawer]  # the L1 drawers ``essential`` shows, in its order
    truncated: bool  # L1 held more than its budget shows (the text ends with MORE_MARKER)
    text: str


@dataclass(frozen=True)
class Recall:
    """L2."""

    workspace_id: str
    wing: str | None
    room: str | None
    drawers: list[LayerDrawer]
    truncated: bool
    text: str  # at most L2_BUDGET characters


@dataclass(frozen=True)
class SearchLayer:
    """L3: the hits (best first, each scored 0–1, explained and cited) and their rendering."""

    workspace_id: str
    query: str
    hits: list[SearchHit]
    truncated: bool
    text: str  # at most L3_BUDGET characters


def _layer_drawer(r: LayerRow, limit: int) -> LayerDrawer:
    text = snippet(r.content, limit)
    if r.longer and not text.endswith("…"):  # only a prefix was read, and it collapsed under the limit
        text = snippet(text + " …", limit)
    return LayerDrawer(r.id, cite(r.wing, r.room, r.id), r.wing, r.room, text, r.importance, r.memory_type,
                       r.occurred_at)


def render_rooms(title: str, drawers: list[LayerDrawer], budget: int) -> tuple[str, list[LayerDrawer], bool]:
    """Drawers grouped under ``[wing/room]`` headings, rooms ordered by their most important drawer (then
    name), drawers by importance within a room; each line ends with the drawer's short id, which with the
    heading is its citation. What fits ``budget`` is chosen across rooms, most important first (a room's
    heading counted with its first drawer), so no drawer is left out while a less important one is shown:
    chosen room by room, a room full of minor drawers pushed out a more important one of the next room.
    When any is left out the text ends with MORE_MARKER. Returns (text, the drawers shown, whether any
    was left out)."""
    reserve = 1 + len(MORE_MARKER)
    size = len(title)
    chosen: dict[tuple[str, str], list[LayerDrawer]] = {}
    cut = False
    for d in sorted(drawers, key=lambda d: (-d.importance, d.wing, d.room, d.id)):
        key = (d.wing, d.room)
        cost = len(f"- {d.snippet} ({short_id(d.id)})") + 1 + (0 if key in chosen else len(f"[{d.wing}/{d.room}]") + 1)
        if size + cost + reserve > budget:
            cut = True
            break
        chosen.setdefault(key, []).append(d)
        size += cost
    lines = [title]
    shown: list[LayerDrawer] = []
    for key in sorted(chosen, key=lambda k: (-max(d.importance for d in chosen[k]), k)):
        lines.append(f"[{key[0]}/{key[1]}]")
        for d in chosen[key]:  # already by importance, then id
            lines.append(f"- {d.snippet} ({short_id(d.id)})")
            shown.append(d)
    if cut:
        lines.append(MORE_MARKER)
    return "\n".join(lines), shown, cut


async def get_workspace_identity(pool: AsyncConnectionPool, workspace_id: str) -> Identity | None:
    """L0: the workspace's identity, or None when none was set."""
    async with workspace_tx(pool, workspace_id) as conn:
        row = await get_identity(conn, workspace_id)
    return Identity(workspace_id, row[0], row[1]) if row else None


async def set_workspace_identity(pool: AsyncConnectionPool, workspace_id: str, text: str, *,
                                 actor: str = "api") -> Identity:
    """Set L0, audited like every identity change (the previous text in memory_history). Raises
    IdentityTooLong over IDENTITY_MAX characters and ValueError when blank."""
    text = text.strip()
    if not text:
        raise ValueError("identity is empty")
    if len(text) > IDENTITY_MAX:
        raise IdentityTooLong(len(text))
    async with workspace_tx(pool, workspace_id) as conn:
        _, at = await set_identity(conn, workspace_id, text, actor=actor,
                                   event_id=f"{actor}-identity:{uuid.uuid4().hex}")
    return Identity(workspace_id, text, at)


async def wake_up(pool: AsyncConnectionPool, workspace_id: str, wing: str | None = None) -> WakeUp:
    """L0 + L1: the identity and the ``L1_DRAWERS`` most important drawers (of ``wing`` if given),
    grouped by room, 200 characters a snippet, at most ``L1_BUDGET`` characters."""
    async with workspace_tx(pool, workspace_id) as conn:
        ident = await get_identity(conn, workspace_id)
        rows = await drawers_by_importance(conn, workspace_id, wing=wing, limit=L1_DRAWERS,
                                           prefix_chars=L1_SNIPPET * 2)
    title = "## L1 — essential story" + (f" ({wing})" if wing else "")
    essential, shown, cut = render_rooms(title, [_layer_drawer(r, L1_SNIPPET) for r in rows], L1_BUDGET)
    if not shown and not cut:
        essential = ""
    identity = ident[0] if ident else None
    text = "\n\n".join(x for x in (identity, essential) if x)
    if shown:
        access_log(pool).note(workspace_id, [d.id for d in shown])
    return WakeUp(workspace_id, wing, identity, essential, shown, cut, text)


async def recall_layer(pool: AsyncConnectionPool, workspace_id: str, wing: str | None = None,
                       room: str | None = None) -> Recall:
    """L2: the ``L2_DRAWERS`` most important drawers of a wing and/or room, 300 characters a snippet, at
    most ``L2_BUDGET`` characters."""
    async with workspace_tx(pool, workspace_id) as conn:
        rows = await drawers_by_importance(conn, workspace_id, wing=wing, room=room, limit=L2_DRAWERS,
                                           prefix_chars=L2_SNIPPET * 2)
    where = "/".join(x for x in (wing, room) if x) or "all"
    text, shown, cut = render_rooms(f"## L2 — {where}", [_layer_drawer(r, L2_SNIPPET) for r in rows], L2_BUDGET)
    if not shown and not cut:
        text = ""
    if shown:
        access_log(pool).note(workspace_id, [d.id for d in shown])
    return Recall(workspace_id, wing, room, shown, cut, text)


def render_search(query: str, hits: list[SearchHit], budget: int = L3_BUDGET) -> tuple[str, list[SearchHit], bool]:
    """Hits as ``[n] citation (score s)`` then their content, best first, within ``budget`` characters: a
    content that does not fit whole is cut (ending "…") when at least 80 of its characters fit, and the
    text ends with MORE_MARKER when anything was cut or left out. Returns (text, hits shown, cut)."""
    title = f"## L3 — search: {snippet(query, 200)}"
    reserve = 1 + len(MORE_MARKER)
    lines, size, shown, cut = [title], len(title), [], False
    for n, h in enumerate(hits, 1):
        head = f"[{n}] {h.citation} (score {h.score:.2f})"
        room_left = budget - size - reserve - (len(head) + 2)
        if room_left < 80:
            cut = True
            break
        body = snippet(h.content, room_left)
        cut = cut or len(body) < len(" ".join(h.content.split()))
        lines += [head, body]
        size += len(head) + len(body) + 2
        shown.append(h)
    if cut:
        lines.append(MORE_MARKER)
    return "\n".join(lines), shown, cut


async def search(recaller: Recaller, workspace_id: str, query: str, k: int = L3_DEFAULT_K) -> SearchLayer:
    """L3: hybrid recall, best first by a 0–1 relevance, each hit explained and cited; the rendering holds
    at most ``L3_BUDGET`` characters. ``k`` is 1..L3_MAX_K (ValueError otherwise)."""
    if not 1 <= k <= L3_MAX_K:
        raise ValueError(f"k must be between 1 and {L3_MAX_K}")
    hits = await recaller.search(workspace_id, query, k)
    text, shown, cut = render_search(query, hits)
    return SearchLayer(workspace_id, query, shown, cut, text)
