"""Forget: remove a drawer, session, user, agent or whole workspace from every place memory lives,
and prove it (``verify``).

Order of work, each step in short transactions so it runs beside a busy pipeline:

1. tombstone the scope (``shared.db.forget``: the pipeline checks tombstones where it would write,
   so an event in flight, redelivered or re-driven from the DLQ cannot re-create anything) and open
   the audit record;
2. delete the JetStream events (pipeline and dead-letter streams) that carry the scope, learning
   from them sessions that were still in flight;
3. a batch of sessions at a time: tombstone them, delete their drawers (unless the same text was also
   said in a session that stays: then only the forgotten sightings go), everything derived from the
   drawers, the embedding-cache entries no remaining drawer uses, episodes, messages and sessions;
4. for a whole workspace, whatever else it holds; a second pass over the streams for events
   published while this ran; close the audit record with counts (never content).

What was deleted (ids, content hashes, a few contents and vectors to probe the search indexes) is
returned in memory for ``verify`` and never stored.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from itertools import pairwise
from typing import Any

from nats.js.errors import APIError, NotFoundError
from psycopg_pool import AsyncConnectionPool

from shared.config import Settings
from shared.db import forget as sql
from shared.db.drawers import as_array
from shared.db.search import SearchParams, candidates
from shared.db.tenancy import workspace_tx
from shared.db.vector_indexes import drop_vector_index, vector_index_left, vector_index_ready
from shared.endpoints import resolve_urls
from shared.ids import content_hash, stable_id
from shared.logging import get_logger
from shared.memory.dreaming import DREAMING_WING
from shared.memory.filing import SessionPlan, embedding_text
from shared.nats_client import connect as connect_nats

__all__ = ["ForgetResult", "Scope", "Targets", "drop_forgotten_drawers", "forget", "verify"]

log = get_logger("palace.forget")
Progress = Callable[[str, int], None]
PROBES = 10
# JetStream's answers when a message went away between reading and deleting it: "sequence not found"
# (JSSequenceNotFoundErr) and "no message found" (the delete found nothing to remove).
_ALREADY_GONE = {10043, 10057}


@dataclass(frozen=True)
class Scope:
    """What to forget: ``kind`` is workspace (value '*'), user, agent, session or drawer."""

    workspace_id: str
    kind: str
    value: str

    def __post_init__(self) -> None:
        if not self.workspace_id:
            raise ValueError("forget needs a workspace")
        if self.kind not in sql.KINDS:
            raise ValueError(f"unknown scope {self.kind!r}; one of {', '.join(sql.KINDS)}")
        if not self.value:
            raise ValueError(f"forget by {self.kind} needs a value")


@dataclass
class Targets:
    """Identifiers and fingerprints of what was forgotten: what ``verify`` looks for. In memory only."""

    session_ids: set[str] = field(default_factory=set)
    drawer_ids: set[str] = field(default_factory=set)
    episode_ids: set[str] = field(default_factory=set)
    content_hashes: set[str] = field(default_factory=set)
    embed_hashes: set[str] = field(default_factory=set)
    # Texts a curation UPDATE wrote into another drawer from forgotten content (reverted by forget).
    derived_hashes: set[str] = field(default_factory=set)
    entity_ids: set[str] = field(default_factory=set)
    probes: list[tuple[str, Any]] = field(default_factory=list)


@dataclass
class ForgetResult:
    forget_id: str
    scope: Scope
    counts: dict[str, int]
    targets: Targets


def drop_forgotten_drawers(plan: SessionPlan, forgotten_ids: set[str]) -> SessionPlan:
    """The plan without the messages that held a drawer forgotten one by one, whole (as forget deleted
    them: a long message's other chunks overlap the forgotten one), their drawers and sightings, and
    without the context the next turn would take from such a message. A redelivered or republished
    session must not bring a forgotten drawer's text back, into any column."""
    if not forgotten_ids:
        return plan
    dropped = {s.seq for s in plan.sources if s.drawer_id in forgotten_ids}
    if not dropped:
        return plan
    sources = [s for s in plan.sources if s.seq not in dropped]
    kept = {s.drawer_id for s in sources}
    # The context of a message's first chunk is the last message before it that is not noise.
    spoken = sorted(m.seq for m in plan.messages if not m.is_noise)
    after = {nxt for prev, nxt in pairwise(spoken) if prev in dropped}
    drawers = [replace(d, context=None) if d.seq in after and d.context is not None else d
               for d in plan.drawers if d.id in kept]
    return SessionPlan(plan.event, plan.session_hash, [m for m in plan.messages if m.seq not in dropped],
                       drawers, sources)


# --- streams -----------------------------------------------------------------------------------


def _matcher(scope: Scope, t: Targets, *, by_content: bool = False) -> Callable[[dict[str, Any]], bool]:
    """Whether an event carries the scope. ``by_content`` also takes an event holding one of the forgotten
    messages' texts anywhere: only ``verify`` looks for those, and only for a drawer (whose text is what
    was forgotten, wherever it is said). A purge deletes events whole, so it never takes one for a text it
    holds: another user's session that also says "Hello" or "thanks" was deleted, unprocessed, with all of
    its turns (ingest drops a forgotten drawer's messages from a session it is still to store)."""
    def match(body: dict[str, Any]) -> bool:
        if body.get("workspace_id") != scope.workspace_id:
            return False
        if scope.kind == "workspace":
            return True
        if scope.kind in ("user", "agent") and body.get(f"{scope.kind}_id") == scope.value:
            return True
        if body.get("session_id") in t.session_ids:
            return True
        # An episode's own event (episodic.created: its summary, abstract and topics) and what was found
        # in it (entity.upserted) name it under different fields.
        if t.episode_ids and (body.get("episode_id") in t.episode_ids
                              or body.get("source_episode_id") in t.episode_ids):
            return True
        ids = body.get("drawer_ids") or []
        if ids and t.drawer_ids and all(i in t.drawer_ids for i in ids):
            return True
        msgs = body.get("messages") or []
        return bool(by_content and t.content_hashes and any(content_hash(m.get("content", "")) in t.content_hashes
                                             for m in msgs if isinstance(m, dict)))
    return match


async def _scan(js: Any, stream: str, match: Callable[[dict[str, Any]], bool]) -> list[tuple[int, dict[str, Any]]]:
    """Messages of ``stream`` whose JSON body matches (stream order)."""
    try:
        info = await js.stream_info(stream)
    except NotFoundError:
        return []
    out: list[tuple[int, dict[str, Any]]] = []
    if not info.state.messages:
        return out
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        try:
            m = await js.get_msg(stream, seq)
        except NotFoundError:
            continue
        try:
            body = json.loads(m.data or b"")
        except ValueError:
            continue
        if isinstance(body, dict) and match(body):
            out.append((seq, body))
    return out


async def _purge_streams(settings: Settings, js: Any, scope: Scope, t: Targets) -> tuple[int, set[str]]:
    """Delete the events carrying the scope from both streams; return how many and the sessions they
    name (sessions still in flight, unknown to the database yet)."""
    match = _matcher(scope, t)
    deleted, sessions = 0, set()
    for stream in (settings.stream_name, settings.dlq_stream_name):
        for seq, body in await _scan(js, stream, match):
            if body.get("session_id"):
                sessions.add(str(body["session_id"]))
            try:
                await js.delete_msg(stream, seq)
                deleted += 1
            except NotFoundError:
                pass
            except APIError as e:
                if e.err_code not in _ALREADY_GONE:
                    raise
                # Acked by every consumer (interest retention removed it) between the scan and now.
    return deleted, sessions


# --- database ----------------------------------------------------------------------------------


def _ehash(content: str, speaker: str | None, context: str | None) -> str:
    return content_hash(embedding_text(content, speaker, context))


async def _forget_batch(pool: AsyncConnectionPool, scope: Scope, session_ids: list[str], drawer_ids: list[str],
                        t: Targets, counts: Counter[str], *, by_drawer: bool = False) -> list[str]:
    """One short transaction: tombstone these sessions, then delete them and their drawers (or, with
    ``by_drawer``, these drawers wherever they were seen, with the messages they were cut from). Returns
    the dreaming sessions made from the episodes a forgotten drawer's sessions lost: to forget next."""
    ws = scope.workspace_id
    derived: list[str] = []
    async with workspace_tx(pool, ws) as conn:
        # The exclusive lock also orders this batch after writers in flight (shared.db.forget).
        await sql.write_tombstones(conn, ws, t_id(scope), "session", session_ids)
        if session_ids:
            # What dreaming synthesised from these sessions' episodes goes with them (its run, and the
            # session it was published as: tombstoned here, so a publish still in flight is refused).
            dreamt = [d for d in await sql.dreamt_from(conn, ws, session_ids, _episode_ids(ws, session_ids))
                      if d not in session_ids]
            await sql.write_tombstones(conn, ws, t_id(scope), "session", dreamt)
            session_ids = session_ids + dreamt
            drawer_ids = sorted(set(drawer_ids) | set(await sql.drawers_of_sessions(conn, ws, session_ids)))
        fates = await sql.drawer_fates(conn, ws, drawer_ids, session_ids,
                                       whole_workspace=scope.kind == "workspace" or by_drawer)
        gone = [f for f in fates if not f["shared"]]
        kept = [f for f in fates if f["shared"]]
        stale = {_ehash(f["content"], f["speaker"], f["context"]) for f in gone}
        stale |= {_ehash(f["content"], f["speaker"], f["context"]) for f in kept if f["first_here"] and f["context"]}
        if by_drawer and gone:
            # The raw messages the drawer was cut from go with it (the rest of the session stays).
            n, revised = await sql.delete_drawer_message_revisions(conn, ws, [f["id"] for f in gone])
            counts["message_revisions"] += n
            t.content_hashes |= revised
            rows = await sql.delete_drawer_messages(conn, ws, [f["id"] for f in gone])
            counts["messages"] += len(rows)
            t.content_hashes |= {h for h, _, _ in rows}
            # The next turn was embedded with the forgotten one as its context: that goes, with its cache entry.
            after = await sql.clear_context_after(conn, ws, [(s, q) for _, s, q in rows])
            counts["contexts_cleared"] += len(after)
            counts["history_snapshots_scrubbed"] += await sql.scrub_snapshots(conn, ws, [a[0] for a in after])
            stale |= {_ehash(content, speaker, context) for _, content, speaker, context in after}
            # A long message's other chunks overlap the forgotten one: they go with the message, unless they
            # were also cut from a message that stays (then only these sightings go).
            siblings = await sql.message_siblings(conn, ws, [(s, q) for _, s, q in rows], [f["id"] for f in gone])
            counts["chunks_with_message"] += len(siblings)
            fates = fates + siblings
            gone = gone + [f for f in siblings if not f["shared"]]
            kept_chunks = [f for f in siblings if f["shared"]]
            stale |= {_ehash(f["content"], f["speaker"], f["context"]) for f in siblings
                      if not f["shared"] or (f["first_here"] and f["context"])}
            counts["drawer_sightings_detached"] += await sql.detach_drawers(
                conn, ws, [f["id"] for f in kept_chunks], [s for _, s, _ in rows],
                [f["id"] for f in kept_chunks if f["first_here"]], seqs=[q for _, _, q in rows])
            counts["history_snapshots_scrubbed"] += await sql.scrub_snapshots(
                conn, ws, [f["id"] for f in kept_chunks if f["first_here"]])
            cut = sorted({s for _, s, _ in rows})
            # Their episodes quote the drawer, and so may what dreaming made of those episodes: those
            # sessions are forgotten next, by the caller.
            derived = [d for d in await sql.dreamt_from(conn, ws, cut, _episode_ids(ws, cut)) if d not in cut]
            await sql.write_tombstones(conn, ws, t_id(scope), "session", derived)
            deleted = await sql.delete_session_episodes(conn, ws, cut)
            counts["episodes"] += len(deleted)
            episodes = sorted(set(deleted) | set(_episode_ids(ws, cut)))
            t.episode_ids |= set(episodes)
            counts.update(await sql.delete_dreaming_runs(conn, ws, [], episodes))
        r = await sql.delete_drawers(conn, ws, [f["id"] for f in gone])
        t.derived_hashes |= r.pop("derived", set())
        t.entity_ids |= r.pop("entity_ids", set())
        counts.update(r)
        counts["drawer_sightings_detached"] += await sql.detach_drawers(
            conn, ws, [f["id"] for f in kept], session_ids, [f["id"] for f in kept if f["first_here"]])
        counts["history_snapshots_scrubbed"] += await sql.scrub_snapshots(
            conn, ws, [f["id"] for f in kept if f["first_here"]])
        if session_ids:
            r = await sql.delete_sessions(conn, ws, session_ids)
            t.content_hashes |= r.pop("hashes")
            t.episode_ids |= r.pop("episode_ids")
            counts.update(r)
        # What extraction noted on these episodes and drawers quotes what it read there.
        counts["kg_notes_scrubbed"] += await sql.scrub_kg_notes(
            conn, ws, sorted(t.episode_ids | set(_episode_ids(ws, session_ids))), [f["id"] for f in gone])
        remaining = await sql.drawers_with_content(conn, ws, sorted({f["content_hash"] for f in fates}))
        keep = {_ehash(c, s, x) for c, s, x in remaining}
        counts["embedding_cache"] += await sql.drop_cache_entries(conn, ws, sorted(stale), keep)
    t.session_ids |= set(session_ids)
    t.episode_ids |= set(_episode_ids(ws, session_ids))
    t.drawer_ids |= {f["id"] for f in gone}
    t.content_hashes |= {f["content_hash"] for f in gone}
    t.embed_hashes |= stale - keep
    for f in gone:
        if len(t.probes) < PROBES and f["embedding"] is not None:
            t.probes.append((f["content"], f["embedding"]))
    return derived


def _episode_ids(workspace_id: str, session_ids: list[str]) -> list[str]:
    """The ids enrich gives these sessions' episodes (shared.db.forget.dreamt_from also finds any other)."""
    return [stable_id("episode", workspace_id, s) for s in session_ids]


def t_id(scope: Scope) -> str:
    """The tombstones of one scope share an id, so re-running a forget is recognisably the same one."""
    return stable_id("forget", scope.workspace_id, scope.kind, scope.value)


async def forget(pool: AsyncConnectionPool, settings: Settings, nats_url: str, scope: Scope, *,
                 requested_by: str, progress: Progress | None = None,
                 database_url: str | None = None) -> ForgetResult:
    """Forget ``scope`` everywhere (idempotent: forgetting again finds nothing more to remove).

    ``database_url`` (default: the configured one) is used, as the table's owner, only to drop a
    forgotten workspace's own vector index."""
    ws = scope.workspace_id
    forget_id = uuid.uuid4().hex
    counts: Counter[str] = Counter()
    t = Targets()
    step = progress or (lambda _what, _n: None)
    async with workspace_tx(pool, ws) as conn:
        await sql.start_audit(conn, ws, forget_id, requested_by, scope.kind, scope.value)
        await sql.write_tombstones(conn, ws, t_id(scope), scope.kind, [scope.value])
        if scope.kind == "session":
            await sql.write_tombstones(conn, ws, t_id(scope), "session", [scope.value])
            # Its events go from the streams even when it was never stored (dead-lettered, or still queued).
            t.session_ids.add(scope.value)
    try:
        nc = await connect_nats(settings, nats_url, connect_timeout=5, max_reconnect_attempts=3)
        try:
            js = nc.jetstream()
            n, in_flight = await _purge_streams(settings, js, scope, t)
            counts["stream_events"] += n
            if scope.kind in ("user", "agent") and in_flight:
                async with workspace_tx(pool, ws) as conn:
                    await sql.write_tombstones(conn, ws, t_id(scope), "session", sorted(in_flight))
                t.session_ids |= in_flight
            step("streams", counts["stream_events"])
            batch = max(1, settings.maintain_batch // 20)
            if scope.kind == "drawer":
                async with workspace_tx(pool, ws) as conn:
                    await sql.write_tombstones(conn, ws, t_id(scope), "drawer", [scope.value])
                derived = await _forget_batch(pool, scope, [], [scope.value], t, counts, by_drawer=True)
                if derived:
                    await _forget_batch(pool, scope, derived, [], t, counts)
            else:
                after = ""
                while True:
                    async with workspace_tx(pool, ws) as conn:
                        sessions = await sql.scope_sessions(conn, ws, scope.kind, scope.value, after, batch)
                    if not sessions:
                        break
                    await _forget_batch(pool, scope, sessions, [], t, counts)
                    after = sessions[-1]
                    step("sessions", counts["sessions"])
            if scope.kind == "workspace":
                for table in sql.WORKSPACE_TABLES:
                    while True:
                        async with workspace_tx(pool, ws) as conn:
                            n = await sql.delete_workspace_batch(conn, ws, table, settings.maintain_batch)
                        counts[table] += n
                        if not n:
                            break
                    step(table, counts[table])
                while True:
                    async with workspace_tx(pool, ws) as conn:
                        n = await sql.scrub_history_batch(conn, ws, settings.maintain_batch)
                    counts["history_scrubbed"] += n
                    if not n:
                        break
                # Its HNSW index holds only its (now deleted) drawers' vectors until a vacuum: it goes whole.
                counts.update(await drop_vector_index(database_url or resolve_urls(settings, nats=False)[0], ws))
                step("vector_indexes", counts["vector_indexes"])
            # Events published while this ran (by handlers that committed just before the tombstones).
            n, _ = await _purge_streams(settings, js, scope, t)
            counts["stream_events"] += n
        finally:
            await nc.close()
        # Texts the forgotten content shares with what stays are not the forgotten user's alone.
        async with workspace_tx(pool, ws) as conn:
            t.content_hashes -= await sql.hashes_still_held(conn, ws, sorted(t.content_hashes))
            await sql.finish_audit(conn, ws, forget_id, dict(counts))
    except BaseException:
        with contextlib.suppress(Exception):
            async with workspace_tx(pool, ws) as conn:
                await sql.finish_audit(conn, ws, forget_id, dict(counts), status="failed")
        raise
    log.info("forgotten", workspace=ws, scope=scope.kind, forget_id=forget_id, **counts)
    return ForgetResult(forget_id, scope, dict(counts), t)


# --- proof -------------------------------------------------------------------------------------


async def verify(pool: AsyncConnectionPool, settings: Settings, nats_url: str, scope: Scope,
                 t: Targets) -> dict[str, int]:
    """Look for the forgotten identifiers and content hashes in every table, the embedding cache,
    the vector and full-text indexes (probing them with forgotten texts and vectors), for a whole
    workspace its own vector index and the request for it, and both streams. Returns place -> rows
    found: all zero means nothing remains."""
    ws = scope.workspace_id
    whole = scope.kind == "workspace"
    p = {"ws": ws, "s": sorted(t.session_ids), "d": sorted(t.drawer_ids), "h": sorted(t.content_hashes),
         "eh": sorted(t.embed_hashes), "e": sorted(t.episode_ids), "en": sorted(t.entity_ids),
         "dh": sorted(t.derived_hashes),
         "dream_wing": DREAMING_WING, "u": scope.value if scope.kind == "user" else None,
         "a": scope.value if scope.kind == "agent" else None, "all": whole}
    out: dict[str, int] = {}
    async with workspace_tx(pool, ws) as conn:
        out.update(await sql.count_remaining(conn, p))
        exact = hnsw = 0
        indexed = await vector_index_ready(conn, ws)
        for content, emb in t.probes:
            # The search paths themselves (shared.db.search.candidates): nearest neighbours by exact
            # scan and through the workspace's HNSW index when it has one, full text through the GIN
            # index, probed with the forgotten texts and vectors.
            for size, key in ((1, "exact"), (None, "hnsw")):
                _, cands, _ = await candidates(conn, ws, content, as_array(emb), [], SearchParams(),
                                               workspace_size=size, vector_index=indexed and key == "hnsw")
                found = sum(1 for c in cands if c.id in t.drawer_ids)
                if key == "exact":
                    exact += found
                else:
                    hnsw += found
        out["search_exact_and_full_text"] = exact
        out["search_hnsw_and_full_text"] = hnsw
        if whole:
            out.update(await vector_index_left(conn, ws))
    nc = await connect_nats(settings, nats_url, connect_timeout=5, max_reconnect_attempts=3)
    try:
        js = nc.jetstream()
        match = _matcher(scope, t, by_content=scope.kind == "drawer")
        out["stream_" + settings.stream_name] = len(await _scan(js, settings.stream_name, match))
        out["stream_" + settings.dlq_stream_name] = len(await _scan(js, settings.dlq_stream_name, match))
    finally:
        await nc.close()
    return out
