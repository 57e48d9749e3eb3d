"""Transactions scoped to one workspace, enforced by PostgreSQL row-level security (migration 0003).

Every query a service runs goes through one of these, so the database itself refuses rows of other
workspaces even where a query forgets its own ``workspace_id`` filter. The setting is transaction
local (``set_config(..., true)``): a pooled connection never carries a workspace into its next use.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

__all__ = ["act_as_maintenance", "key_lookup_tx", "maintenance_tx", "scope_to_workspace", "workspace_tx"]


async def scope_to_workspace(conn: AsyncConnection[Any], workspace_id: str) -> None:
    """Let the connection's current transaction see and write ``workspace_id`` only (until it ends)."""
    await conn.execute("SELECT set_config('palace.workspace_id', %s, true)", (workspace_id,))


@asynccontextmanager
async def workspace_tx(pool: AsyncConnectionPool, workspace_id: str) -> AsyncIterator[AsyncConnection[Any]]:
    """One transaction that can only see and write ``workspace_id``; commits on success."""
    if not workspace_id:
        raise ValueError("a workspace transaction needs a workspace id")
    async with pool.connection() as conn, conn.transaction():
        await scope_to_workspace(conn, workspace_id)
        yield conn


async def act_as_maintenance(conn: AsyncConnection[Any]) -> None:
    """Inside an open transaction: the rest of it runs as the maintenance role (across workspaces)."""
    await conn.execute("SET LOCAL ROLE palace_maintenance")


@asynccontextmanager
async def maintenance_tx(pool: AsyncConnectionPool) -> AsyncIterator[AsyncConnection[Any]]:
    """One transaction across all workspaces, for sweeps that are per-workspace by nature
    (re-driving stuck drawers, decay, leases). Kept to the maintain service and operator tools."""
    async with pool.connection() as conn, conn.transaction():
        await act_as_maintenance(conn)
        yield conn


@asynccontextmanager
async def key_lookup_tx(pool: AsyncConnectionPool, key_id: str) -> AsyncIterator[AsyncConnection[Any]]:
    """Authentication: may read the one ``api_keys`` row of ``key_id`` before any workspace is known."""
    async with pool.connection() as conn, conn.transaction():
        await conn.execute("SELECT set_config('palace.api_key_id', %s, true)", (key_id,))
        yield conn
