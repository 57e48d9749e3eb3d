"""Shared plumbing of the benchmarks: where the stack lives, the LoCoMo data, results files, stats.

Every bench runs its own embedded stack under ``.devstack-bench`` so that a measurement never
disturbs (or is disturbed by) the developer's ``.devstack`` or the tests' ``.devstack-test``;
``PALACE_DATABASE_URL`` / ``PALACE_NATS_URL`` still win when set, as everywhere in Palace.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
from rich.console import Console

REPO = Path(__file__).resolve().parents[1]
# The benches' embedded stack; PALACE_BENCH_STACK (relative to the repository) gives one bench a directory of
# its own, as bench/pipeline.py does.
BENCH_STACK = REPO / os.environ.get("PALACE_BENCH_STACK", ".devstack-bench")
RESULTS = REPO / "bench" / "results"
CACHE = RESULTS / ".cache"
LOCOMO_DEV = Path(os.environ.get("PALACE_BENCH_LOCOMO", REPO.parent / "shared" / "bench" / "locomo-dev.json"))

# Piped output (CI logs, `| tee`) would otherwise wrap the tables at 80 columns.
console = Console(width=None if sys.stdout.isatty() else 150)

__all__ = [
    "BENCH_STACK",
    "CACHE",
    "LOCOMO_DEV",
    "REPO",
    "RESULTS",
    "Question",
    "Turn",
    "bench_lock",
    "bench_settings",
    "check_schema",
    "console",
    "drawer_embed_text",
    "free_port_block",
    "load_locomo",
    "machine_info",
    "module_at",
    "own_database",
    "percentiles",
    "prepare_process",
    "settle_drawers",
    "start_servers",
    "warn_if_busy",
    "wipe_bench_stack",
    "write_results",
]


@dataclass(frozen=True, slots=True)
class Turn:
    """One LoCoMo dialogue turn (text verbatim)."""

    conv: str
    session: str
    dia_id: str
    speaker: str
    text: str


@dataclass(frozen=True, slots=True)
class Question:
    conv: str
    question: str
    category: int
    evidence: tuple[str, ...] = ()  # the dia ids of the turns that answer it


def load_locomo(path: Path = LOCOMO_DEV) -> tuple[list[Turn], list[Question]]:
    """All turns (conversation order) and all questions of the LoCoMo dev split."""
    if not path.exists():
        raise SystemExit(f"LoCoMo data not found at {path} (set PALACE_BENCH_LOCOMO)")
    data = json.loads(path.read_text())
    turns: list[Turn] = []
    questions: list[Question] = []
    for conv in data:
        cid = conv["sample_id"]
        for sess in conv["sessions"]:
            for t in sess["turns"]:
                turns.append(Turn(cid, sess["session_id"], t["dia_id"], t["speaker"], t["text"]))
        for q in conv["questions"]:
            questions.append(Question(cid, q["question"], int(q["category"]), tuple(q.get("evidence") or ())))
    return turns, questions


def bench_settings(**overrides: Any) -> Any:
    """Settings from the environment, but with the bench's own embedded stack directory."""
    from shared.config import Settings

    return Settings(devstack_dir=BENCH_STACK, **overrides)


def prepare_process() -> None:
    """Run from the repository root (services are spawned as ``python -m services.x``), keep
    library logs quiet, and turn SIGTERM into KeyboardInterrupt so ``finally`` blocks stop what
    the bench started even when it is killed politely."""
    os.chdir(REPO)
    from shared.logging import configure_logging

    configure_logging(os.environ.get("PALACE_BENCH_LOG_LEVEL", "WARNING"), json=False)

    def _term(*_: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _term)


@contextlib.contextmanager
def bench_lock() -> Iterator[None]:
    """Hold ``.devstack-bench/bench.lock`` for the whole run.

    Two benches on one stack directory would wreck each other: starting a DevStack "recovers" a
    running one (stops its servers, kills its recorded services). A second run therefore refuses
    to start, naming the run that holds the lock, instead of killing it.
    """
    import fcntl

    BENCH_STACK.mkdir(parents=True, exist_ok=True)
    path = BENCH_STACK / "bench.lock"
    with open(path, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "another process"
            raise SystemExit(f"{BENCH_STACK.name}/ is in use by {holder}; run one bench at a time") from None
        f.seek(0)
        f.truncate()
        f.write(f"pid {os.getpid()}: {' '.join(sys.argv)}\n")
        f.flush()
        try:
            yield
        finally:
            f.truncate(0)
            fcntl.flock(f, fcntl.LOCK_UN)


def free_port_block(n: int, start: int = 19100, stop: int = 29000) -> int:
    """A block of n free ports (``palace_dev.supervisor.free_port_block``) in the bench's own range."""
    from palace_dev.supervisor import free_port_block as block

    return block(n, start=start, stop=stop)


def percentiles(ms: list[float]) -> dict[str, float]:
    a = np.asarray(ms, dtype=np.float64)
    return {
        "p50": float(np.percentile(a, 50)), "p95": float(np.percentile(a, 95)),
        "p99": float(np.percentile(a, 99)), "mean": float(a.mean()), "n": int(a.size),
    }


def machine_info() -> dict[str, Any]:
    """What a reader needs to compare two results files: cores, load, commit."""
    commit, dirty = "", None
    with contextlib.suppress(Exception):
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                                text=True, timeout=5, check=False).stdout.strip()
        dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                                    capture_output=True, text=True, timeout=5, check=False).stdout.strip())
    return {
        "cpus": os.cpu_count(), "loadavg_1m_5m_15m": list(os.getloadavg()), "python": platform.python_version(),
        "platform": platform.platform(), "commit": commit, "uncommitted_changes": dirty,
        "at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def warn_if_busy(threshold: float = 0.7) -> float:
    """Say so when other work is running: on a small machine it skews every absolute figure (the
    side-by-side ratios suffer less, but an OpenMP model on oversubscribed cores degrades unevenly)."""
    load = os.getloadavg()[0]
    if load > threshold * (os.cpu_count() or 1):
        console.print(f"[yellow]warning:[/yellow] 1-minute load average is {load:.2f} on {os.cpu_count()} cores; "
                      "other processes will skew these figures")
    return load


def check_schema(database_url: str) -> list[str]:
    """Migrations whose applied checksum differs from the shipped file.

    The migration runner records checksums but applies each version once, so a database created
    before a migration file was edited silently keeps the old schema (and a bench would measure it).
    """
    import psycopg

    from shared.db.migrate import load_migrations

    with psycopg.connect(database_url) as conn:
        applied = {int(r[0]): str(r[1]) for r in conn.execute("SELECT version, checksum FROM schema_migrations")}
    return [f"{m.version:04d}_{m.name}" for m in load_migrations()
            if m.version in applied and applied[m.version] != m.checksum]


def wipe_bench_stack() -> None:
    """Stop the bench's embedded servers and delete what they hold, all but the lock this run holds: the next
    start is a new database, as a new user's is (its tables without statistics, autovacuum yet to reach them),
    not one warmed by earlier runs."""
    from palace_dev.devstack import DevStack

    DevStack(BENCH_STACK).stop()
    if BENCH_STACK.exists():
        for child in BENCH_STACK.iterdir():
            if child.name != "bench.lock":
                shutil.rmtree(child) if child.is_dir() else child.unlink()


def start_servers(sup: Any) -> list[str]:
    """``sup.start_servers()``, making sure the schema measured is the one in the tree.

    The bench's own embedded stack holds nothing but bench data, so when its schema is stale it is
    deleted and created afresh; an external database is only warned about. Returns the stale
    migrations left in place (empty when the schema is current).
    """
    sup.start_servers()
    stale = check_schema(sup.database_url)
    if stale and sup.stack is not None and Path(sup.stack.root) == BENCH_STACK.resolve():
        console.print(f"[yellow]{BENCH_STACK.name}/ was created with an older {', '.join(stale)}: "
                      "recreating it (bench data only)[/yellow]")
        wipe_bench_stack()
        sup.start_servers()
        stale = check_schema(sup.database_url)
    if stale:
        console.print(f"[yellow]warning:[/yellow] the database was migrated with an older version of {stale}; "
                      "figures reflect that old schema")
    return stale


@contextlib.contextmanager
def bench_servers(settings: Any = None) -> Iterator[tuple[Any, float]]:
    """The bench's PostgreSQL and NATS (no service), under the bench lock, stopped on the way out:
    (supervisor, the machine's load when it started), for a bench that drives the library directly."""
    with bench_lock():
        load = warn_if_busy()
        from palace_dev.supervisor import Supervisor

        sup = Supervisor(settings if settings is not None else bench_settings(), services=[])
        try:
            start_servers(sup)
            yield sup, load
        finally:
            sup.stop()


@contextlib.contextmanager
def own_database(server_url: str, prefix: str) -> Iterator[str]:
    """A new database on the bench's server (``<prefix>_<pid>``), migrated, dropped afterwards: its statistics
    and its rows are the bench's alone (the bench stack's other databases would give the planner another
    picture than the one measured)."""
    import psycopg
    from psycopg import sql

    from shared.db.migrate import apply_migrations

    name = f"{prefix}_{os.getpid()}"
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    info = psycopg.conninfo.conninfo_to_dict(server_url)
    info["dbname"] = name
    url = psycopg.conninfo.make_conninfo(**info)
    try:
        apply_migrations(url, bench_settings().embed_dim)
        yield url
    finally:
        with psycopg.connect(server_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def settle_drawers(database_url: str, *, owned: bool, force: bool = False, min_dead: int = 1000) -> dict[str, Any]:
    """Leave no dead drawers for autovacuum to chew on during a measurement.

    pgvector's HNSW vacuum repairs the graph around every deleted element: after a 100k-row bench
    workspace is deleted, autovacuum spends many minutes of CPU in its HNSW index, and
    on 2 cores that lands in the middle of the next bench (seen: PostgreSQL using 0.9 of a core
    through a whole ingest run). On a database the bench owns, rebuilding the index over the live
    rows and then vacuuming is quick (the fresh index holds no dead entries); elsewhere it only warns.
    """
    import psycopg
    from psycopg import sql

    with psycopg.connect(database_url, autocommit=True) as conn:
        row = conn.execute("SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'drawers'").fetchone()
        dead = int(row[0]) if row else 0
        if not force and dead < min_dead:
            return {"dead_rows": dead, "settled_s": 0.0}
        if not owned:
            console.print(f"[yellow]warning:[/yellow] drawers has {dead:,} dead rows; autovacuum of its HNSW index "
                          "may compete with this measurement")
            return {"dead_rows": dead, "settled_s": 0.0}
        t0 = time.perf_counter()
        with console.status(f"rebuilding the HNSW indexes and vacuuming ({dead:,} dead rows) ..."):
            conn.execute("SET maintenance_work_mem = '1GB'")
            for (name,) in conn.execute("SELECT indexname FROM pg_indexes WHERE tablename = 'drawers'"
                                        " AND indexdef LIKE '%%USING hnsw%%'").fetchall():
                conn.execute(sql.SQL("REINDEX INDEX {}").format(sql.Identifier(name)))
            conn.execute("VACUUM (ANALYZE) drawers")
        return {"dead_rows": dead, "settled_s": time.perf_counter() - t0}


def drawer_embed_text(d: Any) -> str:
    """The text the embed service embeds for a planned drawer (``shared.memory.filing.embedding_text``
    of its content, speaker and, where filing records one, the preceding turn)."""
    from shared.memory.filing import embedding_text

    context = getattr(d, "context", None)
    return embedding_text(d.content, d.speaker, context) if context else embedding_text(d.content, d.speaker)


def write_results(name: str, data: dict[str, Any]) -> Path:
    """Write ``bench/results/<name>.json`` atomically (the ``.tmp`` is git-ignored)."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"{name}.json"
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str) + "\n")
    tmp.replace(out)
    return out


async def cleanup_workspace(database_url: str, workspace: str) -> None:
    """Remove a run's workspace so repeated runs don't grow the bench database: its rows in every table
    keyed by workspace (foreign keys cascade the rest; a table whose rows others still reference is
    retried after them) and its vector index, if maintain built one."""
    import psycopg
    from psycopg import sql

    from shared.db.vector_indexes import drop_vector_index

    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        cur = await conn.execute(
            """SELECT c.table_name FROM information_schema.columns c
                 JOIN information_schema.tables t USING (table_schema, table_name)
                WHERE c.table_schema = 'public' AND c.column_name = 'workspace_id' AND t.table_type = 'BASE TABLE'
                  AND c.table_name NOT IN ('job_leases', 'api_keys', 'vector_indexes')""")
        left = [r[0] for r in await cur.fetchall()]
        for _ in range(3):
            failed = []
            for table in left:
                try:
                    await conn.execute(sql.SQL("DELETE FROM {} WHERE workspace_id = %s").format(sql.Identifier(table)),
                                       (workspace,))
                except psycopg.errors.ForeignKeyViolation:
                    failed.append(table)
            left = failed
    await drop_vector_index(database_url, workspace)


def module_at(ref: str, path: str, name: str) -> ModuleType:
    """The module at ``path`` (in the repository) as it was at git ``ref``, loaded as ``name``, for a bench
    that runs the code before a change beside today's (its imports resolve against today's tree)."""
    import importlib.util
    import tempfile

    src = subprocess.run(["git", "show", f"{ref}:{path}"], cwd=REPO, check=True, capture_output=True,
                         text=True).stdout
    file = Path(tempfile.mkdtemp()) / f"{name}.py"
    file.write_text(src)
    spec = importlib.util.spec_from_file_location(name, file)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses look their module up while the class is built
    spec.loader.exec_module(mod)
    return mod
