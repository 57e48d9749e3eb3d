"""Hybrid recall: one statement (or two at once) finds the candidates and their features; numpy fuses them.

1. Candidates: the nearest drawers by embedding ∪ the best full-text matches ∪ up to
   ``date_candidates`` drawers inside a time window the query names (shared/memory/timeexpr.py), nearest
   first, when the window holds at most ``fts_scan_max`` drawers (``_DATED``) ∪
   the drawers the knowledge graph reaches from the entities the query names (shared/db/graph_recall.py,
   a short deadline-bounded statement before this one).
   Full text matches an OR of the query's lexemes, since ``plainto_tsquery``'s AND misses most
   paraphrases, and keeps the matches holding most of them (migration 0006: ``ts_rank_cd`` chose no
   better and cost more a row). A workspace searched exactly (at most ``exact_max`` drawers and no index
   of its own) finds its full-text matches in the same pass over its rows that finds its nearest
   neighbours (``_SCAN``), and ranks every match. Otherwise the matches come through a
   security-definer function, so the GIN index serves them under row-level security, and that index
   holds each word under its workspace (migration 0047: a word's posting list is the workspace's, not
   the table's); at most ``text_rank_max`` matching rows are ranked, which
   bounds the tail, and the rows past that bound are whichever the scan met last, not the worst. So
   once a workspace holds more than ``fts_scan_max`` drawers the function asks for the query's
   lexemes that are rare there (the workspace lexicon that maintain keeps, migration 0037), or, when
   the query holds none, for two of its ``pair_terms`` rarest lexemes together (migration 0046): a plain
   OR of common words would match most of the workspace, and the one drawer holding the query's rare
   word could be cut. Nearest
   neighbours come from the workspace's own HNSW index once it has one
   (``shared/db/vector_indexes.py``, migration 0019: pgvector 0.6 filters a shared index only after
   its walk, so a tenant in a big table would get a handful of its own neighbours), else from an
   exact scan of the workspace (``+ 0`` keeps the planner off any index). The statement runs
   unprepared, so it is planned with the workspace as a value and the partial index's predicate
   matches. The exact scan is cheap only because embeddings stay inline in the heap (migration 0004):
   TOASTed, each distance paid a TOAST fetch and 679 of them took 3.8 ms, 0.8 inline.
2. Features: per candidate its cosine, its ``tsv`` (content and speaker lexemes), session position,
   importance, age, whether it lies in a window, and the columns a hit shows, all in the same round
   trip; shared/memory/ranking.py scores them (~1 ms for ~200 candidates, where the same arithmetic
   as SQL CTEs cost ~12 ms).

3. Given a second idle connection (``hybrid_search``'s ``text_conn``), a search past exact search finds
   its full-text candidates there (``text_statement``) while the first connection finds the rest: the
   same statements, run at the same time instead of one after the other.

Everything is scoped to one workspace; merged or deleted drawers never return.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import time
import weakref
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import numpy as np
import psycopg
from psycopg import AsyncConnection

from shared.config import Settings
from shared.db.drawers import workspace_size as live_drawers  # the name of an argument below
from shared.db.graph_recall import EXECUTE as GRAPH_EXECUTE
from shared.db.graph_recall import PREPARED_NAME, graph_params, graph_rows, prepare_statement
from shared.logging import get_logger
from shared.memory.citations import cite
from shared.memory.graph_signal import GraphParams, graph_strengths, query_names
from shared.memory.ranking import Candidate, Explanation, Ranked, RankParams, rank, term_keys, terms_of
from shared.memory.timeexpr import date_windows
from shared.metrics import SEARCH_SECONDS

__all__ = ["SearchHit", "SearchParams", "candidates", "hybrid_search", "one_pass"]

log = get_logger("palace.recall")


@dataclass(frozen=True)
class SearchParams:
    k: int = 10
    ann_candidates: int = 100
    fts_candidates: int = 100
    date_candidates: int = 50
    exact_max: int = 5_000
    fts_scan_max: int = 2_000
    # The full-text function ranks at most this many of its matches (the first the GIN scan meets): its
    # cost grows with them, and a search's slowest questions are those matching thousands. 1,000 left
    # the 100k bench workspace's answers as they were at 2,000 (docs/benchmarks.md).
    text_rank_max: int = 1_000
    max_terms: int = 16
    pair_terms: int = 4
    rank: RankParams = field(default_factory=RankParams)
    graph: GraphParams = field(default_factory=GraphParams)

    @classmethod
    def from_settings(cls, settings: Settings) -> SearchParams:
        """The defaults, with the embedding model's cosine band, the graph signal's deadline and the size
        searched exactly (the one past which a workspace gets its own vector index) from the settings."""
        return cls(rank=RankParams(cos_floor=settings.recall_cos_floor, cos_ceiling=settings.recall_cos_ceiling),
                   graph=GraphParams(timeout_ms=settings.recall_graph_timeout_ms),
                   exact_max=settings.vector_index_min_drawers)


@dataclass(frozen=True)
class SearchHit:
    """One recalled drawer. ``score`` is its 0–1 relevance (the same scale in every workspace; hits come
    best first by it); ``dense`` and ``text`` are the vector and full-text signals on 0–1; ``citation``
    (wing/room/short id) is what to cite instead of quoting; ``explanation`` says what each signal added."""

    id: str
    content: str
    score: float
    dense: float
    text: float
    citation: str
    explanation: Explanation
    memory_type: str | None
    importance: float
    wing: str
    room: str
    session_id: str | None
    speaker: str | None
    role: str | None
    occurred_at: datetime | None
    metadata: dict[str, Any]


_LEX = """
WITH lex AS (
    -- The query's first max_terms distinct lexemes: a long query must not become an OR over every pair
    -- of its words (a cost any caller could otherwise choose).
    SELECT t.lexeme AS l FROM unnest(to_tsvector('english', %(text)s)) t ORDER BY t.positions[1] LIMIT %(max_terms)s
), q AS (
    -- Which lexemes the full-text candidates need (migration 0037): any, the workspace's rare ones, or pairs.
    SELECT palace_text_query(%(ws)s, ARRAY(SELECT l FROM lex), %(exact)s, %(pair_terms)s) AS tsq
)"""
_FTS = """, fts AS (
    SELECT t.id FROM q, palace_text_candidates(%(ws)s, q.tsq, ARRAY(SELECT l FROM lex), %(text_rank)s, %(n_fts)s) t
)"""
_W = """, w AS (
    SELECT unnest(%(lo)s::timestamptz[]) AS lo, unnest(%(hi)s::timestamptz[]) AS hi
)"""
_ANN_EXACT = """, ann_exact AS (
    SELECT d.id
      FROM drawers d
     WHERE %(use_ann)s AND NOT %(hnsw)s AND d.workspace_id = %(ws)s AND d.embedding IS NOT NULL
       AND d.deleted_at IS NULL AND d.state <> 'merged'
     ORDER BY (d.embedding <=> %(emb)s::vector) + 0
     LIMIT %(n_ann)s
)"""
_ANN_HNSW = """, ann_hnsw AS (
    SELECT d.id
      FROM drawers d
     WHERE %(use_ann)s AND %(hnsw)s AND d.workspace_id = %(ws)s AND d.embedding IS NOT NULL
       AND d.deleted_at IS NULL AND d.state <> 'merged'
     ORDER BY d.embedding <=> %(emb)s::vector
     LIMIT %(n_ann)s
)"""
# A workspace searched exactly (``scan``): both candidate lists from one pass over its rows. The exact
# nearest-neighbour scan reads every row anyway, so the full-text match is tested on the same rows
# instead of a GIN lookup and a second visit to each match; every match is ranked, in the function's
# order (the function stops after ``text_rank_max`` matches, in whatever order the scan met them).
_SCAN = """, ws_rows AS MATERIALIZED (
    SELECT d.id, d.embedding <=> %(emb)s::vector AS dist, length(d.tsv) AS len,
           CASE WHEN d.tsv @@ (SELECT tsq FROM q)
                THEN length(d.tsv) - length(ts_delete(d.tsv, ARRAY(SELECT l FROM lex))) END AS matched
      FROM drawers d
     WHERE %(scan)s AND d.workspace_id = %(ws)s AND d.deleted_at IS NULL AND d.state <> 'merged'
), ann_exact AS (
    SELECT id FROM ws_rows WHERE %(use_ann)s AND dist IS NOT NULL ORDER BY dist LIMIT %(n_ann)s
), fts AS (
    SELECT id FROM ws_rows WHERE matched IS NOT NULL ORDER BY matched DESC, len, id LIMIT %(n_fts)s
)"""
# The window's drawers nearest the query, when the windows hold at most ``fts_scan`` of them: counted
# first from the (workspace, occurred_at) index alone, merged rows included, each window on its own (a
# month without a year is one window in each recent year: counted as one range from the first to the
# last, the years between were walked too, which at a million drawers is most of the index), each count
# stopping at ``fts_scan`` + 1. Windows that hold more add no candidates here: the first ``fts_scan`` of
# them in time order, as this branch took before, were a sample biased to the window's start (a question
# about late October never saw the drawers of late October), read with their vectors at the cost of the
# search's slowest questions. Their drawers still come through the other branches, and the window still
# counts in their ranking (``dated``).
_DATED = """, dated AS (
    SELECT x.id
      FROM (SELECT DISTINCT ON (d.id) d.id, d.embedding
              FROM w CROSS JOIN LATERAL (
                   SELECT d.id, d.embedding FROM drawers d
                    WHERE d.workspace_id = %(ws)s AND d.deleted_at IS NULL AND d.state <> 'merged'
                      AND d.occurred_at >= w.lo AND d.occurred_at < w.hi
                    LIMIT %(fts_scan)s) d
             WHERE %(n_date)s > 0
               AND (SELECT sum(n.c) FROM w AS v CROSS JOIN LATERAL (
                        SELECT count(*) AS c FROM (
                            SELECT 1 FROM drawers c
                             WHERE c.workspace_id = %(ws)s AND c.deleted_at IS NULL
                               AND c.occurred_at >= v.lo AND c.occurred_at < v.hi
                             LIMIT %(fts_scan)s + 1) y) n) <= %(fts_scan)s) x
     ORDER BY CASE WHEN %(use_ann)s THEN x.embedding <=> %(emb)s::vector END, x.id
     LIMIT %(n_date)s
)"""
_FROM = {x: "SELECT id FROM " + x for x in ("ann_exact", "ann_hnsw", "fts", "dated")}  # noqa: S608 (fixed names)
# the graph lookup's drawers: given, or left by the lookup sent before this statement
_GRAPH = """
                 UNION SELECT unnest(coalesce(%(graph_ids)s::text[],
                                              nullif(current_setting('palace.graph_ids', true), '')::text[]))"""
# = ANY(array) rather than a join: the primary key fetches the ~200 rows, instead of a scan of the table.
_FETCH = """
SELECT d.id, d.session_id, d.seq,
       CASE WHEN row_number() OVER () = 1 THEN (SELECT array_agg(l) FROM lex) END AS lexemes,
       CASE WHEN %(use_ann)s AND d.embedding IS NOT NULL THEN 1 - (d.embedding <=> %(emb)s::vector) END AS cos,
       d.tsv::text AS tsv, d.importance,
       coalesce(d.last_accessed_at, d.filed_at) AS seen_at,
       {dated} AS dated,
       d.content, d.memory_type, d.wing, d.room, d.speaker, d.role, d.occurred_at, d.metadata::text,
       d.superseded_by, CASE WHEN row_number() OVER () = 1 THEN now() END AS now
  FROM c, drawers d
 WHERE d.workspace_id = %(ws)s AND d.id = ANY(c.ids)
   AND CASE WHEN d.deleted_at IS NULL AND d.state <> 'merged' THEN true END  -- by key only: docs/scale.md
"""


@functools.cache
def statement(ann: str = "both", dated: bool = True, graph: bool = True, text: bool = True) -> str:
    """The candidate statement with only the branches a search uses: ``ann`` "exact", "hnsw", "both",
    "none", or "scan" (exact, with the full-text candidates found in the same pass, ``_SCAN``); the
    time-window branch when the query names a window; the graph's drawers when a lookup
    gives or left some. Why: the statement is planned on every search (it runs unprepared, so that the
    partial vector index matches), and a branch whose guard is false is still planned, with every index
    of the drawers table considered for it. Each branch keeps its guard, so the full statement
    (``_SQL``) returns the same rows as any variant given the parameters that variant is chosen for, except
    that "scan" ranks every full-text match where the function ranks the first ``text_rank_max``.
    ``text`` False leaves the full-text branch out (``text_statement`` finds it on another connection);
    "scan" always keeps it, since its one pass finds both lists."""
    text = text or ann == "scan"
    parts = [_LEX, _SCAN if ann == "scan" else _FTS if text else ""]
    if dated:
        parts.append(_W)
    if ann in ("exact", "both"):
        parts.append(_ANN_EXACT)
    if ann in ("hnsw", "both"):
        parts.append(_ANN_HNSW)
    if dated:
        parts.append(_DATED)
    sources = ([_FROM["ann_exact"]] if ann in ("exact", "both", "scan") else []) + (
        [_FROM["ann_hnsw"]] if ann in ("hnsw", "both") else [])
    sources += [*([_FROM["fts"]] if text else []), *([_FROM["dated"]] if dated else [])]
    union = " UNION ".join(sources) + (_GRAPH if graph else "")
    parts.append(", c AS (\n    SELECT array(" + union + ") AS ids\n)")
    in_window = "EXISTS (SELECT 1 FROM w WHERE d.occurred_at >= w.lo AND d.occurred_at < w.hi)"
    parts.append(_FETCH.replace("{dated}", in_window if dated else "false"))
    return "".join(parts)


_SQL = statement()  # every branch, each under its guard


@functools.cache
def text_statement(dated: bool) -> str:
    """The full-text branch alone, with the same columns as ``statement``: what a search sends on a second
    connection while the first runs the rest (``hybrid_search``'s ``text_conn``)."""
    in_window = "EXISTS (SELECT 1 FROM w WHERE d.occurred_at >= w.lo AND d.occurred_at < w.hi)"
    return "".join([_LEX, _FTS, *([_W] if dated else []), ", c AS (\n    SELECT array(" + _FROM["fts"] + ") AS ids\n)",
                    _FETCH.replace("{dated}", in_window if dated else "false")])


def one_pass(workspace_size: int | None, vector_index: bool, params: SearchParams) -> bool:
    """Whether a workspace is searched in one pass over its rows (``_SCAN``): at most ``exact_max`` drawers
    and no index of its own. Such a search has nothing to give a second connection."""
    return not vector_index and workspace_size is not None and workspace_size <= params.exact_max


def _candidate_params(workspace_id: str, query: str, embedding: np.ndarray | None,
                      windows: list[tuple[datetime, datetime]], params: SearchParams, workspace_size: int | None,
                      vector_index: bool, graph_ids: list[str] | None) -> dict[str, Any]:
    return {
        "graph_ids": graph_ids,
        "text": query, "emb": embedding, "use_ann": embedding is not None, "ws": workspace_id,
        # A plain OR of the query's lexemes: its matches cannot outnumber what the function ranks.
        "exact": workspace_size is not None and workspace_size <= params.fts_scan_max,
        # Searched exactly: one pass over the workspace finds both candidate lists (``_SCAN``).
        "scan": one_pass(workspace_size, vector_index, params),
        "hnsw": vector_index, "max_terms": params.max_terms, "pair_terms": params.pair_terms,
        "n_ann": params.ann_candidates, "n_fts": params.fts_candidates, "fts_scan": params.fts_scan_max,
        "text_rank": params.text_rank_max,
        "n_date": params.date_candidates if windows else 0,
        "lo": [w[0] for w in windows], "hi": [w[1] for w in windows],
    }


def _statement_for(cand: dict[str, Any], *, lookup_sent: bool) -> str:
    """The variant of the candidate statement these parameters need (``statement``): the full-text branch
    alone (``text_only``), everything but it (``text_apart``), or all of it."""
    if cand.get("text_only"):
        return text_statement(cand["n_date"] > 0)
    ann = "scan" if cand["scan"] else "none" if not cand["use_ann"] else "hnsw" if cand["hnsw"] else "exact"
    return statement(ann, cand["n_date"] > 0, lookup_sent or bool(cand["graph_ids"]), not cand.get("text_apart"))


def _candidates(fetched: list[tuple[Any, ...]], graph: dict[str, float],
                ) -> tuple[list[str], list[Candidate], dict[str, tuple[Any, ...]]]:
    """The query's lexemes, the candidates and their rows by id. Ages count from one clock reading, the
    first statement's: a search split over two connections (``text_conn``) ranks as it would on one,
    near-ties included."""
    lexemes: list[str] = next((list(r[3]) for r in fetched if r[3]), [])
    now = next((r[18] for r in fetched if r[18] is not None), None)
    keys = term_keys(lexemes)
    cands, rows = [], {}
    for row in fetched:
        did, session_id, seq, _, cos, tsv, importance, seen_at, dated = row[:9]
        age_days = (now - seen_at).total_seconds() / 86400.0 if now is not None and seen_at is not None else 0.0
        content_tf, content_len, speaker_lexemes = terms_of(tsv or "", keys)
        cands.append(Candidate(did, session_id, seq, None if cos is None else float(cos), content_tf,
                               content_len, speaker_lexemes, bool(dated), float(importance), age_days,
                               row[17], graph=graph.get(did, 0.0)))
        rows[did] = row
    return lexemes, cands, rows


async def candidates(
    conn: AsyncConnection[Any], workspace_id: str, query: str, embedding: np.ndarray | None,
    windows: list[tuple[datetime, datetime]], params: SearchParams, *, workspace_size: int | None = None,
    vector_index: bool = False, graph: dict[str, float] | None = None,
) -> tuple[list[str], list[Candidate], dict[str, tuple[Any, ...]]]:
    """The query's lexemes, every candidate with the numbers ``rank`` needs, and each candidate's row
    from ``content`` on, to show if it is picked (one round trip: fetching the top k afterwards cost
    more than reading ~200 short texts now; metadata stays JSON text until a row is picked).
    ``graph``: drawers the knowledge graph reached (``graph_candidates``), candidates too."""
    graph = graph or {}
    cand = _candidate_params(workspace_id, query, embedding, windows, params, workspace_size, vector_index, list(graph))
    cur = await conn.execute(_statement_for(cand, lookup_sent=False), cand,
                             prepare=False)  # planned with the workspace as a value: the partial vector index can match
    return _candidates(await cur.fetchall(), graph)


def _hits(ranked: list[Ranked], rows: dict[str, tuple[Any, ...]]) -> list[SearchHit]:
    out = []
    for r in ranked:
        _, session_id, _, _, _, _, importance, _, _, content, memory_type, wing, room, speaker, role, occurred_at, \
            metadata = rows[r.id][:17]
        out.append(SearchHit(
            id=r.id, content=content, score=r.score, dense=r.dense, text=r.text, citation=cite(wing, room, r.id),
            explanation=r.explanation, memory_type=memory_type,
            importance=float(importance), wing=wing, room=room, session_id=session_id, speaker=speaker, role=role,
            occurred_at=occurred_at, metadata=json.loads(metadata) if metadata else {},
        ))
    return out


async def hybrid_search(
    conn: AsyncConnection[Any], workspace_id: str, query: str, embedding: np.ndarray | None,
    params: SearchParams = SearchParams(), *, workspace_size: int | None = None, now: datetime | None = None,
    vector_index: bool = False, text_conn: AsyncConnection[Any] | None = None,
) -> list[SearchHit]:
    """Top-k drawers of one workspace for a query, in one round trip (``_send``).

    Args:
        conn: a connection with pgvector registered: idle (the search is its own transaction) or inside
            the workspace's transaction (the search runs in a savepoint of it).
        workspace_id: the tenant; nothing outside it is ever read.
        query: the query text (full text, the speaker signal and time windows).
        embedding: the query's embedding, or None to search without it (embedder down).
        params: candidate counts and fusion weights.
        workspace_size: live drawers in the workspace, if known: at most ``params.exact_max`` and no
            ``vector_index``, one pass over the workspace finds every candidate; over ``params.fts_scan_max``
            the full-text candidates need the query's rare lexemes, or two of its lexemes together.
        vector_index: the workspace's own HNSW index is ready (else an exact nearest-neighbour scan).
        now: the reference time of relative expressions ("yesterday"); default the current time.
        text_conn: a second idle connection, or None. Given, and unless the workspace is searched in one
            pass (``_SCAN``), the full-text candidates are found on it while ``conn`` finds the rest, at the
            same time: the two lookups share nothing until their rows are merged, and each was a large
            part of a search's time in a big workspace. The same lookups run, so a search costs about the
            same CPU either way (each statement repeats its scope and the query's lexemes); its latency
            falls. Each reads its own snapshot: a drawer deleted
            between them is missing from one list, never returned deleted.
    """
    windows = date_windows(query, now)
    # The entity names only when the lookup can run (it is off by default): finding them costs per search.
    names = (query_names(query, params.graph.max_words)
             if params.rank.w_graph > 0 and params.graph.timeout_ms > 0 else None)
    with_graph = bool(names)
    size = workspace_size
    if with_graph and size is None:
        # The graph weighs an entity by its rarity among the workspace's drawers; a count capped at the
        # search's thresholds (what Recaller passes) only understates how rare it is.
        size = await live_drawers(conn, workspace_id, 100_000)
    cand = _candidate_params(workspace_id, query, embedding, windows, params, workspace_size, vector_index, None)
    graph_args = graph_params(workspace_id, names, size or 0, params.graph) if with_graph and names else None
    if embedding is not None:  # its text once per search, however many statements and sends mention it
        cand["emb"] = vector_literal(embedding)
    if text_conn is None or cand["scan"] or not cand["use_ann"]:  # one lookup, or one pass: nothing to split
        found, fetched = await _search_rows(conn, cand, graph_args, params)
    else:
        text_rows = asyncio.ensure_future(_send(text_conn, {**cand, "text_only": True}, None, 0))
        try:
            found, fetched = await _search_rows(conn, {**cand, "text_apart": True}, graph_args, params)
            more = (await text_rows)[1]
        except BaseException:
            with contextlib.suppress(Exception):  # the first error is the one to report
                await text_rows  # the connection goes back to its pool idle, not mid-statement
            raise
        seen = {r[0] for r in fetched}
        fetched = fetched + [r for r in more if r[0] not in seen]
    graph = graph_strengths(found, size or 0, params.graph) if found else {}
    lexemes, cands, rows = _candidates(fetched, graph)
    return _hits(rank(cands, lexemes, params.rank, params.k), rows)


async def _search_rows(conn: AsyncConnection[Any], cand: dict[str, Any], graph_args: dict[str, Any] | None,
                       params: SearchParams) -> tuple[list[tuple[str, str, int, int]], list[tuple[Any, ...]]]:
    """The graph lookup's rows and the candidate rows, searching again without the lookup when it fails or
    runs past its deadline."""
    t0 = time.perf_counter()
    try:
        found, fetched = await _send(conn, cand, graph_args, params.graph.timeout_ms)
    except psycopg.errors.InvalidSqlStatementName:
        if graph_args is None or conn.broken:
            raise
        # The prepared lookup is gone (psycopg sends DEALLOCATE ALL after a rollback that follows one of
        # its own prepared statements): prepare it again, in the same round trip as the search.
        _graph_prepared.discard(conn)
        found, fetched = await _retry_without_graph_on_error(conn, cand, graph_args, params, t0)
    except psycopg.Error as e:
        if graph_args is None or conn.broken:
            raise
        # The graph lookup ran past its deadline or failed, and the round trip stopped there (or the
        # candidate statement failed, which the retry will show): search again without the graph.
        if isinstance(e, psycopg.errors.QueryCanceled):
            log.info("graph_recall_deadline", timeout_ms=params.graph.timeout_ms)
            SEARCH_SECONDS.labels("graph_timeout").observe(time.perf_counter() - t0)
        else:
            log.warning("graph_recall_failed", error=repr(e)[:300])
        found, fetched = await _send(conn, cand, None, 0)
    return found, fetched


async def _retry_without_graph_on_error(conn: AsyncConnection[Any], cand: dict[str, Any], graph_args: dict[str, Any],
                                        params: SearchParams, t0: float,
                                        ) -> tuple[list[tuple[str, str, int, int]], list[tuple[Any, ...]]]:
    try:
        return await _send(conn, cand, graph_args, params.graph.timeout_ms)
    except psycopg.Error as e:
        if conn.broken:
            raise
        if isinstance(e, psycopg.errors.QueryCanceled):
            log.info("graph_recall_deadline", timeout_ms=params.graph.timeout_ms)
            SEARCH_SECONDS.labels("graph_timeout").observe(time.perf_counter() - t0)
        else:
            log.warning("graph_recall_failed", error=repr(e)[:300])
        return await _send(conn, cand, None, 0)


def vector_literal(v: np.ndarray) -> str:
    """A vector as pgvector's text input. Nine significant digits give back every float32 exactly
    (pgvector reads each number with strtof) in about two thirds of the text of Python's repr of the
    widened float64, which the client formats and the server parses on every search."""
    return "[" + ",".join(map("%.9g".__mod__, np.asarray(v, dtype=np.float32).tolist())) + "]"


# The first statement of a search: the workspace row-level security admits (transaction-local, as
# shared/db/tenancy.py sets it), the timeout the graph lookup restores, and no graph drawers yet.
_SCOPE = ("SELECT set_config('palace.workspace_id', %(ws)s, true),"
          " set_config('palace.graph_restore', current_setting('statement_timeout'), true),"
          " set_config('palace.graph_ids', '{}', true)")


# Connections where the graph lookup is prepared, and where a failed round trip leaves that unknown.
_graph_prepared: weakref.WeakSet[AsyncConnection[Any]] = weakref.WeakSet()
_graph_unsure: weakref.WeakSet[AsyncConnection[Any]] = weakref.WeakSet()


async def _send(conn: AsyncConnection[Any], cand: dict[str, Any], graph_args: dict[str, Any] | None,
                timeout_ms: int) -> tuple[list[tuple[str, str, int, int]], list[tuple[Any, ...]]]:
    """Run a search's statements in one round trip: (graph lookup rows, candidate rows).

    Why one string: a search used to pay six round trips (BEGIN, the workspace setting, the graph
    lookup's savepoint and deadline, the lookup, the candidates, COMMIT), a fixed cost that a bare
    index lookup does not have. The statements go as one simple-protocol string with client-side
    parameters (``ClientCursor``), which PostgreSQL runs in order and as one transaction:

    * idle connection: an implicit transaction of its own (autocommit, so no BEGIN or COMMIT is sent);
      an error anywhere rolls all of it back, including the settings;
    * inside a transaction: the same statements in a savepoint, rolled back to on an error, so the
      caller's transaction goes on.

    Row-level security holds as before: the first statement scopes the transaction to the workspace.
    The graph lookup keeps its own deadline: since PostgreSQL 13 each statement of a string has its
    own ``statement_timeout``, armed with the value current when it starts, so the lookup runs under
    ``SET LOCAL statement_timeout`` and puts the noted timeout back as its last act. It passes the drawers
    it chose to the candidate statement in a transaction-local setting. Past the deadline the string
    stops there with an error and the caller sends it again without the lookup.
    """
    prepare = graph_args is not None and conn not in _graph_prepared
    probe = graph_args is None and conn in _graph_unsure
    parts = [_SCOPE]
    if probe:  # a failed string held the PREPARE: did it take effect before the failure?
        parts.append("SELECT EXISTS (SELECT 1 FROM pg_prepared_statements WHERE name = %(prepared)s)")
    args = {**cand, "prepared": PREPARED_NAME}
    if graph_args is not None:
        # PREPARE too runs under the deadline: it takes the lookup's table locks.
        parts += [f"SET LOCAL statement_timeout = {int(timeout_ms)}", *([prepare_statement()] if prepare else []),
                  GRAPH_EXECUTE]
        args.update(graph_args)
    parts.append(_statement_for(cand, lookup_sent=graph_args is not None))
    idle = conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    if not idle:
        parts = ["SAVEPOINT palace_search", *parts, "RELEASE SAVEPOINT palace_search"]
    cur = psycopg.AsyncClientCursor(conn)
    try:
        if idle:
            await conn.set_autocommit(True)
        try:
            await cur.execute(";\n".join(parts), args)
        except psycopg.Error:
            if prepare:  # prepared statements outlive the transaction: it may exist now, or not
                _graph_unsure.add(conn)
            if not idle and conn.info.transaction_status == psycopg.pq.TransactionStatus.INERROR:
                await conn.execute("ROLLBACK TO SAVEPOINT palace_search; RELEASE SAVEPOINT palace_search")
            raise
        results: list[list[tuple[Any, ...]]] = []
        while True:
            if cur.description is not None:
                results.append(await cur.fetchall())
            if not cur.nextset():
                break
    finally:
        await cur.close()
        # Cut short mid-statement (cancelled), the connection is not idle and the pool discards it on
        # return; otherwise it goes back as every other one is. (A pool ``reset`` callback for this hung
        # the event loop's shutdown after a failed start.)
        if idle and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
            await conn.set_autocommit(False)
    if prepare:
        _graph_prepared.add(conn)
    if probe:
        _graph_unsure.discard(conn)
        if results[1][0][0]:
            _graph_prepared.add(conn)
    # results: the scope's row, the probe's (when sent), the graph lookup's rows (when sent), the candidates.
    return (graph_rows(results[1]) if graph_args is not None else []), results[-1]
