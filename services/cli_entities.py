"""``palace entities``: the operator's side of entity dedup (look-alike pairs flagged for review, the
merges made, and undoing or deciding them). Straight to the database, in the workspace's scope."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from shared.config import Settings

__all__ = ["register"]

T = TypeVar("T")
Ws = Annotated[str, typer.Option("--workspace", "-w", help="The workspace.")]


def _actor() -> str:
    return f"cli:{os.environ.get('USER', 'unknown')}"


def register(app: typer.Typer, settings: Callable[[], Settings], urls: Callable[..., tuple[str, str]],
             console: Console) -> None:
    entities_app = typer.Typer(help="Entity dedup: flagged look-alikes, merges, and reverting them.",
                               no_args_is_help=True)
    app.add_typer(entities_app, name="entities")

    def run(workspace: str, fn: Callable[[Any], Awaitable[T]]) -> T:
        from shared.db.entity_dedup import MergeError
        from shared.db.pool import open_pool
        from shared.db.tenancy import workspace_tx

        s = settings()
        db, _ = urls(s, nats=False)

        async def go() -> T:
            pool = await open_pool(db, name="cli-entities", max_size=1, role=s.db_role)
            try:
                if getattr(fn, "needs_pool", False):
                    return await fn(pool)
                async with workspace_tx(pool, workspace) as conn:
                    return await fn(conn)
            finally:
                await pool.close()
        try:
            return asyncio.run(go())
        except MergeError as e:
            console.print(Text(f"refused: {e}", style="red"))
            raise typer.Exit(1) from None

    @entities_app.command("flags")
    def flags(workspace: Ws, status: Annotated[str, typer.Option(help="open, kept_apart or merged.")] = "open",
              limit: int = 100) -> None:
        """Pairs that look alike without the evidence a merge needs, for an operator to decide."""
        from shared.db.entity_dedup import list_flags

        rows = run(workspace, lambda c: list_flags(c, workspace, status=status, limit=limit))
        t = Table(title=f"{len(rows)} {status} pairs")
        for col in ("entity", "entity", "rule", "score", "why", "ids"):
            t.add_column(col, overflow="fold")
        for r in rows:
            t.add_row(Text(r.name_a), Text(r.name_b), r.rule, f"{r.score:.2f}", Text(r.reason),
                      f"{r.entity_a} {r.entity_b}")
        console.print(t)

    @entities_app.command("merges")
    def merges(workspace: Ws, limit: int = 100) -> None:
        """Merges made (newest first), with the rule and the evidence behind each."""
        from shared.db.entity_dedup import list_merges

        rows = run(workspace, lambda c: list_merges(c, workspace, limit=limit))
        t = Table(title=f"{len(rows)} merges")
        for col in ("merge id", "kept", "merged", "rule", "why", "status", "when"):
            t.add_column(col, overflow="fold")
        for r in rows:
            t.add_row(r.id, Text(r.survivor), Text(r.merged), r.rule, Text(r.reason), r.status,
                      r.created_at.isoformat(timespec="seconds"))
        console.print(t)

    @entities_app.command("revert")
    def revert(merge_id: str, workspace: Ws) -> None:
        """Undo a merge exactly (rows, aliases, mentions and facts as they were); the pair is kept apart."""
        from shared.db.entity_dedup import revert_merge

        r = run(workspace, lambda c: revert_merge(c, workspace, merge_id, actor=_actor()))
        console.print(Text(f"reverted: {r.merged!r} is its own entity again (kept apart from {r.survivor!r})"))

    @entities_app.command("keep-apart")
    def keep_apart(entity_a: str, entity_b: str, workspace: Ws) -> None:
        """Decide a flagged pair: different entities, never merged automatically."""
        from shared.db.entity_dedup import keep_apart as keep

        run(workspace, lambda c: keep(c, workspace, entity_a, entity_b, actor=_actor(), reason="operator"))
        console.print("kept apart")

    @entities_app.command("merge")
    def merge(survivor: str, merged: str, workspace: Ws) -> None:
        """Decide a flagged pair: MERGED becomes part of SURVIVOR (entity ids; reversible with revert)."""
        from shared.kg_dedup import operator_merge

        async def go(pool: Any) -> str:
            return await operator_merge(pool, workspace, survivor, merged, actor=_actor())
        go.needs_pool = True  # type: ignore[attr-defined]
        console.print(f"merged: {run(workspace, go)}")
