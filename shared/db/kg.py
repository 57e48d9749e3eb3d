"""Temporal knowledge graph in SQL: add, invalidate, query (as of a time), timeline, stats.

Every function runs inside the caller's workspace transaction (``shared.db.tenancy.workspace_tx``)
and validates its input with ``shared.memory.kg`` first, so bad input is a ``KgError`` with a clear
message, never a half-written graph. Facts are only ever added or ended, never rewritten: that is
what keeps "what did we use before PostgreSQL?" answerable after the switch.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import date, datetime
from typing import Any, NamedTuple

from psycopg import AsyncConnection

from shared.db.drawers import record_history
from shared.memory.kg import (
    Direction,
    Fact,
    KgError,
    KgStats,
    Sighting,
    TripleAdded,
    anchor_word,
    as_of_window,
    entity_id,
    match_key,
    normalize_name,
    normalize_predicate,
    parse_direction,
    parse_when,
    pick_links,
    text_words,
    triple_id,
    validate_name,
)

__all__ = [
    "ExtractionStored",
    "LinkResult",
    "add_aliases",
    "add_triple",
    "ensure_entities",
    "entity_timeline",
    "invalidate_triple",
    "kg_stats",
    "link_drawers",
    "pending_mention_entities",
    "query_entity",
    "record_extraction",
    "recount_entities",
    "refresh_entities",
    "resolve_entity",
    "survivor_map",
]

When = datetime | date | str | None

# One column list for every read, so a Fact always comes back the same way.
_FACT_SELECT = """
    SELECT t.id, s.name, t.subject_id, t.predicate, o.name, t.object_id, t.valid_from, t.valid_to,
           (t.valid_to IS NULL OR t.valid_to > now()) AS current, {direction} AS direction, t.confidence,
           t.source_drawer, t.source_episode, t.source_session, t.source_seq, t.created_at, t.invalidated_at
      FROM {source} t
      JOIN entities s ON s.workspace_id = t.workspace_id AND s.id = t.subject_id
      JOIN entities o ON o.workspace_id = t.workspace_id AND o.id = t.object_id
"""
# Which facts a read past its limit keeps: the latest, then shown in the order they started (``_chronological``).
# Oldest first, a busy entity's reads ended before today's facts.
_NEWEST_FIRST = "t.valid_from DESC NULLS LAST, t.created_at DESC, t.id DESC"


def _chronological(facts: list[Fact]) -> list[Fact]:
    """In the order they started (no start first), then as recorded."""
    return sorted(facts, key=lambda f: (f.valid_from is not None, f.valid_from or f.created_at, f.created_at, f.id))


_FACT_FIELDS = ("id", "subject", "subject_id", "predicate", "object", "object_id", "valid_from", "valid_to",
                "current", "direction", "confidence", "source_drawer", "source_episode", "source_session",
                "source_seq", "created_at", "invalidated_at")


# An entity's edges, each branch a range scan of its index; a false flag skips the branch (a one-time
# filter), and a null window bound means no bound. A self-loop is listed once, as outgoing.
_EDGES = """(
    SELECT *, 'outgoing'::text AS dir FROM triples
     WHERE %(out)s AND workspace_id = %(ws)s AND subject_id = %(e)s
       AND (%(hi)s::timestamptz IS NULL OR valid_from IS NULL OR valid_from <= %(hi)s)
       AND (%(lo)s::timestamptz IS NULL OR valid_to IS NULL OR valid_to >= %(lo)s)
    UNION ALL
    SELECT *, 'incoming'::text AS dir FROM triples
     WHERE %(in)s AND workspace_id = %(ws)s AND object_id = %(e)s AND NOT (%(both)s AND subject_id = %(e)s)
       AND (%(hi)s::timestamptz IS NULL OR valid_from IS NULL OR valid_from <= %(hi)s)
       AND (%(lo)s::timestamptz IS NULL OR valid_to IS NULL OR valid_to >= %(lo)s)
)"""


def _fact(row: tuple[Any, ...]) -> Fact:
    return Fact(**dict(zip(_FACT_FIELDS, row, strict=True)))


async def _fact_by_id(conn: AsyncConnection[Any], workspace_id: str, tid: str) -> Fact:
    cur = await conn.execute(
        _FACT_SELECT.format(direction="NULL::text", source="triples")
        + " WHERE t.workspace_id = %s AND t.id = %s", (workspace_id, tid))
    row = await cur.fetchone()
    assert row is not None, tid
    return _fact(row)


# Merges chain (A into B, later B into C): an entity answers for the end of its chain. The depth bound
# only guards against a cycle, which merge_entities never makes (it merges live entities only).
_MAX_MERGE_HOPS = 32


async def survivor_map(conn: AsyncConnection[Any], workspace_id: str, ids: list[str]) -> dict[str, str]:
    """id → the live entity it was merged into, following chains of merges (entity dedup), for the ids
    that were merged away; the others are absent. One statement, a primary-key probe per hop."""
    if not ids:
        return {}
    cur = await conn.execute(
        """WITH RECURSIVE chain(start, cur, depth) AS (
               SELECT id, merged_into, 1 FROM entities
                WHERE workspace_id = %(ws)s AND id = ANY(%(ids)s) AND merged_into IS NOT NULL
               UNION ALL
               SELECT c.start, e.merged_into, c.depth + 1 FROM chain c
                 JOIN entities e ON e.workspace_id = %(ws)s AND e.id = c.cur
                WHERE e.merged_into IS NOT NULL AND c.depth < %(hops)s)
           SELECT DISTINCT ON (start) start, cur FROM chain ORDER BY start, depth DESC""",
        {"ws": workspace_id, "ids": sorted(set(ids)), "hops": _MAX_MERGE_HOPS})
    return {str(i): str(m) for i, m in await cur.fetchall()}


async def _survivors(conn: AsyncConnection[Any], workspace_id: str, *ids: str) -> tuple[str, ...]:
    """The ids with every entity merged away (entity dedup) replaced by the one its merges end in."""
    moved = await survivor_map(conn, workspace_id, list(ids))
    return tuple(moved.get(i, i) for i in ids)


async def ensure_entities(
    conn: AsyncConnection[Any], workspace_id: str, entities: list[tuple[str, str]]
) -> dict[str, bool]:
    """Create the (name, type) entities that do not exist yet; returns id → created by this call.

    An existing entity keeps its name and gains a type only where it had none ('unknown').
    """
    out: dict[str, bool] = {}
    for name, etype in entities:
        eid = entity_id(workspace_id, name)
        cur = await conn.execute(
            "INSERT INTO entities (workspace_id, id, name, entity_type) VALUES (%s, %s, %s, %s)"
            " ON CONFLICT (workspace_id, id) DO NOTHING RETURNING id",
            (workspace_id, eid, name, etype or "unknown"),
        )
        created = await cur.fetchone() is not None
        if created:
            await add_aliases(conn, workspace_id, eid, [name])
        if not created and etype and etype != "unknown":
            await conn.execute(
                "UPDATE entities SET entity_type = %s, updated_at = now()"
                " WHERE workspace_id = %s AND id = %s AND entity_type = 'unknown'", (etype, workspace_id, eid))
        out[eid] = out.get(eid, False) or created
    return out


async def add_aliases(conn: AsyncConnection[Any], workspace_id: str, eid: str, aliases: list[str]) -> int:
    """Let the linker and name lookups find entity ``eid`` under each of ``aliases``; returns how
    many were new. Aliases without a word in them are skipped."""
    return await _add_aliases_of(conn, workspace_id, [(eid, a) for a in aliases])


async def _add_aliases_of(conn: AsyncConnection[Any], workspace_id: str, pairs: list[tuple[str, str]]) -> int:
    """``add_aliases`` for (entity id, alias) pairs of any number of entities, in one statement."""
    rows = [(k, anchor_word(k), eid, a, any(c.isupper() for c in a)) for eid, a in pairs if (k := match_key(a))]
    if not rows:
        return 0
    cur = await conn.execute(
        """INSERT INTO entity_aliases (workspace_id, alias_key, anchor, entity_id, alias, cased)
           SELECT %s, k, n, e, a, c FROM unnest(%s::text[], %s::text[], %s::text[], %s::text[], %s::boolean[])
                                         AS x(k, n, e, a, c)
           ON CONFLICT DO NOTHING""",
        (workspace_id, *([r[i] for r in rows] for i in range(5))))
    return cur.rowcount


class LinkResult(NamedTuple):
    """What ``link_drawers`` found: drawer → entities it mentions, and how many links were new."""

    links: dict[str, set[str]]
    new_mentions: int


async def link_drawers(conn: AsyncConnection[Any], workspace_id: str, drawers: list[tuple[str, str]]) -> LinkResult:
    """The inline linker (no LLM): link each (drawer id, content) to the workspace's existing
    entities whose name or alias occurs in it, as whole words. Never creates an entity.

    One index probe of ``entity_aliases`` by the batch's distinct words (a name's anchor word must be
    among them), then whole-word matching of the few names that come back. Idempotent, so a
    redelivered batch adds nothing; the drawers' entity_count follows new links. Only drawers that
    still exist are linked (one forgotten since it was filed gains no mention).
    """
    texts = {did: text_words(text) for did, text in drawers}
    probe = sorted({w for t in texts.values() for w in t.words})
    if not probe:
        return LinkResult({}, 0)
    cur = await conn.execute(
        "SELECT alias_key, entity_id, cased FROM entity_aliases WHERE workspace_id = %s AND anchor = ANY(%s)",
        (workspace_id, probe))
    aliases = [(str(k), str(e), bool(c)) for k, e, c in await cur.fetchall()]
    links = {did: ids for did, t in texts.items() if (ids := pick_links(t, aliases))}
    pairs = sorted({(eid, did) for did, ids in links.items() for eid in ids})
    if not pairs:
        return LinkResult({}, 0)
    cur = await conn.execute(
        """INSERT INTO entity_mentions (workspace_id, entity_id, drawer_id)
           SELECT %(ws)s, e, d FROM unnest(%(e)s::text[], %(d)s::text[]) AS p(e, d)
            WHERE EXISTS (SELECT 1 FROM drawers x WHERE x.workspace_id = %(ws)s AND x.id = p.d)
           ON CONFLICT DO NOTHING RETURNING entity_id, drawer_id""",
        {"ws": workspace_id, "e": [e for e, _ in pairs], "d": [d for _, d in pairs]})
    new = await cur.fetchall()
    if new:
        # Only the batch's own drawers are written. Entity rows are not: a speaker's entity is named
        # in every session, and bumping its mention_count here made every ingest transaction wait on
        # that one row; the count is refreshed by the recount on entity.upserted (cluster).
        by_drawer = Counter(str(r[1]) for r in new)
        ids = sorted(by_drawer)
        await conn.execute(
            """UPDATE drawers d SET entity_count = d.entity_count + n.k
                 FROM unnest(%s::text[], %s::int[]) AS n(id, k)
                WHERE d.workspace_id = %s AND d.id = n.id""",
            (ids, [by_drawer[i] for i in ids], workspace_id))
    return LinkResult(links, len(new))


async def resolve_entity(conn: AsyncConnection[Any], workspace_id: str, name: str) -> str | None:
    """The id of the entity called ``name`` (or, unambiguously, aliased so) in the workspace; None
    when there is none."""
    clean = validate_name(name)
    eid = entity_id(workspace_id, clean)
    # A merged entity (entity dedup) answers for the survivor its merges end in.
    cur = await conn.execute("SELECT merged_into IS NOT NULL FROM entities WHERE workspace_id = %s AND id = %s",
                             (workspace_id, eid))
    row = await cur.fetchone()
    if row:
        return (await survivor_map(conn, workspace_id, [eid])).get(eid, eid) if row[0] else eid
    # Known by another name (an alias): only when exactly one entity goes by it.
    cur = await conn.execute(
        "SELECT entity_id FROM entity_aliases WHERE workspace_id = %s AND alias_key = %s LIMIT 2",
        (workspace_id, match_key(clean)))
    rows = await cur.fetchall()
    return str(rows[0][0]) if len(rows) == 1 else None


@dataclass(frozen=True)
class _Written:
    """What writing a fact did: its id and start (the existing fact's, when it already held)."""

    id: str
    valid_from: datetime | None
    created: bool
    subject_created: bool
    object_created: bool


async def add_triple(
    conn: AsyncConnection[Any], workspace_id: str, subject: str, predicate: str, obj: str, *,
    valid_from: When = None, valid_to: When = None, confidence: float = 1.0,
    subject_type: str = "unknown", object_type: str = "unknown",
    source_drawer: str | None = None, source_episode: str | None = None,
    source_session: str | None = None, source_seq: int | None = None,
    known: Mapping[str, str] | None = None,
) -> TripleAdded:
    """Record ``subject --predicate--> obj``, creating either entity when it does not exist.

    ``known``: entity id → the id it answers for (itself, or its merge survivor), for entities the
    caller has already created in this transaction (``record_extraction`` does so for a whole
    session in one statement); when both ends are there, they are neither inserted nor looked up
    again, which were three statements of each fact.

    ``valid_from`` defaults to when the statement was said: the source message's time (named by
    ``source_session``/``source_seq``, or the first sighting of ``source_drawer``), else the drawer's
    ``occurred_at``, else now. A statement that already holds at that time is not added twice (the
    existing fact is returned); one said earlier than the current fact's start moves that start back.
    ``valid_to`` records a fact that has already ended.
    """
    w = await _write_triple(conn, workspace_id, subject, predicate, obj, valid_from=valid_from, valid_to=valid_to,
                            confidence=confidence, subject_type=subject_type, object_type=object_type,
                            source_drawer=source_drawer, source_episode=source_episode,
                            source_session=source_session, source_seq=source_seq, known=known)
    return TripleAdded(fact=await _fact_by_id(conn, workspace_id, w.id), created=w.created,
                       subject_created=w.subject_created, object_created=w.object_created)


# When each fact was said, where its sighting does not say: the turn's message, else the drawer's time. The
# session and turn are worked out behind a fence (OFFSET 0) so that the message is found by its primary key:
# under row-level security a COALESCE in the join's condition kept it out of the index condition (it is not
# known to be leakproof), and every lookup read the workspace's messages whole.
_SAID_WHEN = """
SELECT k.n, COALESCE(k.vf, m.created_at, k.occurred_at, now()), k.sess, k.seq
  FROM (SELECT x.n, x.vf, d.occurred_at, COALESCE(x.sess, d.session_id) AS sess, COALESCE(x.seq, d.seq) AS seq
          FROM unnest(%(drawer)s::text[], %(sess)s::text[], %(seq)s::integer[], %(vf)s::timestamptz[])
               WITH ORDINALITY AS x(drawer, sess, seq, vf, n)
          LEFT JOIN drawers d ON d.workspace_id = %(ws)s AND d.id = x.drawer
        OFFSET 0) k
  LEFT JOIN messages m ON m.workspace_id = %(ws)s AND m.session_id = k.sess AND m.seq = k.seq"""
# The latest fact already true when each was said.
_TRUE_THEN = """
SELECT x.n, t.id, t.valid_from
  FROM unnest(%(s)s::text[], %(p)s::text[], %(o)s::text[], %(vf)s::timestamptz[]) WITH ORDINALITY AS x(s, p, o, vf, n)
 CROSS JOIN LATERAL (
       SELECT id, valid_from FROM triples
        WHERE workspace_id = %(ws)s AND subject_id = x.s AND predicate = x.p AND object_id = x.o
          AND (valid_from IS NULL OR valid_from <= x.vf) AND (valid_to IS NULL OR valid_to >= x.vf)
        ORDER BY valid_from DESC NULLS LAST LIMIT 1) t"""


async def _write_triple(
    conn: AsyncConnection[Any], workspace_id: str, subject: str, predicate: str, obj: str, *,
    valid_from: When, valid_to: When, confidence: float, subject_type: str, object_type: str,
    source_drawer: str | None, source_episode: str | None, source_session: str | None, source_seq: int | None,
    known: Mapping[str, str] | None,
) -> _Written:
    """``add_triple`` without reading the fact back: an extraction needs only its id and start."""
    s_name = validate_name(subject, "subject")
    o_name = validate_name(obj, "object")
    pred = normalize_predicate(predicate)
    if not isinstance(confidence, int | float) or not math.isfinite(confidence) or not 0 <= confidence <= 1:
        raise KgError("confidence must be a number between 0 and 1")
    vf_in = parse_when(valid_from, "valid_from")
    vt = parse_when(valid_to, "valid_to")

    if vf_in is not None and source_session is not None and source_seq is not None:
        vf = vf_in  # all given (an extraction knows when each turn was said): nothing to look up
    else:
        cur = await conn.execute(_SAID_WHEN, {"ws": workspace_id, "drawer": [source_drawer], "sess": [source_session],
                                              "seq": [source_seq], "vf": [vf_in]})
        row = await cur.fetchone()
        assert row is not None
        _, vf, source_session, source_seq = row
    if vt is not None and vt < vf:
        raise KgError(f"valid_to {vt.isoformat()} is before valid_from {vf.isoformat()}")

    s0, o0 = entity_id(workspace_id, s_name), entity_id(workspace_id, o_name)
    if known is not None and s0 in known and o0 in known and (subject_type, object_type) == ("unknown", "unknown"):
        created_entities: dict[str, bool] = {s0: False, o0: False}
        sid, oid = known[s0], known[o0]
    else:
        created_entities = await ensure_entities(conn, workspace_id, [(s_name, subject_type), (o_name, object_type)])
        sid, oid = await _survivors(conn, workspace_id, s0, o0)
    key = {"ws": workspace_id, "s": sid, "p": pred, "o": oid, "vf": vf}

    # Already true at that time (said before, or replayed): the fact stands as it is.
    cur = await conn.execute(_TRUE_THEN, {"ws": workspace_id, "s": [sid], "p": [pred], "o": [oid], "vf": [vf]})
    found = await cur.fetchone()
    found = found[1:] if found else None
    created = False
    start: datetime | None = vf
    if found:
        tid, start = str(found[0]), found[1]
    else:
        tid = triple_id(workspace_id, sid, pred, oid, vf)
        cur = await conn.execute(
            """INSERT INTO triples (workspace_id, id, subject_id, predicate, object_id, valid_from, valid_to,
                                    confidence, source_drawer, source_episode, source_session, source_seq)
               VALUES (%(ws)s, %(id)s, %(s)s, %(p)s, %(o)s, %(vf)s, %(vt)s, %(c)s, %(d)s, %(e)s, %(sess)s, %(seq)s)
               ON CONFLICT DO NOTHING RETURNING id""",
            {**key, "id": tid, "vt": vt, "c": float(confidence), "d": source_drawer, "e": source_episode,
             "sess": source_session, "seq": source_seq},
        )
        created = await cur.fetchone() is not None
        if not created and vt is None:
            # The statement is current but was first recorded as starting later: it was said earlier. The
            # row that starts next after it moves back (the current one, or one that has ended since, when
            # an invalidation lies between: the current one must not swallow that gap).
            cur = await conn.execute(
                """UPDATE triples SET valid_from = %(vf)s, source_drawer = %(d)s, source_episode = %(e)s,
                                      source_session = %(sess)s, source_seq = %(seq)s
                    WHERE workspace_id = %(ws)s AND id = (
                          SELECT id FROM triples
                           WHERE workspace_id = %(ws)s AND subject_id = %(s)s AND predicate = %(p)s
                             AND object_id = %(o)s AND valid_from > %(vf)s
                           ORDER BY valid_from LIMIT 1)
                RETURNING id""",
                {**key, "d": source_drawer, "e": source_episode, "sess": source_session, "seq": source_seq},
            )
            moved = await cur.fetchone()
            if moved is not None:
                tid = str(moved[0])
            # else: this very row (same statement, same start) exists already and has ended.
    return _Written(tid, start, created, created_entities[s0], created_entities.get(o0, False))


class _Said(NamedTuple):
    """One extracted fact, its names validated, with where it was said (its sighting's drawer, session
    and turn)."""

    subject: str
    predicate: str
    obj: str
    confidence: float
    said_at: datetime | None
    drawer: str
    session: str | None
    seq: int | None


async def _write_extracted_triples(
    conn: AsyncConnection[Any], workspace_id: str, said: list[_Said], *, episode_id: str | None,
    known: Mapping[str, str],
) -> list[_Written]:
    """``_write_triple`` for the facts of an extraction, with the same outcome, in a fixed number of
    statements whatever their number: when each was said (for the sightings that do not say), the fact
    already true then, one insert of the new ones. Returns what happened to each, in order.

    Why deciding them together changes nothing: facts with different ends or predicates never meet (the
    lookup, the one current row per fact and the id are all by the three), and every fact an extraction
    opens is current, so a fact said twice in one insert meets its first saying's row in
    ``triples_one_current`` and conflicts. A conflicting fact goes the one-at-a-time way, in order,
    once the rows before it exist: it finds the first saying's row, or moves its start earlier."""
    if not said:
        return []
    every = range(len(said))
    ends = [(known[entity_id(workspace_id, x.subject)], x.predicate, known[entity_id(workspace_id, x.obj)])
            for x in said]
    out: dict[int, _Written] = {}
    need = [i for i in every if said[i].said_at is None or said[i].session is None or said[i].seq is None]
    where: dict[int, tuple[Any, str | None, int | None]] = {
        i: (said[i].said_at, said[i].session, said[i].seq) for i in every if i not in need}
    if need:
        cur = await conn.execute(_SAID_WHEN, {
            "ws": workspace_id, "drawer": [said[i].drawer for i in need], "sess": [said[i].session for i in need],
            "seq": [said[i].seq for i in need], "vf": [said[i].said_at for i in need]})
        for n, vf, sess, seq in await cur.fetchall():
            where[need[n - 1]] = (vf, sess, seq)
    # Already true at that time (said before, or replayed): the fact stands as it is.
    cur = await conn.execute(_TRUE_THEN, {
        "ws": workspace_id, "s": [e[0] for e in ends], "p": [e[1] for e in ends], "o": [e[2] for e in ends],
        "vf": [where[i][0] for i in every]})
    for n, tid, start in await cur.fetchall():
        out[n - 1] = _Written(str(tid), start, False, False, False)
    new = [i for i in every if i not in out]
    if new:
        ids = {i: triple_id(workspace_id, *ends[i], where[i][0]) for i in new}
        cur = await conn.execute(
            """INSERT INTO triples (workspace_id, id, subject_id, predicate, object_id, valid_from, confidence,
                                    source_drawer, source_episode, source_session, source_seq)
               SELECT %(ws)s, x.id, x.s, x.p, x.o, x.vf, x.c, x.d, %(e)s, x.sess, x.seq
                 FROM unnest(%(id)s::text[], %(s)s::text[], %(p)s::text[], %(o)s::text[],
                             %(vf)s::timestamptz[], %(c)s::real[], %(d)s::text[], %(sess)s::text[],
                             %(seq)s::integer[]) AS x(id, s, p, o, vf, c, d, sess, seq)
               ON CONFLICT DO NOTHING RETURNING id""",
            {"ws": workspace_id, "e": episode_id, "id": [ids[i] for i in new],
             "s": [ends[i][0] for i in new], "p": [ends[i][1] for i in new], "o": [ends[i][2] for i in new],
             "vf": [where[i][0] for i in new], "c": [said[i].confidence for i in new],
             "d": [said[i].drawer for i in new], "sess": [where[i][1] for i in new],
             "seq": [where[i][2] for i in new]})
        created = {str(r[0]) for r in await cur.fetchall()}
        for i in new:
            if ids[i] in created:  # the first saying of a fact said twice at one time claims its row
                created.discard(ids[i])
                out[i] = _Written(ids[i], where[i][0], True, False, False)
    for i, x in enumerate(said):
        if i not in out:
            out[i] = await _write_triple(
                conn, workspace_id, x.subject, x.predicate, x.obj, valid_from=x.said_at, valid_to=None,
                confidence=x.confidence, subject_type="unknown", object_type="unknown", source_drawer=x.drawer,
                source_episode=episode_id, source_session=x.session, source_seq=x.seq, known=known)
    return [out[i] for i in every]


async def invalidate_triple(
    conn: AsyncConnection[Any], workspace_id: str, subject: str, predicate: str, obj: str, *,
    ended: When = None, actor: str = "api",
) -> list[Fact]:
    """End the current ``subject --predicate--> obj`` fact at ``ended`` (default now): sets valid_to,
    keeps the row. Returns the facts ended (empty when none was current); audited in memory_history."""
    sid, oid = await _survivors(conn, workspace_id, entity_id(workspace_id, validate_name(subject, "subject")),
                                entity_id(workspace_id, validate_name(obj, "object")))
    pred = normalize_predicate(predicate)
    end = parse_when(ended, "ended")
    cur = await conn.execute(
        """SELECT id, valid_from, COALESCE(%s::timestamptz, now()) FROM triples
            WHERE workspace_id = %s AND subject_id = %s AND predicate = %s AND object_id = %s AND valid_to IS NULL
              FOR UPDATE""", (end, workspace_id, sid, pred, oid))
    rows = await cur.fetchall()
    out = []
    for tid, vf, end_at in rows:
        if vf is not None and end_at < vf:
            raise KgError(f"the fact began at {vf.isoformat()}, after the end given ({end_at.isoformat()})")
        await conn.execute(
            "UPDATE triples SET valid_to = %s, invalidated_at = now() WHERE workspace_id = %s AND id = %s",
            (end_at, workspace_id, tid))
        await record_history(conn, workspace_id, drawer_id=None, action="KG_INVALIDATE", actor=actor,
                             event_id=f"kg:{tid}", reason=f"{subject} {pred} {obj} ended",
                             new_value={"triple_id": tid, "valid_to": end_at.isoformat()})
        out.append(await _fact_by_id(conn, workspace_id, tid))
    return out


async def query_entity(
    conn: AsyncConnection[Any], workspace_id: str, name: str, *, as_of: When = None,
    direction: Direction | str = "both", limit: int = 200,
) -> list[Fact]:
    """The entity's relations (outgoing: it is the subject; incoming: the object), ordered by
    valid_from. With ``as_of``, only the facts that held then, ended ones included. Past ``limit``, the
    facts that hold now and then the latest are kept (``_newest_first``): the oldest ones went first."""
    d = parse_direction(direction)
    window = as_of_window(as_of)
    eid = await resolve_entity(conn, workspace_id, name)
    if eid is None:
        return []
    lo, hi = window if window else (None, None)
    cur = await conn.execute(
        _FACT_SELECT.format(direction="t.dir", source=_EDGES)
        + (" ORDER BY " if window else " ORDER BY (t.valid_to IS NULL OR t.valid_to > now()) DESC, ")
        + _NEWEST_FIRST + " LIMIT %(limit)s",
        {"ws": workspace_id, "e": eid, "lo": lo, "hi": hi, "out": d != "incoming", "in": d != "outgoing",
         "both": d == "both", "limit": max(1, min(int(limit), 1000))})
    return _chronological([_fact(r) for r in await cur.fetchall()])


async def entity_timeline(
    conn: AsyncConnection[Any], workspace_id: str, name: str | None = None, *, limit: int = 100
) -> list[Fact]:
    """Every fact about the entity (or the whole workspace when ``name`` is None), in the order they
    started; ended facts are included with their end. Past ``limit``, an entity's facts holding now and its
    latest (``query_entity``); the workspace's latest."""
    if name is not None:
        return await query_entity(conn, workspace_id, name, direction="both", limit=limit)
    cur = await conn.execute(
        _FACT_SELECT.format(direction="NULL::text", source="triples")
        + " WHERE t.workspace_id = %s ORDER BY " + _NEWEST_FIRST + " LIMIT %s",
        (workspace_id, max(1, min(int(limit), 1000))))
    return _chronological([_fact(r) for r in await cur.fetchall()])


async def kg_stats(conn: AsyncConnection[Any], workspace_id: str) -> KgStats:
    """Entity, fact and mention counts, and how often each relation is used."""
    cur = await conn.execute(
        """SELECT (SELECT count(*) FROM entities WHERE workspace_id = %(ws)s AND merged_into IS NULL),
                  (SELECT count(*) FROM entity_mentions WHERE workspace_id = %(ws)s),
                  count(*), count(*) FILTER (WHERE valid_to IS NULL OR valid_to > now())
             FROM triples WHERE workspace_id = %(ws)s""", {"ws": workspace_id})
    row = await cur.fetchone()
    assert row is not None
    entities, mentions, triples, current = (int(v) for v in row)
    cur = await conn.execute(
        "SELECT predicate, count(*) FROM triples WHERE workspace_id = %s GROUP BY predicate"
        " ORDER BY count(*) DESC, predicate", (workspace_id,))
    types = {str(p): int(n) for p, n in await cur.fetchall()}
    return KgStats(entities=entities, triples=triples, current_facts=current, expired_facts=triples - current,
                   mentions=mentions, relationship_types=types)


class ExtractionStored(NamedTuple):
    """What ``record_extraction`` wrote: the entities it touched (id → name), how many mentions
    and facts were new, and the facts it could not take (bad names or predicates), with why."""

    entities: dict[str, str]
    new_mentions: int
    new_facts: int
    skipped: list[str]


def _named_entities(
    workspace_id: str, extractions: list[tuple[list[Sighting], dict[str, str] | None]],
) -> tuple[dict[str, tuple[str, str]], list[str]]:
    """Entity id → (valid name, type) for every entity the extractions name, in their order, and the
    names refused (why). A type is the first known one: what an entity gets when the extractions are
    stored one after the other (inserted with the first, an 'unknown' one typed by a later)."""
    names: dict[str, tuple[str, str]] = {}
    for sightings, types in extractions:
        for sg in sightings:
            seen = [(n, t) for n, t, _ in sg.entities]
            seen += [(n, (types or {}).get(normalize_name(n), "unknown")) for s, _, o, _ in sg.triples for n in (s, o)]
            for name, etype in seen:
                eid = entity_id(workspace_id, name)
                if eid not in names or (names[eid][1] in ("unknown", "") and etype not in ("unknown", "")):
                    names[eid] = (names[eid][0] if eid in names else name, etype)
    skipped: list[str] = []
    valid: dict[str, tuple[str, str]] = {}
    for eid, (name, etype) in names.items():
        try:
            valid[eid] = (validate_name(name), etype)
        except KgError as e:
            skipped.append(f"entity {name[:80]!r}: {e}")
    return valid, skipped


async def ensure_extracted_entities(
    conn: AsyncConnection[Any], workspace_id: str, extractions: list[tuple[list[Sighting], dict[str, str] | None]],
) -> tuple[dict[str, tuple[str, str]], list[str]]:
    """Every entity the extractions (sightings, types of fact ends) name exists, in one statement in id
    order: new ones with their alias, 'unknown' ones typed where a type is known now. Returns
    ``_named_entities``'s (valid, skipped).

    An insert that meets a row another transaction inserted and has not committed waits for it, so two
    transactions that insert the same new entities must take them in one order: a batch of episodes
    inserts all of its entities here first (id order), and never waits on an entity insert again."""
    valid, skipped = _named_entities(workspace_id, extractions)
    if valid:
        ids = sorted(valid)
        types = [valid[i][1] or "unknown" for i in ids]
        cur = await conn.execute(
            """INSERT INTO entities (workspace_id, id, name, entity_type)
               SELECT %s, i, n, t FROM unnest(%s::text[], %s::text[], %s::text[]) AS e(i, n, t)
               ON CONFLICT (workspace_id, id) DO NOTHING RETURNING id""",
            (workspace_id, ids, [valid[i][0] for i in ids], types))
        await _add_aliases_of(conn, workspace_id, [(eid, valid[eid][0]) for (eid,) in await cur.fetchall()])
        # A plain UPDATE locks only the rows it changes (an upsert's DO UPDATE would lock every
        # existing one, and a speaker's entity is in every session of the workspace).
        await conn.execute(
            """UPDATE entities e SET entity_type = x.t, updated_at = now()
                 FROM unnest(%s::text[], %s::text[]) AS x(i, t)
                WHERE e.workspace_id = %s AND e.id = x.i AND e.entity_type = 'unknown' AND x.t <> 'unknown'""",
            (ids, types, workspace_id))
    return valid, skipped


async def record_extraction(
    conn: AsyncConnection[Any], workspace_id: str, sightings: list[Sighting], *, episode_id: str | None = None,
    types: dict[str, str] | None = None, entities_ensured: bool = False,
) -> ExtractionStored:
    """Store what an extractor read in a session's drawers: entities (created when new), a mention
    per drawer that writes one, facts valid from when they were said, and one evidence row per
    drawer that stated a fact. Idempotent: a replay adds no row, and the confidences (running
    averages over the mention and evidence rows) and the drawers' entity_count/triple_count are
    recomputed from rows, so they do not move either. ``types``: normalised name → type for the
    ends of facts that no drawer writes (a speaker behind "I" is a person).

    Entity rows are only inserted here: their counts and confidence are refreshed afterwards, in a
    transaction of their own (``refresh_entities``), so that sessions extracted side by side do not
    queue on the rows of the entities they share for the length of this one.
    """
    # ``entities_ensured``: this transaction already ran ensure_extracted_entities over these sightings
    # (a batch does, for all its episodes at once): only which names are valid is needed here.
    extraction = [(sightings, types)]
    valid, skipped = (_named_entities(workspace_id, extraction) if entities_ensured
                      else await ensure_extracted_entities(conn, workspace_id, extraction))

    # An entity merged by entity dedup answers for its survivor (a replayed extraction must not bring the
    # merged one's mentions back).
    survivor = await survivor_map(conn, workspace_id, sorted(valid))
    known = {eid: survivor.get(eid, eid) for eid in valid}  # every valid entity exists now (inserted above)
    mentioned = {entity_id(workspace_id, n) for sg in sightings for n, _, _ in sg.entities} & set(valid)
    best: dict[tuple[str, str], float] = {}
    for sg in sightings:
        for n, _, c in sg.entities:
            eid = entity_id(workspace_id, n)
            if eid in valid:
                key = (survivor.get(eid, eid), sg.drawer_id)
                best[key] = max(best.get(key, 0.0), float(c))
    mentions = sorted((e, d, c) for (e, d), c in best.items())
    new_mentions = 0
    if mentions:
        cur = await conn.execute(
            """INSERT INTO entity_mentions (workspace_id, entity_id, drawer_id, confidence)
               SELECT %s, e, d, c FROM unnest(%s::text[], %s::text[], %s::real[]) AS m(e, d, c)
               ON CONFLICT (workspace_id, entity_id, drawer_id) DO UPDATE SET confidence = EXCLUDED.confidence
                WHERE entity_mentions.confidence IS DISTINCT FROM EXCLUDED.confidence
               RETURNING (xmax = 0)""",
            (workspace_id, [m[0] for m in mentions], [m[1] for m in mentions], [m[2] for m in mentions]))
        new_mentions = sum(1 for r in await cur.fetchall() if r[0])

    facts: set[str] = set()
    said: list[_Said] = []
    for sg in sightings:
        for subj, pred, obj, conf in sg.triples:
            if entity_id(workspace_id, subj) not in valid or entity_id(workspace_id, obj) not in valid:
                continue
            try:
                if not isinstance(conf, int | float) or not math.isfinite(conf) or not 0 <= conf <= 1:
                    raise KgError("confidence must be a number between 0 and 1")
                said.append(_Said(validate_name(subj, "subject"), normalize_predicate(pred),
                                  validate_name(obj, "object"), float(conf), parse_when(sg.said_at, "valid_from"),
                                  sg.drawer_id, sg.session_id, sg.seq))
            except KgError as e:
                skipped.append(f"triple ({subj[:40]!r}, {pred[:40]!r}, {obj[:40]!r}): {e}")
    written = await _write_extracted_triples(conn, workspace_id, said, episode_id=episode_id, known=known)
    new_facts = sum(w.created for w in written)
    evidence: list[tuple[str, str, float, Any, str | None, int | None]] = []
    for x, w in zip(said, written, strict=True):
        facts.add(w.id)
        evidence.append((w.id, x.drawer, x.confidence, w.valid_from, x.session, x.seq))
    if evidence:
        await conn.execute(
            """INSERT INTO triple_evidence (workspace_id, triple_id, drawer_id, confidence, said_at, episode_id,
                                            session_id, seq)
               SELECT %s, t, d, c, w, %s, s, q
                 FROM unnest(%s::text[], %s::text[], %s::real[], %s::timestamptz[], %s::text[], %s::integer[])
                      AS x(t, d, c, w, s, q)
               ON CONFLICT DO NOTHING""",
            (workspace_id, episode_id, *(list(col) for col in zip(*evidence, strict=True))))
        await conn.execute(
            """UPDATE triples t SET confidence = e.c
                 FROM (SELECT triple_id, avg(confidence) AS c FROM triple_evidence
                        WHERE workspace_id = %(ws)s AND triple_id = ANY(%(ids)s) GROUP BY triple_id) e
                WHERE t.workspace_id = %(ws)s AND t.id = e.triple_id AND t.confidence IS DISTINCT FROM e.c""",
            {"ws": workspace_id, "ids": sorted(facts)})

    drawers = sorted({sg.drawer_id for sg in sightings})
    if drawers:
        await conn.execute(
            """UPDATE drawers d SET entity_count = c.ents, triple_count = c.facts
                 FROM (SELECT x.id,
                              (SELECT count(*) FROM entity_mentions m
                                WHERE m.workspace_id = %(ws)s AND m.drawer_id = x.id) AS ents,
                              (SELECT count(*) FROM (SELECT triple_id FROM triple_evidence v
                                                      WHERE v.workspace_id = %(ws)s AND v.drawer_id = x.id
                                                     UNION
                                                     SELECT id FROM triples t
                                                      WHERE t.workspace_id = %(ws)s AND t.source_drawer = x.id) f)
                                AS facts
                         FROM unnest(%(ids)s::text[]) AS x(id)) c
                WHERE d.workspace_id = %(ws)s AND d.id = c.id
                  AND (d.entity_count, d.triple_count) IS DISTINCT FROM (c.ents::integer, c.facts::integer)""",
            {"ws": workspace_id, "ids": drawers})
    used = mentioned | {entity_id(workspace_id, n) for sg in sightings for s, _, o, _ in sg.triples
                                        for n in (s, o) if entity_id(workspace_id, n) in valid}
    return ExtractionStored({e: valid[e][0] for e in sorted(used)}, new_mentions, new_facts, skipped)


async def refresh_entities(conn: AsyncConnection[Any], workspace_id: str, ids: list[str]) -> int:
    """Bring these entities' mention_count and confidence (the mean over the mentions that carry one) up
    to date: each entity's pending changes (``entity_mention_changes``, left by every write of its
    mentions, migration 0051) are consumed and added to its counters, so the cost follows what changed,
    not how often the entity was ever mentioned. Returns how many entities changed.

    The entities with pending changes are locked first, in id order and FOR NO KEY UPDATE (what the
    UPDATE takes anyway; FOR UPDATE would block every insert of a mention, the foreign key's FOR KEY
    SHARE): two refreshes side by side cannot deadlock, and the second statement's snapshot is taken
    with the rows held, so it sees every change a refresh before it left or consumed."""
    if not ids:
        return 0
    cur = await conn.execute(
        """SELECT e.id FROM entities e
            WHERE e.workspace_id = %(ws)s AND e.id = ANY(%(ids)s)
              AND EXISTS (SELECT 1 FROM entity_mention_changes c WHERE c.workspace_id = %(ws)s AND c.entity_id = e.id)
            ORDER BY e.id FOR NO KEY UPDATE OF e""",
        {"ws": workspace_id, "ids": sorted(set(ids))})
    locked = [str(r[0]) for r in await cur.fetchall()]
    if not locked:
        return 0
    cur = await conn.execute(
        """WITH d AS (DELETE FROM entity_mention_changes c WHERE c.workspace_id = %(ws)s AND c.entity_id = ANY(%(ids)s)
                      RETURNING c.entity_id, c.mentions, c.confidence_sum, c.confidence_n),
                a AS (SELECT entity_id, sum(mentions)::integer AS n, sum(confidence_sum) AS s,
                             sum(confidence_n)::integer AS k FROM d GROUP BY entity_id)
           UPDATE entities e SET mention_count = e.mention_count + a.n, confidence_sum = e.confidence_sum + a.s,
                                 confidence_n = e.confidence_n + a.k, updated_at = now(),
                                 confidence = CASE WHEN e.confidence_n + a.k > 0 THEN greatest(0, least(1,
                                     (e.confidence_sum + a.s) / (e.confidence_n + a.k)))::real END
             FROM a WHERE e.workspace_id = %(ws)s AND e.id = a.entity_id""",
        {"ws": workspace_id, "ids": locked})
    return cur.rowcount


async def pending_mention_entities(conn: AsyncConnection[Any], after: tuple[str, str],
                                   limit: int) -> list[tuple[str, str]]:
    """(workspace, entity) pairs with mention changes nobody consumed yet, after ``after`` in key order
    (the primary key's walk, under the maintenance role: every workspace)."""
    cur = await conn.execute(
        """SELECT DISTINCT workspace_id, entity_id FROM entity_mention_changes
            WHERE (workspace_id, entity_id) > (%s, %s) ORDER BY workspace_id, entity_id LIMIT %s""",
        (*after, limit))
    return [(str(w), str(e)) for w, e in await cur.fetchall()]


async def recount_entities(conn: AsyncConnection[Any], workspace_id: str, ids: list[str]) -> None:
    """Set these entities' counters from their mention rows, for the rare writes that rebuild an entity
    (a merge, its revert, a forget). The rows are locked first (id order); then, in one statement and so
    one snapshot, their pending changes are dropped and the mentions counted: each change is either
    counted here (its mention is visible) or left for ``refresh_entities`` (it is not), never both."""
    if not ids:
        return
    p = {"ws": workspace_id, "ids": sorted(set(ids))}
    await conn.execute("SELECT 1 FROM entities WHERE workspace_id = %(ws)s AND id = ANY(%(ids)s)"
                       " ORDER BY id FOR NO KEY UPDATE", p)
    await conn.execute(
        """WITH gone AS (DELETE FROM entity_mention_changes c
                          WHERE c.workspace_id = %(ws)s AND c.entity_id = ANY(%(ids)s)),
                m AS (SELECT x.id, count(em.entity_id)::integer AS n,
                             coalesce(sum(em.confidence::double precision), 0) AS s, count(em.confidence)::integer AS k
                        FROM unnest(%(ids)s::text[]) AS x(id)
                        LEFT JOIN entity_mentions em ON em.workspace_id = %(ws)s AND em.entity_id = x.id
                       GROUP BY x.id)
           UPDATE entities e SET mention_count = m.n, confidence_sum = m.s, confidence_n = m.k,
                                 confidence = CASE WHEN m.k > 0 THEN greatest(0, least(1, m.s / m.k))::real END,
                                 updated_at = now()
             FROM m WHERE e.workspace_id = %(ws)s AND e.id = m.id""", p)
