"""Raw sessions, messages and the drawers filed from them — written in one short transaction."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from psycopg import AsyncConnection
from psycopg.types.json import Jsonb

from shared.db.drawers import insert_history
from shared.db.forget import rehome_graph
from shared.memory.dedup import BANDS, wording_bands
from shared.memory.filing import CONTEXT_CHARS, MessageRow, SessionPlan
from shared.memory.revisions import KnownMessage, Revisions

__all__ = ["KNOWN_MESSAGES_SQL", "Settled", "StoredSession", "known_messages", "revise_messages", "settle_edits",
           "store_session"]


@dataclass(frozen=True)
class StoredSession:
    """What ``store_session`` wrote: the drawers it created, and every drawer of the session still raw
    (created now, or by an earlier attempt that died before announcing them), both in the plan's order; and
    the drawers that gained a sighting (a new one, created or not: ``settle_edits`` locks those that were
    there before, so an edit retiring one meanwhile and this session saying it are ordered)."""

    created: list[str]
    raw: list[str]
    sighted: list[str] = field(default_factory=list)


# One statement for the whole session: each table's rows as arrays (unnest), the tables written by the
# WITH's sub-statements. They share one snapshot, so the final SELECT sees the drawers as they were
# before this statement (those it inserts come back from ``d``); the foreign keys (messages → sessions,
# drawer_sources → drawers) are checked at the statement's end, when the rows it inserted are there.
_STORE_SQL = """
WITH s AS (
    INSERT INTO sessions (workspace_id, session_id, event_id, agent_id, user_id, started_at, completed_at,
                          metadata, message_count, content_hash)
    VALUES (%(ws)s, %(session)s, %(event)s, %(agent)s, %(user)s, %(started)s, %(completed)s, %(smeta)s,
            %(message_count)s, %(session_hash)s)
    ON CONFLICT (workspace_id, session_id) DO UPDATE
       SET message_count = GREATEST(sessions.message_count, EXCLUDED.message_count),
           completed_at  = COALESCE(EXCLUDED.completed_at, sessions.completed_at),
           metadata      = sessions.metadata || EXCLUDED.metadata,
           updated_at    = now()
     WHERE sessions.content_hash IS DISTINCT FROM EXCLUDED.content_hash
),
m AS (
    -- First write of a (session, seq) wins: a message, once stored, is never overwritten.
    INSERT INTO messages (workspace_id, session_id, seq, role, name, content, content_hash, created_at,
                          metadata, is_noise)
    SELECT %(ws)s, %(session)s, m.seq, m.role, m.name, m.content, m.content_hash, m.created_at, m.metadata,
           m.is_noise
      FROM unnest(%(m_seqs)s::integer[], %(m_roles)s::text[], %(m_names)s::text[], %(m_contents)s::text[],
                  %(m_hashes)s::text[], %(m_created)s::timestamptz[], %(m_metadata)s::jsonb[],
                  %(m_noise)s::boolean[])
           AS m(seq, role, name, content, content_hash, created_at, metadata, is_noise)
    ON CONFLICT (workspace_id, session_id, seq) DO NOTHING
),
d AS (
    INSERT INTO drawers (workspace_id, id, content, content_hash, wing, room, hall, session_id,
                         seq, context, agent_id, user_id, role, speaker, occurred_at, metadata, dedup_bands)
    SELECT %(ws)s, d.id, d.content, d.content_hash, d.wing, d.room, d.hall, %(session)s, d.seq, d.context,
           %(agent)s, %(user)s, d.role, d.speaker, d.occurred_at, d.metadata,
           (%(bands)s::bigint[])[(d.i - 1) * %(nb)s + 1 : d.i * %(nb)s]
      FROM unnest(%(ids)s::text[], %(contents)s::text[], %(hashes)s::text[], %(wings)s::text[], %(rooms)s::text[],
                  %(halls)s::text[], %(seqs)s::integer[], %(contexts)s::text[], %(roles)s::text[],
                  %(speakers)s::text[], %(occurred)s::timestamptz[], %(metadata)s::jsonb[]) WITH ORDINALITY
           AS d(id, content, content_hash, wing, room, hall, seq, context, role, speaker, occurred_at, metadata, i)
    ON CONFLICT (workspace_id, id) DO NOTHING
    RETURNING id
),
src AS (
    INSERT INTO drawer_sources (workspace_id, drawer_id, session_id, seq, chunk_index, char_start, char_end)
    SELECT %(ws)s, s.drawer_id, %(session)s, s.seq, s.chunk_index, s.char_start, s.char_end
      FROM unnest(%(s_ids)s::text[], %(s_seqs)s::integer[], %(s_chunks)s::integer[], %(s_starts)s::integer[],
                  %(s_ends)s::integer[])
           AS s(drawer_id, seq, chunk_index, char_start, char_end)
    ON CONFLICT DO NOTHING  -- a stale one said again is made current by ``settle_edits`` (no lock on a replay)
    RETURNING drawer_id
)
SELECT id, 'created' FROM d
UNION ALL
SELECT DISTINCT drawer_id, 'sighted' FROM src
UNION ALL
SELECT id, 'raw' FROM drawers
 WHERE workspace_id = %(ws)s AND id = ANY(%(ids)s)
   AND CASE WHEN state = 'raw' AND deleted_at IS NULL THEN true END  -- by key only: docs/scale.md
"""


async def store_session(conn: AsyncConnection[Any], plan: SessionPlan, *, message_count: int | None = None,
                        ) -> StoredSession:
    """Upsert the raw session, its messages, its drawers (state raw) and their provenance, in one statement.

    Idempotent: replaying the same plan changes nothing. Each table gets its rows as arrays (a statement per
    row cost the client a message per row and the server an execution per row), and the four tables one
    statement between them (one round trip where there were four). Wording bands are written with the row:
    a later UPDATE of an indexed column would re-insert the row into every index (the vector one included).
    Drawer i's bands are the i-th run of BANDS values in one flat bigint[] (a 2-D array cannot hold them per
    row through unnest). ``message_count``: the session's messages when the plan holds fewer (the edited
    ones, written as revisions, and earlier revisions coming back are left out of it).
    """
    e, ms, ds, ss = plan.event, plan.messages, plan.drawers, plan.sources
    ws = e.workspace_id
    bands = [wording_bands(ws, d.content) for d in ds]
    cur = await conn.execute(_STORE_SQL, {
        "ws": ws, "session": e.session_id, "event": e.event_id, "agent": e.agent_id, "user": e.user_id,
        "started": e.started_at, "completed": e.completed_at, "smeta": Jsonb(e.metadata),
        "message_count": len(ms) if message_count is None else message_count, "session_hash": plan.session_hash,
        "m_seqs": [m.seq for m in ms], "m_roles": [m.role for m in ms], "m_names": [m.name for m in ms],
        "m_contents": [m.content for m in ms], "m_hashes": [m.content_hash for m in ms],
        "m_created": [m.created_at for m in ms], "m_metadata": [Jsonb(m.metadata) for m in ms],
        "m_noise": [m.is_noise for m in ms],
        "bands": [b for bs in bands for b in bs], "nb": BANDS,
        "ids": [d.id for d in ds], "contents": [d.content for d in ds], "hashes": [d.content_hash for d in ds],
        "wings": [d.wing for d in ds], "rooms": [d.room or "general" for d in ds], "halls": [d.hall for d in ds],
        "seqs": [d.seq for d in ds], "contexts": [d.context for d in ds], "roles": [d.role for d in ds],
        "speakers": [d.speaker for d in ds], "occurred": [d.occurred_at for d in ds],
        "metadata": [Jsonb(d.metadata) for d in ds],
        "s_ids": [x.drawer_id for x in ss], "s_seqs": [x.seq for x in ss], "s_chunks": [x.chunk_index for x in ss],
        "s_starts": [x.char_start for x in ss], "s_ends": [x.char_end for x in ss],
    })
    rows = await cur.fetchall()
    # In the plan's order, whatever order the server returned them in (the lookup's plan decides it).
    place = {d.id: n for n, d in enumerate(ds)}
    created = sorted((str(i) for i, kind in rows if kind == "created"), key=place.__getitem__)
    raw = sorted((str(i) for i, kind in rows if kind != "sighted"), key=place.__getitem__)
    return StoredSession(created, raw, sorted(str(i) for i, kind in rows if kind == "sighted"))


# --- edited messages (shared/memory/revisions.py) ----------------------------------------------------

# Serialises the ingests of one session until commit: each reads what the session's positions hold and decides
# what is an edit; two versions handled side by side would both read the same state (and the loser's text
# would be filed without being stored).
_LOCK_SESSION_SQL = "SELECT pg_advisory_xact_lock(hashtextextended('palace.session:' || %s || '/' || %s, 0))"

# By the primary key of messages, and of message_revisions for each position found.
KNOWN_MESSAGES_SQL = """
    SELECT m.seq, m.content_hash,
           ARRAY(SELECT r.content_hash FROM message_revisions r
                  WHERE r.workspace_id = %(ws)s AND r.session_id = %(sid)s AND r.seq = m.seq)
      FROM messages m
     WHERE m.workspace_id = %(ws)s AND m.session_id = %(sid)s AND m.seq = ANY(%(seqs)s::integer[])"""


async def known_messages(conn: AsyncConnection[Any], workspace_id: str, session_id: str,
                         seqs: list[int]) -> dict[int, KnownMessage]:
    """Take the session's lock (``_LOCK_SESSION_SQL``), then read what these positions of it hold (absent:
    never stored). One round trip: pipelined, the read runs once the lock is granted, with a snapshot
    taken after it (READ COMMITTED), so it sees what an ingest of the same session that held it committed."""
    async with conn.pipeline():
        await conn.execute(_LOCK_SESSION_SQL, (workspace_id, session_id))
        cur = await conn.execute(KNOWN_MESSAGES_SQL, {"ws": workspace_id, "sid": session_id, "seqs": seqs})
    return {int(q): KnownMessage(h, frozenset(earlier or ())) for q, h, earlier in await cur.fetchall()}


# The current text moves to message_revisions (the INSERT reads the rows as they were before the UPDATE:
# one snapshot for the statement), and the new text takes its place with the next revision number.
_REVISE_SQL = """
WITH kept AS (
    INSERT INTO message_revisions (workspace_id, session_id, seq, revision, role, name, content, content_hash,
                                   created_at, metadata, is_noise, replaced_by)
    SELECT m.workspace_id, m.session_id, m.seq, m.revision, m.role, m.name, m.content, m.content_hash,
           m.created_at, m.metadata, m.is_noise, %(event)s
      FROM messages m
     WHERE m.workspace_id = %(ws)s AND m.session_id = %(sid)s AND m.seq = ANY(%(seqs)s::integer[])
    ON CONFLICT DO NOTHING)
UPDATE messages m
   SET role = e.role, name = e.name, content = e.content, content_hash = e.content_hash, created_at = e.created_at,
       metadata = e.metadata, is_noise = e.is_noise, revision = m.revision + 1
  FROM unnest(%(seqs)s::integer[], %(roles)s::text[], %(names)s::text[], %(contents)s::text[], %(hashes)s::text[],
              %(created)s::timestamptz[], %(metadata)s::jsonb[], %(noise)s::boolean[])
       AS e(seq, role, name, content, content_hash, created_at, metadata, is_noise)
 WHERE m.workspace_id = %(ws)s AND m.session_id = %(sid)s AND m.seq = e.seq"""


async def revise_messages(conn: AsyncConnection[Any], workspace_id: str, session_id: str, edited: list[MessageRow],
                          *, event_id: str | None) -> int:
    """Store the edited messages as their positions' current revision, keeping the text each held."""
    if not edited:
        return 0
    cur = await conn.execute(_REVISE_SQL, {
        "ws": workspace_id, "sid": session_id, "event": event_id, "seqs": [m.seq for m in edited],
        "roles": [m.role for m in edited], "names": [m.name for m in edited],
        "contents": [m.content for m in edited], "hashes": [m.content_hash for m in edited],
        "created": [m.created_at for m in edited], "metadata": [Jsonb(m.metadata) for m in edited],
        "noise": [m.is_noise for m in edited]})
    return cur.rowcount


# A sighting gone stale with an edit is current again where a message says the drawer again (a later edit of
# the position). Only rows still stale are written: a replay locks nothing.
_RESIGHT_SQL = """
UPDATE drawer_sources s SET revision = NULL, char_start = x.cs, char_end = x.ce
  FROM unnest(%(ids)s::text[], %(seqs)s::integer[], %(chunks)s::integer[], %(starts)s::integer[], %(ends)s::integer[])
       AS x(id, seq, chunk, cs, ce)
 WHERE s.workspace_id = %(ws)s AND s.session_id = %(sid)s AND s.drawer_id = x.id AND s.seq = x.seq
   AND s.chunk_index = x.chunk
   AND (s.revision IS NOT NULL  -- or, at an edited position, a chunk the new text holds elsewhere in it
        OR (s.seq = ANY(%(edited)s::integer[]) AND (s.char_start, s.char_end) IS DISTINCT FROM (x.cs, x.ce)))
RETURNING s.drawer_id"""

# The sightings at the edited positions that their new text is not cut into go stale: they record the revision
# they were cut from (the one just replaced). Returns their drawers.
_STALE_SQL = """
UPDATE drawer_sources s SET revision = m.revision - 1
  FROM messages m
 WHERE s.workspace_id = %(ws)s AND s.session_id = %(sid)s AND s.seq = ANY(%(seqs)s::integer[])
   AND s.revision IS NULL
   AND m.workspace_id = s.workspace_id AND m.session_id = s.session_id AND m.seq = s.seq
   AND NOT EXISTS (SELECT 1 FROM unnest(%(kids)s::text[], %(kseqs)s::integer[], %(kchunks)s::integer[])
                               AS k(id, seq, chunk)
                    WHERE k.id = s.drawer_id AND k.seq = s.seq AND k.chunk = s.chunk_index)
RETURNING s.drawer_id"""

# Of those, the ones with no current sighting left anywhere are soft-deleted (search, layers and the graph stop
# seeing them; restorable, and brought back when a message says them again: ``_REVIVE_SQL``). A drawer that
# other sightings were merged into stays (its words stand for theirs), and so does a pinned one. Run after the
# rows are locked (``_LOCK_SQL``): under READ COMMITTED the statement then sees what a cluster merge into
# them, or an edit of another session that said them too, committed meanwhile.
_RETIRE_SQL = """
UPDATE drawers d SET deleted_at = now(), updated_at = now()
 WHERE d.workspace_id = %(ws)s AND d.id = ANY(%(ids)s::text[]) AND d.deleted_at IS NULL AND NOT d.pinned
   AND NOT EXISTS (SELECT 1 FROM drawer_sources o
                    WHERE o.workspace_id = %(ws)s AND o.drawer_id = d.id AND o.revision IS NULL)
   AND NOT EXISTS (SELECT 1 FROM drawers m WHERE m.workspace_id = %(ws)s AND m.cluster_id = d.id
                      AND m.state = 'merged' AND m.deleted_at IS NULL)
RETURNING d.id, d.wing, d.room, d.deleted_at"""

# The twins that retire candidates were merged into: a twin kept alive only by a merged sighting that goes
# now goes too when nothing says it either.
_TWINS_OF_SQL = """SELECT DISTINCT cluster_id FROM drawers
                    WHERE workspace_id = %(ws)s AND id = ANY(%(ids)s::text[]) AND cluster_id IS NOT NULL
                      AND CASE WHEN state = 'merged' THEN true END  -- by key only: docs/scale.md"""

# Drawers an edit retired (its DELETE row by ingest, of the same moment: by index memory_history_drawer; one
# deleted by anyone else stays deleted) among these. Named by key; liveness as a CASE.
_RETIRED_BY_EDIT = """
    d.workspace_id = %(ws)s AND d.id = ANY(%(ids)s::text[])
    AND CASE WHEN d.deleted_at IS NOT NULL THEN true END  -- by key only: docs/scale.md
    AND EXISTS (SELECT 1 FROM memory_history h
                 WHERE h.workspace_id = %(ws)s AND h.drawer_id = d.id AND h.action = 'DELETE'
                   AND h.actor = %(actor)s AND h.created_at = d.deleted_at AND h.reason LIKE %(reason)s)"""
_RETIRED_SQL = "SELECT d.id FROM drawers d WHERE" + _RETIRED_BY_EDIT  # noqa: S608 - constant fragments

# ... live again once a message says them (a current sighting: this session's, just stored).
_CURRENT = """
   AND EXISTS (SELECT 1 FROM drawer_sources o
                WHERE o.workspace_id = %(ws)s AND o.drawer_id = d.id AND o.revision IS NULL)
RETURNING d.id, d.state"""
# A drawer merged into a twin that is gone since comes back as itself (hidden for good otherwise), as purge does.
_TWIN_GONE = """d.state = 'merged' AND NOT EXISTS (SELECT 1 FROM drawers t WHERE t.workspace_id = d.workspace_id
                                                     AND t.id = d.cluster_id AND t.deleted_at IS NULL)"""
_REVIVE_SET = ("UPDATE drawers d SET deleted_at = NULL, updated_at = now(),"  # noqa: S608 - constant fragments
               " state = CASE WHEN " + _TWIN_GONE + " THEN 'processed' ELSE d.state END,"
               " cluster_id = CASE WHEN " + _TWIN_GONE + " THEN NULL ELSE d.cluster_id END WHERE")
_REVIVE_SQL = _REVIVE_SET + _RETIRED_BY_EDIT + _CURRENT

# NO KEY UPDATE: nothing written here is a key, and a stronger lock would also wait for every insert of a row
# referencing the drawer (a sighting, a fact's evidence), which holds KEY SHARE on it. In id order, as cluster
# locks what it writes (and the twins it merges into).
_LOCK_SQL = "SELECT id FROM drawers WHERE workspace_id = %s AND id = ANY(%s) ORDER BY id FOR NO KEY UPDATE"

# The audit's reason names no session: a forget of the session must not leave its id behind.
_EDIT_REASON = "message edited"


@dataclass(frozen=True)
class Settled:
    """What ``settle_edits`` changed: drawers retired, drawers brought back (id, state), drawers whose
    context was replaced, and drawers kept by another message that now report it (id, state)."""

    retired: list[str]
    revived: list[tuple[str, str]]
    recontexted: list[str]
    repointed: list[tuple[str, str]] = field(default_factory=list)


async def settle_edits(conn: AsyncConnection[Any], workspace_id: str, session_id: str, revisions: Revisions,
                       *, seen_before: bool, existing: list[str], sighted: list[str], event_id: str | None,
                       actor: str) -> Settled:
    """After ``store_session``: what an edit changes beyond the messages, in one lock order.

    The sightings the plan says again are current again (``_RESIGHT_SQL``, a session seen before only), the
    edited positions' other sightings go stale (``_STALE_SQL``); then the drawers that may be retired (and
    the twins they were merged into), the drawers that were there before (``existing``) and have a sighting
    made current now (``sighted``: the store's new ones, or re-sighted) and those taking a new context are
    locked together in id order; then those an edit had retired come back (``_REVIVE_SQL``), the stale
    ones with no current sighting go (``_RETIRE_SQL``), audited as RESTORE and DELETE, and the next turns
    take their new context (``_RECONTEXT_SQL``). Nothing runs, and nothing is locked, for a session that is
    new and says nothing already filed (the common case), or for a replay."""
    ws, sid = workspace_id, session_id
    plan = revisions.plan
    said = set(sighted) & set(existing)  # a drawer that was there, with a sighting made current now
    if seen_before:
        cur = await conn.execute(_RESIGHT_SQL, {
            "ws": ws, "sid": sid, "ids": [x.drawer_id for x in plan.sources], "seqs": [x.seq for x in plan.sources],
            "chunks": [x.chunk_index for x in plan.sources], "starts": [x.char_start for x in plan.sources],
            "ends": [x.char_end for x in plan.sources], "edited": revisions.edited_seqs})
        said |= {str(r[0]) for r in await cur.fetchall()}
    candidates: list[str] = []
    if revisions.edited:
        edited = set(revisions.edited_seqs)
        kept = [x for x in plan.sources if x.seq in edited]
        cur = await conn.execute(_STALE_SQL, {
            "ws": ws, "sid": sid, "seqs": sorted(edited), "kids": [x.drawer_id for x in kept],
            "kseqs": [x.seq for x in kept], "kchunks": [x.chunk_index for x in kept]})
        candidates = sorted({str(r[0]) for r in await cur.fetchall()})
        if candidates:
            cur = await conn.execute(_TWINS_OF_SQL, {"ws": ws, "ids": candidates})
            candidates = sorted({*candidates, *(str(r[0]) for r in await cur.fetchall())})
    recontext = revisions.recontext
    # One lock, in id order, before anything is decided: an edit of another session retiring a drawer this
    # one says now then either commits first (and the check below finds it retired) or waits, and finds
    # this session's sighting.
    lock = sorted({*candidates, *said, *(r[0] for r in recontext)})
    if lock:
        await conn.execute(_LOCK_SQL, (ws, lock))
    reason = {"ws": ws, "actor": actor, "reason": _EDIT_REASON + ":%"}
    retired_before: list[str] = []
    if said:
        cur = await conn.execute(_RETIRED_SQL, {**reason, "ids": sorted(said)})
        retired_before = [str(r[0]) for r in await cur.fetchall()]
    revived: list[tuple[str, str]] = []
    if retired_before:
        cur = await conn.execute(_REVIVE_SQL, {**reason, "ids": retired_before})
        revived = [(str(r[0]), str(r[1])) for r in await cur.fetchall()]
    rows: list[tuple[Any, ...]] = []
    if candidates:
        cur = await conn.execute(_RETIRE_SQL, {"ws": ws, "ids": candidates})
        rows = list(await cur.fetchall())
    # Kept by another message, or brought back by one: they report a message that says them.
    moved = sorted({*(set(candidates) - {str(r[0]) for r in rows}), *(d for d, _ in revived)})
    repointed: list[tuple[str, str]] = []
    if moved:
        cur = await conn.execute(_REPOINT_SQL, {"ws": ws, "ids": moved, "ctx_chars": CONTEXT_CHARS})
        was = await cur.fetchall()
        repointed = [(str(r[0]), str(r[1])) for r in was]
        # What the graph read in them, named by a message that no longer says them (the edited ones, or the
        # one a drawer reported before), is said where they are said now.
        stale = sorted({*((sid, q) for q in revisions.edited_seqs),
                        *((str(r[2]), int(r[3])) for r in was if r[3] is not None)})
        await rehome_graph(conn, ws, moved, [p[0] for p in stale], [p[1] for p in stale])
    await insert_history(conn, ws, [
        {"drawer_id": d, "action": "RESTORE", "actor": actor, "event_id": event_id,
         "reason": "said again after an edit had retired it", "new_value": {"deleted_at": None}} for d, _ in revived
    ] + [
        {"drawer_id": r[0], "action": "DELETE", "actor": actor, "event_id": event_id,
         "reason": f"{_EDIT_REASON}: no message says this any more",
         "old_value": {"deleted_at": None}, "new_value": {"deleted_at": r[3], "wing": r[1], "room": r[2]}}
        for r in rows])
    recontexted: list[str] = []
    if recontext:
        cur = await conn.execute(_RECONTEXT_SQL, {
            "ws": ws, "sid": sid, "ids": [r[0] for r in recontext], "seqs": [r[1] for r in recontext],
            "ctxs": [r[2] for r in recontext]})
        recontexted = [str(r[0]) for r in await cur.fetchall()]
    return Settled(sorted(str(r[0]) for r in rows), revived, recontexted, repointed)


# A live drawer whose own message no longer says it (an edit left it to another message, or a message says
# it again after an edit had retired it) takes what it reports from its earliest current sighting instead,
# as a forget repoints one (``shared.db.forget``): where and when it was said, by whom, the message's
# metadata, and the turn before it as its context. Its placement stays. A new speaker or context makes its
# vector stale: back to raw, to be embedded again. A merged or archived drawer is left as it is (its vector
# is what it comes back with), as ``_RECONTEXT_SQL`` leaves it. Returns the position it reported before.
_REPOINT_SQL = """
UPDATE drawers d
   SET session_id = x.session_id, seq = x.seq, user_id = x.user_id, agent_id = x.agent_id,
       role = coalesce(x.role, d.role), speaker = x.speaker, occurred_at = x.occurred_at,
       metadata = (d.metadata - 'message') || x.metadata, context = x.ctx,
       embedding = CASE WHEN x.stale THEN NULL ELSE d.embedding END,
       embedding_model = CASE WHEN x.stale THEN NULL ELSE d.embedding_model END,
       state = CASE WHEN x.stale THEN 'raw' ELSE d.state END,
       retry_count = CASE WHEN x.stale THEN 0 ELSE d.retry_count END,
       failure_reason = CASE WHEN x.stale THEN NULL ELSE d.failure_reason END, updated_at = now()
  FROM (SELECT d0.id, d0.session_id AS was_session, d0.seq AS was_seq, s.session_id, s.seq, ss.user_id,
               ss.agent_id, m.role, m.name AS speaker,
               coalesce(m.created_at, ss.completed_at, ss.started_at) AS occurred_at,
               jsonb_build_object('seq', s.seq, 'chunk', s.chunk_index)
               || CASE WHEN m.metadata <> '{}' THEN jsonb_build_object('message', m.metadata) ELSE '{}' END
               AS metadata,
               c.ctx,
               c.ctx IS DISTINCT FROM d0.context OR m.name IS DISTINCT FROM d0.speaker AS stale
          FROM drawers d0
          JOIN LATERAL (SELECT o.session_id, o.seq, o.chunk_index FROM drawer_sources o
                         WHERE o.workspace_id = %(ws)s AND o.drawer_id = d0.id AND o.revision IS NULL
                         ORDER BY o.session_id, o.seq, o.chunk_index LIMIT 1) s ON true
          JOIN sessions ss ON ss.workspace_id = %(ws)s AND ss.session_id = s.session_id
          LEFT JOIN messages m ON m.workspace_id = %(ws)s AND m.session_id = s.session_id AND m.seq = s.seq
          -- The context as filing makes it (shared.memory.filing: the turn before, attributed, its last
          -- CONTEXT_CHARS characters), for a message's first chunk only.
          LEFT JOIN LATERAL (SELECT right(CASE WHEN coalesce(p.name, '') <> '' THEN p.name || ': ' || p.content
                                               ELSE p.content END, %(ctx_chars)s) AS ctx
                               FROM messages p
                              WHERE p.workspace_id = %(ws)s AND p.session_id = s.session_id AND p.seq < s.seq
                                AND NOT p.is_noise AND s.chunk_index = 0
                              ORDER BY p.seq DESC LIMIT 1) c ON true
         WHERE d0.workspace_id = %(ws)s AND d0.id = ANY(%(ids)s::text[]) AND d0.deleted_at IS NULL
           AND d0.state IN ('raw', 'processed', 'failed')
           AND NOT EXISTS (SELECT 1 FROM drawer_sources r
                            WHERE r.workspace_id = %(ws)s AND r.drawer_id = d0.id AND r.session_id = d0.session_id
                              AND r.seq = d0.seq AND r.revision IS NULL)) x
 WHERE d.workspace_id = %(ws)s AND d.id = x.id
RETURNING d.id, d.state, x.was_session, x.was_seq"""


# The turn after an edited one, first seen at that position, takes the new words as its context; its
# vector (made with the old ones) goes, and it is embedded and classified again (back to raw).
_RECONTEXT_SQL = """
UPDATE drawers d SET context = x.ctx, embedding = NULL, embedding_model = NULL, state = 'raw', retry_count = 0,
                     failure_reason = NULL, updated_at = now()
  FROM unnest(%(ids)s::text[], %(seqs)s::integer[], %(ctxs)s::text[]) AS x(id, seq, ctx)
 WHERE d.workspace_id = %(ws)s AND d.id = x.id AND d.session_id = %(sid)s AND d.seq = x.seq
   AND d.deleted_at IS NULL AND d.state IN ('raw', 'processed', 'failed')
   AND d.context IS DISTINCT FROM x.ctx
RETURNING d.id"""
