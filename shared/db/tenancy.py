"""Transactions scoped to one workspace, enforced by PostgreSQL row-level security (migration 0003).

Every query a service runs goes through one of these, so the database itself refuses rows of other
workspaces even where a query forgets its own ``workspace_id`` filter. The setting is transaction
local (``set_config(..., true)``): a pooled connection never carries a workspace into its next use.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import psycopg
from psycopg import AsyncConnection, sql
from psycopg_pool import AsyncConnectionPool
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_exponential_jitter

__all__ = ["WRITE_CONFLICTS", "act_as_maintenance", "begun_with", "holds_lock", "key_lookup_tx", "maintenance_tx",
           "retry_conflicts", "scope_to_workspace", "scoped_rows", "scoped_statement",
           "workspace_tx", "workspace_write", "workspaces_tx"]

T = TypeVar("T")

# What PostgreSQL answers when it rolls a transaction back for a conflict with another one: running the
# same transaction again is the remedy.
WRITE_CONFLICTS = (psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure)


_SCOPE = "SELECT set_config('palace.workspace_id', {}, true)"
_IDLE = psycopg.pq.TransactionStatus.IDLE
# The transaction-level locks each connection's current transaction (one begun here) took with its BEGIN, by
# name: a later request for one of them needs no round trip. Cleared when the transaction ends.
_held: weakref.WeakKeyDictionary[AsyncConnection[Any], set[str]] = weakref.WeakKeyDictionary()


def holds_lock(conn: AsyncConnection[Any], name: str) -> bool:
    """Whether ``conn``'s current transaction already holds the transaction-level lock ``name``."""
    return name in _held.get(conn, ())


async def scope_to_workspace(conn: AsyncConnection[Any], workspace_id: str) -> None:
    """Let the connection's current transaction see and write ``workspace_id`` only (until it ends)."""
    await conn.execute("SELECT set_config('palace.workspace_id', %s, true)", (workspace_id,))


async def _hand_back(conn: AsyncConnection[Any]) -> None:
    """Ready a connection switched to autocommit for one transaction to go back to the pool as it came
    (autocommit off); one left mid-statement (a cancelled caller) or broken is closed, and the pool
    replaces it."""
    if conn.closed:
        return
    if conn.info.transaction_status == _IDLE:
        await conn.set_autocommit(False)
    else:
        await conn.close()


@asynccontextmanager
async def begun_with(conn: AsyncConnection[Any], first: sql.Composable) -> AsyncIterator[AsyncConnection[Any]]:
    """A transaction on an idle pooled connection whose BEGIN travels with its first statement (``first``,
    parameters bound client-side) in one round trip; commits on success, rolls back on an error.

    Why: a round trip, not the statement's work, is most of what a short transaction costs both
    processes (a send, a wake-up of the server process, a wait), and psycopg's ``transaction()`` sends
    BEGIN on its own before the statement that scopes the transaction. The two go here as one
    simple-protocol string on a connection switched to autocommit for the duration, so psycopg adds no
    BEGIN of its own; ``conn.transaction()`` inside the block makes a savepoint, as it would inside
    ``transaction()``. Afterwards the connection goes back to the pool as it came (autocommit off); one
    left mid-statement (a cancelled handler) or broken is closed, and the pool replaces it.
    """
    await conn.set_autocommit(True)
    try:
        await conn.execute(sql.SQL("BEGIN; ") + first)
        _held[conn] = set()
        try:
            yield conn
        except BaseException:
            if conn.info.transaction_status != _IDLE:
                with contextlib.suppress(psycopg.Error):  # a connection lost mid-way: its server rolled back
                    await conn.rollback()
            raise
        await conn.commit()
    finally:
        _held.pop(conn, None)
        await _hand_back(conn)


async def scoped_statement(pool: AsyncConnectionPool, workspace_id: str, query: str, params: dict[str, Any]) -> int:
    """One statement in a transaction of its own that sees only ``workspace_id``, in one round trip;
    returns its row count. ``query`` takes ``%(name)s`` parameters, bound client-side.

    The scope and the statement go as one simple-protocol string on an idle connection in autocommit, so
    PostgreSQL runs them as one implicit transaction (an error anywhere rolls back both): one round trip
    where ``workspace_tx`` needs three (BEGIN with the scope, the statement, COMMIT)."""
    return (await _scoped(pool, workspace_id, query, params, fetch=False))[0]


async def scoped_rows(pool: AsyncConnectionPool, workspace_id: str, query: str,
                      params: dict[str, Any]) -> list[tuple[Any, ...]]:
    """``scoped_statement`` for a read: its rows."""
    return (await _scoped(pool, workspace_id, query, params, fetch=True))[1]


async def _scoped(pool: AsyncConnectionPool, workspace_id: str, query: str, params: dict[str, Any], *,
                  fetch: bool) -> tuple[int, list[tuple[Any, ...]]]:
    if not workspace_id:
        raise ValueError("a workspace transaction needs a workspace id")
    async with pool.connection() as conn:
        await conn.set_autocommit(True)
        try:
            async with psycopg.AsyncClientCursor(conn) as cur:
                await cur.execute("SELECT set_config('palace.workspace_id', %(palace_workspace)s, true);\n" + query,
                                  {**params, "palace_workspace": workspace_id})
                cur.nextset()
                return cur.rowcount, (await cur.fetchall() if fetch else [])
        finally:
            await _hand_back(conn)


@asynccontextmanager
async def workspace_tx(pool: AsyncConnectionPool, workspace_id: str, *,
                       lock: tuple[str, sql.Composable] | None = None) -> AsyncIterator[AsyncConnection[Any]]:
    """One transaction that can only see and write ``workspace_id``; commits on success. ``lock``: a
    transaction-level lock to take with the BEGIN, in the same round trip (its name for ``holds_lock``
    and the statement that takes it, which runs after the scope, with a snapshot of its own)."""
    if not workspace_id:
        raise ValueError("a workspace transaction needs a workspace id")
    first = sql.SQL(_SCOPE).format(workspace_id)
    if lock is not None:
        first = first + sql.SQL("; ") + lock[1]
    async with pool.connection() as conn, begun_with(conn, first):
        if lock is not None:
            _held[conn].add(lock[0])  # taken with the BEGIN, outside any savepoint: held to the end
        yield conn


@asynccontextmanager
async def workspaces_tx(
    pool: AsyncConnectionPool,
) -> AsyncIterator[Callable[[str], Awaitable[AsyncConnection[Any]]]]:
    """One transaction for a batch of events from several workspaces, seeing one workspace at a time:
    ``conn = await scope(ws)`` points row-level security at ``ws`` for the statements that follow, until
    the next call. One BEGIN, one COMMIT and one connection for the whole batch instead of a transaction
    per event; commits on success. Only for work with no call to the network between its statements."""

    async with pool.connection() as conn, contextlib.AsyncExitStack() as stack:
        current: list[str] = []  # the workspace the transaction sees now; empty until it begins

        async def scope(workspace_id: str) -> AsyncConnection[Any]:
            if not workspace_id:
                raise ValueError("a workspace transaction needs a workspace id")
            if not current:  # the first scope travels with the BEGIN (begun_with)
                await stack.enter_async_context(begun_with(conn, sql.SQL(_SCOPE).format(workspace_id)))
            elif current[0] != workspace_id:
                await scope_to_workspace(conn, workspace_id)
            current[:] = [workspace_id]
            return conn

        yield scope


def retry_conflicts() -> AsyncRetrying:
    """Attempts of a transaction that PostgreSQL may roll back for a conflict (``WRITE_CONFLICTS``): its
    writes must be upserts, so running it again is the remedy. ``async for attempt in retry_conflicts():``."""
    return AsyncRetrying(retry=retry_if_exception_type(WRITE_CONFLICTS), stop=stop_after_attempt(8),
                         wait=wait_exponential_jitter(multiplier=0.05, max=2.0), reraise=True)


async def workspace_write(pool: AsyncConnectionPool, workspace_id: str,
                          write: Callable[[AsyncConnection[Any]], Awaitable[T]]) -> T:
    """``write`` in a workspace transaction, run again when PostgreSQL picks that transaction as a
    deadlock's victim (another service locked the same rows in another order) or fails it for
    serialization. For writes that follow work too costly or too visible to repeat, such as an LLM's
    answer: a handler's own retry would ask the model again."""
    async for attempt in retry_conflicts():
        with attempt:
            async with workspace_tx(pool, workspace_id) as conn:
                return await write(conn)
    raise AssertionError("unreachable")  # pragma: no cover


async def act_as_maintenance(conn: AsyncConnection[Any]) -> None:
    """Inside an open transaction: the rest of it runs as the maintenance role (across workspaces)."""
    await conn.execute("SET LOCAL ROLE palace_maintenance")


@asynccontextmanager
async def maintenance_tx(pool: AsyncConnectionPool) -> AsyncIterator[AsyncConnection[Any]]:
    """One transaction across all workspaces, for sweeps that are per-workspace by nature
    (re-driving stuck drawers, decay, leases). Kept to the maintain service and operator tools."""
    async with pool.connection() as conn, begun_with(conn, sql.SQL("SET LOCAL ROLE palace_maintenance")):
        yield conn


@asynccontextmanager
async def key_lookup_tx(pool: AsyncConnectionPool, key_id: str) -> AsyncIterator[AsyncConnection[Any]]:
    """Authentication: may read the one ``api_keys`` row of ``key_id`` before any workspace is known."""
    async with pool.connection() as conn, begun_with(
            conn, sql.SQL("SELECT set_config('palace.api_key_id', {}, true)").format(key_id)):
        yield conn
