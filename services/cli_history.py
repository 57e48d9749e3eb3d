"""``palace history`` (the audit trail, filtered) and ``palace revert`` (restore an audited change)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.table import Table

__all__ = ["history", "revert"]

T = TypeVar("T")


async def _in_workspace(workspace: str, fn: Callable[[Any], Awaitable[T]]) -> T:
    from services.cli import _settings, _urls  # the CLI module registers these commands: resolve at call time
    from shared.db.pool import open_pool
    from shared.db.tenancy import workspace_tx

    s = _settings()
    db, _ = _urls(s, nats=False)
    pool = await open_pool(db, name="cli", max_size=1, role=s.db_role)
    try:
        async with workspace_tx(pool, workspace) as conn:
            return await fn(conn)
    finally:
        await pool.close()


def history(
    workspace: Annotated[str, typer.Option("--workspace", "-w", help="Workspace.")],
    drawer: Annotated[str | None, typer.Option(help="Only this drawer.")] = None,
    action: Annotated[str | None, typer.Option(help="Only this action (ADD, UPDATE, DELETE, NONE, SUPERSEDE, "
                                                    "MERGE, CLASSIFY, FAIL, REVERT, REJECT).")] = None,
    since: Annotated[datetime | None, typer.Option(help="From this time (ISO 8601).")] = None,
    until: Annotated[datetime | None, typer.Option(help="Before this time (ISO 8601).")] = None,
    limit: Annotated[int, typer.Option(help="At most this many rows.")] = 100,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """Every proposal, decision and change recorded in memory_history, newest first."""
    from shared.db.decisions import list_history

    rows = asyncio.run(_in_workspace(workspace, lambda conn: list_history(
        conn, workspace, drawer_id=drawer, action=action, since=since, until=until, limit=limit)))
    console = Console()
    if as_json:
        console.print_json(json.dumps(rows, default=str))
        return
    t = Table(title=f"History of {workspace}")
    for c in ("id", "when", "action", "actor", "drawer", "reason"):
        t.add_column(c)
    for r in rows:
        t.add_row(r["id"], r["created_at"].strftime("%Y-%m-%d %H:%M:%S"), r["action"], r["actor"],
                  r["drawer_id"] or "-", (r["reason"] or "")[:120])
    console.print(t)


def revert(
    history_id: Annotated[str, typer.Argument(help="The audit entry whose prior state to restore.")],
    workspace: Annotated[str, typer.Option("--workspace", "-w", help="Workspace.")],
) -> None:
    """Restore the exact prior state an audited change archived (UPDATE, DELETE, SUPERSEDE, REVERT)."""
    from shared.db.decisions import RevertError
    from shared.db.decisions import revert as do_revert

    try:
        out = asyncio.run(_in_workspace(workspace, lambda conn: do_revert(conn, workspace, history_id)))
    except RevertError as e:
        Console(stderr=True).print(f"[red]{e}[/red]")
        raise typer.Exit(1) from None
    Console().print(f"reverted {out['action']} {history_id}: drawer {out['drawer_id']} restored "
                    f"({', '.join(out['restored'])})")
