"""The palace graph: wings hold rooms, and a room filed under several wings is a tunnel between them.

Everything here derives from one aggregate, the live drawer count of every (wing, room) of a
workspace. That aggregate is a GROUP BY over all of the workspace's drawers, so it is cached per
workspace in the process and reused for as long as the workspace's layout version (a counter a
trigger bumps when drawers are added, removed, moved or merged; migration 0013) is unchanged:
a request then costs one primary-key read. The traversal, tunnel and statistics functions are
pure functions of the cached taxonomy.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field
from itertools import combinations

from psycopg_pool import AsyncConnectionPool

from shared.db.graph import graph_version, room_counts
from shared.db.tenancy import workspace_tx

__all__ = ["GraphStats", "PalaceGraph", "RoomVisit", "Taxonomy", "Tunnel", "find_tunnels", "graph_stats",
           "traverse"]


@dataclass(frozen=True)
class Taxonomy:
    """Wing → room → live drawer count, in name order (stable output for agents and tests)."""

    wings: dict[str, dict[str, int]]

    @classmethod
    def from_counts(cls, rows: list[tuple[str, str, int]]) -> Taxonomy:
        wings: dict[str, dict[str, int]] = {}
        for wing, room, n in sorted(rows):
            wings.setdefault(wing, {})[room] = n
        return cls(wings)

    @property
    def total(self) -> int:
        return sum(sum(rooms.values()) for rooms in self.wings.values())

    def wing_counts(self) -> dict[str, int]:
        return {w: sum(rooms.values()) for w, rooms in self.wings.items()}

    def room_wings(self) -> dict[str, list[str]]:
        """Each room name and the wings it is filed under, sorted."""
        out: dict[str, list[str]] = {}
        for wing, rooms in self.wings.items():
            for room in rooms:
                out.setdefault(room, []).append(wing)
        return {r: sorted(ws) for r, ws in sorted(out.items())}

    def rooms(self, wing: str | None = None) -> dict[str, int]:
        """Room → drawers, within one wing or summed over all wings."""
        if wing is not None:
            return dict(self.wings.get(wing, {}))
        out: dict[str, int] = {}
        for rooms in self.wings.values():
            for room, n in rooms.items():
                out[room] = out.get(room, 0) + n
        return dict(sorted(out.items()))


@dataclass(frozen=True)
class RoomVisit:
    room: str
    hop: int
    wings: list[str]
    drawers: int
    via_wing: str | None = None  # the shared wing that led here (None for the start room)


@dataclass(frozen=True)
class Tunnel:
    room: str
    wings: list[str]
    drawers: int


@dataclass(frozen=True)
class GraphStats:
    wings: int
    rooms: int
    drawers: int
    tunnels: int
    edges: int
    rooms_per_wing: dict[str, int] = field(default_factory=dict)


def traverse(tax: Taxonomy, start_room: str, max_hops: int = 2) -> list[RoomVisit]:
    """Breadth-first from ``start_room``: its wings lead to their other rooms (hop 1), those rooms'
    other wings to theirs (hop 2), and so on up to ``max_hops``. Empty when the room does not exist.
    Each room appears once, at its smallest hop; ties keep name order."""
    room_wings = tax.room_wings()
    if start_room not in room_wings:
        return []
    counts = tax.rooms()
    seen_rooms = {start_room}
    seen_wings: set[str] = set()
    out = [RoomVisit(start_room, 0, room_wings[start_room], counts[start_room])]
    frontier: deque[tuple[str, int]] = deque([(start_room, 0)])
    while frontier:
        room, hop = frontier.popleft()
        if hop >= max_hops:
            continue
        for wing in room_wings[room]:
            if wing in seen_wings:
                continue
            seen_wings.add(wing)
            for nxt in sorted(tax.wings[wing]):
                if nxt in seen_rooms:
                    continue
                seen_rooms.add(nxt)
                out.append(RoomVisit(nxt, hop + 1, room_wings[nxt], counts[nxt], via_wing=wing))
                frontier.append((nxt, hop + 1))
    return out


def find_tunnels(tax: Taxonomy, wing_a: str | None = None, wing_b: str | None = None) -> list[Tunnel]:
    """Rooms filed under two or more wings; with ``wing_a`` (and ``wing_b``), only rooms bridging
    those wings. Most drawers first, then by name."""
    counts = tax.rooms()
    out = [Tunnel(room, wings, counts[room]) for room, wings in tax.room_wings().items()
           if len(wings) > 1 and all(w is None or w in wings for w in (wing_a, wing_b))]
    return sorted(out, key=lambda t: (-t.drawers, t.room))


def graph_stats(tax: Taxonomy) -> GraphStats:
    """Counts of the graph whose nodes are rooms and whose edges join two rooms sharing a wing."""
    room_wings = tax.room_wings()
    edges: set[tuple[str, str]] = set()
    for rooms in tax.wings.values():
        edges.update(combinations(sorted(rooms), 2))
    return GraphStats(
        wings=len(tax.wings), rooms=len(room_wings), drawers=tax.total,
        tunnels=sum(1 for ws in room_wings.values() if len(ws) > 1), edges=len(edges),
        rooms_per_wing={w: len(rooms) for w, rooms in tax.wings.items()},
    )


@dataclass
class PalaceGraph:
    """Cached taxonomies, one per workspace, each tagged with the layout version it was built at."""

    pool: AsyncConnectionPool
    max_workspaces: int = 1024
    _cache: OrderedDict[str, tuple[int, Taxonomy]] = field(default_factory=OrderedDict)

    async def taxonomy(self, workspace_id: str) -> Taxonomy:
        async with workspace_tx(self.pool, workspace_id) as conn:
            # The version is read before the counts: a change committed between the two makes the
            # cached entry look older than it is (recomputed next time), never newer.
            version = await graph_version(conn, workspace_id)
            hit = self._cache.get(workspace_id)
            if hit is not None and hit[0] == version:
                self._cache.move_to_end(workspace_id)
                return hit[1]
            tax = Taxonomy.from_counts(await room_counts(conn, workspace_id))
        self._cache[workspace_id] = (version, tax)
        self._cache.move_to_end(workspace_id)
        while len(self._cache) > self.max_workspaces:
            self._cache.popitem(last=False)
        return tax

    async def traverse(self, workspace_id: str, start_room: str, max_hops: int = 2) -> list[RoomVisit]:
        return traverse(await self.taxonomy(workspace_id), start_room, max_hops)

    async def tunnels(self, workspace_id: str, wing_a: str | None = None, wing_b: str | None = None) -> list[Tunnel]:
        return find_tunnels(await self.taxonomy(workspace_id), wing_a, wing_b)

    async def stats(self, workspace_id: str) -> GraphStats:
        return graph_stats(await self.taxonomy(workspace_id))
