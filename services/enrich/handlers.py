"""Subscribers of the enrich service."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket

from nats.aio.msg import Msg

from services._runtime import Deps
from shared.bus import Poison, decode_event, publish_event
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
    upsert_entities,
)
from shared.db.forget import forgotten
from shared.db.maintenance import take_lease
from shared.db.tenancy import maintenance_tx, workspace_tx
from shared.events import DrawerEmbedded, EntityUpserted, EpisodicCreated, SessionStored
from shared.ids import event_id_for, stable_id
from shared.logging import get_logger
from shared.memory.entities import entity_id, extract_entities
from shared.memory.episodes import episode_embedding, summarize_session

__all__ = ["complete_episode", "episode_sweeper", "register"]

log = get_logger("palace.enrich")


async def complete_episode(deps: Deps, workspace_id: str, session_id: str) -> str:
    """Build the session's opened episode once its drawers are embedded (or it has waited
    ``episode_wait_s``), then publish ``episodic.created`` once. Safe to call any number of times,
    from any trigger: every step is keyed by the episode and the session's content hash.

    Returns what happened ('absent', 'waiting', 'built', 'announced', 'done') for logs and tests.
    """
    s = deps.settings
    episode_id = stable_id("episode", workspace_id, session_id)
    async with workspace_tx(deps.pool, workspace_id) as conn:
        progress = await episode_progress(conn, workspace_id, episode_id)
    if progress is None:
        return "absent"  # session.stored opens it, and checks again itself
    outcome = "done"
    if progress.status == "pending":
        if progress.unembedded and progress.waited_s < s.episode_wait_s:
            return "waiting"  # the drawer.embedded of its last drawers comes back here
        async with workspace_tx(deps.pool, workspace_id) as conn:
            turns = await session_turns(conn, workspace_id, session_id)
        if not turns:
            async with workspace_tx(deps.pool, workspace_id) as conn:
                await discard_pending_episode(conn, workspace_id, episode_id)
            return "absent"
        draft = summarize_session([(t["speaker"], t["content"]) for t in turns])
        vector = episode_embedding([t["embedding"] for t in turns if t["embedding"] is not None])
        async with workspace_tx(deps.pool, workspace_id) as conn:
            if await forgotten(conn, workspace_id, session_id=session_id):
                return "forgotten"  # forgotten while it was summarised: nothing may be written back
            await save_episode(conn, workspace_id, episode_id=episode_id, source_hash=progress.source_hash,
                               summary=draft.summary, abstract=draft.abstract, topics=draft.topics,
                               embedding=vector, ttl_days=s.episode_ttl_days)
        outcome = "built"
    elif progress.announced:
        return "done"
    async with workspace_tx(deps.pool, workspace_id) as conn:
        ready = await unannounced_episode(conn, workspace_id, episode_id)
    if ready is None:
        return outcome
    # Commit, then publish, then record it: a crash in between publishes again (same event id, so
    # JetStream's duplicate window drops it and consumers are idempotent anyway), never loses it.
    await publish_event(deps.broker, s, EpisodicCreated(
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

    @deps.handle(SessionStored)
    async def on_session_stored(body: bytes, raw: Msg) -> None:
        """session.stored → open the episode → (once the drawers are embedded) episodic.created."""
        ev: SessionStored = decode_event(SessionStored, body, s)
        if not ev.drawer_ids:
            return  # nothing but noise: no episode
        episode_id = stable_id("episode", ev.workspace_id, ev.session_id)
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
        for session_id in sessions:
            await complete_episode(deps, ev.workspace_id, session_id)

    @deps.handle(EpisodicCreated)
    async def on_episodic_created(body: bytes, raw: Msg) -> None:
        """episodic.created → (extract, then commit) → entity.upserted."""
        ev: EpisodicCreated = decode_event(EpisodicCreated, body, s)
        async with workspace_tx(deps.pool, ev.workspace_id) as conn:
            turns = await session_turns(conn, ev.workspace_id, ev.session_id)
        speakers = tuple(sorted({t["speaker"] for t in turns if t["speaker"]}))
        entities: dict[str, tuple[str, str, str]] = {}
        mentions: set[tuple[str, str]] = set()
        for t in turns:
            for name, etype in extract_entities(t["content"], speakers):
                eid = entity_id(ev.workspace_id, name)
                entities.setdefault(eid, (eid, name, etype))
                mentions.add((eid, t["id"]))
        if not entities:
            return
        async with workspace_tx(deps.pool, ev.workspace_id) as conn:
            if await forgotten(conn, ev.workspace_id, session_id=ev.session_id):
                return
            # Only drawers that still exist (one forgotten meanwhile must not gain a mention).
            alive = await existing_drawers(conn, ev.workspace_id, sorted({d for _, d in mentions}))
            live_mentions = sorted(m for m in mentions if m[1] in alive)
            if not live_mentions:
                return
            used = {e for e, _ in live_mentions}
            await upsert_entities(conn, ev.workspace_id, [entities[e] for e in sorted(used)], live_mentions)
        ids = sorted(entities)
        await publish_event(deps.broker, s, EntityUpserted(
            event_id=event_id_for("entity.upserted", ev.event_id), workspace_id=ev.workspace_id,
            entity_ids=ids, names=[entities[i][1] for i in ids], source_episode_id=ev.episode_id,
        ))
