"""Build and run the maintain service (no consumers: a leased loop over the lifecycle jobs)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket

from psycopg_pool import AsyncConnectionPool

from services._runtime import Deps, WorkerSpec, run_worker
from services.maintain.indexes import vector_index_loop
from shared.config import Settings
from shared.db.curation import llm_cost_today
from shared.db.tenancy import maintenance_tx
from shared.lifecycle import JOBS, run_job
from shared.logging import get_logger
from shared.metrics import LLM_WORKSPACE_CALLS, LLM_WORKSPACE_TOKENS

log = get_logger("palace.maintain")


async def sweep(deps: Deps, holder: str) -> dict[str, int]:
    """One round: every job in the registry whose schedule is due and whose lease this replica wins.

    Jobs span workspaces by nature, so they run under the maintenance role (migration 0003), in
    batches of one short transaction each; publishing happens between transactions, never inside one.
    A failing job is logged and retried on its next round without holding back the others.
    """
    out: dict[str, int] = {}
    for job in JOBS.values():
        try:
            counts = await run_job(job, pool=deps.pool, settings=deps.settings, holder=holder, broker=deps.broker)
        except Exception as e:
            log.warning("job_failed", job=job.name, error=repr(e)[:300], exc_info=e)
            continue
        if counts:
            out.update(counts)
    return out


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
    holder = f"{socket.gethostname()}:{os.getpid()}"
    while not stop.is_set():
        try:
            counts = await sweep(deps, holder)
            if any(counts.values()):
                log.info("sweep", **counts)
        except Exception as e:  # a failed sweep is retried next round; never kill the service
            log.warning("sweep_failed", error=repr(e)[:300], exc_info=e)
        try:
            await export_llm_cost(deps.pool, deps.settings)
        except Exception as e:  # metrics only: try again next round
            log.warning("llm_cost_export_failed", error=repr(e)[:300])
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), deps.settings.maintain_interval_s)


SPEC = WorkerSpec(name="maintain", register=lambda deps: None, background=[maintenance_loop, vector_index_loop])


def main() -> None:
    run_worker(SPEC)
