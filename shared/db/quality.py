"""What a workspace's store is made of: the memory-quality report (``palace quality``, the API).

Everything is counted from the rows themselves (drawers, messages, memory_history, llm_usage), so
the report cannot drift from what recall actually sees.
"""

from __future__ import annotations

from typing import Any

from psycopg import AsyncConnection

__all__ = ["quality_report", "store_counts"]


async def _rows(conn: AsyncConnection[Any], sql: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
    return await (await conn.execute(sql, params)).fetchall()


async def quality_report(conn: AsyncConnection[Any], workspace_id: str, *, top_reasons: int = 20) -> dict[str, Any]:
    """Counts by type and tier, noise dropped, merges, supersessions, failures with reasons, write
    proposals by decision and outcome, what became of the held ones, every audited action, and LLM cost."""
    ws = (workspace_id,)
    by_type_tier = await _rows(conn, """
        SELECT coalesce(memory_type, 'unclassified'), coalesce(pipeline_tier, 'none'), count(*)
          FROM drawers WHERE workspace_id = %s AND deleted_at IS NULL AND state = 'processed'
         GROUP BY 1, 2 ORDER BY 3 DESC, 1, 2""", ws)
    by_state = dict(await _rows(conn, """
        SELECT state, count(*) FROM drawers WHERE workspace_id = %s AND deleted_at IS NULL GROUP BY 1""", ws))
    msgs = (await _rows(conn, """
        SELECT count(*), count(*) FILTER (WHERE is_noise), count(*) FILTER (WHERE revision > 0),
               (SELECT count(*) FROM message_revisions WHERE workspace_id = %s)
          FROM messages WHERE workspace_id = %s""", (workspace_id, workspace_id)))[0]
    lifecycle = (await _rows(conn, """
        SELECT count(*) FILTER (WHERE superseded_by IS NOT NULL AND deleted_at IS NULL),
               count(*) FILTER (WHERE deleted_at IS NOT NULL),
               count(*) FILTER (WHERE pinned AND deleted_at IS NULL)
          FROM drawers WHERE workspace_id = %s""", ws))[0]
    reasons = await _rows(conn, """
        SELECT left(coalesce(failure_reason, 'unknown'), 200), count(*) FROM drawers
         WHERE workspace_id = %s AND state = 'failed' AND deleted_at IS NULL
         GROUP BY 1 ORDER BY 2 DESC, 1 LIMIT %s""", (workspace_id, top_reasons))
    actions = await _rows(conn, """
        SELECT action, actor, count(*) FROM memory_history WHERE workspace_id = %s
         GROUP BY 1, 2 ORDER BY 1, 2""", ws)
    proposals = await _rows(conn, """
        SELECT action, coalesce(new_value->>'outcome', 'unknown'), count(*) FROM memory_history
         WHERE workspace_id = %s AND action IN ('ADD', 'UPDATE', 'DELETE', 'NONE', 'INVALID')
         GROUP BY 1, 2 ORDER BY 1, 2""", ws)
    held = (await _rows(conn, """
        SELECT count(*) FILTER (WHERE r.history_id IS NULL), count(*) FILTER (WHERE r.outcome = 'applied'),
               count(*) FILTER (WHERE r.outcome = 'dropped'), count(*) FILTER (WHERE r.outcome = 'rejected')
          FROM memory_history h
          LEFT JOIN proposal_resolutions r ON r.workspace_id = h.workspace_id AND r.history_id = h.id
         WHERE h.workspace_id = %s AND h.new_value->>'outcome' = 'held'""", ws))[0]
    cost = await _rows(conn, """
        SELECT purpose, model, sum(calls_ok), sum(calls_failed), sum(tokens_in), sum(tokens_out), sum(seconds)
          FROM llm_usage WHERE workspace_id = %s GROUP BY 1, 2 ORDER BY 1, 2""", ws)
    processed = sum(n for _, _, n in by_type_tier)
    return {
        "workspace_id": workspace_id,
        "drawers": {"by_state": by_state, "processed": processed,
                    "by_type_and_tier": [{"memory_type": t, "tier": p, "count": n} for t, p, n in by_type_tier]},
        "noise": {"messages": msgs[0], "dropped_as_noise": msgs[1]},
        "edits": {"messages_edited": msgs[2], "earlier_texts_kept": msgs[3]},
        "near_duplicates_merged": by_state.get("merged", 0),
        "superseded": lifecycle[0],
        "deleted": lifecycle[1],
        "pinned": lifecycle[2],
        "failed": {"count": by_state.get("failed", 0),
                   "reasons": [{"reason": r, "count": n} for r, n in reasons]},
        "proposals": [{"decision": a, "outcome": o, "count": n} for a, o, n in proposals],
        "held_proposals": dict(zip(("pending", "approved_applied", "approved_dropped", "rejected"), held,
                                   strict=True)),
        "audit": [{"action": a, "actor": who, "count": n} for a, who, n in actions],
        "llm_cost": [{"purpose": p, "model": m, "calls_ok": int(ok), "calls_failed": int(bad), "tokens_in": int(tin),
                      "tokens_out": int(tout), "seconds": round(float(sec), 3)}
                     for p, m, ok, bad, tin, tout, sec in cost],
    }


async def store_counts(conn: AsyncConnection[Any], workspace_id: str) -> dict[str, Any]:
    """Sessions and messages stored, drawers by state and by memory type (every drawer, deleted ones
    included: what ingest wrote, for the API's stats and the demo's progress). A deleted drawer counts as
    'deleted' whatever its state: one deleted before it was embedded is never processed, and counted as
    'raw' it read as work still to do."""
    ws = (workspace_id,)
    by_state = dict(await _rows(conn, "SELECT CASE WHEN deleted_at IS NULL THEN state ELSE 'deleted' END, count(*)"
                                      " FROM drawers WHERE workspace_id = %s GROUP BY 1", ws))
    by_type = dict(await _rows(conn, "SELECT coalesce(memory_type, 'unclassified'), count(*) FROM drawers"
                                     " WHERE workspace_id = %s GROUP BY 1", ws))
    sessions, messages = (await _rows(conn, "SELECT (SELECT count(*) FROM sessions WHERE workspace_id = %s),"
                                            " (SELECT count(*) FROM messages WHERE workspace_id = %s)",
                                      (workspace_id, workspace_id)))[0]
    return {"sessions": sessions, "messages": messages, "drawers_by_state": by_state, "drawers_by_type": by_type}
