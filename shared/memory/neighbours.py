"""Exact near-duplicate and neighbour candidates of small workspaces, ranked in the cluster process.

Cluster needs, for every drawer it processes, the few nearest other live drawers of its workspace: those
sharing a wording band with it (its twins, for the near-duplicate merge) and those of all (for the
contradiction check and the write decision). A workspace without an HNSW index of its own is ranked
exactly; in PostgreSQL that visits every heap page holding a live drawer of the workspace and evaluates
one distance per (drawer, candidate) pair, and fetches every band-sharing drawer again for the twins,
every event, although the previous event read nearly the same rows. So a replica keeps each such
workspace's live vectors and bands in memory, and reads from the database only the drawers that
changed since it last looked (``shared.db.clustering.DELTA_SQL``): every change to whether a drawer is a
candidate, or to its vector, stamps the row with its transaction id (migration 0050), and the rows
stamped by transactions the previous read could not see (running then, or begun since) are read. A drawer
deleted outright leaves no row to read, so the winners are checked against the database before they are
returned; one that is gone is dropped here and the ranking is taken again.

The ranking is the database's: the same candidates, the same cosine, nearest first. (One difference:
the database's band lookup stops at the first 200 drawers it meets, so for a phrase repeated more often
than that the cache considers every copy and may find a nearer twin.) Memory is bounded
(least recently used workspaces go first, and one that does not fit is left to the database), and a
workspace idle for a while is dropped, so a vector of a drawer forgotten since stays in memory no longer
than that.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from shared.memory.dedup import BANDS

__all__ = ["DECLINE_S", "IDLE_S", "MAX_DRAWERS", "Change", "Ranked", "VectorCache", "Watermark", "WorkspaceVectors"]

# A workspace unused this long is dropped: its memory, and any vector of a drawer forgotten meanwhile.
IDLE_S = 600.0
# What the last read of a workspace could not see: transactions with ids from the first (its snapshot's
# xmax) on, and those listed (running at the time).
Watermark = tuple[int, tuple[int, ...]]
# The most live drawers a workspace may have to be ranked here. Up to about this size one event's matrix
# product (ten drawers against every held vector) costs less than the ten HNSW walks and band lookups
# the database would make, and it is exact; past it the workspace's own index serves.
MAX_DRAWERS = 20_000
# How long a workspace found too large (or not fitting the budget) is left to the database before it is
# counted again.
DECLINE_S = 60.0
# Bytes a held drawer costs beyond its vector and bands: its id, filing time, slot and dictionary entry.
_ROW_OVERHEAD = 160


@dataclass(frozen=True, slots=True)
class Change:
    """A drawer as the database has it now: its id, when it was filed (µs since the epoch), its vector
    when it is a live candidate (processed, not deleted, embedded; None when it is not), and its wording
    bands (``shared.memory.dedup``; None before they were stored)."""

    id: str
    filed_us: int
    vector: np.ndarray | None
    bands: Sequence[int] | None = None


@dataclass
class Ranked:
    """One drawer's candidates: its twins (drawers sharing a wording band) and its neighbours by vector,
    each (id, cosine similarity), nearest first; and which of them were filed after it."""

    twins: list[tuple[str, float]]
    near: list[tuple[str, float]]
    newer: frozenset[str] = frozenset()


@dataclass
class WorkspaceVectors:
    """One workspace's live vectors and wording bands, packed: rows ``[0, n)`` of each array are the
    drawers held (a drawer dropped gives its row to the last one), so a ranking reads only rows that are
    candidates. A band matches at its own position only (each band's key hashes its index), so sharing a
    band is one comparison of the query's bands with each row's; a row whose bands are not the usual
    ``BANDS`` keys is matched by set instead. ``watermark``: what the last read of the database could not
    see; None until the first full read."""

    dims: int
    watermark: Watermark | None = None
    space: str | None = None  # the embedding space the vectors are in (a re-embedding changes it)
    n: int = 0
    slot: dict[str, int] = field(default_factory=dict)
    ids: np.ndarray = field(default_factory=lambda: np.empty(0, dtype="S32"))
    filed: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))
    unit: np.ndarray = field(default_factory=lambda: np.empty((0, 0), dtype=np.float32))
    bands: np.ndarray = field(default_factory=lambda: np.empty((BANDS, 0), dtype=np.int64))  # a row per band
    banded: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=bool))
    odd_bands: dict[str, frozenset[int]] = field(default_factory=dict)
    used_at: float = 0.0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def __post_init__(self) -> None:
        self.unit = np.empty((0, self.dims), dtype=np.float32)

    @property
    def nbytes(self) -> int:
        return int(self.unit.nbytes + self.bands.nbytes) + _ROW_OVERHEAD * len(self.ids)

    def __contains__(self, drawer_id: str) -> bool:
        return drawer_id in self.slot

    def apply(self, changes: Iterable[Change], watermark: Watermark, *, full: bool = False) -> None:
        """Take the database's rows: hold the live ones (replacing an older version), drop the rest.
        ``full``: the rows are the whole live set, and whatever else was held goes. The vectors are
        normalised in one pass: a first read of a large workspace would otherwise hold the event loop."""
        if full:
            self.slot.clear()
            self.odd_bands.clear()
            self.n = 0
        final = list({c.id: c for c in changes}.values())  # a drawer changed twice: its last state
        self.drop(c.id for c in final if c.vector is None)  # first: a drop moves the last row
        live = [c for c in final if c.vector is not None]
        if not live:
            self.watermark = watermark
            return
        width = max(len(c.id.encode()) for c in live)
        if width > self.ids.dtype.itemsize:  # ids are 32 hex digits; a wider one widens the array
            self.ids = self.ids.astype(f"S{width}")
        self._reserve(self.n + sum(c.id not in self.slot for c in live))
        slots = []
        for c in live:
            s = self.slot.get(c.id)
            if s is None:
                s = self.slot[c.id] = self.n
                self.n += 1
            slots.append(s)
            self.odd_bands.pop(c.id, None)
            if c.bands and len(c.bands) != BANDS:
                self.odd_bands[c.id] = frozenset(c.bands)
        at = np.asarray(slots)
        self.ids[at] = [c.id.encode() for c in live]
        self.filed[at] = [c.filed_us for c in live]
        usual = np.array([c.bands is not None and len(c.bands) == BANDS for c in live])
        self.banded[at] = usual
        if usual.any():
            self.bands[:, at[usual]] = np.array([c.bands for c, u in zip(live, usual, strict=True) if u],
                                                dtype=np.int64).T
        self.unit[at] = _unit(np.stack([c.vector for c in live]))  # type: ignore[misc]
        self.watermark = watermark

    def drop(self, drawer_ids: Iterable[str]) -> None:
        """Forget drawers that are no longer candidates; the last row moves into each freed one."""
        for i in drawer_ids:
            s = self.slot.pop(i, None)
            if s is None:
                continue
            self.odd_bands.pop(i, None)
            last = self.n - 1
            if s != last:
                for a in (self.ids, self.filed, self.unit, self.banded):
                    a[s] = a[last]
                self.bands[:, s] = self.bands[:, last]
                self.slot[self.ids[s].decode()] = s
            self.n = last

    def _reserve(self, rows: int) -> None:
        """Room for ``rows`` drawers, at least doubling when it grows (one copy for a whole first read)."""
        if rows <= len(self.ids):
            return
        extra = max(64, len(self.ids), rows - len(self.ids))
        self.ids = np.concatenate([self.ids, np.zeros(extra, dtype=self.ids.dtype)])
        self.filed = np.concatenate([self.filed, np.zeros(extra, dtype=np.int64)])
        self.unit = np.concatenate([self.unit, np.zeros((extra, self.dims), dtype=np.float32)])
        self.bands = np.concatenate([self.bands, np.zeros((BANDS, extra), dtype=np.int64)], axis=1)
        self.banded = np.concatenate([self.banded, np.zeros(extra, dtype=bool)])

    def rank(self, queries: Sequence[tuple[str, np.ndarray, Sequence[int]]], limit: int) -> list[Ranked] | None:
        """For each query (drawer id, vector, wording bands): the ``limit`` nearest drawers sharing a wording
        band with it and the ``limit`` nearest of all, each among the held drawers filed before it and again
        among those filed after it (by filing time, then id: the database's order), and which are the latter.
        None when a query's drawer is not held (its filing time is not known here)."""
        if any(q not in self.slot for q, _, _ in queries):
            return None
        if not queries:
            return []
        n = self.n
        ids, filed = self.ids[:n], self.filed[:n]
        # A row per query, a column per drawer. Computed as drawers × queries: with the (drawers, dims) matrix
        # on the left the BLAS kernel streams it once, where queries × drawersᵀ read it the slower way.
        sims = np.ascontiguousarray((self.unit[:n] @ np.stack([_unit(v) for _, v, _ in queries]).T).T)
        # The ranking score: the cosine; a zero vector's (NaN in the database, which sorts it last) below
        # every cosine; the query itself, below that.
        score = np.where(np.isnan(sims), -2.0, sims)
        out = []
        for j, (qid, _, qbands) in enumerate(queries):
            qs = self.slot[qid]
            later = (filed > filed[qs]) | ((filed == filed[qs]) & (ids > ids[qs]))  # filed after it
            older, newer = score[j].copy(), score[j]
            older[later] = -np.inf
            older[qs] = -np.inf
            newer[~later] = -np.inf
            qb = np.asarray(qbands, dtype=np.int64)
            if len(qb) == BANDS:
                share = self.banded[:n] & (self.bands[:, :n] == qb[:, None]).any(axis=0)
            else:
                share = self.banded[:n] & np.isin(self.bands[:, :n], qb).any(axis=0)
            if self.odd_bands:
                qset = set(qbands)
                share[[self.slot[i] for i, b in self.odd_bands.items() if b & qset]] = True
            # The drawers sharing a band are few: ranked among themselves, not as the whole row masked.
            among = np.flatnonzero(share)
            after = [self._top(newer, ids, sims[j], limit, among=among), self._top(newer, ids, sims[j], limit)]
            out.append(Ranked(_nearest_first(self._top(older, ids, sims[j], limit, among=among) + after[0]),
                              _nearest_first(self._top(older, ids, sims[j], limit) + after[1]),
                              frozenset(i for i, _ in after[0] + after[1])))
        return out

    @staticmethod
    def _top(row: np.ndarray, ids: np.ndarray, sims: np.ndarray, limit: int,
             among: np.ndarray | None = None) -> list[tuple[str, float]]:
        """The ``limit`` best-scored rows that are candidates (score above -inf), of all or of the rows
        ``among``, best first, ties by id (as the database orders them). The k-th best score is found by
        partitioning the values, and every row scoring at least that is sorted: cheaper than partitioning
        the indices, and a tie at the boundary is decided by id, not by where the partition left it."""
        scores = row if among is None else row[among]
        k = min(limit, int(np.count_nonzero(scores > -np.inf)))
        if not k:
            return []
        at = len(scores) - k
        top = np.flatnonzero(scores >= np.partition(scores, at)[at])
        if among is not None:
            top = among[top]
        top = top[np.lexsort((ids[top], -row[top]))][:k]
        return [(ids[t].decode(), _clip(float(sims[t]))) for t in top]


def _nearest_first(found: list[tuple[str, float]]) -> list[tuple[str, float]]:
    return sorted(found, key=lambda x: (-x[1], x[0]))


def _clip(x: float) -> float:
    """A cosine within [-1, 1] (rounding can step past either end), NaN kept."""
    return x if x != x else max(-1.0, min(1.0, x))


def _unit(v: np.ndarray) -> np.ndarray:
    """The vector, or each row of a matrix, scaled to length 1 (float32, as the database computes); a zero
    vector becomes NaNs, as its cosine is in the database."""
    a = np.asarray(v, dtype=np.float32)
    n = np.sqrt(np.einsum("...i,...i->...", a, a, dtype=np.float64))[..., None].astype(np.float32)
    with np.errstate(invalid="ignore", divide="ignore"):
        return a / n  # a zero vector: 0 / 0, NaN


class VectorCache:
    """Workspaces' live vectors within a memory budget, least recently used dropped first."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._ws: OrderedDict[str, WorkspaceVectors] = OrderedDict()
        self._declined: dict[str, float] = {}  # workspace → until when it is left to the database

    def get(self, workspace_id: str, dims: int) -> WorkspaceVectors:
        """The workspace's entry, created empty (no watermark) when not held or held at other
        dimensions; entries idle longer than ``IDLE_S`` go first."""
        now = time.monotonic()
        for ws in [w for w, v in self._ws.items() if now - v.used_at > IDLE_S]:
            del self._ws[ws]
        wv = self._ws.get(workspace_id)
        if wv is None or wv.dims != dims:
            wv = self._ws[workspace_id] = WorkspaceVectors(dims)
        self._ws.move_to_end(workspace_id)
        wv.used_at = now
        return wv

    def fits(self, live: int, dims: int) -> bool:
        """Whether a workspace of ``live`` drawers is to be held: within ``MAX_DRAWERS`` and the budget."""
        return live <= MAX_DRAWERS and live * (4 * dims + 8 * BANDS + _ROW_OVERHEAD) <= self.max_bytes

    def decline(self, workspace_id: str) -> None:
        """Leave the workspace to the database for ``DECLINE_S``, and drop what is held of it."""
        if len(self._declined) > 10_000:
            self._declined.clear()
        self._declined[workspace_id] = time.monotonic() + DECLINE_S
        self._ws.pop(workspace_id, None)

    def declined(self, workspace_id: str) -> bool:
        until = self._declined.get(workspace_id)
        return until is not None and time.monotonic() < until

    def trim(self) -> None:
        """Drop least recently used workspaces until the budget holds."""
        total = sum(v.nbytes for v in self._ws.values())
        while total > self.max_bytes and self._ws:
            _, v = self._ws.popitem(last=False)
            total -= v.nbytes

    def drop(self, workspace_id: str) -> None:
        self._ws.pop(workspace_id, None)

    @property
    def nbytes(self) -> int:
        return sum(v.nbytes for v in self._ws.values())

    def __len__(self) -> int:
        return len(self._ws)
