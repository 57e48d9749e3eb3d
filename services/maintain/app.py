"""Build and run the maintain service (no consumers: a leased loop)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections import defaultdict

from nats.js.errors import NotFoundError

from services._runtime import Deps, WorkerSpec, run_worker
from services.classify.handlers import DURABLE as CLASSIFY_DURABLE
from services.embed.handlers import DURABLE as EMBED_DURABLE
from services.maintain.indexes import vector_index_loop
from shared.bus import publish_event
from shared.db.maintenance import decay, fail_exhausted, prune, stuck_drawers, take_lease
from shared.db.tenancy import maintenance_tx
from shared.events import DrawerCreated
from shared.ids import event_id_for
from shared.logging import get_logger
from shared.metrics import DRAWERS

log = get_logger("palace.maintain")
MAX_REDRIVES = 3
# The consumers a re-driven drawer goes through before it leaves 'raw'.
REDRIVE_PATH = (EMBED_DURABLE, CLASSIFY_DURABLE)


async def pipeline_backlog(deps: Deps) -> int:
    """Messages waiting in (or held un-acked by) the consumers a re-drive goes through.

    While they hold a backlog, a raw drawer is most likely queued rather than lost: re-driving it
    would put a second copy of its work behind the same queue (feeding the overload), and failing
    it would give up on work that is merely late. A consumer that does not exist counts as empty.
    """
    js = deps.broker.config.connection_state.stream
    total = 0
    for durable in REDRIVE_PATH:
        with contextlib.suppress(NotFoundError):
            info = await js.consumer_info(deps.settings.stream_name, durable)
            total += (info.num_pending or 0) + (info.num_ack_pending or 0)
    return total


async def sweep(deps: Deps, holder: str) -> dict[str, int]:
    """One round of every job whose lease this replica wins. Returns counts for the log."""
    s = deps.settings
    out: dict[str, int] = {}
    # Sweeps span workspaces by nature, so they run under the maintenance role (migration 0003),
    # one short transaction each; publishing happens between transactions, never inside one.
    # Drawers queued behind a backlog are not stuck: re-driving them would only add work.
    backlog = await pipeline_backlog(deps)
    if backlog:
        out["redrive_deferred_backlog"] = backlog
    won = False
    if not backlog:
        async with maintenance_tx(deps.pool) as conn:
            won = await take_lease(conn, "redrive", holder, ttl_s=s.maintain_interval_s,
                                   every_s=s.maintain_interval_s / 2)
    if won:
        async with maintenance_tx(deps.pool) as conn:
            stuck = await stuck_drawers(conn, s.stuck_after_s, MAX_REDRIVES)
        by_ws: dict[tuple[str, int], list[str]] = defaultdict(list)
        for ws, did, n in stuck:
            by_ws[(ws, n)].append(did)
        for (ws, n), ids in by_ws.items():
            for i in range(0, len(ids), 256):
                chunk = ids[i : i + 256]
                await publish_event(deps.broker, s, DrawerCreated(
                    event_id=event_id_for("drawer.redrive", ws, str(n), *chunk), workspace_id=ws,
                    drawer_ids=chunk))
        out["redriven"] = len(stuck)
        async with maintenance_tx(deps.pool) as conn:
            out["failed"] = await fail_exhausted(conn, s.stuck_after_s, MAX_REDRIVES)
        DRAWERS.labels(deps.service, "redriven").inc(out["redriven"])
        DRAWERS.labels(deps.service, "failed").inc(out["failed"])
    async with maintenance_tx(deps.pool) as conn:
        won = await take_lease(conn, "decay", holder, ttl_s=600, every_s=86_400)
    if won:
        async with maintenance_tx(deps.pool) as conn:
            out["decayed"] = await decay(conn, s.decay_after_days, s.decay_factor)
            out["pruned"] = await prune(conn, s.prune_keep_min)
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
