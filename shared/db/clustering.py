"""The cluster stage's reads and writes, one statement per event rather than several per drawer.

For every drawer of a ``drawer.classified`` event the stage needs two neighbour lists, both of live,
processed drawers of the workspace, each ranked among those filed before it and again among those filed
after it (marked *newer*): its *twins* (drawers
sharing a wording band, from the GIN index of migration 0017, nearest by embedding first) for the
near-duplicate merge, and its *neighbours* by embedding, whatever their wording, for the contradiction
check and as the similar memories a write decision (ADD/UPDATE/DELETE/NONE) is taken against (the
older ones only). Drawers filed later are candidates too because drawers are not always processed in
the order they were filed (a batch retried, a slow model, several replicas): a pair is found by
whichever of its two drawers is processed last, and the filing order, not the processing order, says
which one merges into which. The decision's candidates used to come from a full hybrid
search per drawer, whose full-text half matched an OR of word pairs across the workspace; the nearest
older memories by embedding are what the decision compares against (as in Mem0), and they are already
fetched here.

Both lists for every drawer of the event come back from one statement. A workspace without a ready
HNSW index of its own (migration 0019) is scanned exactly, and once per event (``CANDIDATES_SQL``): its
live processed drawers are read from the heap into one work table, and each drawer of the event ranks
that table. Ranking the heap once per drawer instead visited every page of the workspace ten times an
event (a ten-drawer session), and visiting a page cost more than the distance computed on its rows.
The neighbours are the same: the statement is exact either way. A workspace with a ready index gets
``INDEXED_CANDIDATES_SQL``, one walk per drawer, which the planner can serve from that partial index
because it runs unprepared, with the workspace as a value.

The cluster service ranks workspaces of up to ``shared.memory.neighbours.MAX_DRAWERS`` live drawers
itself instead, index or not: even once per event, the exact scan visited every heap page of the
workspace's live drawers and computed ten distances per drawer, and the twins fetched every band-sharing
drawer again, where the service's cached vectors and bands need only the rows changed since its last
read (``DELTA_SQL``, from an index), one matrix product, and the winners' contents. The statements above
remain for larger workspaces, one that does not fit the cache's budget, and callers without a cache.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from psycopg import AsyncConnection

from shared.db.drawers import as_array, insert_history
from shared.memory.neighbours import Change, VectorCache
from shared.metrics import NEIGHBOUR_CACHE_BYTES, NEIGHBOUR_CACHE_READS

__all__ = [
    "CANDIDATES_SQL",
    "CONTENTS_SQL",
    "DELTA_SQL",
    "FULL_SQL",
    "INDEXED_CANDIDATES_SQL",
    "LIVE_COUNT_SQL",
    "MERGE_SQL",
    "SAID_SQL",
    "SUPERSEDE_SQL",
    "TWINS_SQL",
    "Neighbours",
    "cluster_candidates",
    "merge_many",
    "record_history_many",
    "said_when",
    "supersede_many",
]

# The twins are fetched by primary key from an array of the wording candidates: joined to the function
# instead (whose row count the planner cannot know), the lateral subquery hashed every processed drawer
# of the workspace once per drawer of the event. Drawer i's wording bands are the i-th run of ``nb``
# values in one flat bigint[] (a ragged 2-D array cannot be bound; every drawer has as many bands).
_EVENT = """
WITH q AS MATERIALIZED (
    SELECT u.id, u.emb, u.i, me.filed_at,
           ARRAY(SELECT c.id FROM palace_wording_candidates(
                 %(ws)s, (%(bands)s::bigint[])[(u.i - 1) * %(nb)s + 1 : u.i * %(nb)s], 200) c) AS cands
      FROM unnest(%(ids)s::text[], %(embs)b::vector[]) WITH ORDINALITY AS u(id, emb, i)
      JOIN drawers me ON me.workspace_id = %(ws)s AND me.id = u.id
)
"""
# Each list is ranked twice, among the drawers filed before the event's drawer and among those filed after
# it (time, then id), ``n`` each: ranked together, drawers filed after it (a session's other turns, filed
# in the same instant) would take the places of the older ones a write decision is taken against.
_TWINS = """
SELECT q.i, true AS twin, t.id, t.sim, t.content, t.speaker, {newer}
  FROM q CROSS JOIN LATERAL (
       SELECT d.id, 1 - (d.embedding <=> q.emb) AS sim, d.content, d.speaker
         FROM drawers d
        WHERE d.workspace_id = %(ws)s AND d.id = ANY(q.cands) AND (d.filed_at, d.id) {op} (q.filed_at, q.id)
          AND CASE WHEN d.state = 'processed' AND d.deleted_at IS NULL AND d.embedding IS NOT NULL
                   THEN true END  -- by key only: docs/scale.md
        ORDER BY d.embedding <=> q.emb, d.id LIMIT %(n)s) t
"""
_BOTH_TWINS = _TWINS.format(newer="false", op="<") + "UNION ALL" + _TWINS.format(newer="true", op=">")
# The older neighbours through the workspace's HNSW index. The newer ones are few (drawers are processed
# about in the order they were filed), so they are read in filing order (drawers_state) and ranked
# exactly; at most ``_NEWER_SCAN`` of them, the first filed after the drawer (more only when an old drawer
# comes through cluster late: a backlog processed out of order, a failed drawer retried). Ties on distance
# go to the smaller id, as in the process's ranking (the walk's order is the index's own).
_NEWER_SCAN = 1000
_NEIGHBOURS = """
SELECT q.i, false, n.id, n.sim, n.content, n.speaker, false
  FROM q CROSS JOIN LATERAL (
       SELECT d.id, 1 - (d.embedding <=> q.emb) AS sim, d.content, d.speaker
         FROM drawers d
        WHERE d.workspace_id = %(ws)s AND d.id <> q.id AND d.state = 'processed' AND d.deleted_at IS NULL
          AND d.embedding IS NOT NULL AND (d.filed_at, d.id) < (q.filed_at, q.id)
        ORDER BY d.embedding <=> q.emb LIMIT %(n)s) n
UNION ALL
SELECT q.i, false, n.id, 1 - n.dist, d.content, d.speaker, true
  FROM q CROSS JOIN LATERAL (
       SELECT r.id, r.dist FROM (
              SELECT c.id, c.embedding <=> q.emb AS dist FROM drawers c
               WHERE c.workspace_id = %(ws)s AND c.state = 'processed' AND c.filed_at >= q.filed_at
                 AND (c.filed_at, c.id) > (q.filed_at, q.id) AND c.deleted_at IS NULL AND c.embedding IS NOT NULL
               ORDER BY c.filed_at LIMIT {cap}) r
        ORDER BY r.dist, r.id LIMIT %(n)s) n
  JOIN drawers d ON d.workspace_id = %(ws)s AND d.id = n.id
""".replace("{cap}", str(_NEWER_SCAN))
# The exact scan, once per event: the workspace's candidates are read once into a work table, which
# every drawer of the event then ranks; contents are fetched for the winners only.
_SCANNED = """
, w AS MATERIALIZED (
    SELECT d.id, d.filed_at, d.embedding FROM drawers d
     WHERE d.workspace_id = %(ws)s AND d.state = 'processed' AND d.deleted_at IS NULL AND d.embedding IS NOT NULL
)
"""
# Each (drawer, candidate) distance is computed once: written as the sort key and again inside the
# similarity, the planner evaluated the cosine twice per pair, and the cosine is most of a pair's cost.
# OFFSET 0 keeps the inner query from being flattened into the outer one, which would bring the
# second evaluation back. The filing order is compared first, so each side computes the distances of its
# own drawers only.
_SCANNED_NEIGHBOURS = """
SELECT q.i, false, n.id, 1 - n.dist, d.content, d.speaker, {newer}
  FROM q CROSS JOIN LATERAL (
       SELECT r.id, r.dist FROM (
              SELECT w.id, w.embedding <=> q.emb AS dist
                FROM w WHERE (w.filed_at, w.id) {op} (q.filed_at, q.id) OFFSET 0) r
        ORDER BY r.dist, r.id LIMIT %(n)s) n
  JOIN drawers d ON d.workspace_id = %(ws)s AND d.id = n.id
"""
_BOTH_SCANNED = (_SCANNED_NEIGHBOURS.format(newer="false", op="<") + "UNION ALL"
                 + _SCANNED_NEIGHBOURS.format(newer="true", op=">"))
# The vectors travel in binary (``%(embs)b``): an array of vectors goes as text otherwise, hundreds of
# decimal numbers per vector for the client to format and the server to parse.
# The twins alone (the plan test checks they never scan the workspace), and the whole statement: the
# exact one, and the one for a workspace with its own HNSW index.
TWINS_SQL = _EVENT + _BOTH_TWINS
CANDIDATES_SQL = _EVENT + _SCANNED + _BOTH_TWINS + "UNION ALL" + _BOTH_SCANNED
INDEXED_CANDIDATES_SQL = _EVENT + _BOTH_TWINS + "UNION ALL" + _NEIGHBOURS
# For ranking in the cluster process (``shared.memory.neighbours``). A drawer is a candidate while
# processed, not deleted and embedded; migration 0050 stamps ``rev`` with the id of the transaction that
# last changed one of those (or its vector, or its filing time). Each read returns its snapshot's bounds:
# the changes it could not see are exactly those of transactions not completed then, listed as running
# (``xip``) or with ids from ``xmax`` on, so the next read asks for those rows only. (The oldest running
# transaction alone would be a safe bound too, but a long transaction anywhere would then make every read
# take all the changes made since it began.) The LEFT JOIN returns the bounds with no rows. The active
# embedding space comes with them: `palace reembed` swaps the vectors of every row without stamping
# one, and a workspace held in another space is read whole again.
_ROWS = """
SELECT pg_snapshot_xmax(s.snap)::text, ARRAY(SELECT x::text FROM pg_snapshot_xip(s.snap) x),
       (SELECT e.id FROM embedding_spaces e WHERE e.state = 'active'), c.*
  FROM (SELECT pg_current_snapshot() AS snap) s LEFT JOIN LATERAL (
       SELECT d.id, (extract(epoch FROM d.filed_at) * 1000000)::bigint AS filed_us,
              CASE WHEN d.state = 'processed' AND d.deleted_at IS NULL AND d.embedding IS NOT NULL
                   THEN d.embedding END AS embedding, d.dedup_bands
         FROM drawers d WHERE d.workspace_id = %(ws)s AND """
FULL_SQL = _ROWS + "d.state = 'processed' AND d.deleted_at IS NULL AND d.embedding IS NOT NULL) c ON true"
DELTA_SQL = _ROWS + "(d.rev >= %(xmax)s::xid8 OR d.rev = ANY(%(xip)s::text[]::xid8[]))) c ON true"
# How many live drawers a workspace has, before reading them all into the cache.
LIVE_COUNT_SQL = """SELECT count(*) FROM drawers d WHERE d.workspace_id = %(ws)s AND d.state = 'processed'
                       AND d.deleted_at IS NULL AND d.embedding IS NOT NULL"""
# The winners' contents and speakers, for those still candidates (one deleted outright is not in any read above).
CONTENTS_SQL = """SELECT d.id, d.content, d.speaker FROM drawers d WHERE d.workspace_id = %(ws)s AND d.id = ANY(%(ids)s)
                     AND CASE WHEN d.state = 'processed' AND d.deleted_at IS NULL AND d.embedding IS NOT NULL
                              THEN true END  -- by key only: docs/scale.md"""
# The work table holds a row per drawer of the workspace (its vector is most of it): room for it in
# memory, for this transaction only, instead of a temporary file written and read back every event.
_SCAN_WORK_MEM = "64MB"
# How wide each neighbour walk searches. The pool's connections search at 200 for search's 100
# candidates; the walk here needs ``limit`` (5), and its cost grows with the width: pgvector's default.
_WALK_EF = 40


@dataclass
class Neighbours:
    """(drawer id, cosine, content), nearest first, who said each (``speakers``, by drawer id: a merge
    and a contradiction concern one speaker's words), and which of them were filed after the drawer
    (``newer``), read with them."""

    twins: list[tuple[str, float, str]] = field(default_factory=list)
    near: list[tuple[str, float, str]] = field(default_factory=list)
    speakers: dict[str, str | None] = field(default_factory=dict)
    newer: set[str] = field(default_factory=set)


async def cluster_candidates(
    conn: AsyncConnection[Any], workspace_id: str, drawers: list[tuple[str, np.ndarray, list[int]]], limit: int = 5,
    *, indexed: bool = False, cache: VectorCache | None = None,
) -> dict[str, Neighbours]:
    """Twins and neighbours of each (drawer id, embedding, wording bands): ranked here from what ``cache``
    holds when one is given and the workspace fits it (exact), else by the database in one statement:
    through the workspace's own HNSW index when ``indexed`` (it has a ready one), else from one exact scan
    of the workspace."""
    out = {did: Neighbours() for did, _, _ in drawers}
    if not drawers:
        return out
    nb = len(drawers[0][2])
    if any(len(b) != nb for _, _, b in drawers):
        raise ValueError("every drawer needs the same number of wording bands")
    if cache is not None:
        here = None if cache.declined(workspace_id) else await _ranked_here(conn, workspace_id, drawers, limit, cache)
        NEIGHBOUR_CACHE_BYTES.set(cache.nbytes)
        if here is None:
            NEIGHBOUR_CACHE_READS.labels("database").inc()
        else:
            return _collect(out, drawers, here)
    params = {"ws": workspace_id, "ids": [d for d, _, _ in drawers], "embs": [e for _, e, _ in drawers],
              "bands": [b for _, _, bands in drawers for b in bands], "nb": nb, "n": limit}
    # Both settings for this transaction only.
    if indexed:
        await conn.execute("SELECT set_config('hnsw.ef_search', %s, true)", (str(max(_WALK_EF, 8 * limit)),))
    else:
        await conn.execute("SELECT set_config('work_mem', %s, true)", (_SCAN_WORK_MEM,))
    cur = await conn.execute(INDEXED_CANDIDATES_SQL if indexed else CANDIDATES_SQL, params,
                             prepare=False)  # planned with the workspace as a value: its partial vector index can match
    return _collect(out, drawers, await cur.fetchall())


def _collect(out: dict[str, Neighbours], drawers: list[tuple[str, np.ndarray, list[int]]],
             rows: list[Any]) -> dict[str, Neighbours]:
    """(event drawer's ordinal, twin?, id, similarity, content, speaker, filed after it?) rows into each
    drawer's lists, nearest first."""
    ids = [d for d, _, _ in drawers]
    for i, twin, nid, sim, content, speaker, newer in sorted(rows, key=lambda r: (r[0], not r[1], -float(r[3]), r[2])):
        n = out[ids[i - 1]]
        (n.twins if twin else n.near).append((nid, float(sim), content))
        n.speakers[nid] = speaker
        if newer:
            n.newer.add(nid)
    return out


async def _ranked_here(conn: AsyncConnection[Any], workspace_id: str,
                       drawers: list[tuple[str, np.ndarray, list[int]]], limit: int,
                       cache: VectorCache) -> list[tuple[int, bool, str, float, str, str | None, bool]] | None:
    """Each drawer's twins and neighbours, as the candidate statements' rows (drawer's ordinal, twin?,
    id, cosine, content, speaker, filed after it?), ranked from what the cache holds once the workspace's
    entry has read what changed. None where the database should rank instead: the workspace does not fit the cache, a
    vector of other dimensions, or a drawer of the event no longer a candidate."""
    queries = [(d, as_array(e), bands) for d, e, bands in drawers]
    dims = len(queries[0][1])
    wv = cache.get(workspace_id, dims)
    async with wv.lock:  # reads of one workspace apply in the order of their snapshots
        NEIGHBOUR_CACHE_READS.labels("delta" if wv.watermark is not None else "full").inc()
        if wv.watermark is None:
            live = (await (await conn.execute(LIVE_COUNT_SQL, {"ws": workspace_id})).fetchone() or (0,))[0]
            if not cache.fits(live, dims):
                cache.decline(workspace_id)
                return None
            cur = await conn.execute(FULL_SQL, {"ws": workspace_id}, binary=True)
        else:
            xmax, xip = wv.watermark
            cur = await conn.execute(DELTA_SQL, {"ws": workspace_id, "xmax": str(xmax), "xip": [str(x) for x in xip]},
                                     binary=True)
        rows = await cur.fetchall()
        space = rows[0][2]
        if wv.watermark is not None and space != wv.space:  # re-embedded since: read it whole, next event
            cache.drop(workspace_id)
            return None
        changes = [Change(i, f, None if e is None else as_array(e), b) for *_, i, f, e, b in rows if i is not None]
        if any(c.vector is not None and len(c.vector) != dims for c in changes):
            cache.decline(workspace_id)
            return None
        wv.apply(changes, (int(rows[0][0]), tuple(int(x) for x in rows[0][1])), full=wv.watermark is None)
        wv.space = space
        for _ in range(3):  # again when a winner has been deleted outright since it was read
            ranked = wv.rank(queries, limit)
            if ranked is None:
                return None
            winners = sorted({i for r in ranked for i, _ in r.twins + r.near})
            contents = {i: (c, who) for i, c, who in await (await conn.execute(
                CONTENTS_SQL, {"ws": workspace_id, "ids": winners})).fetchall()}
            gone = [i for i in winners if i not in contents]
            if not gone:
                cache.trim()
                return [(q, twin, i, sim, *contents[i], i in r.newer) for q, r in enumerate(ranked, 1)
                        for twin, found in ((True, r.twins), (False, r.near)) for i, sim in found]
            wv.drop(gone)
    return None


async def record_history_many(conn: AsyncConnection[Any], workspace_id: str, rows: list[dict[str, Any]]) -> None:
    """Append audit rows (keys as ``shared.db.drawers.record_history``'s arguments) in one statement; each
    id derives from (event, drawer, action), so a replay adds nothing."""
    await insert_history(conn, workspace_id, rows)


# An event's merges, one statement: each drawer into its older twin, only while the drawer is processed and
# the twin a live, processed drawer, both as the statement begins. (So when a twin is itself merged by the
# same statement, the drawer still merges into it, as the decisions taken one by one did when the twin's
# came second; forgetting the twin's own twin makes the twin live again, so no drawer is left merged into a
# drawer that is gone.) The drawers and their twins are named by key; whether each is still a live,
# processed drawer is a CASE, never matched to an index of drawers by state or liveness: where ``state`` has
# no statistics yet, the plain test walked the workspace for the twins (docs/scale.md, "In-flight states").
MERGE_SQL = """UPDATE drawers d SET state = 'merged', cluster_id = m.target, updated_at = now()
      FROM unnest(%(ids)s::text[], %(targets)s::text[]) AS m(id, target)
     WHERE d.workspace_id = %(ws)s AND d.id = ANY(%(ids)s) AND d.id = m.id
       AND CASE WHEN d.state = 'processed' AND NOT d.pinned AND d.deleted_at IS NULL THEN true END  -- by key only
       AND EXISTS (SELECT 1 FROM drawers t WHERE t.workspace_id = %(ws)s AND t.id = m.target
                      AND CASE WHEN t.state = 'processed' AND t.deleted_at IS NULL THEN true END)
    RETURNING d.id"""
# An event's supersessions, one statement: each older drawer marked superseded by the newer one that
# contradicts it, unless it already is (or is no longer a live, processed drawer).
SUPERSEDE_SQL = """UPDATE drawers d SET superseded_by = s.new, updated_at = now()
      FROM unnest(%(olds)s::text[], %(news)s::text[]) AS s(old, new)
     WHERE d.workspace_id = %(ws)s AND d.id = ANY(%(olds)s) AND d.id = s.old
       AND CASE WHEN d.superseded_by IS NULL AND d.state = 'processed' AND d.deleted_at IS NULL
                THEN true END  -- by key only: docs/scale.md
    RETURNING d.id"""


async def merge_many(conn: AsyncConnection[Any], workspace_id: str, pairs: list[tuple[str, str]]) -> set[str]:
    """Merge each (drawer, older twin) pair in one statement (``MERGE_SQL``). Returns the drawers merged:
    one already merged or pinned (a memory someone chose to keep as it is), or whose twin is gone or merged
    already, is left as it is; a drawer named twice is merged into its first twin."""
    first: dict[str, str] = {}
    for drawer, twin in pairs:
        first.setdefault(drawer, twin)  # one twin per drawer: a drawer named twice keeps the first
    if not first:
        return set()
    cur = await conn.execute(MERGE_SQL, {"ws": workspace_id, "ids": list(first), "targets": list(first.values())})
    return {str(r[0]) for r in await cur.fetchall()}


async def supersede_many(conn: AsyncConnection[Any], workspace_id: str, pairs: list[tuple[str, str]]) -> set[str]:
    """Mark each (older, newer) pair's older drawer superseded by the newer one, in one statement
    (``SUPERSEDE_SQL``). An older drawer named twice keeps its first newer one, as one by one. Returns the
    older drawers marked."""
    first: dict[str, str] = {}
    for old, new in pairs:
        first.setdefault(old, new)
    if not first:
        return set()
    cur = await conn.execute(SUPERSEDE_SQL, {"ws": workspace_id, "olds": list(first), "news": list(first.values())})
    return {str(r[0]) for r in await cur.fetchall()}


# When each drawer was said, by primary key: (occurred_at, session_id, seq).
SAID_SQL = """SELECT id, occurred_at, session_id, seq FROM drawers WHERE workspace_id = %(ws)s AND id = ANY(%(ids)s)"""


async def said_when(conn: AsyncConnection[Any], workspace_id: str, ids: list[str]) -> dict[str, tuple[Any, Any, Any]]:
    """Per drawer, when it was said: (occurred_at, session_id, seq). The candidates' order is when each was
    *filed*, which in one session (filed together) falls to the content hash: what a contradiction
    supersedes is decided by this instead."""
    if not ids:
        return {}
    cur = await conn.execute(SAID_SQL, {"ws": workspace_id, "ids": ids})
    return {str(r[0]): (r[1], r[2], r[3]) for r in await cur.fetchall()}
