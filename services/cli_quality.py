"""``palace quality``: the memory-quality report of one workspace, as tables or JSON."""

from __future__ import annotations

import asyncio
import json
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

__all__ = ["quality", "render"]


async def _report(workspace: str) -> dict[str, Any]:
    from services.cli import _settings, _urls  # the CLI module registers this command: resolve at call time
    from shared.db.pool import open_pool
    from shared.db.quality import quality_report
    from shared.db.tenancy import workspace_tx

    s = _settings()
    db, _ = _urls(s, nats=False)
    pool = await open_pool(db, name="cli", max_size=1, role=s.db_role)
    try:
        async with workspace_tx(pool, workspace) as conn:
            return await quality_report(conn, workspace)
    finally:
        await pool.close()


def render(report: dict[str, Any], console: Console) -> None:
    """Print the report as a few small tables."""
    d = report["drawers"]
    t = Table(title=f"Processed drawers in {report['workspace_id']} by type and tier ({d['processed']})")
    for c in ("memory type", "tier", "drawers"):
        t.add_column(c)
    for r in d["by_type_and_tier"]:
        t.add_row(r["memory_type"], r["tier"], str(r["count"]))
    console.print(t)
    s = Table(title="Store health")
    s.add_column("what")
    s.add_column("count", justify="right")
    for k, v in sorted(d["by_state"].items()):
        s.add_row(f"drawers {k}", str(v))
    s.add_row("messages", str(report["noise"]["messages"]))
    s.add_row("messages dropped as noise", str(report["noise"]["dropped_as_noise"]))
    s.add_row("messages edited (earlier texts kept)",
              f"{report['edits']['messages_edited']} ({report['edits']['earlier_texts_kept']})")
    for k in ("near_duplicates_merged", "superseded", "deleted", "pinned"):
        s.add_row(k.replace("_", " "), str(report[k]))
    console.print(s)
    if report["failed"]["reasons"]:
        f = Table(title=f"Failed drawers ({report['failed']['count']}) by reason")
        f.add_column("reason")
        f.add_column("drawers", justify="right")
        for r in report["failed"]["reasons"]:
            f.add_row(r["reason"], str(r["count"]))
        console.print(f)
        console.print(f"[dim]once the cause is fixed: palace retry-failed --workspace {report['workspace_id']}[/dim]")
    if report["proposals"]:
        pr = Table(title="Write proposals by decision and outcome")
        for c in ("decision", "outcome", "count"):
            pr.add_column(c)
        for r in report["proposals"]:
            pr.add_row(r["decision"], r["outcome"], str(r["count"]))
        console.print(pr)
    h = report["held_proposals"]
    if any(h.values()):
        console.print(f"Held proposals: {h['pending']} pending (palace proposals list), {h['approved_applied']} "
                      f"approved and applied, {h['approved_dropped']} approved but no longer applicable, "
                      f"{h['rejected']} rejected")
    if report["audit"]:
        a = Table(title="Audited actions (memory_history)")
        for c in ("action", "actor", "count"):
            a.add_column(c)
        for r in report["audit"]:
            a.add_row(r["action"], r["actor"], str(r["count"]))
        console.print(a)
    c = Table(title="LLM cost")
    for col in ("purpose", "model", "calls ok", "calls failed", "tokens in", "tokens out", "seconds"):
        c.add_column(col)
    for r in report["llm_cost"]:
        c.add_row(r["purpose"], r["model"], str(r["calls_ok"]), str(r["calls_failed"]), str(r["tokens_in"]),
                  str(r["tokens_out"]), f"{r['seconds']:.1f}")
    if not report["llm_cost"]:
        c.add_row("-", "no LLM calls", "0", "0", "0", "0", "0")
    console.print(c)


def quality(
    workspace: Annotated[str, typer.Option("--workspace", "-w", help="Workspace to report on.")],
    api: Annotated[str | None, typer.Option(help="Use a running API (e.g. http://127.0.0.1:8080).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")] = False,
    key: Annotated[str | None, typer.Option("--key", envvar="PALACE_API_KEY", show_envvar=False,
                                            help="With --api: the workspace's API key (default: PALACE_API_KEY).")]
    = None,
) -> None:
    """What the store is made of: drawers by type and tier, noise, merges, supersessions, failures, LLM cost."""
    if api:
        import httpx

        try:
            r = httpx.get(f"{api}/v1/workspaces/{workspace}/quality", timeout=30,
                          headers={"Authorization": f"Bearer {key}"} if key else None)
        except httpx.TransportError as e:
            Console(stderr=True).print(f"[red]the API at {api} is not reachable ({type(e).__name__})[/red]")
            raise typer.Exit(1) from None
        if r.status_code != 200:
            Console(stderr=True).print(f"[red]refused ({r.status_code}): {r.text[:300]}[/red]")
            raise typer.Exit(1)
        report = r.json()
    else:
        report = asyncio.run(_report(workspace))
    console = Console()
    if as_json:
        console.print_json(json.dumps(report, default=str))
    else:
        render(report, console)
