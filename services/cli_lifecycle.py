"""``palace maintain <job>``, ``palace forget``, ``palace restore``: the lifecycle by hand, with progress.

Kept out of ``services/cli.py`` so the job commands come from the one registry
(``shared.lifecycle.JOBS``): a job added there is a command here without any change.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import Callable
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from shared.config import Settings

__all__ = ["register"]


def _progress(console: Console) -> Progress:
    return Progress(SpinnerColumn(), TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), console=console, transient=False)


def _summary(title: str, counts: dict[str, int], elapsed_s: float) -> Table:
    t = Table(title=title)
    t.add_column("what")
    t.add_column("count", justify="right")
    for k, v in counts.items():
        t.add_row(k, str(v))
    t.add_row("[dim]seconds[/dim]", f"{elapsed_s:.2f}")
    return t


def register(app: typer.Typer, settings: Callable[[], Settings], urls: Callable[..., tuple[str, str]],
             console: Console) -> None:
    """Add ``maintain`` (one command per registered job), ``forget``, ``retry-failed`` and ``restore`` to the
    ``palace`` app."""
    from shared.lifecycle import JOBS

    maintain_app = typer.Typer(help="Run one lifecycle job now (under its lease), with progress.",
                               no_args_is_help=True)
    app.add_typer(maintain_app, name="maintain")

    def make(name: str) -> Callable[[], None]:
        def command() -> None:
            s = settings()
            db, nats_url = urls(s, nats=JOBS[name].needs_bus)  # a database-only job needs no NATS URL
            counts, elapsed = asyncio.run(_run_job(name, s, db, nats_url, console))
            if counts is None:
                console.print(f"[yellow]{name}: another replica holds the lease; try again when it is done[/yellow]")
                raise typer.Exit(1)
            console.print(_summary(f"maintain {name}", counts, elapsed))
        command.__doc__ = JOBS[name].help
        return command

    for name in JOBS:
        maintain_app.command(name)(make(name))

    @app.command("forget")
    def forget_command(
        workspace: Annotated[str, typer.Option("--workspace", "-w", help="Workspace to forget in.")],
        user: Annotated[str | None, typer.Option(help="Forget everything of this user_id.")] = None,
        agent: Annotated[str | None, typer.Option(help="Forget everything of this agent_id.")] = None,
        session: Annotated[str | None, typer.Option(help="Forget one session.")] = None,
        drawer: Annotated[str | None, typer.Option(help="Forget one drawer (and the messages it came from).")] = None,
        everything: Annotated[bool, typer.Option("--all", help="Forget the whole workspace.")] = False,
        check: Annotated[bool, typer.Option("--verify", help="Then search every store for what was forgotten.")]
        = False,
        by: Annotated[str | None, typer.Option(help="Who asks (recorded in the audit).")] = None,
    ) -> None:
        """Forget a drawer, session, user, agent or workspace everywhere it lives (tables, embedding cache,
        episodes, knowledge graph, history content, both streams). Idempotent; safe while the pipeline runs."""
        scope = _scope(workspace, user, agent, session, drawer, everything)
        s = settings()
        db, nats_url = urls(s)
        requested_by = by or f"cli:{os.environ.get('USER', 'unknown')}"
        result, remaining, elapsed = asyncio.run(_forget(s, db, nats_url, scope, requested_by, check, console))
        done = result.scope
        console.print(_summary(f"forgot {done.kind} {done.value} in {workspace} (audit {result.forget_id})",
                               result.counts, elapsed))
        if remaining is not None:
            left = {k: v for k, v in remaining.items() if v}
            t = Table(title="verify: remaining")
            t.add_column("where")
            t.add_column("found", justify="right")
            for k, v in remaining.items():
                t.add_row(k, f"[red]{v}[/red]" if v else "0")
            console.print(t)
            if left:
                console.print(f"[red]not fully forgotten: {left}[/red]")
                raise typer.Exit(1)
            console.print("[green]verified: nothing of it remains[/green]")

    @app.command("retry-failed")
    def retry_failed_command(
        workspace: Annotated[str, typer.Option("--workspace", "-w", help="Workspace whose failed drawers to retry.")],
    ) -> None:
        """Send a workspace's failed drawers through the pipeline again, once what failed them is fixed (an LLM
        that was down, an embedding endpoint): their failure is cleared and they are embedded (if they have
        no vector) and classified anew. `palace quality` lists them with their reasons first."""
        s = settings()
        db, nats_url = urls(s)
        n, elapsed = asyncio.run(_retry_failed(s, db, nats_url, workspace, console))
        console.print(_summary(f"retry-failed {workspace}", {"drawers sent through again": n}, elapsed))

    @app.command()
    def restore(
        workspace: Annotated[str, typer.Option("--workspace", "-w", help="Workspace of the archived drawers.")],
        drawer: Annotated[list[str] | None, typer.Option("--drawer", "-d", help="Drawer id (repeatable); "
                                                         "none: the workspace's whole archive.")] = None,
    ) -> None:
        """Bring the drawers prune archived back into search (what was deleted otherwise stays deleted)."""
        s = settings()
        db, _ = urls(s, nats=False)
        n, elapsed = asyncio.run(_restore(s, db, workspace, list(drawer) if drawer else None, console))
        console.print(_summary(f"restore {workspace}", {"restored": n}, elapsed))


def _scope(workspace: str, user: str | None, agent: str | None, session: str | None, drawer: str | None,
           everything: bool) -> Any:
    from shared.forget import Scope

    given = [(k, v) for k, v in (("user", user), ("agent", agent), ("session", session), ("drawer", drawer)) if v]
    if everything:
        given.append(("workspace", "*"))
    if len(given) != 1:
        raise typer.BadParameter("give exactly one of --user, --agent, --session, --drawer or --all")
    return Scope(workspace, *given[0])


async def _forget(s: Settings, db: str, nats_url: str, scope: Any, requested_by: str, check: bool,
                  console: Console) -> tuple[Any, dict[str, int] | None, float]:
    from shared.db.pool import open_pool
    from shared.forget import forget, verify

    pool = await open_pool(db, name="cli-forget", max_size=2, role=s.db_role)
    try:
        if scope.kind == "drawer":  # a citation or short id names a drawer, as over REST and MCP
            from dataclasses import replace

            from shared.palace_ops import OperationError, drawer_ref_id

            try:
                scope = replace(scope, value=await drawer_ref_id(pool, scope.workspace_id, scope.value))
            except OperationError as e:
                raise typer.BadParameter(str(e), param_hint="--drawer") from None
        t0 = time.perf_counter()
        with _progress(console) as bar:
            task = bar.add_task("forget", total=None)
            result = await forget(pool, s, nats_url, scope, requested_by=requested_by,
                                  progress=lambda what, n: bar.update(task, description=f"forget: {what}",
                                                                      completed=n))
        elapsed = time.perf_counter() - t0
        remaining = await verify(pool, s, nats_url, scope, result.targets) if check else None
        return result, remaining, elapsed
    finally:
        await pool.close()


async def _run_job(name: str, s: Settings, db: str, nats_url: str,
                   console: Console) -> tuple[dict[str, int] | None, float]:
    from shared.bus import build_broker
    from shared.db.pool import open_pool
    from shared.lifecycle import JOBS, run_job

    job = JOBS[name]
    pool = await open_pool(db, name=f"cli-{name}", max_size=2, role=s.db_role)
    broker: Any = None
    try:
        if job.needs_bus:
            broker = build_broker(s, f"cli-{name}", nats_url)
            await broker.connect()
        t0 = time.perf_counter()
        with _progress(console) as bar:
            task = bar.add_task(name, total=None)

            def progress(done: int, total: int | None) -> None:
                bar.update(task, completed=done, total=total)

            counts = await run_job(job, pool=pool, settings=s, holder=f"cli:{socket.gethostname()}:{os.getpid()}",
                                   broker=broker, manual=True, progress=progress)
        return counts, time.perf_counter() - t0
    finally:
        if broker is not None:
            await broker.stop()
        await pool.close()


async def _retry_failed(s: Settings, db: str, nats_url: str, workspace: str, console: Console) -> tuple[int, float]:
    from shared.bus import build_broker
    from shared.db.pool import open_pool
    from shared.lifecycle import retry_failed

    pool = await open_pool(db, name="cli-retry-failed", max_size=1, role=s.db_role)
    broker = build_broker(s, "cli-retry-failed", nats_url)
    await broker.connect()
    try:
        t0 = time.perf_counter()
        with _progress(console) as bar:
            task = bar.add_task("retry-failed", total=None)
            n = await retry_failed(pool, broker, s, workspace, progress=lambda k: bar.advance(task, k))
        return n, time.perf_counter() - t0
    finally:
        await broker.stop()
        await pool.close()


async def _restore(s: Settings, db: str, workspace: str, drawer_ids: list[str] | None,
                   console: Console) -> tuple[int, float]:
    from shared.db.pool import open_pool
    from shared.lifecycle import restore

    pool = await open_pool(db, name="cli-restore", max_size=1, role=s.db_role)
    try:
        t0 = time.perf_counter()
        with _progress(console) as bar:
            task = bar.add_task("restore", total=len(drawer_ids) if drawer_ids else None)
            n = await restore(pool, s, workspace, drawer_ids, actor="cli",
                              progress=lambda done, total: bar.update(task, completed=done, total=total))
        return n, time.perf_counter() - t0
    finally:
        await pool.close()
