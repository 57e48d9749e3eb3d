"""Subscribers of the cluster service."""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from typing import Any

from nats.aio.msg import Msg
from threadpoolctl import threadpool_limits

from services._runtime import Deps, ack_once, decode_batch
from shared.adapters.llm import LlmClient, Usage
from shared.bus import announce_rewritten, decode_event
from shared.db.clustering import cluster_candidates, merge_many, record_history_many, said_when, supersede_many
from shared.db.curation import record_usage
from shared.db.decisions import apply_proposal, decided_sources, lock_decision_sources, lock_targets
from shared.db.drawers import (
    drawers_by_id,
    drawers_missing_bands,
    set_dedup_bands,
    workspace_size,
)
from shared.db.entity_dedup import key_entities_span
from shared.db.episodes import existing_drawers
from shared.db.forget import lock_for_write, writer_tx
from shared.db.tenancy import maintenance_tx, workspace_tx
from shared.db.vector_indexes import recheck_after, vector_index_for
from shared.events import DrawerClassified, EntityUpserted
from shared.faults import is_transient, to_raise
from shared.kg_dedup import dedup_entities
from shared.logging import get_logger
from shared.memory import contradiction
from shared.memory import decisions as writes
from shared.memory.dedup import decide, wording_bands
from shared.memory.neighbours import VectorCache
from shared.metrics import DRAWERS, ENTITIES

__all__ = ["backfill_bands", "backfill_entity_keys", "register"]

log = get_logger("palace.cluster")
# How long a workspace's settled "has a ready HNSW index" answer is reused (one that waits for a build
# is asked again after PALACE_VECTOR_INDEX_POLL_S). Either answer gives correct neighbours (the index
# only makes the walk cheaper), so a stale one costs time, never a result.
_INDEX_CHECK_S = 60.0


@dataclass(frozen=True)
class _Reading:
    """What a drawer.classified event's decisions are taken on: its drawers still waiting for one, and
    their twins and neighbours (by drawer id), with who said each."""

    rows: list[Any]
    found: dict[str, Any]
    said: dict[str, tuple[Any, Any, Any]] = field(default_factory=dict)  # drawer id → (occurred_at, session, seq)


def _said_later(a: tuple[Any, Any, Any] | None, b: tuple[Any, Any, Any] | None) -> bool:
    """Whether ``a`` was said after ``b``: a later time, or at the same time a later turn of the same session.
    Unknown (no time on either): no."""
    if a is None or b is None or a[0] is None or b[0] is None:
        return False
    if a[0] != b[0]:
        return bool(a[0] > b[0])
    return a[1] == b[1] and a[2] is not None and b[2] is not None and a[2] > b[2]


@dataclass
class _Plan:
    """The writes decided for an event's drawers, and the model's usage that decided them."""

    rows: list[Any]
    decisions: list[tuple[str, Any]] = field(default_factory=list)  # (drawer merged, its MERGE decision)
    supersede: list[tuple[str, str, float, str]] = field(default_factory=list)  # (older, newer, cosine, why)
    proposals: list[tuple[Any, writes.Proposal, list[tuple[str, str]]]] = field(default_factory=list)
    usage: list[Usage] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not (self.decisions or self.supersede or self.proposals or self.usage)


def register(deps: Deps) -> None:
    s = deps.settings
    llm = LlmClient(s) if s.llm_base_url else None
    indexed_at: dict[str, tuple[float, bool]] = {}  # workspace → (when to ask again, ready)
    vectors = VectorCache(s.cluster_vector_cache_mb * 2**20) if s.cluster_vector_cache_mb else None
    # The cache's rankings are small matrix products, one event at a time: BLAS threads would wait for
    # work between them, spinning on cores the other services (and replicas) need.
    threadpool_limits(1, user_api="blas")

    async def has_index(conn: Any, ws: str) -> bool:
        """Whether the workspace's own HNSW index is ready, asking maintain for one once the workspace
        outgrows exact scans (at most once a minute per workspace, more often while one is awaited)."""
        now = time.monotonic()
        hit = indexed_at.get(ws)
        if hit is None or now >= hit[0]:
            if len(indexed_at) > 10_000:
                indexed_at.clear()
            size = await workspace_size(conn, ws, s.vector_index_min_drawers + 1)
            ready = await vector_index_for(conn, ws, size, s.vector_index_min_drawers)
            hit = indexed_at[ws] = (now + recheck_after(size, ready, s.vector_index_min_drawers, _INDEX_CHECK_S,
                                                        s.vector_index_poll_s), ready)
        return hit[1]

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

    async def read_event(conn: Any, ev: DrawerClassified) -> _Reading:
        """The event's drawers still waiting for a decision, their twins and neighbours, and who said each
        candidate a decision could concern."""
        ws = ev.workspace_id
        rows = [r for r in await drawers_by_id(conn, ws, ev.drawer_ids, with_embedding=True)
                if r.state == "processed" and r.embedding is not None]
        # A drawer is decided once: a redelivery (an ack lost after the commit), or another event naming it
        # again, skips it.
        done = await decided_sources(conn, ws, [r.id for r in rows])
        rows = [r for r in rows if r.id not in done]
        # Ingest stored the bands with the row; a drawer filed before they existed has them computed here
        # (and written by the backfill below).
        found = await cluster_candidates(conn, ws, [(r.id, r.embedding, r.dedup_bands or wording_bands(ws, r.content))
                                                    for r in rows], indexed=await has_index(conn, ws),
                                         cache=vectors)
        # When each was said, for the neighbours close enough to be checked for a contradiction (only they
        # are ever compared): most events have none, and pay no round trip for it.
        close = {t[0] for r in rows for t in found[r.id].near if t[1] >= s.contradiction_low}
        said = await said_when(conn, ws, sorted(close | {r.id for r in rows})) if close else {}
        return _Reading(rows, found, said)

    async def decide_reading(got: _Reading) -> _Plan:
        """Merges, supersessions and write decisions for what was read: rules only, or the model's
        answers (then called outside any transaction: see on_drawer_classified)."""
        rows, found = got.rows, got.found
        # Who said each twin and each neighbour (same_voice), read with them.
        voices = {i: who for r in rows for i, who in found[r.id].speakers.items()}
        plan = _Plan(rows)
        checks = []
        proposing = []
        for r in rows:
            n = found[r.id]
            # "enabled" and "disabled" differ by one word: a negation is never a duplicate to merge away. Nor is
            # another person's same words: "I love hiking" said by two people is two memories, each its
            # speaker's (merged, the younger one would leave recall). A pair merges into the one filed first,
            # whichever of the two is processed last (and finds the other).
            twins = [t for t in n.twins if contradiction.same_voice(voices.get(t[0]), r.speaker)]
            d = decide(r.content, [t for t in twins if t[0] not in n.newer
                                   and not contradiction.lexical_contradiction(t[2], r.content).contradicts],
                       s.dedup_threshold)
            if d.action == "MERGE":
                plan.decisions.append((r.id, d))
                continue
            absorbed = set()
            for tid, sim, tcontent in twins:
                if tid in n.newer and not contradiction.lexical_contradiction(r.content, tcontent).contradicts:
                    d = decide(tcontent, [(r.id, sim, r.content)], s.dedup_threshold)
                    if d.action == "MERGE":
                        plan.decisions.append((tid, d))
                        absorbed.add(tid)
            # The band's upper end is the merge rule: a neighbour that is not near-verbatim may still be
            # its negation ("enabled" / "disabled" sit very close in embedding space). Neighbours by
            # embedding here, not by wording: a contradiction may be worded differently.
            # And said by the same person: two people disagreeing is two facts, not a correction.
            band = [t for t in n.near if t[1] >= s.contradiction_low and t[0] not in absorbed
                    and contradiction.same_voice(voices.get(t[0]), r.speaker)]
            if band:
                checks.append((r.id, r.content, band, n.newer))
            # A write decision concerns what was known before the drawer: its older neighbours.
            proposing.append((r, [(nid, content) for nid, _, content in n.near if nid not in n.newer]))
        compared: set[frozenset[str]] = set()
        for did, content, band, newer in checks:
            for tid, sim, tcontent in band:
                if frozenset((did, tid)) in compared:  # two drawers of the event, each the other's neighbour
                    continue
                compared.add(frozenset((did, tid)))
                # Compared in filing order; the one said last supersedes (a drawer filed first may have
                # been said after: a later turn of the same session, or history imported late).
                first, then = (did, tid) if tid in newer else (tid, did)
                texts = {did: content, tid: tcontent}
                v = await verdict(texts[first], texts[then], plan.usage)
                if v.contradicts:
                    if _said_later(got.said.get(first), got.said.get(then)):
                        plan.supersede.append((then, first, sim, v.reason))
                    else:
                        plan.supersede.append((first, then, sim, v.reason))
        plan.proposals = [(r, await propose(r.content, cands, plan.usage), cands) for r, cands in proposing]
        return plan

    @deps.handle(DrawerClassified)
    async def on_drawer_classified(body: bytes, raw: Msg) -> None:
        """drawer.classified → merge near-duplicates into their older twin; an older drawer that a newer
        one contradicts is superseded by it (ranks below it, never deleted); a write decision on the rest,
        taken against their nearest older memories. All audited.

        Without a model, deciding is CPU work on what was just read, so reading, deciding and writing are
        one transaction, ordered with forget from its start. With one, the model is asked between a read
        transaction and a write transaction, and the write checks what was forgotten meanwhile."""
        ev: DrawerClassified = decode_event(DrawerClassified, body, s)
        ws = ev.workspace_id
        rewritten: list[str] = []
        if llm is None:
            async with writer_tx(deps.pool, ws) as conn:
                # A forget waits for this transaction (and one under way finishes first): nothing read
                # below can be forgotten before this commits.
                await lock_for_write(conn, ws)
                plan = await decide_reading(await read_event(conn, ev))
                if not plan.empty:
                    rewritten = await write_plan(conn, ev, plan, checked=True)
        else:
            async with workspace_tx(deps.pool, ws) as conn:
                got = await read_event(conn, ev)
            plan = await decide_reading(got)  # the model's calls, outside any transaction
            if plan.empty:
                return
            async with writer_tx(deps.pool, ws) as conn:
                await lock_for_write(conn, ws)
                rewritten = await write_plan(conn, ev, plan, checked=False)
        # Committed: the targets of applied UPDATEs have their new words embedded and classified.
        await announce_rewritten(deps.broker, s, ws, rewritten, ev.event_id or "", caused_by=ev)

    async def write_plan(conn: Any, ev: DrawerClassified, plan: _Plan, *, checked: bool) -> list[str]:
        """Write the plan in the caller's transaction, which holds the forget lock. ``checked``: the drawers
        were read in this same transaction, after the lock (none can have been forgotten since). Returns the
        drawers an applied UPDATE rewrote."""
        ws = ev.workspace_id
        rows, decisions, supersede_, proposals, usage = (plan.rows, plan.decisions, plan.supersede,
                                                         plan.proposals, plan.usage)
        if not checked:
            # Ordered with forget (shared.db.forget): a drawer forgotten since it was read is gone now,
            # and no decision involving it is written (one would name it, or carry its text into
            # another drawer); a forget starting now waits for this transaction and sees what it wrote.
            involved = {r.id for r in rows} | {t for old, new, _, _ in supersede_ for t in (old, new)}
            involved |= {t for did, d in decisions for t in (did, d.target)}
            involved |= {c for _, _, cands in proposals for c, _ in cands}
            gone = involved - await existing_drawers(conn, ws, sorted(involved))
            if gone:
                supersede_ = [x for x in supersede_ if not {x[0], x[1]} & gone]
                decisions = [(did, d) for did, d in decisions if did not in gone and d.target not in gone]
                proposals = [(r, p, cands) for r, p, cands in proposals
                             if r.id not in gone and not {c for c, _ in cands} & gone]
        if proposals:
            # Another event naming the same drawer (announced again) may have been decided side by side with
            # this one: written one after the other, the second finds the drawer decided and writes nothing
            # (a second UPDATE or DELETE, or a second held proposal, from the model's second answer).
            await lock_decision_sources(conn, ws, [r.id for r, _, _ in proposals])
            done = await decided_sources(conn, ws, [r.id for r, _, _ in proposals])
            proposals = [(r, p, cands) for r, p, cands in proposals if r.id not in done]
        # Every drawer this plan writes, locked in id order before the first write: two events writing the
        # same drawers (a supersession, a merge of a twin filed later, an UPDATE's target) side by side then
        # write one after the other instead of deadlocking; and an UPDATE's check (``judged``) sees the
        # words the other wrote, not the ones both were shown.
        # A twin merged into is locked too: an edit retiring it (ingest) then either commits first, and the
        # merge finds it deleted, or waits, and finds the merge.
        await lock_targets(conn, ws, [old for old, _, _, _ in supersede_] + [did for did, _ in decisions]
                           + [d.target for _, d in decisions if d.target]
                           + [p.target for _, p, _ in proposals if p.action in ("UPDATE", "DELETE") and p.target])
        history: list[dict[str, Any]] = []
        # The event's supersessions, then its merges: one statement each, whatever their number.
        marked = await supersede_many(conn, ws, [(old, new) for old, new, _, _ in supersede_])
        for old, new, sim, reason in supersede_:
            if old in marked:
                marked.discard(old)  # audited under the newer drawer that marked it, the first one named
                history.append({"drawer_id": old, "action": "SUPERSEDE", "actor": "cluster",
                                "event_id": ev.event_id, "reason": reason, "old_value": {"superseded_by": None},
                                "new_value": {"superseded_by": new, "similarity": round(sim, 4)}})
                DRAWERS.labels(deps.service, "superseded").inc()
        merged = await merge_many(conn, ws, [(did, d.target) for did, d in decisions])
        for did, d in decisions:
            if did in merged:
                merged.discard(did)  # audited once, under its first twin (the one it was merged into)
                # Its prior state, exactly (MERGE_SQL merges only a processed drawer, and nothing else sets
                # cluster_id): `palace revert` brings it back.
                history.append({"drawer_id": did, "action": "MERGE", "actor": "cluster", "event_id": ev.event_id,
                                "reason": d.reason, "old_value": {"state": "processed", "cluster_id": None},
                                "new_value": {"state": "merged", "cluster_id": d.target}})
                DRAWERS.labels(deps.service, "merged").inc()
        # Pipelined: an audit-only decision (ADD, NONE) waits for no answer, so the event's decisions
        # travel in one round trip instead of one each; their audit rows are collected, and written with
        # the merges' and supersessions' in one statement.
        rewritten = []
        async with conn.pipeline():
            for r, p, cands in proposals:
                why = writes.validate(p, {c for c, _ in cands}, gate=s.decisions_gate)
                outcome = await apply_proposal(conn, ws, p, source_drawer=r.id, mode=s.decisions_mode,
                                               event_id=ev.event_id, dropped=why, audit=history,
                                               judged=None if checked else dict(cands).get(p.target or ""))
                if outcome == "applied" and p.action == "UPDATE" and p.target:
                    rewritten.append(p.target)
        await record_history_many(conn, ws, history)
        if usage:
            await record_usage(conn, ws, s.llm_model, usage)
        return rewritten

    @deps.handle(EntityUpserted)
    async def on_entity_upserted(bodies: list[bytes], raws: list[Msg]) -> None:
        """entity.upserted (batched) → mention counts, then entity dedup: merge the same entity (audited,
        reversible), flag look-alikes for an operator. The events of one workspace are taken together:
        one recount and one candidate search for all the entities they name."""
        events = await decode_batch(deps, EntityUpserted, bodies, raws)
        by_ws: dict[str, list[tuple[EntityUpserted, Msg]]] = {}
        for ev, raw in events:
            by_ws.setdefault(ev.workspace_id, []).append((ev, raw))
        failed: list[Exception] = []
        for ws in sorted(by_ws):
            group = by_ws[ws]
            try:
                await dedup_events(ws, [ev for ev, _ in group])
            except Exception as e:
                if is_transient(e) or len(events) == 1:
                    raise  # the database is down for all of them: the loop holds, NAKs or dead-letters them
                # Each event of the workspace alone: one bad event fails only itself (NAKed, then
                # dead-lettered, by the loop); the others are committed and acked here.
                for ev, raw in group:
                    try:
                        await dedup_events(ws, [ev])
                    except Exception as one:
                        failed.append(one)
                    else:
                        await ack_once(raw)
                continue
            if failed or len(by_ws) > 1:
                for _, raw in group:  # done: not to be redone if a later workspace's events fail
                    await ack_once(raw)
        if failed:
            raise to_raise(failed) from None

    async def dedup_events(ws: str, evs: list[EntityUpserted]) -> None:
        # A merge is audited under the first of the events (a replay merges nothing twice).
        out = await dedup_entities(deps.pool, ws, sorted({i for ev in evs for i in ev.entity_ids}),
                                   context_threshold=s.entity_context_similarity,
                                   event_id=min(ev.event_id or "" for ev in evs) or None)
        if out.merged:
            ENTITIES.labels(deps.service, "merged").inc(len(out.merged))
        if out.flagged:
            ENTITIES.labels(deps.service, "flagged").inc(out.flagged)


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


async def backfill_entity_keys(deps: Deps, stop: asyncio.Event) -> None:
    """One walk of the entities at start, giving those written before entity dedup existed their
    dedup keys (new ones get theirs on entity.upserted), so they are found as candidates too."""
    after: tuple[str, str] | None = ("", "")
    while after is not None and not stop.is_set():
        try:
            async with maintenance_tx(deps.pool) as conn:
                after = await key_entities_span(conn, after, 500)
        except Exception as e:  # retried after a pause; a failure here never stops the service
            log.warning("entity_keys_backfill_failed", error=repr(e)[:300])
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 60.0)
