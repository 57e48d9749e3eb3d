"""Subscribers of the enrich service."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace
from typing import Any

from nats.aio.msg import Msg
from psycopg import AsyncConnection

from services._runtime import Deps, ack_once, decode_batch, leased_rounds
from shared.adapters.llm import LlmClient, LlmError, Usage
from shared.bus import Poison, decode_event, publish_held
from shared.db.curation import record_usage
from shared.db.drawers import record_history, recorded_value
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
from shared.db.extraction_queue import due_drawers, due_turns, lock_unread, mark_extracted
from shared.db.forget import forgotten, writer_tx
from shared.db.kg import ExtractionStored, ensure_extracted_entities, record_extraction, refresh_entities
from shared.db.tenancy import maintenance_tx, retry_conflicts, workspace_tx, workspace_write, workspaces_tx
from shared.events import DrawerEmbedded, EntityUpserted, EpisodicCreated, SessionStored
from shared.faults import is_transient, to_raise
from shared.ids import event_id_for, stable_id
from shared.logging import get_logger
from shared.memory.episodes import episode_embedding, parse_summary, summarize_session, summary_messages
from shared.memory.kg import Sighting
from shared.memory.llm_labels import LlmParseError
from shared.memory.semantic import Turn, build_messages, parse_answer, pattern_sightings, speaker_types

__all__ = ["complete_episode", "episode_sweeper", "extract_due_drawers", "extract_episode", "extract_episodes",
           "kg_sweeper", "register",
           "sweep_due_drawers"]

log = get_logger("palace.enrich")


@dataclass(frozen=True)
class _EpisodeStep:
    """Where one pass over a session's episode left it: the outcome, the built episode still to be
    announced (what ``episodic.created`` carries), or the turns a model must summarise first."""

    outcome: str
    ready: dict[str, Any] | None = None
    turns: list[dict[str, Any]] | None = None
    source_hash: str | None = None


async def _advance_episode(conn: AsyncConnection[Any], deps: Deps, workspace_id: str, session_id: str, *,
                           forget_checked: bool = False) -> _EpisodeStep:
    """Inside the caller's workspace transaction (which may already have done other work): decide what
    is left to do for the session's episode and do it, up to the announcement. Without a model, building
    it is CPU work on the turns just read, so it commits with the read (one transaction where there were
    two); with one, the turns come back to be summarised outside any transaction. ``forget_checked``: this
    transaction already asked ``forgotten`` about the session, and holds the lock that orders it with a
    forget, so the answer still stands."""
    s = deps.settings
    episode_id = stable_id("episode", workspace_id, session_id)
    progress = await episode_progress(conn, workspace_id, episode_id)
    if progress is None:
        return _EpisodeStep("absent")  # session.stored opens it, and checks again itself
    if progress.status != "pending":
        if progress.announced:
            return _EpisodeStep("done")
        return _EpisodeStep("done", await unannounced_episode(conn, workspace_id, episode_id))
    if progress.unembedded and progress.waited_s < s.episode_wait_s:
        return _EpisodeStep("waiting")  # the drawer.embedded of its last drawers comes back here
    turns = await session_turns(conn, workspace_id, session_id)
    if not turns:
        await discard_pending_episode(conn, workspace_id, episode_id)
        return _EpisodeStep("absent")
    if deps.extra.get("llm") is not None:
        return _EpisodeStep("summarise", turns=turns, source_hash=progress.source_hash)
    if not forget_checked and await forgotten(conn, workspace_id, session_id=session_id):
        return _EpisodeStep("forgotten")  # nothing may be written back
    draft = summarize_session([(t["speaker"], t["content"]) for t in turns])
    return _EpisodeStep("built", await _save_episode(conn, deps, workspace_id, session_id, episode_id,
                                                     progress.source_hash, draft, turns))


async def _save_episode(conn: AsyncConnection[Any], deps: Deps, workspace_id: str, session_id: str, episode_id: str,
                        source_hash: str | None, draft: Any, turns: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Fill the pending episode and return what its episodic.created carries (``unannounced_episode``'s
    answer): what was just written when this call filled it (a pending episode is never announced), else
    whatever the episode holds now (built meanwhile, or reopened by newer content)."""
    vector = episode_embedding([t["embedding"] for t in turns if t["embedding"] is not None])
    if await save_episode(conn, workspace_id, episode_id=episode_id, source_hash=source_hash,
                          summary=draft.summary, abstract=draft.abstract, topics=draft.topics,
                          embedding=vector, ttl_days=deps.settings.episode_ttl_days):
        return {"session_id": session_id, "summary": draft.summary, "abstract": draft.abstract,
                "topics": list(draft.topics), "source_hash": source_hash}
    return await unannounced_episode(conn, workspace_id, episode_id)


async def _summarise_episode(deps: Deps, workspace_id: str, session_id: str, step: _EpisodeStep) -> _EpisodeStep:
    """The model's summary, outside any transaction (the extractive one stands when it fails), then
    saved in a transaction of its own."""
    s = deps.settings
    episode_id = stable_id("episode", workspace_id, session_id)
    turns = step.turns or []
    pairs = [(t["speaker"], t["content"]) for t in turns]
    draft = summarize_session(pairs)
    usage: list[Usage] = []
    llm: LlmClient | None = deps.extra.get("llm")
    if llm is not None:
        try:
            answer = await llm.chat(summary_messages(pairs), purpose="episode", usage=usage)
            draft = replace(draft, summary=parse_summary(answer))
        except (LlmError, LlmParseError) as e:
            log.warning("episode_llm_failed", episode_id=episode_id, error=str(e)[:300])
    async def write(conn: AsyncConnection[Any]) -> _EpisodeStep:
        if usage:
            await record_usage(conn, workspace_id, s.llm_model, usage)
        if await forgotten(conn, workspace_id, session_id=session_id):
            return _EpisodeStep("forgotten")  # forgotten while it was summarised: nothing may be written back
        return _EpisodeStep("built", await _save_episode(conn, deps, workspace_id, session_id, episode_id,
                                                         step.source_hash, draft, turns))

    # A deadlock with another service's writes runs this transaction again, not the model's call.
    return await workspace_write(deps.pool, workspace_id, write)


async def complete_episode(deps: Deps, workspace_id: str, session_id: str, *,
                           step: _EpisodeStep | None = None) -> str:
    """Build the session's opened episode once its drawers are embedded (or it has waited
    ``episode_wait_s``), then publish ``episodic.created`` once. The summary is the LLM's when one is
    configured (``deps.extra["llm"]``), called before the writing transaction, else extractive. Safe to
    call any number of times, from any trigger: every step is keyed by the episode and the session's
    content hash. ``step``: what the caller's own transaction already did (``_advance_episode``).

    Returns what happened ('absent', 'waiting', 'built', 'announced', 'done', 'forgotten') for logs and
    tests.
    """
    if step is None:
        async with writer_tx(deps.pool, workspace_id) as conn:
            step = await _advance_episode(conn, deps, workspace_id, session_id)
    if step.turns is not None:
        step = await _summarise_episode(deps, workspace_id, session_id, step)
    ready = step.ready
    if ready is None:
        return step.outcome
    # Commit, then publish, then record it: a crash in between publishes again (same event id, so
    # JetStream's duplicate window drops it and consumers are idempotent anyway), never loses it.
    episode_id = stable_id("episode", workspace_id, session_id)
    await publish_held(deps.broker, deps.settings, EpisodicCreated(
        event_id=event_id_for("episodic.created", episode_id, ready["source_hash"] or ""),
        workspace_id=workspace_id, episode_id=episode_id, session_id=session_id, summary=ready["summary"],
        abstract=ready["abstract"], topics=list(ready["topics"]),
    ))
    await mark_announced(deps.pool, workspace_id, episode_id, ready["source_hash"])
    return "announced"


async def episode_sweeper(deps: Deps, stop: asyncio.Event) -> None:
    """Build the episodes that waited ``episode_wait_s`` for drawers that were never all embedded
    (an embedding that keeps failing): one replica at a time, under a lease."""

    async def build_overdue() -> None:
        async with maintenance_tx(deps.pool) as conn:
            due = await overdue_episodes(conn, deps.settings.episode_wait_s)
        failed = 0
        for ws, session_id in due:
            # One episode that keeps failing (it comes first: the oldest) must not hold back the rest.
            try:
                await complete_episode(deps, ws, session_id)
            except Exception as e:
                if is_transient(e):
                    raise  # the database or NATS is down: the round is retried whole
                failed += 1
                log.error("episode_overdue_failed", workspace=ws, session_id=session_id, error=repr(e)[:300],
                          exc_info=e)
        if due:
            log.info("episodes_overdue_built", count=len(due) - failed, failed=failed)

    await leased_rounds(deps, stop, "episodes", build_overdue, failed_event="episode_sweep_failed")


def register(deps: Deps) -> None:
    s = deps.settings
    llm = LlmClient(s) if s.llm_base_url else None
    deps.extra["llm"] = llm  # complete_episode's summary, from every trigger (handlers and the sweep)
    # Episodes extracted one by one with a model, at once in this process. Its consumer takes one batch at a
    # time (shared.consumers.CONSUMERS): without a model a batch is CPU and statements, and batches side by
    # side only queued on the new entities they share (an insert waits for the transaction that inserted
    # the same row first); with one, batches side by side would queue their episodes here, and that wait
    # counts against each batch's PALACE_HANDLER_TIMEOUT_S, so a slow model would see whole batches cancelled.
    alone = asyncio.Semaphore(s.consumer_concurrency)

    @deps.handle(SessionStored)
    async def on_session_stored(body: bytes, raw: Msg) -> None:
        """session.stored → open the episode → (once the drawers are embedded) episodic.created."""
        ev: SessionStored = decode_event(SessionStored, body, s)
        if not ev.drawer_ids:
            return  # nothing but noise: no episode
        episode_id = stable_id("episode", ev.workspace_id, ev.session_id)
        async with writer_tx(deps.pool, ev.workspace_id) as conn:
            # A session.stored published just before its session was forgotten must not open an episode
            # (the forget, ordered by the lock ``forgotten`` takes, has deleted it or will see this row).
            if await forgotten(conn, ev.workspace_id, session_id=ev.session_id):
                return
            await mark_episode_pending(conn, ev.workspace_id, episode_id, ev.session_id)
            # Its drawers may all be embedded already (fast embedder, or every one an exact repeat): then it
            # is built in this same transaction. That holds the episode's row (locked by the upsert) only
            # while the turns are read and summarised without a model; a model's summary is asked for after
            # the commit (complete_episode), never under the lock.
            step = await _advance_episode(conn, deps, ev.workspace_id, ev.session_id, forget_checked=True)
        # 'waiting' was read before this commit made the episode visible: a drawer.embedded handled in between
        # (its drawers embedded after that read) found no episode to complete, and nothing else would come
        # back for it before the sweep's episode_wait_s. A second look after the commit sees those drawers
        # embedded; any embedded later announce themselves to an episode that is visible by then.
        await complete_episode(deps, ev.workspace_id, ev.session_id, step=None if step.outcome == "waiting" else step)

    @deps.handle(DrawerEmbedded)
    async def on_drawer_embedded(body: bytes, raw: Msg) -> None:
        """drawer.embedded → complete the episodes of the sessions these drawers belong to."""
        try:
            ev: DrawerEmbedded = decode_event(DrawerEmbedded, body, s)
        except Poison:
            return  # classify, the subject's main consumer, dead-letters it: one dead letter per bad event
        sessions = await sessions_awaiting_episode(deps.pool, ev.workspace_id, ev.drawer_ids)
        if not sessions:
            return
        async with writer_tx(deps.pool, ev.workspace_id) as conn:
            # In session order: two events of the same sessions lock their episodes in one order. Each
            # episode's state is read again here (_advance_episode): the read above only picks them.
            steps = [(sid, await _advance_episode(conn, deps, ev.workspace_id, sid)) for sid in sorted(sessions)]
        for session_id, step in steps:
            await complete_episode(deps, ev.workspace_id, session_id, step=step)

    @deps.handle(EpisodicCreated)
    async def on_episodic_created(bodies: list[bytes], raws: list[Msg]) -> None:
        """episodic.created (batched) → (extract, then commit) → entity.upserted, one per episode."""
        events = await decode_batch(deps, EpisodicCreated, bodies, raws)
        if not events:
            return
        if llm is None and len(events) > 1:
            try:
                await extract_episodes(deps, [ev for ev, _ in events])
                return
            except Exception as e:
                if is_transient(e):
                    raise  # the database is down for all of them: the loop holds, NAKs or dead-letters them
                # Something in the batch broke its transaction: each episode alone, below.
        # Each episode on its own: with a model (side by side, at most the consumer's window of them in
        # this process, each waiting on its own answer), or after a failed batch, so that one bad episode
        # fails only itself (NAKed, then dead-lettered, by the loop).
        async def one(ev: EpisodicCreated, raw: Msg) -> None:
            async with alone:
                await extract_episode(deps, llm, ev)
            await ack_once(raw)  # done: neither a batch-mate's failure nor the batch's budget redoes it

        outcomes = await asyncio.gather(*(one(ev, raw) for ev, raw in events), return_exceptions=True)
        failed = [o for o in outcomes if isinstance(o, BaseException)]
        for (_, raw), outcome in zip(events, outcomes, strict=True):
            if not isinstance(outcome, BaseException):
                await ack_once(raw)  # done: a retry of the batch in place leaves it out
        if failed:
            raise to_raise(failed)


async def _read_graph(
    llm: LlmClient | None, turns: list[Turn], session_id: str | None, *, what: str,
) -> tuple[list[Sighting], str, list[str], list[Usage]]:
    """What the turns say: (sightings, tier, warnings, LLM usage). The LLM when configured (outside any
    transaction), keeping the pattern extraction when it fails or answers something unreadable."""
    tier, warnings, usage = "patterns", [], []
    if llm is not None:
        try:
            answer = await llm.chat(build_messages(turns), purpose="extract", usage=usage)
            sightings, warnings = parse_answer(answer, turns, session_id)
            return sightings, "llm", warnings, usage
        except (LlmError, LlmParseError) as e:
            warnings = [f"LLM extraction failed, kept the patterns' ({str(e)[:300]})"]
            log.warning("kg_llm_failed", what=what, error=str(e)[:300])
    return pattern_sightings(turns, session_id), tier, warnings, usage


def _turns(rows: list[dict[str, Any]]) -> list[Turn]:
    return [Turn(r["id"], r["speaker"], r["content"], r["said_at"], r["seq"]) for r in rows]


async def extract_episode(deps: Deps, llm: LlmClient | None, ev: EpisodicCreated) -> ExtractionStored | None:
    """The session's entities and facts: read (patterns, or the LLM with the patterns as fallback),
    then stored in one transaction, then announced. The LLM is called before the transaction opens,
    and a failed or unreadable answer keeps the pattern extraction, so the episode and its drawers
    never depend on the model; without a model, reading the turns, matching the patterns (CPU only) and
    storing are one transaction. Every drawer read is marked extracted (migration 0042), so the sweep
    of unextracted drawers does not read it again. Returns what was stored (None: nothing to store)."""
    s = deps.settings
    if llm is None:
        async with writer_tx(deps.pool, ev.workspace_id) as conn:
            stored = await _extract_locked(conn, deps, ev)
    else:
        async with workspace_tx(deps.pool, ev.workspace_id) as conn:
            stored = await _extracted_by_model(conn, ev)
            turns = [] if stored else _turns(await session_turns(conn, ev.workspace_id, ev.session_id,
                                                                 with_embedding=False))
        if stored is None:
            if not turns:
                return None
            sightings, tier, warnings, usage = await _read_graph(llm, turns, ev.session_id, what=ev.episode_id)
            stored = await workspace_write(deps.pool, ev.workspace_id, lambda conn: _store_extraction(
                conn, deps, ev, turns, sightings, tier, warnings, usage))
    if stored is None or not stored.entities:
        return stored
    ids = sorted(stored.entities)
    async with workspace_tx(deps.pool, ev.workspace_id) as conn:
        await refresh_entities(conn, ev.workspace_id, ids)
    await publish_held(deps.broker, s, EntityUpserted(
        event_id=event_id_for("entity.upserted", ev.event_id), workspace_id=ev.workspace_id,
        entity_ids=ids, names=[stored.entities[i] for i in ids], source_episode_id=ev.episode_id,
    ))
    return stored


async def extract_episodes(deps: Deps, events: list[EpisodicCreated]) -> dict[str, ExtractionStored | None]:
    """``extract_episode`` without a model for a batch of episodes: every episode's turns read, matched
    (CPU only) and stored in one transaction, a workspace at a time; their entities recounted in a
    second; then each episode announced. Returns what was stored, by event id."""
    order = sorted(range(len(events)), key=lambda i: (events[i].workspace_id, events[i].session_id or ""))
    stored: dict[int, ExtractionStored | None] = {}
    async for attempt in retry_conflicts():
        with attempt:
            stored = {}
            async with workspaces_tx(deps.pool) as scope:
                read: list[tuple[int, list[Turn], list[Sighting]]] = []
                for i in order:
                    ev = events[i]
                    stored[i] = None
                    if turns := await _read_locked(await scope(ev.workspace_id), ev):
                        read.append((i, turns, pattern_sightings(turns, ev.session_id)))
                # The batch's drawers marked read first, then every entity of the batch, one statement per
                # workspace each, in id order: batches side by side then take both kinds of lock in one order
                # (episode by episode, they deadlocked), and so do the sweep (extract_due_drawers) and a
                # model's extraction (_store_extraction), which lock the drawers' queue rows before entities.
                named: dict[str, list[tuple[list[Sighting], dict[str, str] | None]]] = {}
                drawers: dict[str, set[str]] = {}
                for i, turns, sightings in read:
                    named.setdefault(events[i].workspace_id, []).append((sightings, speaker_types(turns)))
                    drawers.setdefault(events[i].workspace_id, set()).update(t.drawer_id for t in turns)
                for ws in sorted(named):
                    await mark_extracted(await scope(ws), ws, sorted(drawers[ws]))
                    await ensure_extracted_entities(await scope(ws), ws, named[ws])
                for i, turns, sightings in read:
                    ev = events[i]
                    stored[i] = await _store_extraction(await scope(ev.workspace_id), deps, ev, turns, sightings,
                                                        "patterns", [], [], read_after_lock=True,
                                                        entities_ensured=True)
    touched: dict[str, set[str]] = {}
    for i, got in stored.items():
        if got is not None and got.entities:
            touched.setdefault(events[i].workspace_id, set()).update(got.entities)
    if touched:
        async for attempt in retry_conflicts():
            with attempt:
                async with workspaces_tx(deps.pool) as scope:
                    for ws in sorted(touched):
                        await refresh_entities(await scope(ws), ws, sorted(touched[ws]))
    for i in sorted(stored):
        got, ev = stored[i], events[i]
        if got is None or not got.entities:
            continue
        ids = sorted(got.entities)
        await publish_held(deps.broker, deps.settings, EntityUpserted(
            event_id=event_id_for("entity.upserted", ev.event_id), workspace_id=ev.workspace_id,
            entity_ids=ids, names=[got.entities[e] for e in ids], source_episode_id=ev.episode_id,
        ), caused_by=ev)
    return {events[i].event_id or "": got for i, got in stored.items()}


async def _extract_locked(conn: AsyncConnection[Any], deps: Deps, ev: EpisodicCreated) -> ExtractionStored | None:
    """Without a model, in the caller's transaction: ordered with forget first, then the session's turns
    read, matched (CPU only) and stored. Every drawer read after the forget lock is still there when this
    commits, so none needs checking again."""
    turns = await _read_locked(conn, ev)
    if not turns:
        return None
    return await _store_extraction(conn, deps, ev, turns, pattern_sightings(turns, ev.session_id), "patterns", [], [],
                                   read_after_lock=True)


async def _read_locked(conn: AsyncConnection[Any], ev: EpisodicCreated) -> list[Turn]:
    """The session's turns, read in the caller's transaction after ``forgotten`` took its lock (none when
    the session is forgotten or has no turns left)."""
    if await forgotten(conn, ev.workspace_id, session_id=ev.session_id):
        return []
    return _turns(await session_turns(conn, ev.workspace_id, ev.session_id, with_embedding=False))


async def _store_extraction(
    conn: AsyncConnection[Any], deps: Deps, ev: EpisodicCreated, turns: list[Turn], sightings: list[Sighting],
    tier: str, warnings: list[str], usage: list[Usage], *, read_after_lock: bool = False,
    entities_ensured: bool = False,
) -> ExtractionStored | None:
    """Store what was read, inside the caller's transaction (None: forgotten, or nothing left to store).
    ``read_after_lock``: the turns were read in this transaction after ``forgotten`` (``_extract_locked``).
    ``entities_ensured``: this transaction already inserted the sightings' entities (``extract_episodes``)."""
    if usage:
        await record_usage(conn, ev.workspace_id, deps.settings.llm_model, usage)
    if read_after_lock:
        alive = {t.drawer_id for t in turns}
    else:
        if await forgotten(conn, ev.workspace_id, session_id=ev.session_id):
            return None
        # Only drawers that still exist (one forgotten meanwhile must not gain a mention).
        alive = await existing_drawers(conn, ev.workspace_id, sorted({t.drawer_id for t in turns}))
    # A replay of this episode comes through here again; the sweep only reads drawers never marked.
    await mark_extracted(conn, ev.workspace_id, sorted(alive))
    sightings = [sg for sg in sightings if sg.drawer_id in alive]
    if not sightings:
        return None
    stored = await record_extraction(conn, ev.workspace_id, sightings, episode_id=ev.episode_id,
                                     types=speaker_types(turns), entities_ensured=entities_ensured)
    if warnings or stored.skipped or tier == "llm":
        # The model's reading is noted always: a redelivery of this event finds it (``_extracted_by_model``)
        # instead of asking the model again, whose second answer may differ from what was stored.
        await record_history(
            conn, ev.workspace_id, drawer_id=None, action="KG_EXTRACT", actor="enrich", event_id=ev.event_id,
            reason="; ".join([*warnings, *stored.skipped])[:2000] or None,
            new_value={"episode_id": ev.episode_id, "tier": tier, "entities": len(stored.entities),
                       "new_facts": stored.new_facts, "warnings": len(warnings) + len(stored.skipped),
                       **({"entity_ids": stored.entities} if tier == "llm" else {})})
    return stored


async def _extracted_by_model(conn: AsyncConnection[Any], ev: EpisodicCreated) -> ExtractionStored | None:
    """What the model's reading of this event stored, when an earlier delivery committed it (its
    KG_EXTRACT note, by primary key): the entities to announce again, nothing to store."""
    note = await recorded_value(conn, ev.workspace_id, ev.event_id, None, "KG_EXTRACT")
    if not isinstance(note, dict) or note.get("tier") != "llm" or not isinstance(note.get("entity_ids"), dict):
        return None
    return ExtractionStored({str(k): str(v) for k, v in note["entity_ids"].items()}, 0, 0, [])


async def extract_due_drawers(
    deps: Deps, llm: LlmClient | None, workspace_id: str, drawer_ids: list[str],
) -> ExtractionStored | None:
    """The second trigger of semantic extraction: processed drawers of importance >= 3 that no extractor
    has read (their session's episode never reached extraction, or they predate it). Each is read with
    its session as context (who speaks, who "you" is; the LLM gets the session too) and only its own
    entities and facts are kept, valid from when its message was said, with provenance to the drawer and
    the message. Store, then publish ``entity.upserted``, then mark the drawers read: a crash in between
    reads them again (deterministic ids and upserts: nothing is written twice) and publishes the same
    event id again, never loses the event. Returns what was stored (None: nothing)."""
    s = deps.settings
    async with workspace_tx(deps.pool, workspace_id) as conn:
        due = await due_turns(conn, workspace_id, drawer_ids)
        contexts = {sid: _turns(await session_turns(conn, workspace_id, sid, with_embedding=False))
                    for sid in sorted({str(r["session_id"]) for r in due if r["session_id"]})}
    wanted = {str(r["id"]) for r in due}
    found: list[Sighting] = []
    warnings: list[str] = []
    usage: list[Usage] = []
    tiers: set[str] = set()
    types: dict[str, str] = {}
    groups: dict[str | None, list[Turn]] = {}
    for r in due:
        groups.setdefault(r["session_id"], []).append(_turns([r])[0])
    for sid, own in groups.items():
        context = contexts.get(sid or "", [])
        seen = {t.drawer_id for t in context}
        context = context + [t for t in own if t.drawer_id not in seen]
        sightings, tier, warned, used = await _read_graph(llm, context, sid, what=f"drawers of {sid}")
        found += [sg for sg in sightings if sg.drawer_id in wanted]
        warnings += warned
        usage += used
        tiers.add(tier)
        types |= speaker_types(context)
    async def store(conn: AsyncConnection[Any]) -> ExtractionStored | None:
        if usage:
            await record_usage(conn, workspace_id, s.llm_model, usage)
        gone = {sid for sid in groups if sid and await forgotten(conn, workspace_id, session_id=sid)}
        alive = await existing_drawers(conn, workspace_id, sorted(wanted))
        # Read by their session's extraction meanwhile: its reading stands, this one is not stored.
        unread = await lock_unread(conn, workspace_id, sorted(wanted))
        kept = [sg for sg in found if sg.drawer_id in alive and sg.drawer_id in unread and sg.session_id not in gone]
        if not kept:
            return None
        stored = await record_extraction(conn, workspace_id, kept, types=types)
        if warnings or stored.skipped:
            await record_history(
                conn, workspace_id, drawer_id=None, action="KG_EXTRACT", actor="enrich",
                event_id=event_id_for("kg.drawers", workspace_id, *sorted(wanted)),
                reason="; ".join([*warnings, *stored.skipped])[:2000],
                new_value={"drawers": sorted(wanted)[:50], "tier": "+".join(sorted(tiers)),
                           "entities": len(stored.entities), "new_facts": stored.new_facts,
                           "warnings": len(warnings) + len(stored.skipped)})
        return stored

    # Run again when PostgreSQL picks it as a deadlock's victim: the model's answer is not asked for twice.
    stored = await workspace_write(deps.pool, workspace_id, store)
    if stored is not None and stored.entities:
        ids = sorted(stored.entities)
        async with workspace_tx(deps.pool, workspace_id) as conn:
            await refresh_entities(conn, workspace_id, ids)
        await publish_held(deps.broker, s, EntityUpserted(
            event_id=event_id_for("entity.upserted", "drawers", workspace_id, *sorted(wanted)),
            workspace_id=workspace_id, entity_ids=ids, names=[stored.entities[i] for i in ids],
        ))
    # Every drawer asked about leaves the queue: those archived, merged or forgotten meanwhile too.
    async with workspace_tx(deps.pool, workspace_id) as conn:
        await mark_extracted(conn, workspace_id, sorted(set(drawer_ids)))
    return stored


async def kg_sweeper(deps: Deps, stop: asyncio.Event) -> None:
    """Extract the drawers queued for extraction (processed, importance >= 3) that no extractor read
    within ``kg_sweep_grace_s``: one replica at a time, under a lease; a workspace's drawers together."""
    llm: LlmClient | None = deps.extra.get("llm")  # register's client
    await leased_rounds(deps, stop, "kg-drawers", lambda: sweep_due_drawers(deps, llm),
                        failed_event="kg_sweep_failed")


async def sweep_due_drawers(deps: Deps, llm: LlmClient | None, *, batch: int = 50) -> int:
    """One pass of the sweep: every queued drawer past its grace, ``batch`` drawers of a workspace at a
    time. Returns how many drawers were read."""
    async with maintenance_tx(deps.pool) as conn:
        due = await due_drawers(conn, deps.settings.kg_sweep_grace_s)
    by_ws: dict[str, list[str]] = {}
    for ws, did in due:
        by_ws.setdefault(ws, []).append(did)
    for ws, ids in by_ws.items():
        for i in range(0, len(ids), batch):
            try:
                await extract_due_drawers(deps, llm, ws, ids[i:i + batch])
            except Exception as e:
                # Left queued and tried again next pass; one bad batch must not starve the others.
                log.warning("kg_due_batch_failed", workspace_id=ws, drawers=len(ids[i:i + batch]),
                            error=repr(e)[:300])
    if due:
        log.info("kg_due_drawers_extracted", count=len(due))
    return len(due)
