"""Subscribers of the enrich service."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from dataclasses import dataclass
from typing import Any

from nats.aio.msg import Msg
from psycopg import AsyncConnection

from services._runtime import Deps
from shared.adapters.llm import LlmClient, LlmError
from shared.bus import Poison, decode_event, publish_event
from shared.db.curation import record_usage
from shared.db.drawers import record_history
from shared.db.episodes import (
    discard_pending_episode,
    episode_progress,
    existing_drawers,
    mark_announced,
    mark_episode_pending,
    overdue_episodes,
    save_episode,
    session_turns,
    sessions_awaiting_episode,
    unannounced_episode,
)
from shared.db.forget import forgotten
from shared.db.kg import ExtractionStored, record_extraction, refresh_entities
from shared.db.maintenance import take_lease
from shared.db.tenancy import maintenance_tx, workspace_tx
from shared.events import DrawerEmbedded, EntityUpserted, EpisodicCreated, SessionStored
from shared.ids import event_id_for, stable_id
from shared.logging import get_logger
from shared.memory.episodes import episode_embedding, summarize_session
from shared.memory.kg import Sighting
from shared.memory.llm_labels import LlmParseError
from shared.memory.semantic import Turn, build_messages, parse_answer, pattern_sightings, speaker_types

__all__ = ["complete_episode", "episode_sweeper", "extract_episode", "register"]

log = get_logger("palace.enrich")


@dataclass(frozen=True)
class _EpisodeStep:
    """Where one pass over a session's episode left it: the outcome, and the built episode still to be
    announced (what ``episodic.created`` carries), if any."""

    outcome: str
    ready: dict[str, Any] | None = None


async def _advance_episode(conn: AsyncConnection[Any], deps: Deps, workspace_id: str, session_id: str) -> _EpisodeStep:
    """Inside the caller's workspace transaction (which may already have done other work): decide what
    is left to do for the session's episode and do it, up to the announcement. Building it is CPU work
    on the turns just read (no model, no network), so it commits with the read: one transaction where
    there were two."""
    s = deps.settings
    episode_id = stable_id("episode", workspace_id, session_id)
    progress = await episode_progress(conn, workspace_id, episode_id)
    if progress is None:
        return _EpisodeStep("absent")  # session.stored opens it, and checks again itself
    if progress.status == "pending":
        if progress.unembedded and progress.waited_s < s.episode_wait_s:
            return _EpisodeStep("waiting")  # the drawer.embedded of its last drawers comes back here
        turns = await session_turns(conn, workspace_id, session_id)
        if not turns:
            await discard_pending_episode(conn, workspace_id, episode_id)
            return _EpisodeStep("absent")
        if await forgotten(conn, workspace_id, session_id=session_id):
            return _EpisodeStep("forgotten")  # nothing may be written back
        draft = summarize_session([(t["speaker"], t["content"]) for t in turns])
        vector = episode_embedding([t["embedding"] for t in turns if t["embedding"] is not None])
        await save_episode(conn, workspace_id, episode_id=episode_id, source_hash=progress.source_hash,
                           summary=draft.summary, abstract=draft.abstract, topics=draft.topics,
                           embedding=vector, ttl_days=s.episode_ttl_days)
        return _EpisodeStep("built", await unannounced_episode(conn, workspace_id, episode_id))
    if progress.announced:
        return _EpisodeStep("done")
    return _EpisodeStep("done", await unannounced_episode(conn, workspace_id, episode_id))


async def complete_episode(deps: Deps, workspace_id: str, session_id: str, *,
                           step: _EpisodeStep | None = None) -> str:
    """Build the session's opened episode once its drawers are embedded (or it has waited
    ``episode_wait_s``), then publish ``episodic.created`` once. Safe to call any number of times,
    from any trigger: every step is keyed by the episode and the session's content hash. ``step``: what
    the caller's own transaction already did (``_advance_episode``), so it is not done again.

    Returns what happened ('absent', 'waiting', 'built', 'announced', 'done') for logs and tests.
    """
    if step is None:
        async with workspace_tx(deps.pool, workspace_id) as conn:
            step = await _advance_episode(conn, deps, workspace_id, session_id)
    ready = step.ready
    if ready is None:
        return step.outcome
    # Commit, then publish, then record it: a crash in between publishes again (same event id, so
    # JetStream's duplicate window drops it and consumers are idempotent anyway), never loses it.
    episode_id = stable_id("episode", workspace_id, session_id)
    await publish_event(deps.broker, deps.settings, EpisodicCreated(
        event_id=event_id_for("episodic.created", episode_id, ready["source_hash"] or ""),
        workspace_id=workspace_id, episode_id=episode_id, session_id=session_id, summary=ready["summary"],
        abstract=ready["abstract"], topics=list(ready["topics"]),
    ))
    async with workspace_tx(deps.pool, workspace_id) as conn:
        await mark_announced(conn, workspace_id, episode_id, ready["source_hash"])
    return "announced"


async def episode_sweeper(deps: Deps, stop: asyncio.Event) -> None:
    """Build the episodes that waited ``episode_wait_s`` for drawers that were never all embedded
    (an embedding that keeps failing): one replica at a time, under a lease."""
    s = deps.settings
    holder = f"{socket.gethostname()}:{os.getpid()}"
    while not stop.is_set():
        try:
            async with maintenance_tx(deps.pool) as conn:
                won = await take_lease(conn, "episodes", holder, ttl_s=s.maintain_interval_s,
                                       every_s=s.maintain_interval_s / 2)
            if won:
                async with maintenance_tx(deps.pool) as conn:
                    due = await overdue_episodes(conn, s.episode_wait_s)
                for ws, session_id in due:
                    await complete_episode(deps, ws, session_id)
                if due:
                    log.info("episodes_overdue_built", count=len(due))
        except Exception as e:  # retried next round; never kill the service
            log.warning("episode_sweep_failed", error=repr(e)[:300])
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), s.maintain_interval_s)


def register(deps: Deps) -> None:
    s = deps.settings
    llm = LlmClient(s) if s.llm_base_url else None

    @deps.handle(SessionStored)
    async def on_session_stored(body: bytes, raw: Msg) -> None:
        """session.stored → open the episode → (once the drawers are embedded) episodic.created."""
        ev: SessionStored = decode_event(SessionStored, body, s)
        if not ev.drawer_ids:
            return  # nothing but noise: no episode
        episode_id = stable_id("episode", ev.workspace_id, ev.session_id)
        # Committed on its own: the upsert locks the episode's row, and a build in the same transaction
        # would hold that lock while drawer.embedded of the same session waits to save it.
        async with workspace_tx(deps.pool, ev.workspace_id) as conn:
            await mark_episode_pending(conn, ev.workspace_id, episode_id, ev.session_id)
        # Its drawers may all be embedded already (fast embedder, or every one an exact repeat).
        await complete_episode(deps, ev.workspace_id, ev.session_id)

    @deps.handle(DrawerEmbedded)
    async def on_drawer_embedded(body: bytes, raw: Msg) -> None:
        """drawer.embedded → complete the episodes of the sessions these drawers belong to."""
        try:
            ev: DrawerEmbedded = decode_event(DrawerEmbedded, body, s)
        except Poison:
            return  # classify, the subject's main consumer, dead-letters it: one dead letter per bad event
        async with workspace_tx(deps.pool, ev.workspace_id) as conn:
            sessions = await sessions_awaiting_episode(conn, ev.workspace_id, ev.drawer_ids)
            # In session order: two events of the same sessions lock their episodes in one order.
            steps = [(sid, await _advance_episode(conn, deps, ev.workspace_id, sid)) for sid in sorted(sessions)]
        for session_id, step in steps:
            await complete_episode(deps, ev.workspace_id, session_id, step=step)

    @deps.handle(EpisodicCreated)
    async def on_episodic_created(body: bytes, raw: Msg) -> None:
        """episodic.created → (extract, then commit) → entity.upserted."""
        ev: EpisodicCreated = decode_event(EpisodicCreated, body, s)
        await extract_episode(deps, llm, ev)


async def extract_episode(deps: Deps, llm: LlmClient | None, ev: EpisodicCreated) -> ExtractionStored | None:
    """The session's entities and facts: read (patterns, or the LLM with the patterns as fallback),
    then stored in one transaction, then announced. The LLM is called before the transaction opens,
    and a failed or unreadable answer keeps the pattern extraction, so the episode and its drawers
    never depend on the model. Without a model, reading the turns, matching the patterns (CPU only)
    and storing are one transaction. Returns what was stored (None: nothing to store)."""
    s = deps.settings
    if llm is None:
        async with workspace_tx(deps.pool, ev.workspace_id) as conn:
            turns = await _turns(conn, ev)
            if not turns:
                return None
            stored = await _store_extraction(conn, deps, ev, turns, pattern_sightings(turns, ev.session_id),
                                             "patterns", [], [])
    else:
        async with workspace_tx(deps.pool, ev.workspace_id) as conn:
            turns = await _turns(conn, ev)
        if not turns:
            return None
        sightings: list[Sighting] | None = None
        tier, warnings, usage = "patterns", [], []
        try:
            answer = await llm.chat(build_messages(turns), purpose="extract", usage=usage)
            sightings, warnings = parse_answer(answer, turns, ev.session_id)
            tier = "llm"
        except (LlmError, LlmParseError) as e:
            warnings = [f"LLM extraction failed, kept the patterns' ({str(e)[:300]})"]
            log.warning("kg_llm_failed", episode_id=ev.episode_id, error=str(e)[:300])
        if sightings is None:
            sightings = pattern_sightings(turns, ev.session_id)
        async with workspace_tx(deps.pool, ev.workspace_id) as conn:
            stored = await _store_extraction(conn, deps, ev, turns, sightings, tier, warnings, usage)
    if stored is None or not stored.entities:
        return stored
    ids = sorted(stored.entities)
    async with workspace_tx(deps.pool, ev.workspace_id) as conn:
        await refresh_entities(conn, ev.workspace_id, ids)
    await publish_event(deps.broker, s, EntityUpserted(
        event_id=event_id_for("entity.upserted", ev.event_id), workspace_id=ev.workspace_id,
        entity_ids=ids, names=[stored.entities[i] for i in ids], source_episode_id=ev.episode_id,
    ))
    return stored


async def _turns(conn: AsyncConnection[Any], ev: EpisodicCreated) -> list[Turn]:
    rows = await session_turns(conn, ev.workspace_id, ev.session_id)
    return [Turn(r["id"], r["speaker"], r["content"], r["said_at"], r["seq"]) for r in rows]


async def _store_extraction(
    conn: AsyncConnection[Any], deps: Deps, ev: EpisodicCreated, turns: list[Turn], sightings: list[Sighting],
    tier: str, warnings: list[str], usage: list[Any],
) -> ExtractionStored | None:
    """Store what was read, inside the caller's transaction (None: forgotten, or nothing left to store)."""
    if usage:
        await record_usage(conn, ev.workspace_id, deps.settings.llm_model, usage)
    if await forgotten(conn, ev.workspace_id, session_id=ev.session_id):
        return None
    # Only drawers that still exist (one forgotten meanwhile must not gain a mention).
    alive = await existing_drawers(conn, ev.workspace_id, sorted({sg.drawer_id for sg in sightings}))
    sightings = [sg for sg in sightings if sg.drawer_id in alive]
    if not sightings:
        return None
    stored = await record_extraction(conn, ev.workspace_id, sightings, episode_id=ev.episode_id,
                                     types=speaker_types(turns))
    if warnings or stored.skipped:
        await record_history(
            conn, ev.workspace_id, drawer_id=None, action="KG_EXTRACT", actor="enrich", event_id=ev.event_id,
            reason="; ".join([*warnings, *stored.skipped])[:2000],
            new_value={"episode_id": ev.episode_id, "tier": tier, "entities": len(stored.entities),
                       "new_facts": stored.new_facts, "warnings": len(warnings) + len(stored.skipped)})
    return stored
