"""The knowledge-graph recall signal (Signet's graph boost), the pure part: which entity names a query
could hold, and how strongly each drawer the graph reaches is tied to the query.

A query names entities ("What did we decide about PostgreSQL?"); the drawers that mention them, or
mention an entity one triple away from them, are likely evidence even when their wording and
embedding are far from the question's. The database part (shared/db/graph_recall.py) looks the names
up, walks one hop and returns, per reached drawer, the entities that reached it and how many drawers
mention each; this module turns that into a 0–1 strength.

Why rarity, and why the maximum: an entity mentioned in most of a workspace (the user, the agent, a
speaker) selects nothing; one mentioned in a handful of drawers selects those. So an entity counts by
its rarity, ``log(N / df) / log(N)``, and one mentioned in more than ``max_df`` drawers is not used at
all (its drawers would be an arbitrary slice of the workspace, and fetching them would cost the most).
A drawer's strength is the best of its entities, not their sum: extraction that finds more entities
per drawer (a better extractor, an LLM) must not inflate the signal. An entity reached by one hop
counts ``hop_factor`` of its rarity: the query did not name it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from shared.memory.episodes import STOPWORDS
from shared.memory.kg import text_words

__all__ = ["GraphParams", "QueryNames", "graph_strengths", "query_names"]


@dataclass(frozen=True)
class GraphParams:
    """Limits and shape of the graph signal; the defaults are what ships (``PALACE_RECALL_GRAPH_*``)."""

    max_words: int = 4  # longest name (in words) looked for in a query
    max_entities: int = 20  # entities matched by the query's words
    max_hops: int = 50  # neighbours reached through current triples
    max_df: int = 200  # an entity mentioned in more drawers than this selects nothing
    hop_factor: float = 0.5  # a neighbour's share of its rarity
    max_drawers: int = 50  # drawers added as candidates (the strongest)
    timeout_ms: int = 0  # the graph statement's deadline: past it, the search goes on without the graph; 0: off


@dataclass(frozen=True)
class QueryNames:
    """The word runs of a query that could be an entity's ``match_key`` (shared/memory/kg.py), split the
    way the inline linker matches: a one-word name written with a capital (``cased``) matches only where
    the query writes it with one too; runs of several words match any alias."""

    any_alias: tuple[str, ...]  # multi-word runs, and single words the query capitalises
    uncased_only: tuple[str, ...]  # single words the query writes in lower case only

    def __bool__(self) -> bool:
        return bool(self.any_alias or self.uncased_only)


def query_names(query: str, max_words: int = 4) -> QueryNames:
    """Every run of 1..``max_words`` consecutive words of ``query`` that is not made only of stopwords or
    single letters (a name like that links nowhere, as in the inline linker)."""
    tw = text_words(query)
    words = tw.joined.split()
    capitalised = tw.capitalised
    any_alias: set[str] = set()
    uncased: set[str] = set()
    for i in range(len(words)):
        for n in range(1, max_words + 1):
            run = words[i:i + n]
            if len(run) < n:
                break
            if all(w in STOPWORDS or len(w) < 2 for w in run):
                continue
            key = " ".join(run)
            if n > 1 or key in capitalised:
                any_alias.add(key)
            else:
                uncased.add(key)
    return QueryNames(tuple(sorted(any_alias)), tuple(sorted(uncased - any_alias)))


def graph_strengths(rows: Iterable[tuple[str, str, int, int]], workspace_drawers: int,
                    p: GraphParams = GraphParams()) -> dict[str, float]:
    """Drawer id → 0–1 graph strength, from (drawer id, entity id, hops, df) rows: the entity reached the
    drawer after ``hops`` (0: named by the query, 1: one triple away) and is mentioned in ``df`` drawers
    of a workspace of ``workspace_drawers``. The ``max_drawers`` strongest, ties broken by id."""
    n = max(workspace_drawers, 2)
    out: dict[str, float] = {}
    for drawer_id, _entity_id, hops, df in rows:
        if df <= 0 or df > p.max_df:
            continue
        rarity = min(max(math.log(n / df) / math.log(n), 0.0), 1.0)
        s = rarity * (1.0 if hops == 0 else p.hop_factor)
        if s > out.get(drawer_id, 0.0):
            out[drawer_id] = s
    best = sorted(out.items(), key=lambda kv: (-kv[1], kv[0]))[: p.max_drawers]
    return dict(best)
