"""Applying write decisions, the audit trail they leave, and reverting any audited change.

Before a decision changes a drawer, the drawer's prior state (every column a change can touch,
embedding included) is archived in the audit row's ``old_value``; ``revert`` writes it back exactly.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import numpy as np
from psycopg import AsyncConnection, sql
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from shared.db.drawers import as_array, record_history
from shared.memory.decisions import Proposal, content_hash, outcome_for
from shared.memory.dedup import wording_bands

__all__ = ["DECIDED_SQL", "RESTORABLE", "RevertError", "apply_proposal", "decided_sources", "list_history",
           "lock_decision_sources", "lock_targets", "restore_columns", "revert", "snapshot"]

# Columns a decision may change, hence archived before it does and restored by a revert.
RESTORABLE = ("content", "content_hash", "embedding", "memory_type", "importance", "summary", "state",
              "superseded_by", "deleted_at", "pinned", "metadata", "cluster_id")


async def snapshot(conn: AsyncConnection[Any], workspace_id: str, drawer_id: str) -> dict[str, Any] | None:
    """The drawer's restorable columns, JSON-ready (embedding as a list of floats), and the model its
    vector came from (``embedding_model``: a restore writes the vector back only into the same space)."""
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(
            sql.SQL("SELECT {}, embedding_model FROM drawers WHERE workspace_id = %s AND id = %s").format(
                sql.SQL(", ").join(map(sql.Identifier, RESTORABLE))), (workspace_id, drawer_id))
        row = await cur.fetchone()
    if row is None:
        return None
    if row["embedding"] is not None:
        row["embedding"] = [float(x) for x in as_array(row["embedding"])]
    if isinstance(row["deleted_at"], datetime):
        row["deleted_at"] = row["deleted_at"].isoformat()
    return dict(row)


# The drawer's model and the active space's dimension, for a restore that would write an archived vector back.
_SPACE_SQL = """SELECT d.embedding_model, (SELECT dim FROM embedding_spaces WHERE state = 'active')
                  FROM drawers d WHERE d.workspace_id = %s AND d.id = %s"""


async def _vector_fits(conn: AsyncConnection[Any], workspace_id: str, drawer_id: str, values: dict[str, Any]) -> bool:
    """Whether an archived vector still belongs in the ``embedding`` column: the active space has its
    dimension, and it came from the model the drawer's vector comes from now (archives older than the
    model's name in them are taken at their dimension's word). After ``palace reembed`` it does not."""
    cur = await conn.execute(_SPACE_SQL, (workspace_id, drawer_id))
    row = await cur.fetchone()
    if row is None:
        return False
    model, dim = row
    archived = values.get("embedding_model")
    return (dim is None or len(values["embedding"]) == dim) and (archived is None or model is None
                                                                 or archived == model)


async def restore_columns(conn: AsyncConnection[Any], workspace_id: str, drawer_id: str, values: dict[str, Any]) -> int:
    """Write archived columns back. An archived vector from another embedding space (a re-embed since) is
    not written: the drawer goes back to 'raw' without one, so the pipeline embeds it again in the active
    space (and classifies it again) instead of the restore failing or mixing spaces."""
    values = dict(values)
    extra: dict[str, Any] = {}
    if values.pop("embedding_stale", False):
        # The archived vector was dropped by a forget (shared.db.forget.scrub_snapshots): embedded again.
        values["embedding"] = None
        values["state"] = "raw" if values.get("state", "processed") == "processed" else values["state"]
        extra = {"embedding_model": None, "retry_count": 0}
    elif values.get("embedding") is not None and not await _vector_fits(conn, workspace_id, drawer_id, values):
        values["embedding"] = None
        values["state"] = "raw" if values.get("state", "processed") == "processed" else values["state"]
        extra = {"embedding_model": None, "retry_count": 0}
    elif values.get("embedding") is not None and values.get("embedding_model") is not None:
        extra = {"embedding_model": values["embedding_model"]}
    cols = [c for c in RESTORABLE if c in values]
    if not cols:
        return 0
    params: list[Any] = []
    for c in cols:
        v = values[c]
        if c == "embedding" and v is not None:
            v = np.asarray(v, dtype=np.float32)
        elif c == "metadata":
            v = Jsonb(v if v is not None else {})
        params.append(v)
    if "content" in cols:  # the wording bands follow the words (they are derived, so not archived)
        cols.append("dedup_bands")
        params.append(wording_bands(workspace_id, values["content"] or ""))
    cols += list(extra)
    params += list(extra.values())
    q = sql.SQL("UPDATE drawers SET {}, updated_at = now() WHERE workspace_id = %s AND id = %s").format(
        sql.SQL(", ").join(sql.SQL("{} = %s").format(sql.Identifier(c)) for c in cols))
    cur = await conn.execute(q, (*params, workspace_id, drawer_id))
    return cur.rowcount


# By index (memory_history_source_drawer): the audit rows of the write decisions taken on these drawers.
DECIDED_SQL = """SELECT DISTINCT new_value ->> 'source_drawer' FROM memory_history
                  WHERE workspace_id = %(ws)s AND new_value ? 'source_drawer'
                    AND (new_value ->> 'source_drawer') = ANY(%(ids)s)"""


async def decided_sources(conn: AsyncConnection[Any], workspace_id: str, drawer_ids: list[str]) -> set[str]:
    """The drawers a write decision was already taken on (committed with everything else decided for them
    then): by a former delivery of the same event, or another event that named them (ingest announces a
    drawer again when another session says it, or its session is re-published). Asking the model again,
    whose second answer may differ, could apply a second UPDATE or DELETE."""
    if not drawer_ids:
        return set()
    cur = await conn.execute(DECIDED_SQL, {"ws": workspace_id, "ids": drawer_ids})
    return {r[0] for r in await cur.fetchall()}


async def lock_decision_sources(conn: AsyncConnection[Any], workspace_id: str, drawer_ids: list[str]) -> None:
    """Hold the write decision on each of these drawers until this transaction ends, taken in one order (no
    deadlock): two events naming the same drawer, each having asked the model outside any transaction,
    write one after the other, and the second sees the first's decision (``decided_sources``, asked after
    this)."""
    ids = sorted(set(drawer_ids))
    if ids:
        await conn.execute(
            "SELECT count(pg_advisory_xact_lock(hashtextextended('palace.decision:' || %s || '/' || k, 0)))"
            " FROM unnest(%s::text[]) AS k", (workspace_id, ids))


async def lock_targets(conn: AsyncConnection[Any], workspace_id: str, drawer_ids: list[str]) -> None:
    """Lock the drawers proposals would change, in id order, before any is checked or written: two events
    updating the same target side by side then write one after the other, and the second's check
    (``apply_proposal``'s ``judged``) sees the first's words, not the ones both were shown."""
    ids = sorted(set(drawer_ids))
    if ids:
        # NO KEY UPDATE: nothing here changes a key, and FOR UPDATE would also wait for (and deadlock with) an
        # insert of a row referencing one of them (a sighting, a fact's evidence), which holds KEY SHARE on it.
        await conn.execute("SELECT id FROM drawers WHERE workspace_id = %s AND id = ANY(%s) ORDER BY id"
                           " FOR NO KEY UPDATE", (workspace_id, ids))


async def apply_proposal(
    conn: AsyncConnection[Any], workspace_id: str, p: Proposal, *, source_drawer: str,
    mode: str, event_id: str, dropped: str | None = None,
    actor: str = "cluster", extra: dict[str, Any] | None = None, audit: list[dict[str, Any]] | None = None,
    judged: str | None = None,
) -> str:
    """Audit a proposal and apply it as far as ``mode`` allows. Returns the outcome:
    applied | held | shadow | dropped.

    ``judged``: the target's content as the model was shown it, read before it was asked (outside this
    transaction). A target whose content changed since (an UPDATE applied or approved meanwhile, a revert)
    is not what the model judged: the proposal is dropped, never applied or held against the new words.

    ``audit``: where the caller collects the audit rows of many proposals, to write them in one
    statement later in the same transaction (``shared.db.drawers.insert_history``); without it the
    row is written here.

    A held proposal records the target's content hash as it was, so approving it later can tell
    whether the memory it was judged against has changed since (shared/db/proposals.py).

    An applied UPDATE leaves the target ``raw`` without a vector, as forget leaves a drawer whose text it
    changes: its new words are embedded (with its speaker and context, as any drawer's) and classified
    again through the pipeline, announced by the caller after its commit (``announce_rewritten``) or, after
    a crash, by maintain's re-drive. The vector of the drawer that prompted it (or of the old words) would
    otherwise sit under words it was not made from."""
    outcome = "dropped" if dropped else outcome_for(mode, p.action)
    reason = dropped or p.reason
    old_value = None
    target_hash = None
    if outcome in ("held", "applied") and p.action in ("UPDATE", "DELETE") and p.target and judged is not None:
        cur = await conn.execute("SELECT content FROM drawers WHERE workspace_id = %s AND id = %s",
                                 (workspace_id, p.target))
        row = await cur.fetchone()
        if row is not None and row[0] != judged:
            outcome, reason = "dropped", "the target changed while the proposal was made"
    if outcome == "held" and p.target:
        cur = await conn.execute("SELECT content_hash FROM drawers WHERE workspace_id = %s AND id = %s",
                                 (workspace_id, p.target))
        row = await cur.fetchone()
        target_hash = row[0] if row else None
    if outcome == "applied" and p.action in ("UPDATE", "DELETE") and p.target:
        old_value = await snapshot(conn, workspace_id, p.target)
        if old_value is None or old_value["deleted_at"] is not None:
            outcome, reason, old_value = "dropped", "target no longer live", None
        elif old_value["state"] != "processed":  # merged into a twin meanwhile, or rewritten and re-embedding
            outcome, reason, old_value = "dropped", f"target is {old_value['state']} now", None
        elif p.action == "DELETE" and old_value["pinned"]:
            outcome, reason, old_value = "dropped", "pinned memories are never deleted", None
    if outcome == "applied" and old_value is not None:
        if p.action == "UPDATE":
            await conn.execute(
                "UPDATE drawers SET content = %s, content_hash = %s, embedding = NULL, summary = NULL,"
                " state = 'raw', retry_count = 0, failure_reason = NULL, dedup_bands = %s, updated_at = now()"
                " WHERE workspace_id = %s AND id = %s",
                (p.content, content_hash(p.content or ""), wording_bands(workspace_id, p.content or ""),
                 workspace_id, p.target))  # bands of the new words
        else:
            await conn.execute("UPDATE drawers SET deleted_at = now(), updated_at = now()"
                               " WHERE workspace_id = %s AND id = %s", (workspace_id, p.target))
    row = {
        "drawer_id": p.target if p.action in ("UPDATE", "DELETE") and p.target else source_drawer,
        "action": p.action if p.action in ("ADD", "UPDATE", "DELETE", "NONE") else "INVALID", "actor": actor,
        "event_id": f"{event_id}:{source_drawer}", "reason": f"{outcome}: {reason}"[:1000], "old_value": old_value,
        "new_value": {"outcome": outcome, "mode": mode, "source_drawer": source_drawer, "target": p.target,
                      "confidence": p.confidence, "content": p.content, "by": p.source,
                      **({"target_hash": target_hash} if target_hash else {}), **(extra or {})},
    }
    if audit is not None:
        audit.append(row)
    else:
        await record_history(conn, workspace_id, **row)
    return outcome


async def list_history(
    conn: AsyncConnection[Any], workspace_id: str, *, drawer_id: str | None = None, action: str | None = None,
    since: datetime | None = None, until: datetime | None = None, limit: int = 100,
) -> list[dict[str, Any]]:
    """Audit rows, newest first (the archived embedding left out of ``old_value``)."""
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(
            """SELECT id, drawer_id, action, actor, reason, old_value - 'embedding' AS old_value, new_value,
                      event_id, created_at
                 FROM memory_history
                WHERE workspace_id = %(ws)s AND (%(d)s::text IS NULL OR drawer_id = %(d)s)
                  AND (%(a)s::text IS NULL OR action = %(a)s)
                  AND (%(s)s::timestamptz IS NULL OR created_at >= %(s)s)
                  AND (%(u)s::timestamptz IS NULL OR created_at < %(u)s)
                ORDER BY created_at DESC, id LIMIT %(n)s""",
            {"ws": workspace_id, "d": drawer_id, "a": action.upper() if action else None, "s": since, "u": until,
             "n": limit})
        return list(await cur.fetchall())


class RevertError(ValueError):
    """The audit row does not exist or archived no prior state."""


async def revert(conn: AsyncConnection[Any], workspace_id: str, history_id: str) -> dict[str, Any]:
    """Write back the prior state an audited change archived; the revert is audited too (and can be
    reverted in turn). Returns {drawer_id, restored: [columns]}."""
    cur = await conn.execute("SELECT drawer_id, old_value, action FROM memory_history WHERE workspace_id = %s"
                             " AND id = %s", (workspace_id, history_id))
    row = await cur.fetchone()
    if row is None:
        raise RevertError(f"no audit entry {history_id!r} in workspace {workspace_id!r}")
    drawer_id, old, action = row
    if not drawer_id or not isinstance(old, dict) or not any(c in old for c in RESTORABLE):
        raise RevertError(f"audit entry {history_id} ({action}) archived no prior state to restore")
    current = await snapshot(conn, workspace_id, drawer_id)
    if current is None:
        raise RevertError(f"drawer {drawer_id} no longer exists")
    await restore_columns(conn, workspace_id, drawer_id, old)
    restored = [c for c in RESTORABLE if c in old]
    await record_history(conn, workspace_id, drawer_id=drawer_id, action="REVERT", actor="operator",
                         event_id=f"revert:{history_id}:{datetime.now().isoformat()}",
                         reason=f"reverted {action} {history_id}",
                         old_value={c: current[c] for c in restored}, new_value={"reverted": history_id})
    return {"drawer_id": drawer_id, "restored": restored, "action": action}
