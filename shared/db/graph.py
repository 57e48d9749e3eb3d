"""Palace graph SQL: the per-workspace layout version and the wing/room drawer counts it guards."""

from __future__ import annotations

from typing import Any

from psycopg import AsyncConnection

__all__ = ["graph_version", "room_counts"]


async def graph_version(conn: AsyncConnection[Any], workspace_id: str) -> int:
    """The workspace's layout version (migration 0013's trigger bumps it); 0 before its first drawer."""
    cur = await conn.execute(
        "SELECT version FROM palace_graph_versions WHERE workspace_id = %s", (workspace_id,))
    row = await cur.fetchone()
    return int(row[0]) if row else 0


async def room_counts(conn: AsyncConnection[Any], workspace_id: str) -> list[tuple[str, str, int]]:
    """(wing, room, live drawers) for every room of the workspace: what the taxonomy is built from.

    Live means not deleted and not merged into a twin, the drawers search can return.
    """
    cur = await conn.execute(
        """SELECT wing, room, count(*) FROM drawers
            WHERE workspace_id = %s AND deleted_at IS NULL AND state <> 'merged'
            GROUP BY wing, room ORDER BY wing, room""",
        (workspace_id,),
    )
    return [(str(w), str(r), int(n)) for w, r, n in await cur.fetchall()]
