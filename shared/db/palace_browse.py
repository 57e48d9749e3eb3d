"""Palace browser reads: a room's drawers a page at a time, and one drawer with its provenance
(the raw session and messages it was filed from, the chunk positions) and its audit history.

Every statement is bounded by the index it walks: pages by keyset on ``drawers_room_pages``
(migration 0014), a drawer and its session by primary key, its sources and history by their
primary-key/drawer index, messages by a sequence range of the session's primary key, each with a
LIMIT, so no request reads more than its caps whatever the size of the workspace.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg import AsyncConnection
from psycopg.rows import dict_row

__all__ = [
    "DrawerDetail",
    "DrawerRow",
    "HistoryRow",
    "MessageRow",
    "SessionRow",
    "SourceRow",
    "drawer_detail",
    "drawer_history",
    "drawer_sources",
    "room_drawers",
    "session_messages",
    "session_of",
]


@dataclass(frozen=True)
class DrawerRow:
    """A drawer as a room listing shows it."""

    id: str
    content: str
    wing: str
    room: str
    hall: str | None
    memory_type: str | None
    importance: float
    speaker: str | None
    occurred_at: datetime | None
    filed_at: datetime


@dataclass(frozen=True)
class DrawerDetail(DrawerRow):
    state: str
    summary: str | None
    session_id: str | None
    seq: int | None
    role: str | None
    agent_id: str | None
    source: str
    access_count: int
    last_accessed_at: datetime | None
    deleted_at: datetime | None
    superseded_by: str | None


@dataclass(frozen=True)
class SourceRow:
    session_id: str
    seq: int
    chunk_index: int
    char_start: int
    char_end: int
    revision: int | None = None


@dataclass(frozen=True)
class SessionRow:
    session_id: str
    agent_id: str | None
    user_id: str | None
    started_at: datetime | None
    completed_at: datetime | None
    message_count: int
    received_at: datetime


@dataclass(frozen=True)
class MessageRow:
    seq: int
    role: str
    name: str | None
    content: str
    created_at: datetime | None
    is_noise: bool
    revision: int = 0


@dataclass(frozen=True)
class HistoryRow:
    id: str
    action: str
    actor: str
    reason: str | None
    old_value: Any
    new_value: Any
    event_id: str | None
    created_at: datetime


_LIST_COLS = "id, content, wing, room, hall, memory_type, importance, speaker, occurred_at, filed_at"


async def room_drawers(
    conn: AsyncConnection[Any], workspace_id: str, wing: str, room: str, *, limit: int,
    after: tuple[datetime, str] | None = None,
) -> list[DrawerRow]:
    """Live drawers of one room, newest filed first, at most ``limit``; ``after`` is the (filed_at, id)
    of the last drawer of the previous page. Row comparison on the index's own order keeps each page
    an index range (drawers_room_pages)."""
    where = "" if after is None else " AND (filed_at, id) < (%(at)s, %(aid)s)"
    cur = await conn.execute(
        f"""SELECT {_LIST_COLS} FROM drawers
             WHERE workspace_id = %(ws)s AND wing = %(wing)s AND room = %(room)s
               AND deleted_at IS NULL AND state <> 'merged'{where}
             ORDER BY filed_at DESC, id DESC LIMIT %(n)s""",  # noqa: S608 - constant fragments only
        {"ws": workspace_id, "wing": wing, "room": room, "n": limit,
         "at": after[0] if after else None, "aid": after[1] if after else None},
    )
    return [DrawerRow(*r) for r in await cur.fetchall()]


async def drawer_detail(conn: AsyncConnection[Any], workspace_id: str, drawer_id: str) -> DrawerDetail | None:
    """One drawer by primary key, deleted or not (a deleted one can still be inspected and restored)."""
    cur = await conn.execute(
        f"""SELECT {_LIST_COLS}, state, summary, session_id, seq, role, agent_id, source, access_count,
                   last_accessed_at, deleted_at, superseded_by
              FROM drawers WHERE workspace_id = %s AND id = %s""",  # noqa: S608 - constant columns
        (workspace_id, drawer_id),
    )
    row = await cur.fetchone()
    return DrawerDetail(*row) if row else None


async def drawer_sources(conn: AsyncConnection[Any], workspace_id: str, drawer_id: str, *, limit: int) -> list[
        SourceRow]:
    """Every place the drawer's text was seen (an exact repeat is one drawer with several sources)."""
    cur = await conn.execute(
        """SELECT session_id, seq, chunk_index, char_start, char_end, revision FROM drawer_sources
            WHERE workspace_id = %s AND drawer_id = %s
            ORDER BY session_id, seq, chunk_index LIMIT %s""",
        (workspace_id, drawer_id, limit),
    )
    return [SourceRow(*r) for r in await cur.fetchall()]


async def session_of(conn: AsyncConnection[Any], workspace_id: str, session_id: str) -> SessionRow | None:
    cur = await conn.execute(
        """SELECT session_id, agent_id, user_id, started_at, completed_at, message_count, received_at
             FROM sessions WHERE workspace_id = %s AND session_id = %s""",
        (workspace_id, session_id),
    )
    row = await cur.fetchone()
    return SessionRow(*row) if row else None


async def session_messages(
    conn: AsyncConnection[Any], workspace_id: str, session_id: str, *, first_seq: int, last_seq: int, limit: int,
) -> list[MessageRow]:
    """The raw messages of a session from ``first_seq`` to ``last_seq`` (a range of its primary key),
    at most ``limit``, in order."""
    cur = await conn.execute(
        """SELECT seq, role, name, content, created_at, is_noise, revision FROM messages
            WHERE workspace_id = %s AND session_id = %s AND seq BETWEEN %s AND %s
            ORDER BY seq LIMIT %s""",
        (workspace_id, session_id, first_seq, last_seq, limit),
    )
    return [MessageRow(*r) for r in await cur.fetchall()]


async def drawer_history(conn: AsyncConnection[Any], workspace_id: str, drawer_id: str, *, limit: int) -> list[
        HistoryRow]:
    """The drawer's audit trail (memory_history), newest first (index memory_history_drawer)."""
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(
            """SELECT id, action, actor, reason, old_value, new_value, event_id, created_at FROM memory_history
                WHERE workspace_id = %s AND drawer_id = %s ORDER BY created_at DESC LIMIT %s""",
            (workspace_id, drawer_id, limit),
        )
        return [HistoryRow(**r) for r in await cur.fetchall()]
