"""Subscribers of the classify service: heuristic → centroid → LLM, then ``drawer.classified``."""

from __future__ import annotations

import contextlib
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from nats.aio.msg import Msg
from psycopg import AsyncConnection

from services._runtime import Deps, ack_once, decode_batch
from shared.adapters.llm import LlmClient, Usage
from shared.bus import publish_event
from shared.db.centroids import load_centroids
from shared.db.curation import (
    LLM_FAILURE_PREFIX,
    claim_for_llm,
    record_llm_failures,
    record_usage,
    release_llm_claims,
    save_llm_labels,
)
from shared.db.drawers import DrawerRow, drawers_by_id, save_classifications
from shared.db.tenancy import retry_conflicts, workspace_write, workspaces_tx
from shared.events import DrawerClassified, DrawerEmbedded
from shared.faults import is_transient, to_raise
from shared.ids import event_id_for
from shared.logging import get_logger
from shared.memory.centroids import nearest_type
from shared.memory.classify import classify
from shared.memory.cold_path import label_with_llm
from shared.memory.phases import Decision, decide
from shared.metrics import DRAWERS

__all__ = ["LlmPending", "register"]

log = get_logger("palace.classify")


class LlmPending(Exception):
    """Some drawers got no LLM label this time and have attempts left: the event is retried later
    (NAK with backoff); drawers already labelled are skipped then."""


def register(deps: Deps) -> None:
    s = deps.settings
    llm = LlmClient(s) if s.llm_base_url else None

    @deps.handle(DrawerEmbedded)
    async def on_drawer_embedded(bodies: list[bytes], raws: list[Msg]) -> None:
        """drawer.embedded (batched) → (classify, then commit) → drawer.classified, one per event. No LLM
        call holds a transaction."""
        events = await decode_batch(deps, DrawerEmbedded, bodies, raws)
        if not events:
            return
        try:
            settled = await classify_events(events)
        except Exception as e:
            if is_transient(e) or len(events) == 1:
                raise  # the database is down for all of them: the loop holds, NAKs or dead-letters them
            # Something in the batch broke its transaction: each event alone, so one bad event fails only
            # itself (NAKed, then dead-lettered, by the loop); the others are committed and acked here.
            failed: list[Exception] = []
            for one in events:
                try:
                    alone = await classify_events([one])
                except Exception as err:
                    failed.append(err)
                    continue
                if alone.pending:
                    failed.append(LlmPending(f"drawers still lacking an LLM label: {alone.why[:200]}"))
                else:
                    await ack_once(one[1])
            if failed:
                raise to_raise(failed) from None
            return
        if settled.pending:
            # Acked: the events whose drawers are all labelled; the rest come back after a backoff.
            for ev, raw in events:
                if (ev.event_id or "") not in settled.pending:
                    await ack_once(raw)
            raise LlmPending(f"{len(settled.pending)} events with drawers still lacking an LLM label: "
                             f"{settled.why[:200]}")

    async def classify_events(events: list[tuple[DrawerEmbedded, Msg]]) -> _Settled:
        """Read, classify and save every event's drawers in one transaction (CPU work only between the
        read and the write), a workspace at a time; then the LLM's labels for the cold ones, outside it;
        then announce each event. Returns the events that are still waiting on the LLM."""
        by_ws: dict[str, list[DrawerEmbedded]] = defaultdict(list)
        for ev, _ in events:
            by_ws[ev.workspace_id].append(ev)
        cold: list[tuple[DrawerEmbedded, list[DrawerRow], dict[str, Decision]]] = []
        processed = 0
        async for attempt in retry_conflicts():
            with attempt:
                cold, processed = [], 0
                # Workspaces in a fixed order, each under its own row-level-security scope: the transaction
                # sees one workspace at a time (shared.db.tenancy.workspaces_tx).
                async with workspaces_tx(deps.pool) as scope:
                    for ws in sorted(by_ws):
                        conn = await scope(ws)
                        got, cold_here = await _classify_workspace(conn, ws, by_ws[ws])
                        processed += got
                        cold += cold_here
        DRAWERS.labels(deps.service, "processed").inc(processed)
        pending: dict[str, str] = {}
        for ev, rows, decisions in cold:
            if llm is None:
                continue
            try:
                await _cold_path(deps, llm, ev, rows, decisions)
            except LlmPending as e:
                pending[ev.event_id or ""] = str(e)
        for ev, _ in events:
            if (ev.event_id or "") in pending:
                continue  # announced once its drawers are labelled (or given up on)
            await publish_event(deps.broker, s, DrawerClassified(
                event_id=event_id_for("drawer.classified", ev.event_id), workspace_id=ev.workspace_id,
                session_id=ev.session_id, drawer_ids=ev.drawer_ids,
            ), caused_by=ev)
        return _Settled(set(pending), next(iter(pending.values()), ""))

    async def _classify_workspace(
        conn: AsyncConnection[Any], ws: str, evs: list[DrawerEmbedded],
    ) -> tuple[int, list[tuple[DrawerEmbedded, list[DrawerRow], dict[str, Decision]]]]:
        """One workspace's share of a batch, inside the batch's transaction: (drawers saved, the events
        with drawers left for the LLM)."""
        # Each drawer is audited under the first event of the batch that names it.
        owner: dict[str, DrawerEmbedded] = {}
        for ev in evs:
            for i in ev.drawer_ids:
                owner.setdefault(i, ev)
        # 'failed' too: maintain gives up on drawers raw for too long, even when their events were only
        # queued behind a backlog; when the work does arrive, it completes them. Not those the LLM phase
        # gave up on: their failure is final until an operator re-drives them. Only drawers with a vector:
        # one whose text changed after this event was published (forget re-points a shared drawer) waits
        # for its re-embedding, which announces it again.
        rows = [r for r in await drawers_by_id(conn, ws, list(owner), with_embedding=True)
                if r.has_embedding
                and (r.state == "raw" or (r.state == "failed" and not _llm_gave_up(r.failure_reason)))]
        if not rows:
            return 0, []
        centroids = await load_centroids(conn, ws)
        decisions: dict[str, Decision] = {}
        for r in rows:
            c = classify(r.content)
            hit = None
            if centroids and r.embedding is not None and s.heuristic_low <= c.confidence < s.heuristic_high:
                hit = nearest_type(r.embedding, centroids, min_cosine=s.centroid_min_cosine,
                                   min_samples=s.centroid_min_samples)
            decisions[r.id] = decide(c, low=s.heuristic_low, high=s.heuristic_high, centroid_hit=hit,
                                     llm_enabled=llm is not None)
        decided = [{"id": i, "memory_type": d.memory_type, "confidence": d.confidence, "importance": d.importance,
                    "tier": d.tier, "event_id": owner[i].event_id} for i, d in decisions.items() if d.tier != "llm"]
        saved = await save_classifications(conn, ws, decided, event_id=None, actor="classify") if decided else 0
        # The drawers for the model, claimed for this batch: one another batch is asking about (another
        # event naming it, a re-drive) is left to it; that batch announces it once labelled. A claim lasts
        # as long as a handler may run, so one of a batch that died is taken over afterwards.
        claimed = await claim_for_llm(conn, ws, {r.id: owner[r.id].event_id or "" for r in rows
                                                 if decisions[r.id].tier == "llm"}, s.handler_timeout_s)
        cold = []
        for ev in evs:
            mine = [r for r in rows if owner[r.id] is ev and r.id in claimed]
            if mine:
                cold.append((ev, mine, {r.id: decisions[r.id] for r in mine}))
        return saved, cold


@dataclass(frozen=True)
class _Settled:
    """What a batch left undone: the events still waiting on LLM labels, and why."""

    pending: set[str]
    why: str


def _llm_gave_up(reason: str | None) -> bool:
    return bool(reason) and reason.startswith(LLM_FAILURE_PREFIX)  # type: ignore[union-attr]


async def _cold_path(
    deps: Deps, llm: LlmClient, ev: DrawerEmbedded, cold: list[DrawerRow], decisions: dict[str, Decision]
) -> None:
    """The model's labels for an event's claimed drawers, written with their failures; the claims given up
    either way."""
    ws = ev.workspace_id
    try:
        await _label_and_write(deps, llm, ev, cold, decisions)
    except LlmPending:
        raise  # written, claims included: the drawers with attempts left are asked about again later
    except BaseException:
        # Nothing written (or not all of it): the claims go, so that another event may ask at once (this
        # one, delivered again, would take them back anyway).
        with contextlib.suppress(Exception):
            await workspace_write(deps.pool, ws, lambda conn: release_llm_claims(conn, ws, [r.id for r in cold]))
        raise


async def _label_and_write(
    deps: Deps, llm: LlmClient, ev: DrawerEmbedded, cold: list[DrawerRow], decisions: dict[str, Decision]
) -> None:
    s, ws = deps.settings, ev.workspace_id
    usage: list[Usage] = []

    async def chat(messages: list[dict[str, str]]) -> str:
        return await llm.chat(messages, purpose="classify", usage=usage)

    result = await label_with_llm(chat, [(r.id, r.content) for r in cold], batch=s.llm_batch)
    for w in result.warnings:
        log.warning("llm_label_warning", workspace_id=ws, warning=w[:300])
    failures = {
        did: (why, {k: getattr(decisions[did], k) for k in ("memory_type", "confidence", "importance")})
        for did, why in result.errors.items()
    }
    async def write(conn: AsyncConnection[Any]) -> tuple[list[str], list[str], list[str]]:
        changed = await save_llm_labels(
            conn, ws, {d: (lab, decisions[d].importance) for d, lab in result.labels.items()}, event_id=ev.event_id
        )
        gave_up, again = await record_llm_failures(conn, ws, failures, max_failures=s.llm_max_failures,
                                                   event_id=ev.event_id)
        await record_usage(conn, ws, s.llm_model, usage)
        await release_llm_claims(conn, ws, [r.id for r in cold])
        return changed, gave_up, again

    # A deadlock with another service's writes runs this transaction again, not the model's calls.
    changed, gave_up, again = await workspace_write(deps.pool, ws, write)
    DRAWERS.labels(deps.service, "processed").inc(len(changed))
    DRAWERS.labels(deps.service, "failed").inc(len(gave_up))
    # The new labels reach the centroids at maintain's next `centroids` run (shared/lifecycle.py).
    if again:
        raise LlmPending(f"{len(again)} drawers without an LLM label yet: {next(iter(result.errors.values()))[:200]}")
