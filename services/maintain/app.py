"""Build and run the maintain service (no consumers: a leased loop over the lifecycle jobs)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket

from services._runtime import Deps, WorkerSpec, run_worker
from services.maintain.indexes import vector_index_loop
from shared.lifecycle import JOBS, run_job
from shared.logging import get_logger

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


async def maintenance_loop(deps: Deps, stop: asyncio.Event) -> None:
    holder = f"{socket.gethostname()}:{os.getpid()}"
    while not stop.is_set():
        try:
            counts = await sweep(deps, holder)
            if any(counts.values()):
                log.info("sweep", **counts)
        except Exception as e:  # a failed sweep is retried next round; never kill the service
            log.warning("sweep_failed", error=repr(e)[:300], exc_info=e)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), deps.settings.maintain_interval_s)


SPEC = WorkerSpec(name="maintain", register=lambda deps: None, background=[maintenance_loop, vector_index_loop])


def main() -> None:
    run_worker(SPEC)
