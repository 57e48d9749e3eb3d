"""Subscribers of the enrich service."""

from __future__ import annotations

import numpy as np
from nats.aio.msg import Msg

from services._runtime import Deps
from shared.bus import decode_event, publish_event
from shared.db.episodes import existing_drawers, session_turns, upsert_entities, upsert_episode
from shared.db.forget import forgotten
from shared.db.tenancy import workspace_tx
from shared.events import EntityUpserted, EpisodicCreated, SessionStored
from shared.ids import event_id_for, stable_id
from shared.memory.entities import entity_id, extract_entities
from shared.memory.episodes import summarize_session

__all__ = ["DURABLE", "DURABLE_KG", "register"]

DURABLE = "enrich"
DURABLE_KG = "enrich-kg"
EPISODE_TTL_DAYS = 90.0


def register(deps: Deps) -> None:
    s = deps.settings

    @deps.handle(DURABLE)
    async def on_session_stored(body: bytes, raw: Msg) -> None:
        """session.stored → (summarise, then commit) → episodic.created."""
        ev: SessionStored = decode_event(SessionStored, body, s)
        async with workspace_tx(deps.pool, ev.workspace_id) as conn:
            turns = await session_turns(conn, ev.workspace_id, ev.session_id)
        if not turns:
            return
        draft = summarize_session([(t["speaker"], t["content"]) for t in turns])
        embs = [np.asarray(t["embedding"], dtype=np.float32) for t in turns if t["embedding"] is not None]
        centroid = None
        if embs:
            m = np.mean(embs, axis=0)
            centroid = (m / (np.linalg.norm(m) or 1.0)).astype(np.float32)
        episode_id = stable_id("episode", ev.workspace_id, ev.session_id)
        async with workspace_tx(deps.pool, ev.workspace_id) as conn:
            if await forgotten(conn, ev.workspace_id, session_id=ev.session_id):
                return  # forgotten while it was summarised: nothing may be written back
            await upsert_episode(
                conn, ev.workspace_id, episode_id=episode_id, session_id=ev.session_id,
                agent_id=turns[0]["agent_id"], summary=draft.summary, abstract=draft.abstract,
                topics=draft.topics, embedding=centroid, started_at=turns[0]["started_at"],
                completed_at=turns[0]["completed_at"], ttl_days=EPISODE_TTL_DAYS,
            )
        await publish_event(deps.broker, s, EpisodicCreated(
            event_id=event_id_for("episodic.created", ev.event_id), workspace_id=ev.workspace_id,
            episode_id=episode_id, session_id=ev.session_id, summary=draft.summary, abstract=draft.abstract,
            topics=draft.topics,
        ))

    @deps.handle(DURABLE_KG)
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
