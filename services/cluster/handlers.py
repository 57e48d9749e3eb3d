"""Subscribers of the cluster service."""

from __future__ import annotations

import asyncio
import contextlib

from nats.aio.msg import Msg

from services._runtime import Deps
from shared.adapters.llm import LlmClient, Usage
from shared.bus import decode_event
from shared.db.curation import record_usage
from shared.db.decisions import apply_proposal
from shared.db.drawers import (
    drawers_by_id,
    drawers_missing_bands,
    older_neighbours,
    older_twins,
    record_history,
    set_dedup_bands,
)
from shared.db.search import SearchParams, hybrid_search
from shared.db.tenancy import maintenance_tx, workspace_tx
from shared.events import DrawerClassified, EntityUpserted
from shared.logging import get_logger
from shared.memory import contradiction
from shared.memory import decisions as writes
from shared.memory.dedup import decide, wording_bands
from shared.metrics import DRAWERS

__all__ = ["backfill_bands", "register"]

log = get_logger("palace.cluster")
_CANDIDATES = SearchParams(k=6)  # top 5 besides the drawer itself


def register(deps: Deps) -> None:
    s = deps.settings
    llm = LlmClient(s) if s.llm_base_url else None

    async def verdict(older: str, newer: str, usage: list[Usage]) -> contradiction.Verdict:
        """The LLM's verdict when one is configured and answers; the lexical detector otherwise."""
        if llm is not None:
            try:
                answer = await llm.chat(contradiction.build_messages(older, newer), purpose="contradiction",
                                        usage=usage)
                return contradiction.parse_verdict(answer)
            except Exception as e:
                log.warning("contradiction_llm_fallback", error=repr(e)[:300])
        return contradiction.lexical_contradiction(older, newer)

    async def propose(fact: str, cands: list[tuple[str, str]], usage: list[Usage]) -> writes.Proposal:
        """No candidates: ADD without asking. An exact restatement (normalised SHA-256): NONE. Otherwise
        the LLM decides when configured; without one (or when it fails) the fact is kept: ADD."""
        if not cands:
            return writes.Proposal("ADD", None, "no similar memories", 1.0, source="rule")
        h = writes.content_hash(fact)
        same = next((c for c, text in cands if writes.content_hash(text) == h), None)
        if same is not None:
            return writes.Proposal("NONE", same, "same normalised content (sha256)", 1.0, source="rule")
        if llm is not None:
            try:
                answer = await llm.chat(writes.build_messages(fact, cands), purpose="decision", usage=usage)
                return writes.parse_proposal(answer)
            except Exception as e:
                log.warning("decision_llm_fallback", error=repr(e)[:300])
                return writes.Proposal("ADD", None, f"LLM unavailable ({type(e).__name__}): kept as new", 1.0,
                                          source="rule")
        return writes.Proposal("ADD", None, "no LLM configured: kept as new", 1.0, source="rule")

    @deps.handle(DrawerClassified)
    async def on_drawer_classified(body: bytes, raw: Msg) -> None:
        """drawer.classified → merge near-duplicates into their older twin; an older drawer that a newer
        one contradicts is superseded by it (ranks below it, never deleted). Both audited."""
        ev: DrawerClassified = decode_event(DrawerClassified, body, s)
        async with workspace_tx(deps.pool, ev.workspace_id) as conn:
            rows = await drawers_by_id(conn, ev.workspace_id, ev.drawer_ids, with_embedding=True)
            decisions = []
            checks = []
            proposing = []
            for r in rows:
                if r.state != "processed" or r.embedding is None:
                    continue
                # Ingest stored the bands with the row (the backfill below covers older drawers).
                twins = await older_twins(conn, ev.workspace_id, r.id, r.embedding,
                                          wording_bands(ev.workspace_id, r.content))
                # "enabled" and "disabled" differ by one word: a negation is never a duplicate to merge away.
                d = decide(r.content, [t for t in twins
                                       if not contradiction.lexical_contradiction(t[2], r.content).contradicts],
                           s.dedup_threshold)
                if d.action == "MERGE":
                    decisions.append((r.id, d))
                    continue
                # The band's upper end is the merge rule: a neighbour that is not near-verbatim may still be
                # its negation ("enabled" / "disabled" sit very close in embedding space). Neighbours by
                # embedding here, not by wording: a contradiction may be worded differently.
                near = await older_neighbours(conn, ev.workspace_id, r.id, r.embedding)
                band = [t for t in near if t[1] >= s.contradiction_low]
                if band:
                    checks.append((r.id, r.content, band))
                hits = await hybrid_search(conn, ev.workspace_id, r.content, r.embedding, _CANDIDATES)
                proposing.append((r, [(h.id, h.content) for h in hits if h.id != r.id][:5]))
        # Contradiction checks outside any transaction: the LLM may be asked.
        usage: list[Usage] = []
        supersede = []
        for did, content, band in checks:
            for tid, sim, tcontent in band:
                v = await verdict(tcontent, content, usage)
                if v.contradicts:
                    supersede.append((tid, did, sim, v.reason))
        proposals = [(r, await propose(r.content, cands, usage), cands) for r, cands in proposing]
        if supersede or usage or proposals:
            async with workspace_tx(deps.pool, ev.workspace_id) as conn:
                for old, new, sim, reason in supersede:
                    cur = await conn.execute(
                        """UPDATE drawers SET superseded_by = %(new)s, updated_at = now()
                            WHERE workspace_id = %(ws)s AND id = %(old)s AND superseded_by IS NULL
                              AND state = 'processed' AND deleted_at IS NULL""",
                        {"new": new, "old": old, "ws": ev.workspace_id},
                    )
                    if cur.rowcount:
                        await record_history(
                            conn, ev.workspace_id, drawer_id=old, action="SUPERSEDE", actor="cluster",
                            event_id=ev.event_id, reason=reason, old_value={"superseded_by": None},
                            new_value={"superseded_by": new, "similarity": round(sim, 4)},
                        )
                        DRAWERS.labels(deps.service, "superseded").inc()
                for r, p, cands in proposals:
                    why = writes.validate(p, {c for c, _ in cands}, gate=s.decisions_gate)
                    await apply_proposal(conn, ev.workspace_id, p, source_drawer=r.id, source_embedding=r.embedding,
                                         mode=s.decisions_mode, event_id=ev.event_id, dropped=why)
                if usage:
                    await record_usage(conn, ev.workspace_id, s.llm_model, usage)
        for did, d in decisions:
            async with workspace_tx(deps.pool, ev.workspace_id) as conn:
                # Merge only while the target is still a live, processed drawer (checked in the same statement).
                cur = await conn.execute(
                    """UPDATE drawers SET state = 'merged', cluster_id = %(t)s, updated_at = now()
                        WHERE workspace_id = %(ws)s AND id = %(id)s AND state = 'processed'
                          AND EXISTS (SELECT 1 FROM drawers t WHERE t.workspace_id = %(ws)s AND t.id = %(t)s
                                         AND t.state = 'processed' AND t.deleted_at IS NULL)""",
                    {"t": d.target, "ws": ev.workspace_id, "id": did},
                )
                if cur.rowcount:
                    await record_history(conn, ev.workspace_id, drawer_id=did, action="MERGE", actor="cluster",
                                         event_id=ev.event_id, reason=d.reason, new_value={"cluster_id": d.target})
                    DRAWERS.labels(deps.service, "merged").inc()

    @deps.handle(EntityUpserted)
    async def on_entity_upserted(body: bytes, raw: Msg) -> None:
        """entity.upserted → refresh mention counts of the entities."""
        ev: EntityUpserted = decode_event(EntityUpserted, body, s)
        async with workspace_tx(deps.pool, ev.workspace_id) as conn:
            await conn.execute(
                """UPDATE entities e SET mention_count = m.n, updated_at = now()
                     FROM (SELECT entity_id, count(*) AS n FROM entity_mentions
                            WHERE workspace_id = %(ws)s AND entity_id = ANY(%(ids)s) GROUP BY entity_id) m
                    WHERE e.workspace_id = %(ws)s AND e.id = m.entity_id""",
                {"ws": ev.workspace_id, "ids": ev.entity_ids},
            )


async def backfill_bands(deps: Deps, stop: asyncio.Event) -> None:
    """Give drawers processed before wording bands existed their bands, in small batches, so the
    near-duplicate check finds them too. Idempotent: replicas racing on a batch write the same values."""
    while not stop.is_set():
        done = 0
        with contextlib.suppress(Exception):  # retried next round; a failure here never stops the service
            async with maintenance_tx(deps.pool) as conn:
                rows = await drawers_missing_bands(conn, 500)
                by_ws: dict[str, list[tuple[str, list[int]]]] = {}
                for ws, did, content in rows:
                    by_ws.setdefault(ws, []).append((did, wording_bands(ws, content)))
                for ws, items in by_ws.items():
                    await set_dedup_bands(conn, ws, items)
                done = len(rows)
        if done < 500:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 60.0)
