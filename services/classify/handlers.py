"""Subscribers of the classify service: heuristic → centroid → LLM, then ``drawer.classified``."""

from __future__ import annotations

from typing import Any

from nats.aio.msg import Msg
from psycopg import AsyncConnection

from services._runtime import Deps
from shared.adapters.llm import LlmClient, Usage
from shared.bus import decode_event, publish_event
from shared.db.centroids import load_centroids
from shared.db.curation import LLM_FAILURE_PREFIX, record_llm_failures, record_usage, save_llm_labels
from shared.db.drawers import DrawerRow, drawers_by_id, save_classifications
from shared.db.tenancy import workspace_tx, workspace_write
from shared.events import DrawerClassified, DrawerEmbedded
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
    async def on_drawer_embedded(body: bytes, raw: Msg) -> None:
        """drawer.embedded → (classify, then commit) → drawer.classified. No LLM call holds a transaction."""
        ev: DrawerEmbedded = decode_event(DrawerEmbedded, body, s)
        ws = ev.workspace_id
        async with workspace_tx(deps.pool, ws) as conn:
            # 'failed' too: maintain gives up on drawers raw for too long, even when their events were
            # only queued behind a backlog; when the work does arrive, it completes them. Not those the
            # LLM phase gave up on: their failure is final until an operator re-drives them. Only drawers
            # with a vector: one whose text changed after this event was published (forget re-points a
            # shared drawer) waits for its re-embedding, which announces it again.
            rows = [r for r in await drawers_by_id(conn, ws, ev.drawer_ids, with_embedding=True)
                    if r.has_embedding
                    and (r.state == "raw" or (r.state == "failed" and not _llm_gave_up(r.failure_reason)))]
            centroids = await load_centroids(conn, ws) if rows else []
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
                    "tier": d.tier} for i, d in decisions.items() if d.tier != "llm"]
        if decided:
            async with workspace_tx(deps.pool, ws) as conn:
                await save_classifications(conn, ws, decided, event_id=ev.event_id, actor="classify")
        DRAWERS.labels(deps.service, "processed").inc(len(decided))
        cold = [r for r in rows if decisions[r.id].tier == "llm"]
        if cold and llm is not None:
            await _cold_path(deps, llm, ev, cold, decisions)
        await publish_event(deps.broker, s, DrawerClassified(
            event_id=event_id_for("drawer.classified", ev.event_id), workspace_id=ws,
            session_id=ev.session_id, drawer_ids=ev.drawer_ids,
        ))


def _llm_gave_up(reason: str | None) -> bool:
    return bool(reason) and reason.startswith(LLM_FAILURE_PREFIX)  # type: ignore[union-attr]


async def _cold_path(
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
        return changed, gave_up, again

    # A deadlock with another service's writes runs this transaction again, not the model's calls.
    changed, gave_up, again = await workspace_write(deps.pool, ws, write)
    DRAWERS.labels(deps.service, "processed").inc(len(changed))
    DRAWERS.labels(deps.service, "failed").inc(len(gave_up))
    # The new labels reach the centroids at maintain's next `centroids` run (shared/lifecycle.py).
    if again:
        raise LlmPending(f"{len(again)} drawers without an LLM label yet: {next(iter(result.errors.values()))[:200]}")
