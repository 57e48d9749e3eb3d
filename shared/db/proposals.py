"""Held proposals: the UPDATE and DELETE decisions controlled-write mode recorded but did not apply.

An operator lists them and resolves each once: approving applies it exactly as full mode would
(``apply_proposal``: the target's prior state archived in the audit row, so ``palace revert`` undoes
it), rejecting leaves the store as it is. Either way the resolution is audited and kept in
``proposal_resolutions`` (migration 0035), whose key makes a second resolution of the same proposal
impossible. A proposal whose target changed after it was made (its content hash differs from the one
recorded with it), was deleted, or is pinned (for DELETE), or whose prompting drawer was deleted or
forgotten since, is not applied: the approval is recorded as dropped with the reason, because the
decision was judged against memories that are no longer there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from psycopg import AsyncConnection, sql
from psycopg.rows import dict_row

from shared.db.decisions import apply_proposal, snapshot
from shared.db.drawers import history_id_for, record_history
from shared.db.forget import lock_for_write
from shared.memory.decisions import Proposal

__all__ = ["STATUSES", "ProposalError", "ProposalNotFound", "ProposalResolved", "Resolution", "list_proposals",
           "resolve_proposal"]

# Which held proposals each status lists (fixed SQL, chosen by name).
_STATUS_SQL = {
    "pending": "r.history_id IS NULL",
    "approved": "r.outcome IN ('applied', 'dropped')",
    "rejected": "r.outcome = 'rejected'",
    "all": "true",
}
STATUSES = tuple(_STATUS_SQL)
_LIST_SQL = """
    SELECT h.id, h.created_at, h.action, h.drawer_id AS target, h.new_value->>'source_drawer' AS source_drawer,
           h.new_value->>'content' AS content, (h.new_value->>'confidence')::float8 AS confidence,
           h.new_value->>'by' AS proposed_by, h.reason,
           CASE WHEN r.history_id IS NULL THEN 'pending'
                WHEN r.outcome = 'rejected' THEN 'rejected' ELSE 'approved' END AS status,
           r.outcome, r.actor AS resolved_by, r.note, r.audit_id, r.created_at AS resolved_at
      FROM memory_history h
      LEFT JOIN proposal_resolutions r ON r.workspace_id = h.workspace_id AND r.history_id = h.id
     WHERE h.workspace_id = %(ws)s AND h.new_value->>'outcome' = 'held' AND {}
     ORDER BY h.created_at DESC, h.id LIMIT %(n)s
"""


class ProposalError(ValueError):
    """The proposal cannot be resolved (see the two kinds below)."""


class ProposalNotFound(ProposalError):
    """No held proposal with this id in the workspace."""


class ProposalResolved(ProposalError):
    """The proposal was approved or rejected already."""


@dataclass(frozen=True)
class Resolution:
    history_id: str
    action: str
    target: str | None
    outcome: str  # applied | dropped | rejected
    reason: str
    audit_id: str  # the memory_history row the resolution wrote (revert it to undo an approval)


async def list_proposals(
    conn: AsyncConnection[Any], workspace_id: str, *, status: str = "pending", limit: int = 100,
) -> list[dict[str, Any]]:
    """Held proposals, newest first, with their resolution when they have one (partial index
    memory_history_held)."""
    if status not in STATUSES:
        raise ValueError(f"status must be one of {', '.join(STATUSES)}")
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(sql.SQL(_LIST_SQL).format(sql.SQL(_STATUS_SQL[status])),  # type: ignore[arg-type]
                          {"ws": workspace_id, "n": limit})
        return list(await cur.fetchall())


async def _held(conn: AsyncConnection[Any], workspace_id: str, history_id: str) -> dict[str, Any]:
    """The held proposal, locked so that concurrent resolutions of it queue behind this one."""
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute("SELECT id, action, drawer_id, reason, new_value FROM memory_history"
                          " WHERE workspace_id = %s AND id = %s FOR UPDATE", (workspace_id, history_id))
        row = await cur.fetchone()
    if row is None:
        raise ProposalNotFound(f"no audit entry {history_id!r} in workspace {workspace_id!r}")
    nv = row["new_value"] if isinstance(row["new_value"], dict) else {}
    if nv.get("outcome") != "held":
        raise ProposalNotFound(f"audit entry {history_id} ({row['action']}) is not a held proposal")
    cur2 = await conn.execute("SELECT outcome, actor FROM proposal_resolutions WHERE workspace_id = %s"
                              " AND history_id = %s", (workspace_id, history_id))
    done = await cur2.fetchone()
    if done is not None:
        raise ProposalResolved(f"proposal {history_id} was resolved already ({done[0]} by {done[1]})")
    return row


async def _why_not(conn: AsyncConnection[Any], workspace_id: str, row: dict[str, Any]) -> str | None:
    """Why approving the proposal must not change its target now, or None."""
    target, nv = row["drawer_id"], row["new_value"]
    current = await snapshot(conn, workspace_id, target) if target else None
    if current is None or current["deleted_at"] is not None:
        return "target no longer live"
    if current["state"] != "processed":  # merged into a twin since, or rewritten and not yet embedded again
        return f"target is {current['state']} now, not a live processed memory"
    if row["action"] == "DELETE" and current["pinned"]:
        return "pinned memories are never deleted"
    if nv.get("target_hash") and nv["target_hash"] != current["content_hash"]:
        return "target changed since the proposal was made"
    source = nv.get("source_drawer")
    if source:
        cur = await conn.execute("SELECT 1 FROM drawers WHERE workspace_id = %s AND id = %s AND deleted_at IS NULL",
                                 (workspace_id, source))
        if await cur.fetchone() is None:  # deleted or forgotten: its fact must not come back through the target
            return "the drawer that prompted it is no longer live"
    return None


async def resolve_proposal(
    conn: AsyncConnection[Any], workspace_id: str, history_id: str, *, approve: bool, actor: str = "operator",
    note: str | None = None,
) -> Resolution:
    """Approve (apply as full mode would) or reject one held proposal; audited either way.

    Raises ProposalError when it does not exist, is not a held proposal, or was resolved already.
    """
    # Ordered with forget (shared.db.forget): a drawer forgotten before this is gone when _why_not looks
    # (the approval is dropped); a forget starting now waits, then reverts what this applied.
    await lock_for_write(conn, workspace_id)
    row = await _held(conn, workspace_id, history_id)
    nv, action, target = row["new_value"], row["action"], row["drawer_id"]
    source = nv.get("source_drawer") or ""
    event_id = f"resolve:{history_id}"
    reason = (row["reason"] or "").removeprefix("held: ")
    if approve:
        why = await _why_not(conn, workspace_id, row)
        p = Proposal(action=action, target=target, reason=reason, confidence=float(nv.get("confidence") or 0.0),
                     content=nv.get("content"), source=nv.get("by") or "llm")
        outcome = await apply_proposal(
            conn, workspace_id, p, source_drawer=source, mode="full", event_id=event_id,
            dropped=why, actor=actor, extra={"approved": history_id, **({"note": note} if note else {})})
        audit_id = history_id_for(workspace_id, f"{event_id}:{source}", target, action)
        reason = why or reason
    else:
        outcome = "rejected"
        await record_history(conn, workspace_id, drawer_id=target, action="REJECT", actor=actor, event_id=event_id,
                             reason=f"rejected {action} {history_id}" + (f": {note}" if note else ""),
                             new_value={"rejected": history_id, "action": action, "source_drawer": source})
        audit_id = history_id_for(workspace_id, event_id, target, "REJECT")
    await conn.execute(
        "INSERT INTO proposal_resolutions (workspace_id, history_id, outcome, actor, note, audit_id)"
        " VALUES (%s, %s, %s, %s, %s, %s)", (workspace_id, history_id, outcome, actor, note, audit_id))
    return Resolution(history_id, action, target, outcome, reason, audit_id)
