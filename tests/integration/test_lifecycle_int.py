"""Memory lifecycle against the real PostgreSQL: decay and prune follow their rules in small batches,
never under the floor or the per-workspace minimum; a pruned drawer leaves search and is restored
exactly; expiry ends episodes and the archive past retention; every batch query uses an index."""

from __future__ import annotations

import asyncio
import json
import random
import re
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest

from shared.config import Settings
from shared.db.pool import open_pool
from shared.lifecycle import JOBS, restore, run_job
from tests.integration.helpers import Stack, analyze, wait_for, ws

DIM = 384


def _vec(seed: int) -> str:
    r = random.Random(seed)
    v = [r.gauss(0, 1) for _ in range(DIM)]
    n = sum(x * x for x in v) ** 0.5
    return "[" + ",".join(f"{x / n:.6f}" for x in v) + "]"


def _insert(stack: Stack, workspace: str, rows: list[dict[str, Any]]) -> None:
    """Drawers written straight into the table (as the pipeline leaves them, wording bands included:
    without them cluster's backfill of the running stack would lock and rewrite them at a moment of its
    choosing, and a job's SKIP LOCKED would pass them by), with chosen ages."""
    with psycopg.connect(stack.database_url) as conn, conn.cursor() as cur:
        cur.executemany(
            """INSERT INTO drawers (workspace_id, id, content, content_hash, embedding, embedding_model, state,
                                    memory_type, importance, filed_at, last_accessed_at, access_count, pinned,
                                    session_id, seq, user_id, dedup_bands)
               VALUES (%(ws)s, %(id)s, %(content)s, md5(%(content)s), %(emb)s::vector, 'test', %(state)s, 'fact',
                       %(importance)s, now() - make_interval(days => %(age)s),
                       CASE WHEN %(accessed)s::int IS NULL THEN NULL
                            ELSE now() - make_interval(days => %(accessed)s::int) END,
                       %(access_count)s, %(pinned)s, 's1', %(seq)s, 'u1', '{}')""",
            [{"ws": workspace, "state": "processed", "age": 40, "accessed": None, "access_count": 0, "importance": 3.0,
              "pinned": False, "emb": _vec(i), "seq": i, **r} for i, r in enumerate(rows)],
        )
        cur.executemany(
            "INSERT INTO drawer_sources (workspace_id, drawer_id, session_id, seq) VALUES (%s, %s, 's1', %s)",
            [(workspace, r["id"], i) for i, r in enumerate(rows)],
        )


def _run(stack: Stack, name: str, **overrides: Any) -> dict[str, int]:
    s = stack.settings.model_copy(update=overrides)

    async def go() -> dict[str, int] | None:
        pool = await open_pool(stack.database_url, name="test-lifecycle", max_size=2, role=s.db_role)
        try:
            return await run_job(JOBS[name], pool=pool, settings=s, holder="test", manual=True)
        finally:
            await pool.close()

    out = asyncio.run(go())
    assert out is not None, f"{name}: lease not won"
    return out


def _hot_updates(stack: Stack) -> int:
    return int(stack.sql("SELECT n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = 'drawers'")[0][0])


def _importance(stack: Stack, workspace: str) -> dict[str, float]:
    return {r[0]: round(float(r[1]), 4) for r in stack.sql(
        "SELECT id, importance FROM drawers WHERE workspace_id = %s", (workspace,))}


def test_decay_follows_its_rules_and_never_goes_under_the_floor(stack: Stack) -> None:
    w = ws()
    _insert(stack, w, [
        {"id": "old-idle", "content": "old idle", "importance": 1.0},
        {"id": "old-recalled", "content": "old but recalled", "importance": 1.0, "accessed": 2},
        {"id": "old-recalled-long-ago", "content": "recalled long ago", "importance": 1.0, "accessed": 9},
        {"id": "young", "content": "young", "importance": 1.0, "age": 10},
        {"id": "near-floor", "content": "near the floor", "importance": 0.305},
        {"id": "at-floor", "content": "at the floor", "importance": 0.3},
        {"id": "pinned", "content": "pinned", "importance": 1.0, "pinned": True},
        {"id": "archived", "content": "archived", "importance": 1.0},
        # Importance is what classify judged of a processed memory: a drawer not yet classified, one that
        # failed, and a near-duplicate merged into another (it comes back as itself if that one goes) keep theirs.
        {"id": "raw", "content": "raw", "importance": 1.0, "state": "raw"},
        {"id": "failed", "content": "failed", "importance": 1.0, "state": "failed"},
        {"id": "merged", "content": "merged", "importance": 1.0, "state": "merged"},
    ])
    stack.sql("UPDATE drawers SET deleted_at = now() WHERE workspace_id = %s AND id = 'archived' RETURNING 1", (w,))
    # Never announced, so raw for good: touched in the future, lest the stack's maintain re-drive it as stuck
    # while the walk below runs (classify would then judge its importance).
    stack.sql("UPDATE drawers SET updated_at = now() + interval '1 day' WHERE workspace_id = %s AND id = 'raw'"
              " RETURNING 1", (w,))
    at_floor_written = stack.sql("SELECT updated_at FROM drawers WHERE workspace_id = %s AND id = 'at-floor'", (w,))
    # Batches of 3 keys: the walk crosses many spans (other tests' workspaces too) and must cover all.
    hot_before = _hot_updates(stack)
    out = _run(stack, "decay", maintain_batch=3)
    assert out["decayed"] >= 3
    # Decay's rewrites are HOT (no index touched, the HNSW graph included): most of them at least.
    wait_for(lambda: _hot_updates(stack) - hot_before >= out["decayed"] // 2, 15, "HOT updates counted")
    imp = _importance(stack, w)
    assert imp == {"old-idle": 0.98, "old-recalled": 1.0, "old-recalled-long-ago": 0.98, "young": 1.0,
                   "near-floor": 0.3, "at-floor": 0.3, "pinned": 1.0, "archived": 1.0, "raw": 1.0, "failed": 1.0,
                   "merged": 1.0}
    for _ in range(3):
        _run(stack, "decay", maintain_batch=50)
    imp = _importance(stack, w)
    assert imp["old-idle"] == round(0.98 ** 4, 4)
    assert imp["near-floor"] == 0.3 and imp["at-floor"] == 0.3
    assert min(imp.values()) >= 0.3
    # Once at the floor a drawer is left alone (not rewritten every run).
    assert stack.sql("SELECT updated_at FROM drawers WHERE workspace_id = %s AND id = 'at-floor'",
                     (w,)) == at_floor_written


SNAPSHOT = """SELECT id, content, content_hash, embedding::text, embedding_model, state, memory_type, importance,
                     access_count, last_accessed_at, filed_at, updated_at, session_id, seq, user_id, pinned,
                     (SELECT json_agg(json_build_array(s.session_id, s.seq) ORDER BY s.seq)
                        FROM drawer_sources s WHERE s.workspace_id = d.workspace_id AND s.drawer_id = d.id)
                FROM drawers d WHERE workspace_id = %s AND id = ANY(%s) ORDER BY id"""


def test_prune_archives_keeps_the_minimum_and_restore_brings_back_only_the_archive(stack: Stack) -> None:
    w, small = ws(), ws()
    low = [{"id": f"low-{i:02d}", "content": f"quokka marmalade note {i}", "importance": 0.1 + i / 100}
           for i in range(20)]
    recalled = [{"id": f"rec-{i}", "content": f"recalled low {i}", "importance": 0.1, "access_count": 5}
                for i in range(5)]
    high = [{"id": f"high-{i:03d}", "content": f"important {i}", "importance": 3.0} for i in range(85)]
    _insert(stack, w, low + recalled + high)  # 110 live drawers: 10 over the minimum
    _insert(stack, small, [{"id": f"s-{i}", "content": f"small {i}", "importance": 0.1} for i in range(50)])
    low_ids = [d["id"] for d in low]
    # (A recall bumps access stats, so the snapshot is taken after it: one recall leaves them prunable.)
    hit_ids = [h["id"] for h in stack.search(w, "quokka marmalade note", k=20)]
    assert any(i.startswith("low-") for i in hit_ids)
    wait_for(lambda: stack.sql("SELECT bool_and(access_count = 1) FROM drawers WHERE workspace_id = %s AND "
                               "id = ANY(%s)", (w, hit_ids))[0][0], what="recall's access bump")
    before = stack.sql(SNAPSHOT, (w, low_ids[:10]))

    out = _run(stack, "prune", maintain_batch=4, prune_keep_min=100)
    assert out["archived"] >= 10
    archived = [r[0] for r in stack.sql(
        "SELECT id FROM drawers WHERE workspace_id = %s AND deleted_at IS NOT NULL ORDER BY id", (w,))]
    # Exactly the 10 least important eligible ones; recalled ones are never pruned.
    assert archived == low_ids[:10]
    assert stack.sql("SELECT count(*) FROM drawers WHERE workspace_id = %s AND deleted_at IS NULL", (w,))[0][0] == 100
    assert stack.sql("SELECT count(*) FROM drawers WHERE workspace_id = %s AND deleted_at IS NOT NULL",
                     (small,))[0][0] == 0
    assert stack.sql("SELECT count(*) FROM memory_history WHERE workspace_id = %s AND action = 'ARCHIVE'",
                     (w,))[0][0] == 10
    # Out of every search path.
    hits = stack.search(w, "quokka marmalade note", k=20)
    assert not {h["id"] for h in hits} & set(archived)
    # A second run finds the workspace at its minimum.
    _run(stack, "prune", maintain_batch=4, prune_keep_min=100)
    assert stack.sql("SELECT count(*) FROM drawers WHERE workspace_id = %s AND deleted_at IS NULL", (w,))[0][0] == 100

    # A drawer someone deleted is not the archive's: the whole archive's restore leaves it deleted.
    stack.sql("UPDATE drawers SET deleted_at = now() WHERE workspace_id = %s AND id = 'high-000' RETURNING 1", (w,))

    async def go() -> tuple[int, int]:
        pool = await open_pool(stack.database_url, name="test-restore", max_size=1)
        try:
            s = stack.settings.model_copy(update={"maintain_batch": 3})
            one = await restore(pool, s, w, [archived[0]])
            rest = await restore(pool, s, w)
            return one, rest
        finally:
            await pool.close()

    assert asyncio.run(go()) == (1, 9)
    after = stack.sql(SNAPSHOT, (w, low_ids[:10]))
    imp, seen = 7, 9  # the importance and last_accessed_at columns of SNAPSHOT
    # Embedding, provenance, counts: all as they were; importance raised to the prune threshold (the old
    # value in each RESTORE record), or the next prune would archive them again; the restore counts as a
    # recall, or decay would take them below that threshold at its next run.
    assert [r[:imp] + r[imp + 1:seen] + r[seen + 1:] for r in after] \
        == [r[:imp] + r[imp + 1:seen] + r[seen + 1:] for r in before]
    assert all(r[seen] is not None and (b[seen] is None or r[seen] > b[seen])
               for r, b in zip(after, before, strict=True))
    floor = stack.settings.prune_importance_below
    assert [r[imp] for r in after] == [pytest.approx(max(b[imp], floor)) for b in before]
    olds = stack.sql("SELECT (old_value->>'importance')::real FROM memory_history WHERE workspace_id = %s"
                     " AND action = 'RESTORE' ORDER BY drawer_id", (w,))
    assert [o[0] for o in olds] == [pytest.approx(b[imp]) for b in before]
    assert stack.sql("SELECT id FROM drawers WHERE workspace_id = %s AND deleted_at IS NOT NULL", (w,)) \
        == [("high-000",)]
    assert set(archived) <= {h["id"] for h in stack.search(w, "quokka marmalade note", k=30)}
    _run(stack, "decay", maintain_batch=50)
    _run(stack, "prune", maintain_batch=4, prune_keep_min=100)
    assert not stack.sql("SELECT id FROM drawers WHERE workspace_id = %s AND deleted_at IS NOT NULL"
                         " AND id = ANY(%s)", (w, archived)), "restored, then decayed and archived again at once"


def test_expire_ends_episodes_and_the_archive_past_retention(stack: Stack) -> None:
    w = ws()
    _insert(stack, w, [{"id": "gone", "content": "archived long ago"}, {"id": "kept", "content": "archived lately"},
                       {"id": "live", "content": "live"}, {"id": "twin", "content": "archived long ago!"},
                       {"id": "older", "content": "what gone contradicted"}])
    stack.sql("""UPDATE drawers SET deleted_at = now() - make_interval(days => CASE id WHEN 'gone' THEN 200 ELSE 10
                 END) WHERE workspace_id = %s AND id IN ('gone', 'kept') RETURNING 1""", (w,))
    # A near-duplicate merged into the purged drawer, and a drawer it superseded.
    stack.sql("UPDATE drawers SET state = 'merged', cluster_id = 'gone' WHERE workspace_id = %s AND id = 'twin'"
              " RETURNING 1", (w,))
    stack.sql("UPDATE drawers SET superseded_by = 'gone' WHERE workspace_id = %s AND id = 'older' RETURNING 1", (w,))
    stack.sql("""INSERT INTO episodes (workspace_id, id, session_id, summary, abstract, expires_at) VALUES
                 (%s, 'e-old', 's-old', 'x', 'x', now() - interval '1 day'),
                 (%s, 'e-new', 's-new', 'y', 'y', now() + interval '1 day') RETURNING 1""", (w, w))
    out = _run(stack, "expire", maintain_batch=2)
    assert out["episodes_expired"] >= 1 and out["archive_purged"] >= 1
    assert [r[0] for r in stack.sql("SELECT id FROM drawers WHERE workspace_id = %s ORDER BY id", (w,))] == [
        "kept", "live", "older", "twin"]
    # Not hidden for good behind a drawer that no longer exists.
    assert stack.sql("SELECT id, state, cluster_id, superseded_by FROM drawers WHERE workspace_id = %s"
                     " AND id IN ('older', 'twin') ORDER BY id", (w,)) == [("older", "processed", None, None),
                                                                        ("twin", "processed", None, None)]
    assert stack.sql("SELECT count(*) FROM drawer_sources WHERE workspace_id = %s AND drawer_id = 'gone'",
                     (w,))[0][0] == 0
    assert [r[0] for r in stack.sql("SELECT id FROM episodes WHERE workspace_id = %s", (w,))] == ["e-new"]


def test_a_held_lease_keeps_a_second_runner_out(stack: Stack) -> None:
    s = stack.settings

    async def go() -> tuple[Any, Any]:
        pool = await open_pool(stack.database_url, name="test-lease", max_size=2)
        try:
            from shared.db.maintenance import take_lease
            from shared.db.tenancy import maintenance_tx

            async with maintenance_tx(pool) as conn:
                assert await take_lease(conn, "expire", "other-replica", ttl_s=60, every_s=0)
            blocked = await run_job(JOBS["expire"], pool=pool, settings=s, holder="test", manual=True)
            async with maintenance_tx(pool) as conn:
                await conn.execute("UPDATE job_leases SET expires_at = now() WHERE job = 'expire'")
            freed = await run_job(JOBS["expire"], pool=pool, settings=s, holder="test", manual=True)
            return blocked, freed
        finally:
            await pool.close()

    blocked, freed = asyncio.run(go())
    assert blocked is None and freed is not None


def test_a_job_that_failed_is_due_again_at_once(stack: Stack) -> None:
    """The schedule counts from when a run took its lease; a run that failed (a database blip mid-job) must
    not wait a whole period (a day, for decay and prune) to be tried again."""
    from shared.lifecycle import Job

    s = stack.settings
    attempts = []

    async def flaky(run: Any) -> dict[str, int]:
        attempts.append(1)
        if len(attempts) == 1:
            raise RuntimeError("the database went away mid-job")
        return {"done": 1}

    job = Job(f"test-flaky-{uuid.uuid4().hex[:6]}", "test", lambda _s: 86_400.0, flaky)

    async def go() -> tuple[Any, Any]:
        pool = await open_pool(stack.database_url, name="test-flaky", max_size=2)
        try:
            with pytest.raises(RuntimeError):
                await run_job(job, pool=pool, settings=s, holder="test")
            again = await run_job(job, pool=pool, settings=s, holder="test")  # on schedule, not manual
            later = await run_job(job, pool=pool, settings=s, holder="test")  # it ran: not due for a day
            return again, later
        finally:
            await pool.close()

    again, later = asyncio.run(go())
    assert again == {"done": 1} and later is None and len(attempts) == 2


def test_a_long_job_never_holds_back_the_others(stack: Stack) -> None:
    """maintain runs each job as a task of its own: while one is stuck (a dreaming run waiting on a slow
    LLM, decay over a large palace), another on a short schedule keeps running, and the stuck one is not
    started twice. Real leases in the real database; the two jobs' bodies are the test's."""
    from services._runtime import Deps
    from services.maintain.app import Jobs
    from shared.lifecycle import Job, JobRun

    s = stack.settings
    tag = ws()
    slow_runs, quick_runs = [], []

    async def go() -> tuple[list[str], list[str]]:
        release = asyncio.Event()

        async def slow(run: JobRun) -> dict[str, int]:
            slow_runs.append(run.holder)
            await release.wait()
            return {"slow": 1}

        async def quick(run: JobRun) -> dict[str, int]:
            quick_runs.append(run.holder)
            return {"quick": 1}

        registry = {j.name: j for j in (Job(f"{tag}-slow", "stuck", lambda _: 0.0, slow),
                                        Job(f"{tag}-quick", "due every round", lambda _: 0.0, quick))}
        pool = await open_pool(stack.database_url, name="test-jobs", max_size=4, role=s.db_role)
        jobs = Jobs(Deps(s, "maintain", pool, None), "replica-1", registry=registry)  # type: ignore[arg-type]
        try:
            # Rounds until the quick job ran 4 times (bounded): on a busy machine a round may start it late.
            for _ in range(100):
                jobs.start_due()
                await asyncio.sleep(0.3)
                if len(quick_runs) >= 4:
                    break
            running = jobs.running()
            release.set()
            await asyncio.sleep(0.3)
            return running, jobs.running()
        finally:
            await jobs.cancel()
            await pool.close()

    running, after = asyncio.run(go())
    assert running == [f"{tag}-slow"] and after == []
    assert len(slow_runs) == 1, "a job still running is never started again"
    assert len(quick_runs) >= 4, f"the quick job ran {len(quick_runs)} times while the slow one was stuck"


@pytest.fixture(scope="module")
def big_workspace(stack: Stack) -> str:
    """20k drawers, analysed: at this size a sequential scan is what the planner picks without an index."""
    w = ws()
    with psycopg.connect(stack.database_url) as conn:
        conn.execute(
            """INSERT INTO drawers (workspace_id, id, content, content_hash, state, importance, filed_at, deleted_at,
                                    dedup_bands)
               SELECT %s, 'd' || lpad(g::text, 6, '0'), 'c' || g, md5('c' || g), 'processed', (g %% 50) / 10.0,
                      now() - make_interval(days => g %% 60),
                      CASE WHEN g %% 97 = 0 THEN now() - make_interval(days => g %% 300) END, '{}'
                 FROM generate_series(1, 20000) g""", (w,))
        conn.execute("""INSERT INTO episodes (workspace_id, id, session_id, summary, abstract, expires_at)
                        SELECT %s, 'e' || g, 's' || g, 's', 'a', now() + make_interval(days => g %% 100 - 5)
                          FROM generate_series(1, 20000) g""", (w,))
        analyze(conn, "drawers")
        analyze(conn, "episodes")
    return w


def _plan(stack: Stack, query: str, params: Any) -> str:
    with psycopg.connect(stack.database_url, cursor_factory=psycopg.ClientCursor) as conn:
        conn.execute("SET LOCAL ROLE palace_maintenance")
        rows = conn.execute("EXPLAIN (FORMAT JSON) " + query, params).fetchall()
    return json.dumps(rows[0][0])


@pytest.mark.parametrize("name", ["decay", "prune_span", "archive", "restore", "expire_episodes",
                                  "oldest_expired_episode",
                                  "purge_archive", "oldest_purgeable", "next_ws", "centroid_training_set"])
def test_every_batch_query_uses_an_index(stack: Stack, big_workspace: str, name: str) -> None:
    from shared.db import lifecycle as sql
    from shared.db.centroids import TRAINING_PAIRS_SQL

    w = big_workspace
    s = Settings()
    cases: dict[str, tuple[str, Any]] = {
        "decay": (sql.DECAY_SQL, {"ws": w, "id": "d010000", "n": 500, "floor": 0.3, "factor": 0.98,
                                  "older": 30 * 86400.0, "idle": 7 * 86400.0}),
        "prune_span": (sql.PRUNE_SPAN_SQL, {"ws": w, "id": "d010000", "n": 500, "below": 0.5, "acc": 3}),
        "archive": (sql.ARCHIVE_SQL, {"ws": w, "ids": [f"d{i:06d}" for i in range(1, 500)], "below": 0.5,
                                      "acc": 3}),
        "restore": (sql.RESTORE_SQL, {"ws": w, "ids": None, "n": 500, "actor": "t", "floor": 0.5,
                                      "reason": None, "event": None}),
        "expire_episodes": (sql.EXPIRE_EPISODES_SQL, {"ws": w, "n": 500}),
        "oldest_expired_episode": (sql.OLDEST_EXPIRED_EPISODE_SQL, ()),
        "purge_archive": (sql.PURGE_ARCHIVE_SQL, {"ws": w, "ret": s.archive_retention_days * 86400.0, "n": 500}),
        "oldest_purgeable": (sql.OLDEST_PURGEABLE_SQL, (s.archive_retention_days * 86400.0,)),
        "next_ws": (sql.NEXT_WORKSPACE_SQL, (w,)),
        "centroid_training_set": (TRAINING_PAIRS_SQL, (w,)),
    }
    query, params = cases[name]
    plan = _plan(stack, query, params)
    # The tables the fixture filled to size; a small one beside them (entity_mentions in the purge, a few
    # rows here) may be scanned whole when that is cheaper, as its statistics of the moment decide.
    scanned = re.findall(r'"Node Type": "Seq Scan", [^}]*?"Relation Name": "(\w+)"', plan)
    assert not {"drawers", "episodes"} & set(scanned), plan
    assert "Index" in plan, plan
    if name == "centroid_training_set":  # not the primary key filtered row by row
        assert "drawers_llm_labelled" in plan, plan


def test_operators_run_each_job_restore_and_forget_from_the_cli(stack: Stack, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from services.cli import app

    env = {"PALACE_DATABASE_URL": stack.database_url, "PALACE_NATS_URL": stack.nats_url}
    # What only touches the database asks for nothing else: no NATS URL, and no embedded stack to find one in.
    db_only = {"PALACE_DATABASE_URL": stack.database_url, "PALACE_NATS_URL": "", "PALACE_DEVSTACK_DIR": str(tmp_path)}
    runner = CliRunner()
    for job in JOBS:
        # The stack's own maintain may hold the job's lease this moment: the CLI says so and exits 1 (an
        # operator runs it again when it is done), as the test does for a while.
        deadline = time.monotonic() + 60
        while True:
            r = runner.invoke(app, ["maintain", job], env=env if JOBS[job].needs_bus else db_only)
            if r.exit_code == 0 or "holds the lease" not in r.output or time.monotonic() > deadline:
                break
            time.sleep(1)
        assert r.exit_code == 0, r.output
        assert f"maintain {job}" in r.output
    w = ws()
    a, b = "a" * 32, "b" * 32
    _insert(stack, w, [{"id": a, "content": "archived by hand"}, {"id": b, "content": "kept as is"}])
    # Archived as prune does it: the deletion and its ARCHIVE record at the same moment.
    stack.sql("""WITH d AS (UPDATE drawers SET deleted_at = now() WHERE workspace_id = %s AND id = %s RETURNING id)
                 INSERT INTO memory_history (workspace_id, id, drawer_id, action, actor)
                 SELECT %s, 'archive:a', id, 'ARCHIVE', 'test' FROM d RETURNING 1""", (w, a, w))
    r = runner.invoke(app, ["restore", "--workspace", w, "--drawer", a], env=db_only)
    assert r.exit_code == 0, r.output
    assert stack.sql("SELECT count(*) FROM drawers WHERE workspace_id = %s AND deleted_at IS NULL", (w,))[0][0] == 2
    # A whole id in capitals is the same id (it named nothing, and the forget reported success).
    r = runner.invoke(app, ["forget", "--workspace", w, "--drawer", a.upper(), "--verify", "--by", "ops"], env=env)
    assert r.exit_code == 0, r.output
    assert "nothing of it remains" in r.output
    assert [x[0] for x in stack.sql("SELECT id FROM drawers WHERE workspace_id = %s", (w,))] == [b]
    assert stack.sql("SELECT requested_by FROM forget_audit WHERE workspace_id = %s", (w,)) == [("ops",)]
    # A citation (or short id) is resolved, as over REST and MCP; one that names no drawer is refused.
    wing, room = stack.sql("SELECT wing, room FROM drawers WHERE workspace_id = %s AND id = %s", (w, b))[0]
    r = runner.invoke(app, ["forget", "--workspace", w, "--drawer", "general/fact/cccccccccccc"], env=env)
    assert r.exit_code == 2 and "no live drawer" in r.output, r.output
    r = runner.invoke(app, ["forget", "--workspace", w, "--drawer", f"{wing}/{room}/{b[:12]}"], env=env)
    assert r.exit_code == 0, r.output
    assert stack.sql("SELECT count(*) FROM drawers WHERE workspace_id = %s", (w,)) == [(0,)]
    assert stack.sql("SELECT scope_value FROM forget_audit WHERE workspace_id = %s ORDER BY started_at",
                     (w,)) == [(a,), (b,)]
    # Forget purges the streams too: without a NATS URL it refuses before touching anything, naming it.
    r = runner.invoke(app, ["forget", "--workspace", w, "--drawer", b], env=db_only)
    assert r.exit_code == 2 and "PALACE_NATS_URL" in r.output and "PALACE_DATABASE_URL" not in r.output, r.output
    r = runner.invoke(app, ["forget", "--workspace", w, "--user", "u1", "--all"], env=env)
    assert r.exit_code != 0


def test_a_sweep_round_keeps_its_lease_while_it_runs(stack: Stack) -> None:
    """A sweep round that outlasts its lease's TTL (a slow LLM) renews it, so no other replica starts
    the same round meanwhile; without renewal the lease would lapse after one interval."""
    from services._runtime import Deps, leased_rounds
    from shared.db.maintenance import take_lease
    from shared.db.tenancy import maintenance_tx

    # A lease of 2 s, renewed every 0.7 s: a renewal delayed by a busy machine does not let it lapse.
    s = stack.settings.model_copy(update={"maintain_interval_s": 2.0})
    every = s.maintain_interval_s
    lease = f"{ws()}-sweep"

    async def go() -> tuple[bool, bool]:
        pool = await open_pool(stack.database_url, name="test-sweep-lease", max_size=3, role=s.db_role)
        stop, inside = asyncio.Event(), asyncio.Event()

        async def slow_round() -> None:
            inside.set()
            await asyncio.sleep(3 * every)
            stop.set()

        async def other_replica() -> bool:
            async with maintenance_tx(pool) as conn:
                return await take_lease(conn, lease, "other-replica", ttl_s=every, every_s=0)

        try:
            loop = asyncio.create_task(leased_rounds(Deps(s, "enrich", pool, None), stop, lease,  # type: ignore[arg-type]
                                                     slow_round, failed_event="test_sweep_failed"))
            await asyncio.wait_for(inside.wait(), 30)
            await asyncio.sleep(2 * every)  # past the TTL the round took its lease with
            during = await other_replica()
            await asyncio.wait_for(loop, 30)
            # No renewal after the round: the lease lapses within its TTL of the last renewal, which may
            # have come at the round's very end; a loaded machine gets a few TTLs.
            after = False
            for _ in range(20):
                await asyncio.sleep(every / 2)
                if after := await other_replica():
                    break
            return during, after
        finally:
            await pool.close()

    during, after = asyncio.run(go())
    assert not during, "another replica took the lease while the round still ran"
    assert after


def test_a_sweep_round_stops_when_its_lease_is_lost(stack: Stack) -> None:
    """A replica whose renewals failed until its lease expired, and another replica took it, stops its round:
    the other one runs that round now, and two at once would ask the LLM twice for the same work."""
    from services._runtime import Deps, leased_rounds

    s = stack.settings
    every = s.maintain_interval_s
    lease = f"{ws()}-sweep"
    seen: list[str] = []

    async def go() -> None:
        pool = await open_pool(stack.database_url, name="test-sweep-lost", max_size=3, role=s.db_role)
        stop = asyncio.Event()

        async def long_round() -> None:
            seen.append("started")
            stack.sql("UPDATE job_leases SET holder = 'other-replica', expires_at = now() + interval '1 hour'"
                      " WHERE job = %s RETURNING 1", (lease,))
            try:
                await asyncio.sleep(5 * every)
                seen.append("finished")
            except asyncio.CancelledError:
                seen.append("stopped")
                stop.set()
                raise

        try:
            await asyncio.wait_for(leased_rounds(Deps(s, "enrich", pool, None), stop, lease,  # type: ignore[arg-type]
                                                 long_round, failed_event="test_sweep_failed"), 4 * every)
        finally:
            await pool.close()

    asyncio.run(go())
    assert seen == ["started", "stopped"]
    assert stack.sql("SELECT holder FROM job_leases WHERE job = %s", (lease,)) == [("other-replica",)]
