"""Search latency at scale: the real recall path against the bare HNSW lookup it is built on.

Why this shape: absolute milliseconds depend on the machine, so each size is measured three ways
in the same run, query by query, interleaved (so background noise hits all three alike):

* full  — ``Recaller.search``: query embedding + the hybrid SQL (what the API and the CLI call);
* sql   — the same ``Recaller.search`` with the query vector computed beforehand: the database's share;
* bare  — ``SELECT id … ORDER BY embedding <=> q LIMIT k`` (the HNSW floor).

full ÷ bare says what the whole path costs over the index it cannot do without; sql ÷ bare says
what the hybrid part (full-text branch, fusion, scoring) adds inside PostgreSQL.

The workspace is filled directly in PostgreSQL (this bench measures search, not ingest) with rows
shaped like the pipeline's own: every LoCoMo session is planned by ``plan_session`` (noise filter,
chunking, speaker, position, preceding turn) and its drawers get their real embeddings (computed
once, cached); beyond those ~2,700 drawers come copies with a numbered text suffix, their own
session ids and noisy normalised copies of the real vectors, so vectors, words and sessions stay
realistic as the workspace grows. Importances are spread (1.0-4.9) and a fifth of the drawers are
decayed below their peak, so wake_up's essential story (L1) is measured with an order to find.

    .venv/bin/python bench/search.py [--sizes 10000,100000] [--queries 200] [--k 10]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import hashlib
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import psycopg
from _common import (
    CACHE,
    REPO,
    Question,
    Turn,
    bench_lock,
    bench_settings,
    console,
    drawer_embed_text,
    load_locomo,
    machine_info,
    percentiles,
    prepare_process,
    settle_drawers,
    start_servers,
    warn_if_busy,
    write_results,
)
from pgvector.psycopg import register_vector
from psycopg import sql
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from shared.config import Settings
from shared.db.lexicon import refresh_lexicon
from shared.db.tenancy import maintenance_tx, workspace_tx
from shared.db.vector_indexes import index_name_for
from shared.events import Message, SessionCompleted
from shared.ids import content_hash, drawer_id
from shared.memory.filing import plan_session
from shared.ports import Embedder

WS_PREFIX = "bench-search-"
METHODS = ("full", "sql", "bare", "wake_up", "inject")
REF = "ref"  # the hybrid-SQL path of another commit (--compare), measured beside the others
# This tree's hybrid-SQL path in a worker process too (--compare): the before and the after then run alike, each
# in a process of its own, where comparing the worker with the bench's own "sql" path would count the cost of
# the worker's separate process as part of the change.
THIS = "this"
FTS_COUNT_SQL = (
    "SELECT count(*) FROM drawers WHERE workspace_id = %s"
    " AND tsv @@ replace(plainto_tsquery('english', %s)::text, ' & ', ' | ')::tsquery"
)


def bare_sql(limit: int) -> sql.Composed:
    """The bare HNSW lookup. LIMIT is a literal on purpose: psycopg prepares a statement after five
    runs, and a generic plan for ``LIMIT $3`` has to guess the limit (10% of the rows), for which a
    sequential scan and sort could look cheaper than the index; a literal keeps the floor an index
    scan whatever the planner guesses."""
    return sql.SQL("SELECT id FROM drawers WHERE workspace_id = %s ORDER BY embedding <=> %s LIMIT {}").format(
        sql.Literal(limit))


def exact_sql(limit: int) -> sql.Composed:
    """The same ordering as ``bare_sql`` (run with index scans disabled: the exact answer)."""
    return sql.SQL("SELECT id FROM drawers WHERE workspace_id = %s AND embedding IS NOT NULL"
                   " ORDER BY embedding <=> %s LIMIT {}").format(sql.Literal(limit))


# ---------------------------------------------------------------------------------------- drawers
@dataclass(frozen=True, slots=True)
class BaseDrawer:
    """One drawer as ingest would file it from a LoCoMo turn, and the text embed would embed."""

    content: str
    speaker: str | None
    role: str
    session_id: str
    seq: int
    context: str | None
    embed_text: str
    turns: tuple[tuple[str, str], ...] = ()  # (conversation, dia id) of every turn filed as this text


def pipeline_drawers(turns: list[Turn], settings: Settings) -> list[BaseDrawer]:
    """Every LoCoMo session through ``plan_session``, exactly as ingest files it (one workspace, so a
    text repeated across sessions is one drawer, as it would be)."""
    by_session: dict[tuple[str, str], list[Turn]] = {}
    for t in turns:
        by_session.setdefault((t.conv, t.session), []).append(t)
    out: list[BaseDrawer] = []
    seen: dict[str, int] = {}
    for (conv, sess), ts in by_session.items():
        ev = SessionCompleted(workspace_id="bench-search", session_id=f"{conv}:{sess}", messages=[
            Message(role="user" if i % 2 == 0 else "assistant", content=t.text, name=t.speaker)
            for i, t in enumerate(ts)])
        plan = plan_session(ev, chunk_chars=settings.chunk_chars, chunk_overlap=settings.chunk_overlap,
                            min_chars=settings.min_chars)
        for d in plan.drawers:
            seq = getattr(d, "seq", None)
            seq = int(seq if seq is not None else d.metadata.get("seq", 0))  # type: ignore[call-overload]
            turn = ((conv, ts[seq].dia_id),) if 0 <= seq < len(ts) else ()
            if d.id in seen:  # the same text said again: one drawer, answering for both turns
                i = seen[d.id]
                out[i] = dataclasses.replace(out[i], turns=out[i].turns + turn)
                continue
            seen[d.id] = len(out)
            out.append(BaseDrawer(d.content, d.speaker, d.role, ev.session_id, seq, getattr(d, "context", None),
                                  drawer_embed_text(d), turn))
    return out


async def base_embeddings(embedder: Embedder, drawers: list[BaseDrawer], batch: int) -> np.ndarray:
    """Real document embeddings of the base drawers, computed once per model and cached on disk.

    The cache is keyed by model name and checked against a hash of the embedded texts, so a change
    to the data, to filing or to what is embedded never silently reuses stale vectors.
    """
    texts = [d.embed_text for d in drawers]
    digest = hashlib.sha256("\x1e".join(texts).encode()).hexdigest()[:16]
    name = embedder.model_name.replace("/", "_")
    path, meta = CACHE / f"{name}-turns.npy", CACHE / f"{name}-turns.json"
    with contextlib.suppress(FileNotFoundError, json.JSONDecodeError, ValueError):
        if json.loads(meta.read_text()).get("texts_sha256") == digest:
            vecs = np.load(path)
            if vecs.shape == (len(texts), embedder.dim):
                console.print(f"base embeddings: cached ({path.relative_to(CACHE.parents[2])})")
                return vecs
    CACHE.mkdir(parents=True, exist_ok=True)
    (CACHE / ".gitignore").write_text("*\n")
    out: list[np.ndarray] = []
    t0 = time.perf_counter()
    with _progress() as bar:
        task = bar.add_task(f"embedding {len(texts)} LoCoMo drawers once ({embedder.model_name})", total=len(texts))
        for i in range(0, len(texts), batch):
            out.append(await embedder.embed_documents(texts[i : i + batch]))
            bar.advance(task, len(out[-1]))
    vecs = np.vstack(out).astype(np.float32)
    np.save(path, vecs)
    meta.write_text(json.dumps({"model": embedder.model_name, "texts_sha256": digest, "n": len(texts),
                                "seconds": time.perf_counter() - t0}))
    return vecs


@dataclass
class Rows:
    content: list[str]
    base: np.ndarray  # index into the base drawers
    lap: np.ndarray
    vecs: np.ndarray


def synth_rows(base: list[BaseDrawer], vecs: np.ndarray, size: int, synth: str, noise: float, seed: int) -> Rows:
    """``size`` drawers: the real ones first, then synthetic ones derived from them.

    Synthetic drawer j of source i has content ``"<content> #j"`` and session ``"<session>#j"`` (a
    session of its own, so session-level scoring sees realistic sessions). Its vector is, with ``g``
    Gaussian of expected norm 1 (per-component σ = 1/√dim):

    * ``copy``: ``normalise(v_i + noise·g)``, a noisy copy of its source;
    * ``mix`` (default): ``normalise(a·v_i + (1−a)·v_r + noise·g)`` with ``r`` another real drawer
      at random and ``a ~ U(0.5, 0.9)``: a point between two real memories, leaning to its source.

    Why ``mix``: at 100k every real vector has ~36 noisy copies, and tight clusters of that many
    near-duplicates wreck a pgvector 0.6 HNSW graph (m=16): measured here, recall@10 0.2–0.3 and
    scans stopping short of LIMIT 100 even at ef_search 1000, so the "bare" floor would be a broken
    index. Mixtures stay inside the narrow cone real e5 vectors occupy (unrelated turns still score
    ~0.84) and spread over it: recall@10 0.95 at ef_search 200, nearest-neighbour cosines like the
    real ones (``calibration`` in the results shows both).
    """
    n_real, dim = vecs.shape
    idx = np.arange(size)
    b, lap = idx % n_real, idx // n_real
    content = [base[i].content if k == 0 else f"{base[i].content} #{k}" for i, k in zip(b, lap, strict=True)]
    out = vecs[b].copy()
    syn = lap > 0
    n_syn = int(syn.sum())
    if n_syn:
        rng = np.random.default_rng(seed)
        if synth == "mix":
            a = rng.uniform(0.5, 0.9, (n_syn, 1)).astype(np.float32)
            out[syn] = a * out[syn] + (1 - a) * vecs[rng.integers(0, n_real, n_syn)]
        out[syn] += rng.standard_normal((n_syn, dim), dtype=np.float32) * (noise / np.sqrt(dim))
        out /= np.linalg.norm(out, axis=1, keepdims=True)
    return Rows(content, b, lap, out.astype(np.float32))


def calibration(vecs: np.ndarray, rows: Rows, seed: int, sample: int = 1000) -> dict[str, float | None]:
    """Synthetic vectors against real ones: cosine to their source, and nearest-neighbour and
    unrelated-pair cosines among the real drawers, so the generator's realism is checkable."""
    sims = vecs @ vecs.T
    np.fill_diagonal(sims, -1.0)
    out: dict[str, float | None] = {
        "real_nn_cos_p50": float(np.median(sims.max(axis=1))),
        "real_pair_cos_p50": float(np.median(sims[np.triu_indices(len(vecs), 1)])),
        "synthetic_source_cos_p50": None, "synthetic_nn_real_cos_p50": None}
    syn = np.flatnonzero(rows.lap > 0)
    if syn.size:
        pick = np.random.default_rng(seed).choice(syn, min(sample, syn.size), replace=False)
        sv = rows.vecs[pick]
        out["synthetic_source_cos_p50"] = float(np.median((sv * vecs[rows.base[pick]]).sum(axis=1)))
        out["synthetic_nn_real_cos_p50"] = float(np.median((sv @ vecs.T).max(axis=1)))
    return out


# ------------------------------------------------------------------------------------------ load
def load_workspace(database_url: str, workspace: str, base: list[BaseDrawer], rows: Rows, model: str,
                   mode: str) -> dict[str, Any]:
    """Replace every bench-search workspace with this one, via binary COPY.

    ``mode='insert'`` copies with the HNSW index in place (what a live system pays per row: a few
    hundred rows/s on 2 cores). ``mode='rebuild'`` drops the HNSW index, copies, and re-creates it
    from its own definition (``pg_get_indexdef``) in the same transaction, so a crash rolls back to
    the original index; many times faster, but it locks and rebuilds the index of the whole table:
    only for a database the bench owns.
    """
    stats: dict[str, Any] = {"mode": mode, "rows": len(rows.content)}
    with psycopg.connect(database_url, autocommit=True) as conn:
        register_vector(conn)
        have = {r[0] for r in conn.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_name = 'drawers'")}
        t0 = time.perf_counter()
        conn.execute("DELETE FROM drawers WHERE workspace_id LIKE %s", (WS_PREFIX + "%",))
        stats["delete_previous_s"] = time.perf_counter() - t0
        cols = ["workspace_id", "id", "content", "content_hash", "embedding", "embedding_model", "state",
                "importance", "memory_type", "role", "speaker", "session_id"]
        types = ["text", "text", "text", "text", "vector", "text", "text", "float4", "text", "text", "text", "text"]
        extra = [(c, t) for c, t in (("seq", "int4"), ("context", "text")) if c in have]  # newer schemas
        cols += [c for c, _ in extra]
        types += [t for _, t in extra]
        copy_sql = sql.SQL("COPY drawers ({}) FROM STDIN WITH (FORMAT BINARY)").format(
            sql.SQL(", ").join(map(sql.Identifier, cols)))
        with conn.transaction():
            # The workspace's own HNSW index (migration 0019). 'rebuild' builds it after the COPY.
            index = index_name_for(workspace)
            indexdef = sql.SQL(
                "CREATE INDEX {} ON drawers USING hnsw (embedding vector_cosine_ops) WITH (m = 16, "
                "ef_construction = 64) WHERE workspace_id = {}").format(sql.Identifier(index), sql.Literal(workspace))
            conn.execute(sql.SQL("DROP INDEX IF EXISTS {}").format(sql.Identifier(index)))
            conn.execute("DELETE FROM vector_indexes WHERE workspace_id LIKE %s", (WS_PREFIX + "%",))
            if mode == "insert":
                conn.execute(indexdef)
            t0 = time.perf_counter()
            n = len(rows.content)
            with _progress() as bar, conn.cursor() as cur:
                label = "HNSW index in place" if mode == "insert" else "HNSW index dropped"
                task = bar.add_task(f"COPY {n:,} drawers into {workspace} ({label})", total=n)
                with cur.copy(copy_sql) as copy:
                    copy.set_types(types)
                    for i, text in enumerate(rows.content):
                        d, lap = base[rows.base[i]], int(rows.lap[i])
                        h = content_hash(text)
                        rec: list[Any] = [workspace, drawer_id(workspace, h), text, h, rows.vecs[i], model,
                                          "processed", importance_of(i), "fact", d.role, d.speaker,
                                          d.session_id if lap == 0 else f"{d.session_id}#{lap}"]
                        for c, _ in extra:
                            rec.append(d.seq if c == "seq" else d.context)
                        copy.write_row(rec)
                        if i % 1000 == 999:
                            bar.advance(task, 1000)
                    bar.update(task, completed=n)
            stats["copy_s"] = time.perf_counter() - t0
            # Decayed drawers, as daily decay leaves them: importance below the peak wake_up's index
            # orders (migration 0034), which its walk must see through.
            t0 = time.perf_counter()
            stats["decayed_rows"] = conn.execute(
                "UPDATE drawers SET importance = importance * %s WHERE workspace_id = %s AND id < %s",
                (DECAYED_BY, workspace, DECAYED_BELOW_ID)).rowcount
            stats["decay_s"] = time.perf_counter() - t0
            if mode == "rebuild":
                t0 = time.perf_counter()
                conn.execute("SET CONSTRAINTS ALL IMMEDIATE")  # the layout-version triggers fire at commit
                with console.status(f"building {index} ..."):
                    conn.execute("SET LOCAL maintenance_work_mem = '1GB'")  # the graph must fit, or the build crawls
                    conn.execute(indexdef)
                stats["index_build_s"] = time.perf_counter() - t0
            conn.execute("INSERT INTO vector_indexes (workspace_id, index_name, state, drawers, ready_at)"
                         " VALUES (%s, %s, 'ready', %s, now())", (workspace, index, len(rows.content)))
        t0 = time.perf_counter()
        with console.status("VACUUM ANALYZE drawers (planner statistics, GIN pending list) ..."):
            conn.execute("VACUUM (ANALYZE) drawers")
        stats["vacuum_analyze_s"] = time.perf_counter() - t0
    stats["total_s"] = sum(v for k, v in stats.items() if k.endswith("_s"))
    return stats


BG_PREFIX = "bench-bg-"
# A fifth of the drawers decayed by 0.7 (ids are hex: those below '33' are a fifth of them), within the
# slack of their importance peak, so the index keeps the peak they had.
DECAYED_BY, DECAYED_BELOW_ID = 0.7, "33"


def importance_of(i: int) -> float:
    """Importances spread over 1.0-4.9 as classification gives them, so the essential story (L1) has an
    order to find rather than a tie."""
    return 1.0 + (i * 7919 % 40) / 10.0


def background_sizes(total: int, workspaces: int, seed: int, lo: int = 100, hi: int = 50_000) -> list[int]:
    """Other tenants' sizes: log-normal (many small workspaces, a few large), each within [lo, hi],
    summing to ``total``."""
    rng = np.random.default_rng(seed + 1)
    raw = np.exp(rng.normal(np.log(600), 1.3, workspaces))
    sizes = np.clip(raw * total / raw.sum(), lo, hi).astype(int)
    sizes[np.argmax(sizes)] += total - int(sizes.sum())  # exact total
    return [int(x) for x in sizes]


def load_background(database_url: str, base: list[BaseDrawer], rows: Rows, sizes: list[int], model: str) -> float:
    """COPY the other tenants (``bench-bg-NNNN``), reusing them when they are already there. Returns seconds
    spent (0 when reused). Their own vector indexes are not built: the searched workspaces' costs are what
    is measured, and a big table with many tenants is what matters to them."""
    total = sum(sizes)
    with psycopg.connect(database_url, autocommit=True) as conn:
        register_vector(conn)
        row = conn.execute("SELECT count(*) FROM drawers WHERE workspace_id LIKE %s", (BG_PREFIX + "%",)).fetchone()
        if row and int(row[0]) == total:
            console.print(f"other tenants: {total:,} drawers in {len(sizes)} workspaces, reused")
            return 0.0
        conn.execute("DELETE FROM drawers WHERE workspace_id LIKE %s", (BG_PREFIX + "%",))
        t0 = time.perf_counter()
        copy_sql = ("COPY drawers (workspace_id, id, content, content_hash, embedding, embedding_model, state, "
                    "importance, memory_type, role, speaker, session_id) FROM STDIN WITH (FORMAT BINARY)")
        with _progress() as bar, conn.cursor() as cur, cur.copy(copy_sql) as copy:
            copy.set_types(["text", "text", "text", "text", "vector", "text", "text", "float4", "text", "text",
                            "text", "text"])
            task = bar.add_task(f"COPY {total:,} drawers of {len(sizes)} other tenants", total=total)
            i = 0
            for w, n in enumerate(sizes):
                ws = f"{BG_PREFIX}{w:04d}"
                for _ in range(n):
                    d, lap = base[rows.base[i]], int(rows.lap[i])
                    text = rows.content[i]
                    h = content_hash(text)
                    copy.write_row([ws, drawer_id(ws, h), text, h, rows.vecs[i], model, "processed", 3.0, "fact",
                                    d.role, d.speaker, d.session_id if lap == 0 else f"{d.session_id}#{lap}"])
                    i += 1
                    if i % 5000 == 0:
                        bar.advance(task, 5000)
            bar.update(task, completed=total)
        with console.status("VACUUM ANALYZE drawers ..."):
            conn.execute("VACUUM (ANALYZE) drawers")
        return time.perf_counter() - t0


# --------------------------------------------------------------------------------------- measure
class RefPath:
    """``Recaller.search`` of another commit, in a process of its own (bench/search_ref_worker.py): the
    before of a change, timed side by side with the after, query by query, on the same database."""

    def __init__(self, ref: str, tree: Path, proc: asyncio.subprocess.Process, shared_path: str) -> None:
        self.ref, self.tree, self._proc, self.shared_path = ref, tree, proc, shared_path

    @staticmethod
    def export(ref: str | None, workdir: Path) -> tuple[str, Path]:
        """REF's ``shared`` package, as committed, under ``workdir``: (short commit, tree). None: this
        working tree, as it is."""
        if ref is None:
            return "working tree", REPO
        commit = subprocess.run(["git", "rev-parse", "--short", ref], cwd=REPO, capture_output=True, text=True,
                                check=True).stdout.strip()
        tree = workdir / f"ref-{commit}"
        tree.mkdir()
        archive = subprocess.run(["git", "archive", commit, "shared"], cwd=REPO, capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
        return commit, tree

    @classmethod
    async def start(cls, ref: str | None, database_url: str, model: str, vectors: dict[str, np.ndarray],
                    workdir: Path) -> RefPath:
        commit, tree = await asyncio.to_thread(cls.export, ref, workdir)
        queries = list(vectors)
        np.savez(workdir / "vectors.npz", queries=np.array(json.dumps(queries)), model=np.array(model),
                 vectors=np.stack([vectors[q] for q in queries]))
        proc = await asyncio.create_subprocess_exec(
            sys.executable, str(REPO / "bench" / "search_ref_worker.py"), database_url, str(workdir / "vectors.npz"),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, cwd=tree,
            env={**os.environ, "PYTHONPATH": str(tree)})
        assert proc.stdout is not None
        hello = json.loads(await proc.stdout.readline() or b"{}")
        shared_path = str(hello.get("shared", ""))
        if not shared_path.startswith(str(tree)):
            proc.kill()
            raise SystemExit(f"--compare {ref}: the worker imported shared from {shared_path!r}, not {tree}")
        return cls(f"{ref} ({commit})" if ref is not None else commit, tree, proc, shared_path)

    async def search(self, workspace: str, query: str, k: int) -> tuple[float, float]:
        """Milliseconds of one search as the worker timed it, and the CPU milliseconds it cost (the
        worker's process and its backends)."""
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._proc.stdin.write((json.dumps({"ws": workspace, "q": query, "k": k}) + "\n").encode())
        await self._proc.stdin.drain()
        line = await self._proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the --compare worker ({self.ref}) exited")
        reply = json.loads(line)
        return float(reply["ms"]), float(reply["cpu_ms"])

    async def close(self) -> None:
        if self._proc.stdin is not None:
            self._proc.stdin.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._proc.wait(), 10)
        if self._proc.returncode is None:
            self._proc.kill()


class Precomputed:
    """An ``Embedder`` answering queries from vectors computed beforehand, so a ``Recaller`` runs
    exactly its SQL path (same statement, same parameters, same extra queries) minus the model."""

    def __init__(self, inner: Embedder, vectors: dict[str, np.ndarray]) -> None:
        self.model_name, self.dim, self._v = inner.model_name, inner.dim, vectors

    async def embed_query(self, text: str) -> np.ndarray:
        return self._v[text]

    async def embed_documents(self, texts: Sequence[str]) -> np.ndarray:
        raise NotImplementedError("queries only")

    async def aclose(self) -> None:
        return None


class _RecordingCursor(psycopg.AsyncCursor[Any]):
    """Remembers every statement executed through it (to EXPLAIN what the Recaller really runs)."""

    seen: ClassVar[list[tuple[Any, Any]]] = []

    async def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
        _RecordingCursor.seen.append((query, params))
        return await super().execute(query, params, **kwargs)


@contextlib.contextmanager
def _recording_client_cursor() -> Any:
    """Record what goes through ``AsyncClientCursor`` too (search sends its statements with one)."""
    original = psycopg.AsyncClientCursor.execute

    async def execute(self: Any, query: Any, params: Any = None, **kwargs: Any) -> Any:
        _RecordingCursor.seen.append((query, params))
        return await original(self, query, params, **kwargs)

    psycopg.AsyncClientCursor.execute = execute  # type: ignore[method-assign]
    try:
        yield
    finally:
        psycopg.AsyncClientCursor.execute = original  # type: ignore[method-assign]


async def explain(database_url: str, embedder: Embedder, workspace: str, vectors: dict[str, np.ndarray],
                  query: str, k: int) -> dict[str, Any]:
    """Plans of the bare lookup and of the statement ``Recaller.search`` actually sends (captured on
    a one-connection pool, then run under ``EXPLAIN ANALYZE``): does each reach the HNSW index?"""
    from shared.db.pool import open_pool
    from shared.recall import Recaller

    out: dict[str, Any] = {}
    vec = vectors[query]
    pool = await open_pool(database_url, name="bench-explain", min_size=1, max_size=1)
    try:
        async with workspace_tx(pool, workspace) as conn:
            cur = await conn.execute(sql.SQL("EXPLAIN ") + bare_sql(k), (workspace, vec), prepare=False)
            plan = _short("\n".join(r[0] for r in await cur.fetchall()))
            out["bare_plan"], out["bare_uses_hnsw"] = plan, index_name_for(workspace) in plan
            conn.cursor_factory = _RecordingCursor
        _RecordingCursor.seen.clear()
        recaller = Recaller(pool, Precomputed(embedder, vectors), touch=False, cache_size=0)
        await recaller.search(workspace, query, k)  # the first fills the per-workspace cache
        _RecordingCursor.seen.clear()
        with _recording_client_cursor():
            await recaller.search(workspace, query, k)
        seen = list(_RecordingCursor.seen)
        # Every round trip one search sends, pool health check included (round trips add up); a string of
        # several statements is one round trip, its statements separated by " ; ".
        out["statements_per_search"] = [" ; ".join(" ".join(part.split())[:60] for part in _text(q).split(";\n"))
                                        for q, _ in seen]
        async with workspace_tx(pool, workspace) as conn:
            conn.cursor_factory = psycopg.AsyncCursor
            stmts = [(q, p) for q, p in seen if "drawers" in _text(q)]
            if stmts:
                q, p = max(stmts, key=lambda s: len(_text(s[0])))  # the search statement, not the size count
                pre = "EXPLAIN (ANALYZE, TIMING OFF, COSTS OFF) "
                if isinstance(q, str) and ";\n" in q:  # one round trip of statements: explain the last
                    # Only the first (the workspace setting): the graph lookup's deadline, under EXPLAIN's
                    # own work, would only cancel this; the candidates then take no graph drawers.
                    *before, q = q.split(";\n")
                    cur = psycopg.AsyncClientCursor(conn)
                    await cur.execute(before[0], p)
                    await cur.execute(pre + q, p)
                else:
                    cur = await conn.execute(sql.SQL(pre) + q if isinstance(q, sql.Composable) else pre + q, p)
                hplan = _short("\n".join(r[0] for r in await cur.fetchall()))
                out["hybrid_plan"], out["hybrid_uses_hnsw"] = hplan, index_name_for(workspace) in hplan
    finally:
        await pool.close()
    return out


async def diagnostics(database_url: str, workspace: str, qs: list[tuple[str, np.ndarray]], k: int,
                      ann_candidates: int, ef_search: int | None) -> dict[str, Any]:
    """Outside the timings: how many rows an HNSW scan returns when ``ann_candidates`` are asked
    (pgvector < 0.8 stops at ``hnsw.ef_search``), how many rows match an OR of the query's lexemes
    (what a full-text branch built that way must rank), and the bare lookup's recall@k against an
    exact scan.

    Its own autocommit connection, with the pool's ``ef_search``: a planner setting changed here
    must not leak into a pooled connection's open transaction.
    """
    from pgvector.psycopg import register_vector_async

    ann_rows, fts_rows, recall = [], [], []
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        await register_vector_async(conn)
        if ef_search is not None:
            await conn.execute(sql.SQL("SET hnsw.ef_search = {}").format(sql.Literal(ef_search)))
        for q, v in qs:
            cur = await conn.execute(bare_sql(ann_candidates), (workspace, v), prepare=False)
            ann_rows.append(len(await cur.fetchall()))
            cur = await conn.execute(FTS_COUNT_SQL, (workspace, q))
            row = await cur.fetchone()
            fts_rows.append(int(row[0]) if row else 0)
            cur = await conn.execute(bare_sql(k), (workspace, v), prepare=False)
            approx = {r[0] for r in await cur.fetchall()}
            await conn.execute("SET enable_indexscan = off")
            cur = await conn.execute(exact_sql(k), (workspace, v))
            exact = {r[0] for r in await cur.fetchall()}
            await conn.execute("RESET enable_indexscan")
            recall.append(len(approx & exact) / max(1, len(exact)))
    return {"queries": len(qs), "ann_rows_mean": float(np.mean(ann_rows)), "ann_candidates_asked": ann_candidates,
            "fts_matching_rows_mean": float(np.mean(fts_rows)), "fts_matching_rows_max": int(np.max(fts_rows)),
            "bare_recall_at_k": float(np.mean(recall))}


async def agreement(pool: Any, embedder: Embedder, vectors: dict[str, np.ndarray], workspace: str, k: int,
                    queries: list[str], answers: dict[str, set[tuple[str, str]]],
                    turns_of: dict[str, tuple[tuple[str, str], ...]]) -> dict[str, Any]:
    """How much of what search returns an exhaustive search would return too: the top k of
    ``Recaller.search`` (the workspace's HNSW walk, full-text candidates from its rare words or the pairs
    of its rarest ones, at most ``text_rank_max`` matches ranked) against the same ranking over exact
    candidates (every drawer's distance, every full-text match of an OR of the query's lexemes ranked):
    the recall@k of the shortcuts a large workspace takes, which ANN recall alone does not show.

    Compared by source memory, not by drawer: a synthetic drawer repeats its source's text (``synth_rows``),
    so full text ties ~36 copies of every real turn, and which copy of a tie either path keeps says
    nothing about what it found.

    And LoCoMo's labels at this size: a question is answered in the top k when a hit is (a copy of) one of
    its evidence turns (``answers``: question → (conversation, dia id); ``turns_of``: source text → the
    turns filed as it), counted over the questions whose evidence the workspace holds."""
    from shared.db.drawers import workspace_size
    from shared.db.search import SearchParams, hybrid_search
    from shared.recall import Recaller

    fast = Recaller(pool, Precomputed(embedder, vectors), touch=False, cache_size=0)
    async with workspace_tx(pool, workspace) as conn:
        size = await workspace_size(conn, workspace, 10**9)
    exhaustive = SearchParams(k=k, exact_max=10**9, fts_scan_max=10**9)
    shares, answered_fast, answered_exhaustive = [], [], []
    held = {t for ts in turns_of.values() for t in ts}
    for q in queries:
        got = {_source(h.content) for h in await fast.search(workspace, q, k)}
        async with pool.connection() as conn:
            want = {_source(h.content) for h in await hybrid_search(conn, workspace, q, vectors[q], exhaustive,
                                                                    workspace_size=size, vector_index=False)}
        shares.append(len(got & want) / max(1, len(want)))
        if answers.get(q, set()) & held:
            answered_fast.append(any(set(turns_of.get(c, ())) & answers[q] for c in got))
            answered_exhaustive.append(any(set(turns_of.get(c, ())) & answers[q] for c in want))
    return {"agreement_queries": len(queries), "top_k_vs_exhaustive": float(np.mean(shares)),
            "top_k_vs_exhaustive_min": float(np.min(shares)), "labelled_queries": len(answered_fast),
            "evidence_at_k": float(np.mean(answered_fast)) if answered_fast else None,
            "evidence_at_k_exhaustive": float(np.mean(answered_exhaustive)) if answered_exhaustive else None}


def _source(content: str) -> str:
    """The real turn a drawer of ``synth_rows`` was made from: its content without the copy number."""
    return re.sub(r" #\d+$", "", content)


async def measure(pool: Any, embedder: Embedder, vectors: dict[str, np.ndarray], workspace: str, k: int,
                  warm: list[str], timed: list[str], ref: RefPath | None = None, this: RefPath | None = None,
                  ) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Per-query latency of full / sql / bare / wake_up / inject (and, when given, ``ref`` and ``this``: the
    sql path of another commit and of this tree, each in a worker process of its own), interleaved in a fresh
    shuffled order for every query; and the CPU milliseconds of each call (the bench process and the pool's
    backends; a worker's own process and backends).

    Shuffled, not rotated: a rotation keeps every path's predecessor fixed, so "sql" always ran right
    after "full", whose embedding leaves the model's threads spinning on the cores for a few ms, and
    "bare" never did. A shuffle lets each path follow each other path alike."""
    from shared.inject import inject
    from shared.layers import wake_up
    from shared.recall import Recaller

    # cache_size=0: every query pays its embedding, as a new question does; touch=False: no writes.
    full_r = Recaller(pool, embedder, touch=False, cache_size=0)
    sql_r = Recaller(pool, Precomputed(embedder, vectors), touch=False, cache_size=0)

    async def full(q: str) -> int:
        return len(await full_r.search(workspace, q, k))

    async def sql_only(q: str) -> int:
        return len(await sql_r.search(workspace, q, k))

    async def bare(q: str) -> int:
        # Scoped like every service query (row-level security), so the ratios compare like with like.
        async with workspace_tx(pool, workspace) as conn:
            cur = await conn.execute(bare_sql(k), (workspace, vectors[q]), prepare=False)
            return len(await cur.fetchall())

    async def wake(q: str) -> int:
        # L0 + L1: what an agent loads at the start of a session (no query).
        return len((await wake_up(pool, workspace)).text)

    async def inject_(q: str) -> int:
        # Before a turn: the question as the user's message, embedding included (like "full").
        return (await inject(full_r, workspace, q)).match_count

    fns: dict[str, Callable[[str], Awaitable[int]]] = {"full": full, "sql": sql_only, "bare": bare,
                                                        "wake_up": wake, "inject": inject_}
    workers = {m: w for m, w in ((REF, ref), (THIS, this)) if w is not None}
    methods = METHODS + tuple(workers)
    for q in warm:
        for fn in fns.values():
            await fn(q)
        for w in workers.values():
            await w.search(workspace, q, k)
    times: dict[str, list[float]] = {m: [] for m in methods}
    cpu: dict[str, list[float]] = {m: [] for m in methods}
    backends = await _backend_pids(pool)
    order = random.Random(len(timed))  # seeded: the same orders for the same question count
    with _progress() as bar:
        task = bar.add_task(f"{len(timed)} queries × {len(methods)} paths on {workspace}", total=len(timed))
        for q in timed:
            for m in order.sample(methods, len(methods)):
                if m in workers:
                    ms, cpu_ms = await workers[m].search(workspace, q, k)  # timed in its own process
                    times[m].append(ms)
                    cpu[m].append(cpu_ms)
                    continue
                c0 = time.thread_time() + server_cpu_s(backends)
                t0 = time.perf_counter()
                await fns[m](q)
                times[m].append((time.perf_counter() - t0) * 1000)
                cpu[m].append((time.thread_time() + server_cpu_s(backends) - c0) * 1000)
            bar.advance(task)
    return times, cpu


async def _backend_pids(pool: Any) -> list[int]:
    """The PostgreSQL backends of the pool's connections (all of them, checked out at once)."""
    conns = []
    try:
        for _ in range(pool.max_size):
            conns.append(await pool.getconn())
        pids = []
        for c in conns:
            cur = await c.execute("SELECT pg_backend_pid()")
            row = await cur.fetchone()
            await c.commit()  # not a rollback: psycopg answers one with DEALLOCATE ALL
            pids.append(int(row[0]))
        return pids
    finally:
        for c in conns:
            await pool.putconn(c)


def server_cpu_s(pids: list[int]) -> float:
    """CPU seconds these backends have run (``/proc/<pid>/schedstat``, in nanoseconds): with the CPU time
    of the thread that runs the event loop, what a search costs the machine, which load does not
    inflate as it does wall time. (The thread, not the process: the embedding model's threads spin on
    after a query and would be charged to the next call.)"""
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError, ValueError, IndexError), open(f"/proc/{pid}/schedstat") as f:
            total += int(f.read().split()[0])
    return total / 1e9


def lat_ratio(r: dict[str, Any], m: str) -> str:
    """A path's p99 over bare HNSW's p50: the issue's tail goal (≤ 6)."""
    lat = r["latency_ms"]
    return f"{lat[m]['p99'] / lat['bare']['p50']:.2f}"


def _text(q: Any) -> str:
    return q if isinstance(q, str) else repr(q)


def _short(plan: str) -> str:
    """A plan without the 384 numbers of the query vector."""
    return re.sub(r"'\[[^']{40,}\]'", "'[...]'", plan)


def _progress() -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=console)


# ------------------------------------------------------------------------------------------ main
async def _show(pool: Any, query: str) -> str | None:
    async with pool.connection() as conn:
        cur = await conn.execute(query)
        row = await cur.fetchone()
    return str(row[0]) if row else None


async def run(args: argparse.Namespace, settings: Settings, database_url: str) -> dict[str, Any]:
    from shared.adapters import build_embedder
    from shared.db.pool import open_pool
    from shared.db.search import SearchParams

    turns, questions = load_locomo()
    base = pipeline_drawers(turns, settings)
    embedder = build_embedder(settings)
    try:
        warm_up = getattr(embedder, "warm_up", None)
        if warm_up is not None:
            await warm_up()
        vecs = await base_embeddings(embedder, base, settings.embed_batch)
        picked: list[Question] = random.Random(args.seed).sample(questions, min(len(questions),
                                                                                args.queries + args.warmup))
        qtexts = list(dict.fromkeys(q.question for q in picked))
        answers: dict[str, set[tuple[str, str]]] = {}
        for qq in picked:
            answers.setdefault(qq.question, set()).update((qq.conv, e) for e in qq.evidence)
        vectors = {q: await embedder.embed_query(q) for q in qtexts}  # for the sql and bare paths
        warm, timed = qtexts[: args.warmup], qtexts[args.warmup :]

        # What every path runs with: the server's default, and what the project's pool sets.
        with psycopg.connect(database_url) as c:
            c.execute("SELECT '[1]'::vector")  # loads pgvector in the backend, so its settings show
            row = c.execute("SHOW hnsw.ef_search").fetchone()
            server_ef = int(row[0]) if row else None
        pool = await open_pool(database_url, name="bench-search", min_size=2, max_size=2)
        ref: RefPath | None = None
        this: RefPath | None = None
        refdir = tempfile.TemporaryDirectory(prefix="palace-bench-ref-")
        try:
            if args.compare:
                ref = await RefPath.start(args.compare, database_url, embedder.model_name, vectors, Path(refdir.name))
                this = await RefPath.start(None, database_url, embedder.model_name, vectors, Path(refdir.name))
                console.print(f"--compare: the hybrid SQL path of {ref.ref} and this tree's, each in a process of "
                              "its own, run beside the others, query by query")
            await _show(pool, "SELECT '[1]'::vector")
            ef = await _show(pool, "SHOW hnsw.ef_search")
            ef_search = int(ef) if ef else None
            pgvector_version = await _show(pool, "SELECT extversion FROM pg_extension WHERE extname = 'vector'")
            console.print(f"pgvector {pgvector_version}; hnsw.ef_search on the search connections: {ef_search} "
                          f"(server default {server_ef})")
            sizes: dict[str, Any] = {}
            background_s = 0.0
            if args.background:
                bg_sizes = background_sizes(args.background, args.background_workspaces, args.seed)
                bg_rows = synth_rows(base, vecs, args.background, args.synth, args.noise, args.seed + 7)
                background_s = await asyncio.to_thread(load_background, database_url, base, bg_rows, bg_sizes,
                                                       embedder.model_name)
            embed_ms = []
            for q in timed:
                t0 = time.perf_counter()
                await embedder.embed_query(q)
                embed_ms.append((time.perf_counter() - t0) * 1000)
            for size in args.sizes:
                ws = f"{WS_PREFIX}{size}"
                rows = synth_rows(base, vecs, size, args.synth, args.noise, args.seed)
                calib = calibration(vecs, rows, args.seed)
                if calib["synthetic_source_cos_p50"] is not None:
                    console.print(f"vectors: {len(base):,} real + {size - min(size, len(base)):,} synthetic "
                                  f"({args.synth}); median cosine synthetic→source "
                                  f"{calib['synthetic_source_cos_p50']:.3f}, synthetic→nearest real "
                                  f"{calib['synthetic_nn_real_cos_p50']:.3f}, real→nearest real "
                                  f"{calib['real_nn_cos_p50']:.3f}, unrelated real pair "
                                  f"{calib['real_pair_cos_p50']:.3f}")
                load = await asyncio.to_thread(load_workspace, database_url, ws, base, rows, embedder.model_name,
                                               args.load)
                t0 = time.perf_counter()
                async with maintenance_tx(pool) as conn:  # what maintain does for a workspace past exact search
                    load["common_lexemes"] = await refresh_lexicon(conn, ws, settings.lexicon_common_share)
                load["lexicon_s"] = time.perf_counter() - t0
                load["total_s"] += load["lexicon_s"]
                console.print(f"[bold]{size:,}[/bold] drawers loaded in {load['total_s']:.1f} s: "
                              + ", ".join(f"{k.removesuffix('_s')} {v:.1f} s" for k, v in load.items()
                                          if k.endswith("_s") and k != "total_s"))
                plans = await explain(database_url, embedder, ws, vectors, timed[0], args.k)
                console.print(f"EXPLAIN bare lookup (uses HNSW: {plans['bare_uses_hnsw']}):")
                console.print(plans["bare_plan"], markup=False, highlight=False)
                if "hybrid_plan" in plans:
                    scans = [ln for ln in plans["hybrid_plan"].splitlines()
                             if "Scan" in ln or "Execution Time" in ln]
                    console.print(f"EXPLAIN ANALYZE of the statement Recaller.search sends, scan nodes "
                                  f"(uses HNSW: {plans['hybrid_uses_hnsw']}):")
                    console.print("\n".join(scans), markup=False, highlight=False)
                if plans.get("statements_per_search"):
                    sent = [x[:40] or "<empty: pool health check>" for x in plans["statements_per_search"]]
                    console.print(f"statements one search sends: {len(sent)} ({'; '.join(sent)})",
                                  markup=False, highlight=False)
                diag = await diagnostics(database_url, ws, [(q, vectors[q]) for q in timed[: args.diag_queries]],
                                         args.k, SearchParams().ann_candidates, ef_search)
                in_ws = base[: min(size, len(base))]  # synth_rows: the real drawers first, then copies of them
                diag.update(await agreement(pool, embedder, vectors, ws, args.k, timed[: args.agreement_queries],
                                            answers, {d.content: d.turns for d in in_ws}))
                times, cpu = await measure(pool, embedder, vectors, ws, args.k, warm, timed, ref, this)
                stats = {m: percentiles(t) for m, t in times.items()}
                sizes[str(size)] = {
                    "workspace": ws, "calibration": calib, "load": load, "explain": plans, "diagnostics": diag,
                    "latency_ms": stats,
                    "cpu_ms_mean": {m: float(np.mean(c)) for m, c in cpu.items()},
                    "ratios": {**{f"{m}_over_bare_{p}": stats[m][p] / stats["bare"][p]
                                  for m in ("full", "sql", "wake_up") for p in ("p50", "p95", "p99")},
                               **{f"inject_over_full_{p}": stats["inject"][p] / stats["full"][p]
                                  for p in ("p50", "p99")},
                               **({f"{m}_over_bare_{p}": stats[m][p] / stats["bare"][p]
                                   for m in (REF, THIS) for p in ("p50", "p95", "p99")} if ref else {}),
                               **({f"{a}_over_ref_{p}": stats[a][p] / stats[REF][p]
                                   for a in ("sql", THIS) for p in ("p50", "p95", "p99")} if ref else {})},
                }
            if not args.keep:
                with psycopg.connect(database_url, autocommit=True) as conn:
                    conn.execute("DELETE FROM drawers WHERE workspace_id LIKE %s", (WS_PREFIX + "%",))
                # Dead HNSW entries would keep autovacuum busy for minutes, into the next bench.
                settle_drawers(database_url, owned=args.load == "rebuild", force=True)
        finally:
            for w in (ref, this):
                if w is not None:
                    await w.close()
            refdir.cleanup()
            await pool.close()
    finally:
        aclose = getattr(embedder, "aclose", None)
        if aclose is not None:
            await aclose()
    return {"ef_search": ef_search, "ef_search_server_default": server_ef, "pgvector": pgvector_version,
            "base_drawers": len(base), "sizes": sizes, "queries": len(timed), "warmup": len(warm),
            "background": {"drawers": args.background, "workspaces": args.background_workspaces,
                           "load_s": background_s},
            "embed_ms": percentiles(embed_ms), "compare": ref.ref if ref is not None else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",") if x.strip()], default=[10_000, 100_000],
                    help="comma-separated workspace sizes (drawers)")
    ap.add_argument("--queries", type=int, default=200, help="timed LoCoMo questions per size")
    ap.add_argument("--k", type=int, default=10, help="results per search")
    ap.add_argument("--warmup", type=int, default=20, help="other questions run first on every path")
    ap.add_argument("--diag-queries", type=int, default=20, help="questions for the untimed diagnostics")
    ap.add_argument("--agreement-queries", type=int, default=200,
                    help="questions for search against exhaustive search, and LoCoMo's labels at size (untimed)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--synth", choices=["mix", "copy"], default="mix",
                    help="synthetic vectors beyond the real drawers: mixtures of two real vectors leaning to the "
                         "source, or noisy copies of the source (see synth_rows)")
    ap.add_argument("--noise", type=float, default=None,
                    help="expected norm of the Gaussian noise added to synthetic vectors (default: 0.1 for mix, "
                         "0.25 for copy, i.e. a copy at the real nearest-neighbour distance)")
    ap.add_argument("--load", choices=["insert", "rebuild", "auto"], default="auto",
                    help="insert with the HNSW index in place, or drop it, COPY and re-create it "
                         "(auto: rebuild on the bench's own embedded stack, insert on external servers)")
    ap.add_argument("--keep", action="store_true", help="keep the last workspace loaded")
    ap.add_argument("--background", type=int, default=0,
                    help="drawers of other tenants in the same table (kept and reused between runs)")
    ap.add_argument("--background-workspaces", type=int, default=998, help="how many other tenants")
    ap.add_argument("--compare", metavar="REF", default=None,
                    help="also time the hybrid SQL path of another commit (e.g. main), in its own process, "
                         "interleaved query by query with this tree's: a before/after from one run")
    ap.add_argument("--scale", action="store_true",
                    help="the 1M-drawer database: 1,000 workspaces (a 100k and a 1k one measured, 998 others "
                         "of 100 to 50k drawers), then the one-line summary for the 100k workspace")
    args = ap.parse_args()
    if args.scale:
        args.sizes = [1_000, 100_000]
        args.background = 1_000_000 - sum(args.sizes)
    if args.noise is None:
        args.noise = 0.1 if args.synth == "mix" else 0.25

    prepare_process()
    with bench_lock():
        _run(args)


def _run(args: argparse.Namespace) -> None:
    """One run, under the stack lock (see ``bench_lock``)."""
    load_at_start = warn_if_busy()
    from palace_dev.supervisor import Supervisor

    settings = bench_settings()
    if args.load == "auto":
        args.load = "insert" if settings.database_url else "rebuild"
    sup = Supervisor(settings, services=[])
    stale_schema: list[str] = []
    t_start = time.perf_counter()
    try:
        with console.status("starting PostgreSQL (and NATS) ..."):
            stale_schema = start_servers(sup)
        res = asyncio.run(run(args, settings, sup.database_url))
    finally:
        with console.status("stopping servers ..."):
            sup.stop()
    out = {"bench": "search_1m" if args.scale else "search",
           "config": {"sizes": args.sizes, "queries": args.queries, "k": args.k, "background": args.background,
                                         "warmup": args.warmup, "seed": args.seed, "synth": args.synth,
                                         "noise": args.noise,
                                         "load": args.load, "embed_model": settings.embed_model,
                                         "compare": args.compare,
                                         "external_database": bool(settings.database_url)},
           "stale_migrations": stale_schema, **res, "wall_s": time.perf_counter() - t_start,
           "machine": {**machine_info(), "loadavg_1m_at_start": load_at_start}}
    path = write_results("search_1m" if args.scale else "search", out)

    t = Table(title=f"search latency, ms — k={args.k}, {res['queries']} LoCoMo questions, hnsw.ef_search="
                    f"{res['ef_search']} (server default {res['ef_search_server_default']}), "
                    f"{settings.embed_model}, {out['machine']['cpus']} cores")
    for col in ("drawers", "path", "p50", "p95", "p99", "÷ bare p50", "÷ bare p95", "÷ bare p99"):
        t.add_column(col, justify="left" if col == "path" else "right")
    labels = {"full": "full (embed + hybrid SQL)", "sql": "hybrid SQL only", "bare": "bare HNSW",
              "wake_up": "wake_up (L0 + L1)", "inject": "inject (embed + search + block)",
              REF: f"hybrid SQL only at {res['compare']} (own process)",
              THIS: "hybrid SQL only, this tree (own process)"}
    for size, r in res["sizes"].items():
        lat = r["latency_ms"]
        shown = list(lat)
        for m in shown:
            ratios = [f"{lat[m][p] / lat['bare'][p]:.2f}" for p in ("p50", "p95", "p99")]
            t.add_row(f"{int(size):,}" if m == "full" else "", labels[m],
                      *(f"{lat[m][p]:.1f}" for p in ("p50", "p95", "p99")), *ratios, end_section=m == shown[-1])
    console.print(t)
    for size, r in res["sizes"].items():
        ra = r["ratios"]
        console.print(f"{int(size):,} drawers: wake_up ÷ bare HNSW p50 {ra['wake_up_over_bare_p50']:.2f} (aim ≤ 3), "
                      f"inject ÷ search p50 {ra['inject_over_full_p50']:.2f} / p99 {ra['inject_over_full_p99']:.2f} "
                      "(aim ≤ 1.2)")
        cpu_ms = r.get("cpu_ms_mean", {})
        if cpu_ms:
            console.print(f"{int(size):,} drawers: CPU ms per search (event-loop thread + its PostgreSQL "
                          "backends), mean: " + ", ".join(f"{m} {cpu_ms[m]:.2f}" for m in ("sql", "bare", REF, THIS)
                                                           if m in cpu_ms))
        if "this_over_ref_p50" in ra:
            console.print(f"{int(size):,} drawers: hybrid SQL ÷ the same at {res['compare']}, both in processes "
                          f"of their own: p50 {ra['this_over_ref_p50']:.2f}, p99 {ra['this_over_ref_p99']:.2f} "
                          f"(the bench's own path ÷ it: {ra['sql_over_ref_p50']:.2f} / {ra['sql_over_ref_p99']:.2f}); "
                          f"p50 / p99 ÷ bare p50 {ra['this_over_bare_p50']:.2f} / {lat_ratio(r, THIS)} now, "
                          f"{ra['ref_over_bare_p50']:.2f} / {lat_ratio(r, REF)} at {res['compare']}")
    d = Table(title="context (untimed)")
    for col in ("drawers", "load s (mode)", "HNSW rows / asked", "rows matching OR of lexemes (mean / max)",
                "bare recall@k vs exact", "search top k vs exhaustive (mean / min)",
                "evidence in top k: search / exhaustive (questions)", "search SQL uses HNSW"):
        d.add_column(col, justify="right")
    for size, r in res["sizes"].items():
        g, ld = r["diagnostics"], r["load"]
        d.add_row(f"{int(size):,}", f"{ld['total_s']:.1f} ({ld['mode']})",
                  f"{g['ann_rows_mean']:.1f} / {g['ann_candidates_asked']}",
                  f"{g['fts_matching_rows_mean']:,.0f} / {g['fts_matching_rows_max']:,}",
                  f"{g['bare_recall_at_k']:.3f}",
                  f"{g['top_k_vs_exhaustive']:.3f} / {g['top_k_vs_exhaustive_min']:.1f}" if "top_k_vs_exhaustive" in g
                  else "n/a",
                  f"{g['evidence_at_k']:.3f} / {g['evidence_at_k_exhaustive']:.3f} ({g['labelled_queries']})"
                  if g.get("evidence_at_k") is not None else "n/a",
                  str(r["explain"].get("hybrid_uses_hnsw", "n/a")))
    console.print(d)
    console.print(f"results: {path.relative_to(path.parents[2])} (wall {out['wall_s']:.0f} s)")
    if args.scale:
        big = res["sizes"][str(max(args.sizes))]
        lat = big["latency_ms"]
        print(f"search_1m sql_p50_ms={lat['sql']['p50']:.2f} sql_p99_ms={lat['sql']['p99']:.2f} "
              f"hnsw_p50_ms={lat['bare']['p50']:.2f} full_p50_ms={lat['full']['p50']:.2f} "
              f"embed_p50_ms={res['embed_ms']['p50']:.2f} ann_recall={big['diagnostics']['bare_recall_at_k']:.3f}")


if __name__ == "__main__":
    main()
