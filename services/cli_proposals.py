"""``palace proposals``: the UPDATE/DELETE decisions controlled-write mode held, listed, approved or rejected."""

from __future__ import annotations

import asyncio
import json
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from services.cli_history import _in_workspace

__all__ = ["proposals_app"]

proposals_app = typer.Typer(help="Held write proposals (controlled-write mode): list, approve, reject.",
                            no_args_is_help=True)

Workspace = Annotated[str, typer.Option("--workspace", "-w", help="Workspace.")]
Note = Annotated[str | None, typer.Option(help="Why (kept in the audit row).")]


@proposals_app.command("list")
def list_(
    workspace: Workspace,
    status: Annotated[str, typer.Option(help="pending, approved, rejected or all.")] = "pending",
    limit: Annotated[int, typer.Option(help="At most this many rows.")] = 100,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """Held proposals, newest first: what each would change and why it was proposed."""
    from shared.db.proposals import STATUSES, list_proposals

    if status not in STATUSES:
        Console(stderr=True).print(f"[red]--status must be one of {', '.join(STATUSES)}[/red]")
        raise typer.Exit(2)
    rows = asyncio.run(_in_workspace(workspace, lambda conn: list_proposals(conn, workspace, status=status,
                                                                             limit=limit)))
    console = Console()
    if as_json:
        console.print_json(json.dumps(rows, default=str))
        return
    t = Table(title=f"{status.capitalize()} proposals of {workspace}")
    for c in ("id", "when", "action", "target", "from drawer", "conf", "reason", "new content", "status"):
        t.add_column(c)
    for r in rows:
        t.add_row(r["id"], r["created_at"].strftime("%Y-%m-%d %H:%M:%S"), r["action"], r["target"] or "-",
                  r["source_drawer"] or "-", f"{r['confidence'] or 0:.2f}", (r["reason"] or "")[:80],
                  (r["content"] or "-")[:80], r["status"] if r["outcome"] in (None, "rejected")
                  else f"{r['status']} ({r['outcome']})")
    console.print(t)


def _resolve(history_id: str, workspace: str, *, approve: bool, note: str | None) -> None:
    from shared.db.proposals import ProposalError, resolve_proposal

    try:
        out = asyncio.run(_in_workspace(workspace, lambda conn: resolve_proposal(
            conn, workspace, history_id, approve=approve, note=note)))
    except ProposalError as e:
        Console(stderr=True).print(f"[red]{e}[/red]")
        raise typer.Exit(1) from None
    why = f" ({out.reason})" if out.outcome == "dropped" else ""
    Console().print(f"{out.action} {history_id} on drawer {out.target}: {out.outcome}{why}; audit {out.audit_id}",
                    soft_wrap=True)
    if out.outcome == "applied" and out.action == "UPDATE" and out.target:
        try:
            asyncio.run(_announce(workspace, out.target, out.audit_id))
        except Exception as e:  # the drawer is raw: maintain's re-drive announces it later
            Console(stderr=True).print(f"[yellow]the rewritten drawer is embedded again at maintain's next re-drive "
                                       f"(announcing it now failed: {type(e).__name__})[/yellow]")


async def _announce(workspace: str, drawer_id: str, cause: str) -> None:
    """Announce the drawer an approved UPDATE rewrote, so its new words are embedded and classified now."""
    from services.cli import _settings
    from shared.bus import announce_rewritten, build_broker
    from shared.endpoints import resolve_urls

    s = _settings()
    _, nats_url = resolve_urls(s, database=False)
    broker = build_broker(s, "cli", nats_url)
    await broker.connect()
    try:
        await announce_rewritten(broker, s.model_copy(update={"dependency_wait_s": 5.0}), workspace, [drawer_id],
                                 cause)
    finally:
        await broker.stop()


@proposals_app.command("approve")
def approve(history_id: Annotated[str, typer.Argument(help="The held proposal (id from 'proposals list').")],
            workspace: Workspace, note: Note = None) -> None:
    """Apply a held proposal exactly as full mode would (prior state archived; 'palace revert' undoes it)."""
    _resolve(history_id, workspace, approve=True, note=note)


@proposals_app.command("reject")
def reject(history_id: Annotated[str, typer.Argument(help="The held proposal (id from 'proposals list').")],
           workspace: Workspace, note: Note = None) -> None:
    """Decline a held proposal: nothing changes, the rejection is audited."""
    _resolve(history_id, workspace, approve=False, note=note)
