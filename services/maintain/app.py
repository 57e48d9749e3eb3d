"""Build and run the maintain service (no consumers: a leased loop over the lifecycle jobs)."""

from __future__ import annotations

import asyncio
import contextlib

from psycopg_pool import AsyncConnectionPool

from services._runtime import Deps, WorkerSpec, holder_name, run_worker
from services.maintain.indexes import vector_index_loop
from services.maintain.statistics import statistics_loop
from shared.config import Settings
from shared.db.curation import llm_cost_today
from shared.db.tenancy import maintenance_tx
from shared.lifecycle import JOBS, Job, run_job
from shared.logging import get_logger
from shared.metrics import LLM_WORKSPACE_CALLS, LLM_WORKSPACE_TOKENS

log = get_logger("palace.maintain")


async def run_due(deps: Deps, job: Job, holder: str) -> dict[str, int] | None:
    """One job, if its schedule is due and this replica wins its lease.

    Jobs span workspaces by nature, so they run under the maintenance role (migration 0003), in
    batches of one short transaction each; publishing happens between transactions, never inside one.
    A failing job is logged and retried on its next round.
    """
    try:
        counts = await run_job(job, pool=deps.pool, settings=deps.settings, holder=holder, broker=deps.broker)
    except Exception as e:
        log.warning("job_failed", job=job.name, error=repr(e)[:300], exc_info=e)
        return None
    if counts and any(counts.values()):
        log.info("job_done", job=job.name, **counts)
    return counts


class Jobs:
    """Each lifecycle job as a task of its own, started when the previous run of it has ended.

    One round used to run the jobs one after another, so a long one (decay over a large palace, a
    dreaming run waiting on a slow LLM) held back every other, the re-drive of stuck drawers included:
    the safety net that keeps a lost event from losing its drawer. Now a job can only hold back itself;
    each run still takes its lease, so one replica at a time runs it whatever the others do.
    """

    def __init__(self, deps: Deps, holder: str, registry: dict[str, Job] | None = None) -> None:
        self._deps, self._holder = deps, holder
        self._registry = JOBS if registry is None else registry
        self._running: dict[str, asyncio.Task[dict[str, int] | None]] = {}

    def start_due(self) -> list[str]:
        """Start every job not running now (each checks its own schedule and lease); their names."""
        started = []
        for job in self._registry.values():
            task = self._running.get(job.name)
            if task is not None and not task.done():
                continue
            self._running[job.name] = asyncio.create_task(run_due(self._deps, job, self._holder),
                                                          name=f"job-{job.name}")
            started.append(job.name)
        return started

    def running(self) -> list[str]:
        return sorted(n for n, t in self._running.items() if not t.done())

    async def cancel(self) -> None:
        """Stop what runs (its current batch's transaction rolls back; its lease expires or is released)."""
        for task in self._running.values():
            task.cancel()
        await asyncio.gather(*self._running.values(), return_exceptions=True)


async def export_llm_cost(pool: AsyncConnectionPool, settings: Settings) -> int:
    """Set the per-workspace LLM cost gauges from today's ``llm_usage`` rows; returns the series set.

    Read from the table rather than counted in process: the LLM is called by classify and cluster,
    each possibly several replicas, and the table already sums them all. Gauges are cleared first, so a
    workspace that left the named set does not linger with a stale value.
    """
    top = settings.metrics_cost_workspaces
    if top <= 0:
        return 0
    async with maintenance_tx(pool) as conn:
        rows = await llm_cost_today(conn, top=top)
    LLM_WORKSPACE_CALLS.clear()
    LLM_WORKSPACE_TOKENS.clear()
    for ws, purpose, ok, failed, tin, tout in rows:
        LLM_WORKSPACE_CALLS.labels(ws, purpose, "ok").set(ok)
        LLM_WORKSPACE_CALLS.labels(ws, purpose, "error").set(failed)
        LLM_WORKSPACE_TOKENS.labels(ws, purpose, "in").set(tin)
        LLM_WORKSPACE_TOKENS.labels(ws, purpose, "out").set(tout)
    return len(rows)


async def maintenance_loop(deps: Deps, stop: asyncio.Event) -> None:
    jobs = Jobs(deps, holder_name())
    try:
        while not stop.is_set():
            jobs.start_due()
            try:
                await export_llm_cost(deps.pool, deps.settings)
            except Exception as e:  # metrics only: try again next round
                log.warning("llm_cost_export_failed", error=repr(e)[:300])
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), deps.settings.maintain_interval_s)
    finally:
        await jobs.cancel()


SPEC = WorkerSpec(name="maintain", register=lambda deps: None,
                  background=[maintenance_loop, vector_index_loop, statistics_loop])


def main() -> None:
    run_worker(SPEC)
