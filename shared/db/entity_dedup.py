"""Entity dedup in SQL: candidate lookup by index, evidence, merge, follow-up, revert, flags.

The decisions are ``shared.memory.entity_dedup``'s; this module gathers what they need and applies
them. Each merge runs in its own short transaction with both entity rows locked (in id order, so two
replicas merging the same pair never deadlock) and re-checks that both are still live, so a pair
decided twice (a replay, two replicas) merges once. Nothing here calls the network.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg import AsyncConnection
from psycopg.types.json import Jsonb

from shared.db.drawers import record_history
from shared.db.kg import recount_entities
from shared.ids import stable_id
from shared.memory.entity_dedup import (
    Candidate,
    Decision,
    canonical_name,
    dedup_keys,
    extends,
    name_words,
    worth_checking,
)
from shared.memory.kg import entity_id, match_key

__all__ = [
    "EntityRow",
    "FlagRow",
    "MergeError",
    "MergeRow",
    "absorb_followups",
    "candidates_of",
    "flag_pair",
    "index_entity_keys",
    "keep_apart",
    "kept_apart",
    "kept_apart_pairs",
    "key_entities_span",
    "list_flags",
    "list_merges",
    "live_entities",
    "merge_entities",
    "revert_merge",
]

CANDIDATE_CAP = 50  # more look-alikes than this for one name: the name is too common to decide on
CONTEXT_SAMPLE = 64  # mentioning drawers averaged into an entity's context embedding


@dataclass(frozen=True)
class EntityRow:
    id: str
    name: str
    entity_type: str
    mention_count: int
    merged_into: str | None


async def live_entities(conn: AsyncConnection[Any], workspace_id: str, ids: list[str]) -> list[EntityRow]:
    cur = await conn.execute(
        "SELECT id, name, entity_type, mention_count, merged_into FROM entities"
        " WHERE workspace_id = %s AND id = ANY(%s) ORDER BY id", (workspace_id, ids))
    return [EntityRow(str(i), str(n), str(t), int(c), m) for i, n, t, c, m in await cur.fetchall()]


async def index_entity_keys(conn: AsyncConnection[Any], workspace_id: str, rows: list[EntityRow]) -> None:
    """Record the dedup keys of these entities (idempotent: a name's keys never change)."""
    keys = sorted({(k, r.id) for r in rows for k in dedup_keys(r.name)})
    if keys:
        await conn.execute(
            """INSERT INTO entity_keys (workspace_id, key, entity_id)
               SELECT %s, k, e FROM unnest(%s::text[], %s::text[]) AS u(k, e) ON CONFLICT DO NOTHING""",
            (workspace_id, [k for k, _ in keys], [e for _, e in keys]))


async def key_entities_span(conn: AsyncConnection[Any], after: tuple[str, str], limit: int) -> tuple[str, str] | None:
    """Key the next ``limit`` entities after ``after`` in primary-key order, across workspaces
    (maintenance role): entities written before dedup existed get found as candidates too. Returns
    the last key of the span, or None at the end. Idempotent."""
    cur = await conn.execute(
        "SELECT workspace_id, id, name FROM entities WHERE (workspace_id, id) > (%s, %s)"
        " ORDER BY workspace_id, id LIMIT %s", (*after, limit))
    rows = await cur.fetchall()
    keys = sorted({(str(w), k, str(i)) for w, i, n in rows for k in dedup_keys(str(n))})
    if keys:
        await conn.execute(
            """INSERT INTO entity_keys (workspace_id, key, entity_id)
               SELECT * FROM unnest(%s::text[], %s::text[], %s::text[]) ON CONFLICT DO NOTHING""",
            ([w for w, _, _ in keys], [k for _, k, _ in keys], [i for _, _, i in keys]))
    return (str(rows[-1][0]), str(rows[-1][1])) if len(rows) == limit else None


def _probe_keys(name: str) -> tuple[list[str], list[str]]:
    """(exact keys, spelling-block keys) that find the entities a name may be the same as."""
    canon = canonical_name(name)
    words = name_words(name)
    exact = [f"n:{canon}"]
    exact += [f"n:{w}" for w in words if len(words) > 1]       # a longer name finds its short forms
    exact.append(f"w:{canon}" if len(words) == 1 else f"w:{words[0]}")  # a short name finds longer ones
    if len(words) > 1:
        exact.append(f"w:{words[-1]}")
    return sorted(set(exact)), [k for k in dedup_keys(name) if k.startswith("b:")]


async def candidates_of(
    conn: AsyncConnection[Any], workspace_id: str, entities: list[EntityRow]
) -> list[tuple[Candidate, Candidate]]:
    """(entity, candidate) pairs, each side with the evidence about the pair: the live entities the
    name indexes (entity_keys, entity_aliases) relate to each of ``entities``, whose names make a rule
    possible. Three index probes for the whole batch, then a few per plausible pair."""
    if not entities:
        return []
    probes: list[tuple[int, str]] = []
    for i, e in enumerate(entities):
        exact, block = _probe_keys(e.name)
        probes += [(i, k) for k in exact + block]
    cur = await conn.execute(
        """SELECT q.i, c.entity_id FROM unnest(%(i)s::int[], %(k)s::text[]) AS q(i, key)
           CROSS JOIN LATERAL (SELECT DISTINCT entity_id FROM entity_keys
                                WHERE workspace_id = %(ws)s AND key = q.key LIMIT %(cap)s) c""",
        {"ws": workspace_id, "i": [i for i, _ in probes], "k": [k for _, k in probes], "cap": CANDIDATE_CAP + 1})
    found: dict[int, set[str]] = {}
    for i, oid in await cur.fetchall():
        found.setdefault(int(i), set()).add(str(oid))
    # Known by another name: entities that carry e's name as an alias, and those whose names e carries.
    keys = {i: match_key(e.name) for i, e in enumerate(entities)}
    cur = await conn.execute("SELECT alias_key, entity_id FROM entity_aliases WHERE workspace_id = %s"
                             " AND alias_key = ANY(%s)", (workspace_id, sorted(set(keys.values()))))
    owners_of: dict[str, set[str]] = {}
    for k, oid in await cur.fetchall():
        owners_of.setdefault(str(k), set()).add(str(oid))
    cur = await conn.execute("SELECT entity_id, alias FROM entity_aliases WHERE workspace_id = %s"
                             " AND entity_id = ANY(%s)", (workspace_id, [e.id for e in entities]))
    carried: dict[str, set[str]] = {}
    for eid, alias in await cur.fetchall():
        carried.setdefault(str(eid), set()).add(entity_id(workspace_id, str(alias)))
    per: list[tuple[set[str], set[str], set[str]]] = []
    for i, e in enumerate(entities):
        carry_mine = owners_of.get(keys[i], set()) - {e.id}
        mine = carried.get(e.id, set()) - {e.id}
        per.append(((found.get(i, set()) | carry_mine | mine) - {e.id}, carry_mine, mine))
    all_ids = sorted(set().union(*(ids for ids, _, _ in per)))
    if not all_ids:
        return []
    cur = await conn.execute(
        "SELECT id, name, entity_type, mention_count FROM entities"
        " WHERE workspace_id = %s AND id = ANY(%s) AND merged_into IS NULL", (workspace_id, all_ids))
    live = {str(i): (str(i), str(n), str(t), int(c)) for i, n, t, c in await cur.fetchall()}
    # The plausible pairs first (names only), then the evidence about all of them in three statements:
    # shared relations, context similarity (only where no relation is shared) and how many longer names a
    # short candidate has. A statement per pair cost a round trip and a plan each, and recomputed the
    # same entity's context embedding for every pair it was in.
    pairs: list[tuple[EntityRow, tuple[str, str, str, int], bool, bool, int, int, list[str]]] = []
    for e, (ids, carry_mine, mine) in zip(entities, per, strict=True):
        others = [live[o] for o in sorted(ids) if o in live]
        if len(others) > CANDIDATE_CAP:
            others = [o for o in others if o[0] in carry_mine | mine
                      or canonical_name(o[1]) == canonical_name(e.name)]
        owners = len(carry_mine) + 1
        words = name_words(e.name)
        longer = sum(1 for o in others if extends(words, name_words(o[1])))
        for o in others:
            alias = o[0] in carry_mine or o[0] in mine
            if worth_checking(e.name, o[1], alias=alias):
                pairs.append((e, o, o[0] in mine, o[0] in carry_mine, owners if alias else 1, longer, words))
    if not pairs:
        return []
    shared = await _shared_relations(conn, workspace_id, [(e.id, o[0]) for e, o, *_ in pairs])
    ctx = await _context_similarity(conn, workspace_id,
                                    [(e.id, o[0]) for i, (e, o, *_) in enumerate(pairs) if not shared[i]])
    longer_of = await _count_longer(conn, workspace_id, sorted({
        name_words(o[1])[0] for _, o, *_, words in pairs if len(name_words(o[1])) == 1 and len(words) > 1}))
    out = []
    for i, (e, (oid, oname, otype, ocount), e_alias, o_alias, owners, longer, words) in enumerate(pairs):
        n_shared = shared[i]
        # Context only corroborates: not needed once a shared relation does.
        similarity = None if n_shared else ctx.get((e.id, oid))
        ow = name_words(oname)
        o_longer = longer_of.get(ow[0], 0) if len(ow) == 1 and len(words) > 1 else 0
        out.append((
            Candidate(e.id, e.name, e.entity_type, e.mention_count, n_shared, similarity, alias_of_other=e_alias,
                      alias_owners=owners, longer_names=longer),
            Candidate(oid, oname, otype, ocount, n_shared, similarity, alias_of_other=o_alias,
                      alias_owners=owners, longer_names=o_longer)))
    return out


async def _count_longer(conn: AsyncConnection[Any], workspace_id: str, words: list[str]) -> dict[str, int]:
    """For candidates with a one-word name: how many live entities' names extend it (several people
    called "Caroline ..." make "Caroline" ambiguous). One statement for every such word."""
    if not words:
        return {}
    cur = await conn.execute(
        """SELECT q.w, x.name FROM unnest(%(w)s::text[]) AS q(w)
           CROSS JOIN LATERAL (SELECT e.name FROM entity_keys k
                                 JOIN entities e ON e.workspace_id = k.workspace_id AND e.id = k.entity_id
                                WHERE k.workspace_id = %(ws)s AND k.key = 'w:' || q.w AND e.merged_into IS NULL
                                LIMIT %(cap)s) x""",
        {"ws": workspace_id, "w": words, "cap": CANDIDATE_CAP + 1})
    out = dict.fromkeys(words, 0)
    for w, n in await cur.fetchall():
        out[str(w)] += int(extends([str(w)], name_words(str(n))))
    return out


async def _shared_relations(conn: AsyncConnection[Any], workspace_id: str, pairs: list[tuple[str, str]]) -> list[int]:
    """Per pair: relations both have, the same predicate to the same counterpart in the same direction
    (the pair's relations to each other do not count). One statement: each entity's edges once (range
    scans of the triples indexes), then the pairs' common ones."""
    if not pairs:
        return []
    cur = await conn.execute(
        """WITH p AS (SELECT * FROM unnest(%(a)s::text[], %(b)s::text[]) WITH ORDINALITY AS p(a, b, i)),
                ents AS (SELECT a AS e FROM p UNION SELECT b FROM p),
                rel AS (SELECT t.subject_id AS e, t.predicate, t.object_id AS other, 'out' AS dir
                          FROM ents JOIN triples t ON t.workspace_id = %(ws)s AND t.subject_id = ents.e
                        UNION
                        SELECT t.object_id, t.predicate, t.subject_id, 'in'
                          FROM ents JOIN triples t ON t.workspace_id = %(ws)s AND t.object_id = ents.e)
           SELECT p.i, count(*) FROM p
             JOIN rel ra ON ra.e = p.a
             JOIN rel rb ON rb.e = p.b AND rb.predicate = ra.predicate AND rb.other = ra.other AND rb.dir = ra.dir
            WHERE ra.other NOT IN (p.a, p.b)
            GROUP BY p.i""",
        {"ws": workspace_id, "a": [a for a, _ in pairs], "b": [b for _, b in pairs]})
    out = [0] * len(pairs)
    for i, n in await cur.fetchall():
        out[int(i) - 1] = int(n)
    return out


async def _context_similarity(
    conn: AsyncConnection[Any], workspace_id: str, pairs: list[tuple[str, str]]
) -> dict[tuple[str, str], float]:
    """Per pair: cosine similarity of the two entities' context embeddings (the mean of the embeddings of
    a sample of the drawers mentioning each); a pair is absent when either has no embedded mention.
    One statement: each entity's context is computed once, however many pairs it is in."""
    if not pairs:
        return {}
    cur = await conn.execute(
        """WITH p AS (SELECT * FROM unnest(%(a)s::text[], %(b)s::text[]) AS p(a, b)),
                ents AS (SELECT a AS e FROM p UNION SELECT b FROM p),
                ctx AS (SELECT ents.e,
                               (SELECT avg(d.embedding)
                                  FROM (SELECT drawer_id FROM entity_mentions
                                         WHERE workspace_id = %(ws)s AND entity_id = ents.e
                                         ORDER BY drawer_id LIMIT %(n)s) m
                                  JOIN drawers d ON d.workspace_id = %(ws)s AND d.id = m.drawer_id
                                 WHERE d.embedding IS NOT NULL AND d.deleted_at IS NULL) AS v
                          FROM ents)
           SELECT p.a, p.b, 1 - (x.v <=> y.v) FROM p
             JOIN ctx x ON x.e = p.a JOIN ctx y ON y.e = p.b
            WHERE x.v IS NOT NULL AND y.v IS NOT NULL""",
        {"ws": workspace_id, "a": [a for a, _ in pairs], "b": [b for _, b in pairs], "n": CONTEXT_SAMPLE})
    return {(str(a), str(b)): float(v) for a, b, v in await cur.fetchall() if v is not None}


async def kept_apart_pairs(
    conn: AsyncConnection[Any], workspace_id: str, pairs: list[tuple[str, str]]
) -> set[tuple[str, str]]:
    """Which of these pairs (in either order) an operator, or a revert, kept apart; as sorted pairs."""
    keys = sorted({tuple(sorted(p)) for p in pairs})
    if not keys:
        return set()
    cur = await conn.execute(
        """SELECT f.entity_a, f.entity_b FROM unnest(%s::text[], %s::text[]) AS q(a, b)
             JOIN entity_flags f ON f.workspace_id = %s AND f.entity_a = q.a AND f.entity_b = q.b
            WHERE f.status = 'kept_apart'""",
        ([a for a, _ in keys], [b for _, b in keys], workspace_id))
    return {(str(a), str(b)) for a, b in await cur.fetchall()}


async def kept_apart(conn: AsyncConnection[Any], workspace_id: str, a: str, b: str) -> bool:
    lo, hi = sorted((a, b))
    cur = await conn.execute(
        "SELECT 1 FROM entity_flags WHERE workspace_id = %s AND entity_a = %s AND entity_b = %s"
        " AND status = 'kept_apart'", (workspace_id, lo, hi))
    return await cur.fetchone() is not None


async def flag_pair(conn: AsyncConnection[Any], workspace_id: str, a: str, b: str, d: Decision) -> None:
    """Record (or refresh) an ambiguous pair for an operator; a decided pair stays decided."""
    lo, hi = sorted((a, b))
    await conn.execute(
        """INSERT INTO entity_flags (workspace_id, entity_a, entity_b, rule, reason, score, evidence)
           VALUES (%s, %s, %s, %s, %s, %s, %s)
           ON CONFLICT (workspace_id, entity_a, entity_b) DO UPDATE
              SET rule = EXCLUDED.rule, reason = EXCLUDED.reason, score = EXCLUDED.score,
                  evidence = EXCLUDED.evidence, updated_at = now()
            WHERE entity_flags.status = 'open'
              AND (entity_flags.reason, entity_flags.evidence) IS DISTINCT FROM (EXCLUDED.reason, EXCLUDED.evidence)""",
        (workspace_id, lo, hi, d.rule, d.reason, d.score, Jsonb(d.evidence)))


# --- merge ---------------------------------------------------------------------------------------

async def _move(conn: AsyncConnection[Any], ws: str, loser: str, survivor: str) -> dict[str, Any]:
    """Move the loser's aliases, mentions and facts to the survivor; returns what was there before
    and what was added, for the audit and an exact revert."""
    p = {"ws": ws, "l": loser, "s": survivor}
    cur = await conn.execute("SELECT to_jsonb(a) FROM entity_aliases a WHERE workspace_id = %(ws)s"
                             " AND entity_id = %(l)s ORDER BY alias_key", p)
    aliases = [r[0] for r in await cur.fetchall()]
    cur = await conn.execute(
        """INSERT INTO entity_aliases (workspace_id, alias_key, anchor, entity_id, alias, cased)
           SELECT workspace_id, alias_key, anchor, %(s)s, alias, cased FROM entity_aliases
            WHERE workspace_id = %(ws)s AND entity_id = %(l)s
           ON CONFLICT DO NOTHING RETURNING alias_key""", p)
    aliases_added = sorted(str(r[0]) for r in await cur.fetchall())
    await conn.execute("DELETE FROM entity_aliases WHERE workspace_id = %(ws)s AND entity_id = %(l)s", p)

    cur = await conn.execute("SELECT drawer_id, confidence FROM entity_mentions WHERE workspace_id = %(ws)s"
                             " AND entity_id = %(l)s ORDER BY drawer_id", p)
    rows = await cur.fetchall()
    mentions = [str(r[0]) for r in rows]
    # What extraction judged of each mention, for the revert (the linker's mentions carry none).
    mention_confidence = {str(d): float(c) for d, c in rows if c is not None}
    cur = await conn.execute(
        """INSERT INTO entity_mentions (workspace_id, entity_id, drawer_id, confidence)
           SELECT workspace_id, %(s)s, drawer_id, confidence FROM entity_mentions
            WHERE workspace_id = %(ws)s AND entity_id = %(l)s
           ON CONFLICT DO NOTHING RETURNING drawer_id""", p)
    mentions_added = sorted(str(r[0]) for r in await cur.fetchall())
    await conn.execute("DELETE FROM entity_mentions WHERE workspace_id = %(ws)s AND entity_id = %(l)s", p)
    if mentions:
        await conn.execute(
            """UPDATE drawers d SET entity_count = (SELECT count(*) FROM entity_mentions m
                                                     WHERE m.workspace_id = d.workspace_id AND m.drawer_id = d.id)
                WHERE d.workspace_id = %s AND d.id = ANY(%s)""", (ws, mentions))

    cur = await conn.execute(
        """SELECT to_jsonb(t) FROM triples t WHERE workspace_id = %(ws)s AND subject_id = %(l)s
            UNION ALL
            SELECT to_jsonb(t) FROM triples t WHERE workspace_id = %(ws)s AND object_id = %(l)s AND subject_id <> %(l)s
            ORDER BY 1""", p)
    triples = [r[0] for r in await cur.fetchall()]
    absorbed: dict[str, str] = {}      # loser's fact id -> the survivor's fact it duplicated
    moved_back: dict[str, str | None] = {}  # survivor's fact id -> its valid_from before (said earlier by the loser)
    evidence: dict[str, list[Any]] = {}  # loser's absorbed fact id -> its evidence rows (the delete cascades)
    evidence_added: dict[str, list[str]] = {}  # survivor's fact id -> drawers whose evidence the merge gave it
    for t in triples:
        s = survivor if t["subject_id"] == loser else t["subject_id"]
        o = survivor if t["object_id"] == loser else t["object_id"]
        if t["valid_to"] is None:
            cur = await conn.execute(
                """SELECT id, valid_from FROM triples WHERE workspace_id = %s AND subject_id = %s AND predicate = %s
                     AND object_id = %s AND valid_to IS NULL AND id <> %s""", (ws, s, t["predicate"], o, t["id"]))
            dup = await cur.fetchone()
            if dup is not None:
                # Its sightings now count for the fact it duplicates (its confidence and the drawers'
                # triple_count are averaged and counted over evidence rows), and are kept for the revert.
                cur = await conn.execute("SELECT to_jsonb(v) FROM triple_evidence v WHERE workspace_id = %s"
                                         " AND triple_id = %s ORDER BY drawer_id", (ws, t["id"]))
                evidence[t["id"]] = [r[0] for r in await cur.fetchall()]
                cur = await conn.execute(
                    """INSERT INTO triple_evidence (workspace_id, triple_id, drawer_id, confidence, said_at, episode_id,
                                                    session_id, seq, created_at)
                       SELECT workspace_id, %s, drawer_id, confidence, said_at, episode_id, session_id, seq, created_at
                         FROM triple_evidence WHERE workspace_id = %s AND triple_id = %s
                       ON CONFLICT DO NOTHING RETURNING drawer_id""", (dup[0], ws, t["id"]))
                added = [str(r[0]) for r in await cur.fetchall()]
                if added:
                    evidence_added.setdefault(str(dup[0]), []).extend(added)
                    await _average_evidence(conn, ws, [str(dup[0])])
                await conn.execute("DELETE FROM triples WHERE workspace_id = %s AND id = %s", (ws, t["id"]))
                absorbed[t["id"]] = str(dup[0])
                cur = await conn.execute(
                    """UPDATE triples SET valid_from = %s::timestamptz WHERE workspace_id = %s AND id = %s
                         AND valid_from > %s::timestamptz RETURNING id""",
                    (t["valid_from"], ws, dup[0], t["valid_from"]))
                if await cur.fetchone() is not None and str(dup[0]) not in moved_back:
                    moved_back[str(dup[0])] = dup[1].isoformat() if isinstance(dup[1], datetime) else dup[1]
                continue
        await conn.execute("UPDATE triples SET subject_id = %s, object_id = %s WHERE workspace_id = %s AND id = %s",
                           (s, o, ws, t["id"]))
    return {"aliases": aliases, "aliases_added": aliases_added, "mentions": mentions,
            "mention_confidence": mention_confidence, "mentions_added": mentions_added, "triples": triples,
            "absorbed": absorbed, "moved_back": moved_back, "evidence": evidence, "evidence_added": evidence_added}


async def _average_evidence(conn: AsyncConnection[Any], ws: str, triple_ids: list[str]) -> None:
    """A fact's confidence: the mean over its evidence rows (as ``shared.db.kg.record_extraction`` keeps it)."""
    await conn.execute(
        """UPDATE triples t SET confidence = e.c
             FROM (SELECT triple_id, avg(confidence) AS c FROM triple_evidence
                    WHERE workspace_id = %(ws)s AND triple_id = ANY(%(ids)s) GROUP BY triple_id) e
            WHERE t.workspace_id = %(ws)s AND t.id = e.triple_id AND t.confidence IS DISTINCT FROM e.c""",
        {"ws": ws, "ids": triple_ids})


async def _lock_pair(conn: AsyncConnection[Any], ws: str, a: str, b: str) -> dict[str, dict[str, Any]]:
    # NO KEY UPDATE: a merge, a revert or keeping a pair apart changes no key and deletes no entity, and the
    # stronger lock also made every insert of a mention of either (its foreign key's KEY SHARE) wait, which
    # deadlocked with an extraction updating the drawers a merge recounts. A mention inserted meanwhile on
    # the entity merged away is a follow-up (``absorb_followups``), as one inserted just after would be.
    cur = await conn.execute(
        "SELECT id, to_jsonb(e) - 'embedding' FROM entities e WHERE workspace_id = %s AND id = ANY(%s)"
        " ORDER BY id FOR NO KEY UPDATE", (ws, sorted({a, b})))
    return {str(i): j for i, j in await cur.fetchall()}


async def merge_entities(
    conn: AsyncConnection[Any], workspace_id: str, d: Decision, *, actor: str, event_id: str | None,
    unless_kept_apart: bool = False,
) -> str | None:
    """Merge ``d.loser`` into ``d.survivor`` (audited, reversible); the merge id, or None when either
    is gone or already merged (a replica or an earlier delivery did it), or, with ``unless_kept_apart``
    (dedup's own merges, decided before this transaction), when an operator or a revert has kept the pair
    apart since: asked under the pair's row locks, which ``keep_apart`` takes too."""
    assert d.survivor and d.loser and d.survivor != d.loser
    rows = await _lock_pair(conn, workspace_id, d.survivor, d.loser)
    if len(rows) != 2 or any(r["merged_into"] is not None for r in rows.values()):
        return None
    if unless_kept_apart and await kept_apart(conn, workspace_id, d.survivor, d.loser):
        return None
    loser_row, surv_row = rows[d.loser], rows[d.survivor]
    cur = await conn.execute("SELECT embedding::text FROM entities WHERE workspace_id = %s AND id = %s",
                             (workspace_id, d.loser))
    emb = await cur.fetchone()
    loser_row = {**loser_row, "embedding": emb[0] if emb else None}
    moved = await _move(conn, workspace_id, d.loser, d.survivor)
    surv_type = surv_row["entity_type"]
    new_type = surv_type
    if surv_type in ("unknown", "concept") and loser_row["entity_type"] not in ("unknown", "concept"):
        new_type = loser_row["entity_type"]
    await conn.execute(
        "UPDATE entities SET merged_into = %s, updated_at = now() WHERE workspace_id = %s AND id = %s",
        (d.survivor, workspace_id, d.loser))
    await conn.execute("UPDATE entities SET entity_type = %s, updated_at = now() WHERE workspace_id = %s AND id = %s",
                       (new_type, workspace_id, d.survivor))
    await recount_entities(conn, workspace_id, [d.loser, d.survivor])
    cur = await conn.execute("SELECT count(*) FROM entity_merges WHERE workspace_id = %s AND merged_id = %s",
                             (workspace_id, d.loser))
    earlier = await cur.fetchone()
    merge_id = stable_id("entity-merge", workspace_id, d.survivor, d.loser, str(earlier[0] if earlier else 0))
    snapshot = {"loser": loser_row, "survivor": {"entity_type": surv_type,
                                                 "mention_count": surv_row["mention_count"]}, **moved}
    await conn.execute(
        """INSERT INTO entity_merges (workspace_id, id, survivor_id, merged_id, rule, reason, evidence, snapshot,
                                      actor, event_id) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)""",
        (workspace_id, merge_id, d.survivor, d.loser, d.rule, d.reason, Jsonb(d.evidence), Jsonb(snapshot),
         actor, event_id))
    lo, hi = sorted((d.survivor, d.loser))
    await conn.execute("UPDATE entity_flags SET status = 'merged', resolved_by = %s, updated_at = now()"
                       " WHERE workspace_id = %s AND entity_a = %s AND entity_b = %s AND status = 'open'",
                       (actor, workspace_id, lo, hi))
    await record_history(conn, workspace_id, drawer_id=None, action="ENTITY_MERGE", actor=actor,
                         event_id=f"entity-merge:{merge_id}", reason=d.reason,
                         old_value={"entity": d.loser, "name": loser_row["name"]},
                         new_value={"merge_id": merge_id, "survivor": d.survivor, "name": surv_row["name"],
                                    "rule": d.rule, "mentions_moved": len(moved["mentions"]),
                                    "facts_moved": len(moved["triples"])})
    return merge_id


async def absorb_followups(conn: AsyncConnection[Any], workspace_id: str, ids: list[str]) -> int:
    """Entities of an event that were merged away but gained mentions, aliases or facts since (a
    replay, an extractor naming them again): move those to the survivor, recorded in the same merge
    so its revert still restores everything. A survivor that was itself merged away since (A into B,
    then B into C) passes them on along its own merge, one recorded hop at a time, so each merge's
    revert stays exact. Returns how many entities had something to move."""
    total = 0
    for _ in range(32):  # a chain of merges is short; the bound only guards against a cycle
        moved_to = await _absorb_once(conn, workspace_id, ids)
        total += len(moved_to)
        ids = sorted(set(moved_to))
        if not ids:
            break
    return total


async def _absorb_once(conn: AsyncConnection[Any], workspace_id: str, ids: list[str]) -> list[str]:
    """One hop of ``absorb_followups``; returns the survivors something moved to."""
    cur = await conn.execute(
        """SELECT m.id, m.merged_id, m.survivor_id FROM entity_merges m
            WHERE m.workspace_id = %s AND m.merged_id = ANY(%s) AND m.status = 'merged'
              AND (EXISTS (SELECT 1 FROM entity_mentions x WHERE x.workspace_id = m.workspace_id
                              AND x.entity_id = m.merged_id)
                   OR EXISTS (SELECT 1 FROM entity_aliases a WHERE a.workspace_id = m.workspace_id
                                 AND a.entity_id = m.merged_id)
                   OR EXISTS (SELECT 1 FROM triples t WHERE t.workspace_id = m.workspace_id
                                 AND t.subject_id = m.merged_id)
                   OR EXISTS (SELECT 1 FROM triples t WHERE t.workspace_id = m.workspace_id
                                 AND t.object_id = m.merged_id))
            ORDER BY m.merged_id""", (workspace_id, ids))
    todo = await cur.fetchall()
    moved_to: list[str] = []
    for mid, loser, survivor in todo:
        rows = await _lock_pair(conn, workspace_id, survivor, loser)
        if len(rows) != 2 or rows[loser]["merged_into"] != survivor:
            continue
        cur = await conn.execute("SELECT snapshot FROM entity_merges WHERE workspace_id = %s AND id = %s FOR UPDATE",
                                 (workspace_id, mid))
        snap_row = await cur.fetchone()
        assert snap_row is not None
        snap = snap_row[0]
        moved = await _move(conn, workspace_id, loser, survivor)
        for k in ("aliases", "aliases_added", "mentions", "mentions_added", "triples"):
            snap[k] = snap.get(k, []) + moved[k]
        for k in ("absorbed", "moved_back", "mention_confidence", "evidence"):
            snap[k] = {**moved[k], **snap.get(k, {})}
        for k, v in moved["evidence_added"].items():
            snap.setdefault("evidence_added", {}).setdefault(k, []).extend(v)
        await conn.execute("UPDATE entity_merges SET snapshot = %s WHERE workspace_id = %s AND id = %s",
                           (Jsonb(snap), workspace_id, mid))
        await recount_entities(conn, workspace_id, [loser, survivor])
        moved_to.append(str(survivor))
    return moved_to


class MergeError(ValueError):
    """A revert or merge an operator asked for that cannot be done (with why)."""


async def revert_merge(conn: AsyncConnection[Any], workspace_id: str, merge_id: str, *, actor: str) -> MergeRow:
    """Undo a merge exactly: the merged entity's row, aliases, mentions and facts come back as they
    were, the survivor loses what the merge gave it, and the pair is kept apart from then on."""
    cur = await conn.execute(
        "SELECT survivor_id, merged_id, status, snapshot FROM entity_merges WHERE workspace_id = %s AND id = %s"
        " FOR UPDATE", (workspace_id, merge_id))
    row = await cur.fetchone()
    if row is None:
        raise MergeError(f"no merge {merge_id!r} in this workspace")
    survivor, loser, status, snap = row
    if status != "merged":
        raise MergeError(f"merge {merge_id} was already reverted")
    rows = await _lock_pair(conn, workspace_id, survivor, loser)
    later = (rows.get(survivor) or {}).get("merged_into")
    if later is not None:
        # What this merge gave the survivor went on with it: reverting here would leave it there, and the
        # next entity.upserted would merge the entity again through the alias it left behind.
        cur = await conn.execute("SELECT id FROM entity_merges WHERE workspace_id = %s AND merged_id = %s"
                                 " AND status = 'merged' ORDER BY created_at DESC LIMIT 1", (workspace_id, survivor))
        nxt = await cur.fetchone()
        raise MergeError(f"{survivor} was merged into {later} since" + (f" (merge {nxt[0]})" if nxt else "")
                         + ": revert that merge first")
    p = {"ws": workspace_id, "l": loser, "s": survivor}
    # Facts: ids rewritten back, duplicates that were folded into the survivor's fact re-inserted
    # exactly, and the survivor's facts whose start moved back get their own start again.
    for t in snap["triples"]:
        if t["id"] in snap["absorbed"]:
            # Unless forget took its source drawer meanwhile.
            await conn.execute(
                """INSERT INTO triples SELECT r.* FROM jsonb_populate_record(NULL::triples, %s) r
                    WHERE r.source_drawer IS NULL OR EXISTS (SELECT 1 FROM drawers d
                                                              WHERE d.workspace_id = r.workspace_id
                                                                AND d.id = r.source_drawer)
                   ON CONFLICT DO NOTHING""", (Jsonb(t),))
        else:
            await conn.execute("UPDATE triples SET subject_id = %s, object_id = %s WHERE workspace_id = %s AND id = %s",
                               (t["subject_id"], t["object_id"], workspace_id, t["id"]))
    for tid, vf in snap["moved_back"].items():
        await conn.execute("UPDATE triples SET valid_from = %s::timestamptz WHERE workspace_id = %s AND id = %s",
                           (vf, workspace_id, tid))
    # The absorbed facts' sightings go back to them (those of drawers forget took meanwhile stay gone), and
    # the facts they were folded into lose what the merge gave them.
    for tid, drawers_ in snap.get("evidence_added", {}).items():
        await conn.execute("DELETE FROM triple_evidence WHERE workspace_id = %s AND triple_id = %s"
                           " AND drawer_id = ANY(%s)", (workspace_id, tid, drawers_))
    for rows_ in snap.get("evidence", {}).values():
        for v in rows_:
            await conn.execute(
                """INSERT INTO triple_evidence SELECT r.* FROM jsonb_populate_record(NULL::triple_evidence, %s) r
                    WHERE EXISTS (SELECT 1 FROM triples t WHERE t.workspace_id = r.workspace_id AND t.id = r.triple_id)
                      AND EXISTS (SELECT 1 FROM drawers d WHERE d.workspace_id = r.workspace_id AND d.id = r.drawer_id)
                   ON CONFLICT DO NOTHING""", (Jsonb(v),))
    touched = sorted(set(snap.get("evidence_added", {})) | set(snap.get("evidence", {})))
    if touched:
        await _average_evidence(conn, workspace_id, touched)
    await conn.execute("DELETE FROM entity_mentions WHERE workspace_id = %s AND entity_id = %s AND drawer_id = ANY(%s)",
                       (workspace_id, survivor, snap["mentions_added"]))
    conf = snap.get("mention_confidence", {})
    await conn.execute(  # the drawers forget took meanwhile stay forgotten; each with the confidence it had
        """INSERT INTO entity_mentions (workspace_id, entity_id, drawer_id, confidence)
           SELECT %(ws)s, %(l)s, d.id, (%(c)s::jsonb ->> d.id)::real FROM drawers d
            WHERE d.workspace_id = %(ws)s AND d.id = ANY(%(m)s)
           ON CONFLICT DO NOTHING""", {**p, "m": snap["mentions"], "c": Jsonb(conf)})
    await conn.execute("DELETE FROM entity_aliases WHERE workspace_id = %s AND entity_id = %s AND alias_key = ANY(%s)",
                       (workspace_id, survivor, snap["aliases_added"]))
    for a in snap["aliases"]:
        await conn.execute("INSERT INTO entity_aliases SELECT * FROM jsonb_populate_record(NULL::entity_aliases, %s)"
                           " ON CONFLICT DO NOTHING", (Jsonb(a),))
    drawers = sorted(set(snap["mentions"]))
    if drawers:
        await conn.execute(
            """UPDATE drawers d SET entity_count = (SELECT count(*) FROM entity_mentions m
                                                     WHERE m.workspace_id = d.workspace_id AND m.drawer_id = d.id)
                WHERE d.workspace_id = %s AND d.id = ANY(%s)""", (workspace_id, drawers))
    lr = snap["loser"]
    await conn.execute(
        """UPDATE entities e SET name = r.name, entity_type = r.entity_type, properties = r.properties,
                  mention_count = r.mention_count, embedding = r.embedding, created_at = r.created_at,
                  updated_at = r.updated_at, merged_into = NULL
             FROM jsonb_populate_record(NULL::entities, %(row)s) r
            WHERE e.workspace_id = %(ws)s AND e.id = %(l)s""", {**p, "row": Jsonb(lr)})
    await conn.execute("UPDATE entities SET entity_type = %(t)s, updated_at = now() WHERE workspace_id = %(ws)s"
                       " AND id = %(s)s", {**p, "t": snap["survivor"]["entity_type"]})
    await recount_entities(conn, workspace_id, [loser, survivor])
    await conn.execute(
        "UPDATE entity_merges SET status = 'reverted', reverted_at = now(), reverted_by = %s"
        " WHERE workspace_id = %s AND id = %s", (actor, workspace_id, merge_id))
    await keep_apart(conn, workspace_id, survivor, loser, actor=actor, reason=f"merge {merge_id} reverted")
    await record_history(conn, workspace_id, drawer_id=None, action="ENTITY_MERGE_REVERT", actor=actor,
                         event_id=f"entity-merge-revert:{merge_id}", reason="merge reverted",
                         old_value={"merge_id": merge_id, "survivor": survivor},
                         new_value={"entity": loser, "name": lr["name"]})
    merges = await list_merges(conn, workspace_id, merge_id=merge_id)
    return merges[0]


async def keep_apart(conn: AsyncConnection[Any], workspace_id: str, a: str, b: str, *, actor: str,
                     reason: str) -> None:
    """Record that ``a`` and ``b`` are different entities: dedup never merges them again (a merge of theirs
    decided before waits for this, then finds them kept apart)."""
    lo, hi = sorted((a, b))
    await _lock_pair(conn, workspace_id, lo, hi)
    await conn.execute(
        """INSERT INTO entity_flags (workspace_id, entity_a, entity_b, status, rule, reason, resolved_by)
           VALUES (%s, %s, %s, 'kept_apart', 'operator', %s, %s)
           ON CONFLICT (workspace_id, entity_a, entity_b) DO UPDATE
              SET status = 'kept_apart', reason = EXCLUDED.reason, resolved_by = EXCLUDED.resolved_by,
                  updated_at = now()""", (workspace_id, lo, hi, reason, actor))


# --- listings (operator CLI) ------------------------------------------------------------------------


@dataclass(frozen=True)
class MergeRow:
    id: str
    survivor_id: str
    survivor: str
    merged_id: str
    merged: str
    rule: str
    reason: str
    status: str
    created_at: datetime


@dataclass(frozen=True)
class FlagRow:
    entity_a: str
    name_a: str
    entity_b: str
    name_b: str
    status: str
    rule: str
    reason: str
    score: float
    updated_at: datetime


async def list_merges(conn: AsyncConnection[Any], workspace_id: str, *, merge_id: str | None = None,
                      limit: int = 100) -> list[MergeRow]:
    cur = await conn.execute(
        """SELECT m.id, m.survivor_id, s.name, m.merged_id, l.name, m.rule, m.reason, m.status, m.created_at
             FROM entity_merges m
             JOIN entities s ON s.workspace_id = m.workspace_id AND s.id = m.survivor_id
             JOIN entities l ON l.workspace_id = m.workspace_id AND l.id = m.merged_id
            WHERE m.workspace_id = %s AND (%s::text IS NULL OR m.id = %s)
            ORDER BY m.created_at DESC, m.id LIMIT %s""", (workspace_id, merge_id, merge_id, limit))
    return [MergeRow(*r) for r in await cur.fetchall()]


async def list_flags(conn: AsyncConnection[Any], workspace_id: str, *, status: str = "open",
                     limit: int = 100) -> list[FlagRow]:
    cur = await conn.execute(
        """SELECT f.entity_a, a.name, f.entity_b, b.name, f.status, f.rule, f.reason, f.score, f.updated_at
             FROM entity_flags f
             JOIN entities a ON a.workspace_id = f.workspace_id AND a.id = f.entity_a
             JOIN entities b ON b.workspace_id = f.workspace_id AND b.id = f.entity_b
            WHERE f.workspace_id = %s AND f.status = %s ORDER BY f.created_at DESC LIMIT %s""",
        (workspace_id, status, limit))
    return [FlagRow(*r) for r in await cur.fetchall()]
