"""``palace reembed``: move every vector to a new embedding model or dimension while the stack runs."""

from __future__ import annotations

import asyncio
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

__all__ = ["reembed"]

console = Console()


def reembed(
    provider: Annotated[str | None, typer.Option(
        help="Provider of the new space: 'local', 'openai' or 'hash' (omitted: --drop-old or --abort).")] = None,
    model: Annotated[str | None, typer.Option(help="Model of the new space (default: PALACE_EMBED_MODEL).")] = None,
    dim: Annotated[int | None, typer.Option(help="Dimension of the new space's vectors.")] = None,
    base_url: Annotated[str | None, typer.Option(help="OpenAI-compatible base URL of the new space.")] = None,
    batch: Annotated[int, typer.Option(help="Rows embedded per call.")] = 64,
    drop_old: Annotated[bool, typer.Option(
        "--drop-old", help="Drop the retired space's vectors (with a new space: also after its switch).")] = False,
    abort: Annotated[bool, typer.Option("--abort", help="Abandon a re-embed under way.")] = False,
) -> None:
    """Re-embed every drawer, episode and entity into a new space, then switch searches and services to it.

    The new vectors are built beside the old ones while the pipeline runs; the switch is one short
    transaction. Interrupted, it resumes where it stopped when run again with the same options.
    """
    from services.cli import _settings, _urls  # the CLI module registers this command: resolve at call time
    from shared import reembed as rb
    from shared.db.embedding_spaces import SpaceTarget

    s = _settings()
    db_url, _ = _urls(s, nats=False)
    if abort:
        done = asyncio.run(rb.abandon(db_url))
        console.print("re-embed abandoned" if done else "no re-embed was under way")
        return
    if provider is None:
        if not drop_old:
            console.print("[red]name the new space (--provider, --dim ...), or give --drop-old or --abort[/red]")
            raise typer.Exit(2)
        dropped = asyncio.run(rb.drop_old(s, db_url))
        console.print("retired space dropped" if dropped else "no retired space to drop")
        return
    if drop_old and asyncio.run(rb.drop_old(s, db_url, keep_cache=True)):  # an earlier space's, kept until now
        console.print("retired space dropped")
    target = SpaceTarget(provider=provider, model=model or (provider if provider == "hash" else s.embed_model),
                         dim=dim or s.embed_dim, base_url=base_url)
    with Progress(TextColumn("{task.description:<9}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console) as bar:
        tasks: dict[str, TaskID] = {}

        def progress(phase: str, done: int, total: int) -> None:
            if phase not in tasks:
                tasks[phase] = bar.add_task(phase, total=total)
            bar.update(tasks[phase], completed=done, total=total)

        try:
            result = asyncio.run(rb.reembed(s, db_url, target, batch=batch, progress=progress))
        except ValueError as e:
            console.print(f"[red]{e}[/red]")
            raise typer.Exit(1) from None
    console.print(f"active space {result.space.id}: {target.model}, {target.dim} dimensions — "
                  f"{result.drawers} drawers, {result.episodes} episodes, {result.entities} entities, "
                  f"{result.indexes} vector indexes; switched after {result.switch_attempts} attempt(s) "
                  f"(locks waited for {result.switch_wait_s * 1000:.0f} ms, "
                  f"held {result.switch_held_s * 1000:.0f} ms); "
                  f"{result.settled} drawers settled")
    if drop_old:
        asyncio.run(rb.drop_old(s, db_url))
        console.print("retired space dropped")
    else:
        console.print("the retired space's vectors are kept until `palace reembed --drop-old`")
