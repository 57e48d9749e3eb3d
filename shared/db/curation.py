"""SQL of the LLM phase: apply its labels (with entities and triples), count its failures, and
account for its cost. Callers run these in short transactions after the LLM call has returned."""

from __future__ import annotations

from typing import Any

from psycopg import AsyncConnection
from psycopg.types.json import Jsonb

from shared.adapters.llm import Usage
from shared.db.drawers import record_history
from shared.db.kg import record_extraction, refresh_entities
from shared.memory.kg import Sighting
from shared.memory.llm_labels import LlmLabel

__all__ = ["CLAIM_SQL", "OTHER_WORKSPACES", "claim_for_llm", "llm_cost_today", "record_llm_failures", "record_usage",
           "release_llm_claims", "save_llm_labels"]

LLM_FAILURE_PREFIX = "llm: "
_LLM_CONFIDENCE = 0.8  # what a model's entity or fact counts for in the running averages


# An LLM label onto a drawer still raw (or failed).
LLM_LABEL_SQL = """UPDATE drawers SET memory_type = %(t)s, confidence = 1.0, importance = %(imp)s, summary = %(sum)s,
          pipeline_tier = 'llm', state = 'processed', failure_reason = NULL, updated_at = now(),
          room = CASE WHEN room = 'general' THEN %(t)s ELSE room END,
          metadata = (metadata - 'llm_failures') || %(meta)s
    WHERE workspace_id = %(ws)s AND id = %(id)s
      AND CASE WHEN state IN ('raw', 'failed') THEN true END  -- by key only: docs/scale.md"""


async def save_llm_labels(
    conn: AsyncConnection[Any], workspace_id: str, labels: dict[str, tuple[LlmLabel, float]], *, event_id: str,
) -> list[str]:
    """Apply LLM labels to drawers still raw (or failed); store their entities and triples; audit.

    labels: drawer id → (label, the heuristic importance used when the LLM gave none).
    Returns the drawers changed.
    """
    changed: list[str] = []
    for did, (lab, fallback_importance) in labels.items():
        importance = lab.importance if lab.importance is not None else fallback_importance
        cur = await conn.execute(
            LLM_LABEL_SQL,
            {"t": lab.memory_type, "imp": importance, "sum": lab.summary, "ws": workspace_id, "id": did,
             "meta": Jsonb({"llm_warnings": lab.warnings} if lab.warnings else {})},
        )
        if not cur.rowcount:
            continue
        changed.append(did)
        await _store_graph(conn, workspace_id, did, lab)
        await record_history(
            conn, workspace_id, drawer_id=did, action="CLASSIFY", actor="classify", event_id=event_id,
            reason="llm" + (f" ({len(lab.warnings)} warnings: {'; '.join(lab.warnings)[:500]})"
                            if lab.warnings else ""),
            new_value={"memory_type": lab.memory_type, "importance": importance, "tier": "llm",
                       "summary": lab.summary, "entities": len(lab.entities), "triples": len(lab.triples)},
        )
    return changed


async def _store_graph(conn: AsyncConnection[Any], workspace_id: str, drawer_id: str, lab: LlmLabel) -> None:
    """The label's entities and facts through the knowledge-graph writer, so they get what the enrich
    extraction gets: facts valid from when the drawer's message was said (add_triple finds that time
    from the drawer), evidence and running-average confidences, the drawer's counts."""
    if not lab.entities and not lab.triples:
        return
    stored = await record_extraction(conn, workspace_id, [Sighting(
        drawer_id=drawer_id, said_at=None, session_id=None, seq=None,
        entities=tuple((n, t, _LLM_CONFIDENCE) for n, t in lab.entities),
        triples=tuple((s, p, o, _LLM_CONFIDENCE) for s, p, o in lab.triples))])
    await refresh_entities(conn, workspace_id, sorted(stored.entities))


# One more failed LLM attempt on a drawer still raw.
LLM_FAILURE_SQL = """UPDATE drawers SET metadata = jsonb_set(metadata, '{llm_failures}',
              to_jsonb(coalesce((metadata->>'llm_failures')::int, 0) + 1)),
              failure_reason = %(reason)s
        WHERE workspace_id = %(ws)s AND id = %(id)s
          AND CASE WHEN state = 'raw' THEN true END  -- by key only: docs/scale.md
    RETURNING (metadata->>'llm_failures')::int"""


# Drawers of a batch's cold path claimed for it (migration 0054), each for the event that names it: those
# still waiting for a label and not claimed by another event within its time (the same event, delivered
# again after its batch died, takes its claim back). Locked in id order (the primary key's), so two batches
# claiming side by side wait for each other, and the second sees the first's claims.
CLAIM_SQL = """UPDATE drawers d SET llm_claimed_until = now() + make_interval(secs => %(s)s), llm_claimed_by = c.owner
      FROM unnest(%(ids)s::text[], %(owners)s::text[]) AS c(id, owner)
     WHERE d.workspace_id = %(ws)s AND d.id = ANY(%(ids)s) AND d.id = c.id
       AND CASE WHEN d.state IN ('raw', 'failed') AND (d.llm_claimed_until IS NULL OR d.llm_claimed_until < now()
                                                       OR d.llm_claimed_by = c.owner)
                THEN true END  -- by key only: docs/scale.md
    RETURNING d.id"""


async def claim_for_llm(conn: AsyncConnection[Any], workspace_id: str, owners: dict[str, str], seconds: float,
                        ) -> set[str]:
    """Claim these drawers (drawer id → the event id asking about it) for at most ``seconds``; returns those
    claimed. One claimed by another event meanwhile is that event's to label: asked twice, the model's two
    answers would both be written, and a failure counted twice."""
    if not owners:
        return set()
    ids = sorted(owners)
    cur = await conn.execute(CLAIM_SQL, {"s": seconds, "ws": workspace_id, "ids": ids,
                                         "owners": [owners[i] for i in ids]})
    return {str(r[0]) for r in await cur.fetchall()}


async def release_llm_claims(conn: AsyncConnection[Any], workspace_id: str, drawer_ids: list[str]) -> None:
    """Give up this batch's claims (its answers, or failures, are written, or it failed before asking)."""
    if drawer_ids:
        await conn.execute("UPDATE drawers SET llm_claimed_until = NULL, llm_claimed_by = NULL"
                           " WHERE workspace_id = %s AND id = ANY(%s) AND llm_claimed_until IS NOT NULL",
                           (workspace_id, sorted(set(drawer_ids))))


async def record_llm_failures(
    conn: AsyncConnection[Any], workspace_id: str, failures: dict[str, tuple[str, dict[str, Any]]], *,
    max_failures: int, event_id: str,
) -> tuple[list[str], list[str]]:
    """Count one failed LLM attempt per drawer; at ``max_failures`` the drawer becomes ``failed``
    with the reason and keeps its heuristic label (never deleted, and visible in the quality report).

    failures: drawer id → (reason, heuristic outcome: memory_type, confidence, importance).
    Returns (drawers now failed, drawers still raw that should be tried again).
    """
    gave_up: list[str] = []
    again: list[str] = []
    for did, (reason, h) in failures.items():
        cur = await conn.execute(
            LLM_FAILURE_SQL,
            {"reason": (LLM_FAILURE_PREFIX + reason)[:1000], "ws": workspace_id, "id": did},
        )
        row = await cur.fetchone()
        if row is None:
            continue
        if row[0] < max_failures:
            again.append(did)
            continue
        await conn.execute(
            """UPDATE drawers SET state = 'failed', memory_type = %(memory_type)s, confidence = %(confidence)s,
                      importance = %(importance)s, pipeline_tier = 'heuristic', updated_at = now()
                WHERE workspace_id = %(ws)s AND id = %(id)s""",
            {**h, "ws": workspace_id, "id": did},
        )
        gave_up.append(did)
        await record_history(conn, workspace_id, drawer_id=did, action="FAIL", actor="classify",
                             event_id=event_id, reason=(LLM_FAILURE_PREFIX + reason)[:1000])
    return gave_up, again


async def record_usage(conn: AsyncConnection[Any], workspace_id: str, model: str, usage: list[Usage]) -> None:
    """Add attempts to the workspace's per-day cost rows."""
    totals: dict[str, list[float]] = {}
    for u in usage:
        t = totals.setdefault(u.purpose, [0, 0, 0, 0, 0.0])
        t[0 if u.outcome == "ok" else 1] += 1
        t[2] += u.tokens_in
        t[3] += u.tokens_out
        t[4] += u.seconds
    async with conn.cursor() as cur:
        await cur.executemany(
            """INSERT INTO llm_usage (workspace_id, day, purpose, model, calls_ok, calls_failed, tokens_in,
                                      tokens_out, seconds)
               VALUES (%s, current_date, %s, %s, %s, %s, %s, %s, %s)
               ON CONFLICT (workspace_id, day, purpose, model) DO UPDATE SET
                 calls_ok = llm_usage.calls_ok + EXCLUDED.calls_ok,
                 calls_failed = llm_usage.calls_failed + EXCLUDED.calls_failed,
                 tokens_in = llm_usage.tokens_in + EXCLUDED.tokens_in,
                 tokens_out = llm_usage.tokens_out + EXCLUDED.tokens_out,
                 seconds = llm_usage.seconds + EXCLUDED.seconds, updated_at = now()""",
            [(workspace_id, p, model, int(t[0]), int(t[1]), int(t[2]), int(t[3]), t[4]) for p, t in totals.items()],
        )


OTHER_WORKSPACES = "(other)"


async def llm_cost_today(conn: AsyncConnection[Any], *, top: int) -> list[tuple[str, str, int, int, int, int]]:
    """Today's LLM cost per workspace and purpose across all workspaces (run under the maintenance role):
    (workspace, purpose, calls_ok, calls_failed, tokens_in, tokens_out). The ``top`` workspaces by
    tokens keep their name; the rest are summed under OTHER_WORKSPACES, so a metric labelled with the
    workspace stays bounded however many workspaces there are."""
    cur = await conn.execute(
        """WITH t AS (SELECT workspace_id, purpose, sum(calls_ok) AS ok, sum(calls_failed) AS failed,
                             sum(tokens_in) AS tin, sum(tokens_out) AS tout
                        FROM llm_usage WHERE day = current_date GROUP BY 1, 2),
                top AS (SELECT workspace_id FROM t GROUP BY 1
                         ORDER BY sum(tin + tout) DESC, workspace_id LIMIT %(n)s)
           SELECT CASE WHEN t.workspace_id IN (SELECT workspace_id FROM top) THEN t.workspace_id
                       ELSE %(other)s END AS ws, purpose,
                  sum(ok)::bigint, sum(failed)::bigint, sum(tin)::bigint, sum(tout)::bigint
             FROM t GROUP BY 1, 2 ORDER BY 1, 2""",
        {"n": top, "other": OTHER_WORKSPACES})
    return [(r[0], r[1], int(r[2]), int(r[3]), int(r[4]), int(r[5])) for r in await cur.fetchall()]
