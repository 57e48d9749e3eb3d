"""The memory-lifecycle jobs and the one registry maintain and ``palace maintain`` run them from.

A job is one entry in ``JOBS``: its name, its schedule (a setting) and an async function doing the
work in small batches, each its own short transaction. ``run_job`` wraps every run in a lease
(``job_leases``) so exactly one replica (or an operator's ``palace maintain <job>``) runs a job at a
time; the lease is renewed after every batch, so a replica that dies mid-run frees the job after
``PALACE_JOB_LEASE_TTL_S`` and one that lost its lease stops at its next batch.
"""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from nats.js.errors import NotFoundError
from psycopg_pool import AsyncConnectionPool

from shared.config import Settings
from shared.db import lifecycle as sql
from shared.db.maintenance import fail_exhausted, stuck_drawers, take_lease
from shared.db.tenancy import maintenance_tx
from shared.logging import get_logger

if TYPE_CHECKING:  # the CLI imports this module for its job names; faststream is most of its import time
    from faststream.nats import NatsBroker

__all__ = ["JOBS", "Job", "JobRun", "LeaseLost", "redrive_idle_s", "restore", "retry_failed", "run_job"]

log = get_logger("palace.lifecycle")

# Progress callback: (units done so far, total units when known).
Progress = Callable[[int, int | None], None]

MAX_REDRIVES = 3
# The consumers whose queued messages may still carry a raw drawer's work (their durable names): embed and
# classify, which a (re-)announced drawer goes through before it leaves 'raw', and ingest, whose
# session.completed stays un-acked from before the drawers' commit until they are announced.
REDRIVE_PATH = ("ingest", "embed", "classify")


class LeaseLost(RuntimeError):
    """Another holder took the job's lease (ours had expired): stop before doing more."""


@dataclass
class JobRun:
    """One run of a job: what it may use, and the checkpoint it calls after every batch."""

    name: str
    pool: AsyncConnectionPool
    settings: Settings
    holder: str
    broker: NatsBroker | None = None
    progress: Progress | None = None
    _renewed: float = field(default_factory=time.monotonic)

    async def checkpoint(self, done: int, total: int | None = None) -> None:
        """Report progress and keep the lease (renewed once a third of its TTL has passed)."""
        if self.progress is not None:
            self.progress(done, total)
        ttl = self.settings.job_lease_ttl_s
        if time.monotonic() - self._renewed >= ttl / 3:
            async with maintenance_tx(self.pool) as conn:
                if not await sql.renew_lease(conn, self.name, self.holder, ttl):
                    raise LeaseLost(f"lease on {self.name!r} was taken over")
            self._renewed = time.monotonic()


@dataclass(frozen=True)
class Job:
    name: str
    help: str
    every_s: Callable[[Settings], float]
    run: Callable[[JobRun], Awaitable[dict[str, int]]]
    needs_bus: bool = False


async def _estimated_drawers(run: JobRun) -> int | None:
    async with maintenance_tx(run.pool) as conn:
        return await sql.estimated_drawer_count(conn)


async def decay(run: JobRun) -> dict[str, int]:
    """importance x factor (never below the floor) for old drawers nobody recalled lately: one walk of
    the primary key in spans of ``maintain_batch`` keys."""
    s = run.settings
    total = await _estimated_drawers(run)
    key: tuple[str, str] | None = sql.START_KEY
    scanned = decayed = 0
    while key is not None:
        async with maintenance_tx(run.pool) as conn:
            key, n = await sql.decay_batch(
                conn, key, batch=s.maintain_batch, factor=s.decay_factor, floor=s.decay_floor,
                older_than_days=s.decay_after_days, idle_days=s.decay_idle_days)
        decayed += n
        scanned += s.maintain_batch if key is not None else 0
        await run.checkpoint(min(scanned, total) if total else scanned, total)
    return {"decayed": decayed}


async def prune(run: JobRun) -> dict[str, int]:
    """Archive the least important, rarely recalled drawers of each workspace, never leaving it with
    fewer than ``prune_keep_min`` live drawers. Archived drawers stay restorable (``restore``).

    Candidates are collected by walking the workspace's primary key in spans (read-only), then the
    lowest-importance ones within the budget are archived in batches, each re-checked under its lock.
    """
    s = run.settings
    ws = ""
    archived = workspaces = 0
    while True:
        async with maintenance_tx(run.pool) as conn:
            nxt = await sql.next_workspace(conn, ws)
            if nxt is None:
                break
            ws = nxt
            budget = await sql.live_drawer_count(conn, ws) - s.prune_keep_min
        workspaces += 1
        if budget <= 0:
            continue
        found: list[tuple[float, str]] = []
        after: str | None = ""
        while after is not None:
            async with maintenance_tx(run.pool) as conn:
                after, cands = await sql.prune_candidates_span(
                    conn, ws, after, batch=s.maintain_batch, importance_below=s.prune_importance_below,
                    accesses_below=s.prune_accesses_below)
            found.extend(cands)
            await run.checkpoint(archived)
        pick = [i for _, i in sorted(found)[:budget]]
        for k in range(0, len(pick), s.maintain_batch):
            async with maintenance_tx(run.pool) as conn:
                archived += await sql.archive_batch(conn, ws, pick[k : k + s.maintain_batch],
                                                    importance_below=s.prune_importance_below,
                                                    accesses_below=s.prune_accesses_below)
            await run.checkpoint(archived)
    return {"archived": archived, "workspaces": workspaces}


async def expire(run: JobRun) -> dict[str, int]:
    """Delete episodes past ``expires_at`` and archived drawers past the archive retention."""
    s = run.settings
    out = {"episodes_expired": 0, "archive_purged": 0}
    for key, step in (
        ("episodes_expired", lambda c: sql.expire_episodes_batch(c, limit=s.maintain_batch)),
        ("archive_purged", lambda c: sql.purge_archive_batch(
            c, retention_days=s.archive_retention_days, limit=s.maintain_batch)),
    ):
        while True:
            async with maintenance_tx(run.pool) as conn:
                n = await step(conn)
            out[key] += n
            await run.checkpoint(sum(out.values()))
            if not n:
                break
    return out


async def pipeline_backlog(broker: NatsBroker, settings: Settings) -> tuple[int, float]:
    """Messages waiting in (or held un-acked by) the consumers a re-drive goes through, and the age of
    the oldest of them (``redrive_idle_s``). A consumer that does not exist counts as empty."""
    from shared.consumers import oldest_unacked_age_s

    js = broker.config.connection_state.stream
    total, oldest = 0, 0.0
    for durable in REDRIVE_PATH:
        with contextlib.suppress(NotFoundError):
            info = await js.consumer_info(settings.stream_name, durable)
            waiting = (info.num_pending or 0) + (info.num_ack_pending or 0)
            total += waiting
            if waiting:
                oldest = max(oldest, await oldest_unacked_age_s(js, settings.stream_name, durable))
    return total, oldest


def redrive_idle_s(backlog: int, oldest_s: float, stuck_after_s: float) -> float | None:
    """How long a raw drawer must have been idle (since its last change) for this round to re-drive it, or
    None when the round waits for the pipeline's backlog.

    A drawer is stuck once it has been raw for ``stuck_after_s`` since its last event. While the backlog
    still holds a message that old, that event may be queued in it rather than lost: re-driving would put a
    second copy of the work behind the same queue (feeding the overload), and failing it would give up on
    work that is merely late, so the round waits. A backlog of only younger messages (a palace ingesting
    without pause always has one) cannot hold the round back, or a stuck drawer would never be re-driven
    while ingest goes on; but the event announcing a drawer's change is published after the commit that
    stamped it, so a drawer idle ``stuck_after_s`` by the clock may have its event among those younger
    messages (a drawer just embedded, its drawer.embedded queued for classify). Only a drawer idle
    ``stuck_after_s`` longer than the oldest queued message is past every message still queued toward it."""
    if backlog <= 0:
        return stuck_after_s
    if oldest_s >= stuck_after_s:
        return None
    return stuck_after_s + oldest_s


async def redrive(run: JobRun) -> dict[str, int]:
    """Re-announce drawers stuck in 'raw'; fail those still raw after every re-drive (never deleted).
    Deferred while the pipeline's backlog holds messages as old as a stuck drawer's last event: drawers
    queued behind it are late, not stuck (``redrive_idle_s``)."""
    from shared.bus import publish_event
    from shared.events import DrawerCreated
    from shared.ids import event_id_for
    from shared.metrics import DRAWERS

    if run.broker is None:
        raise RuntimeError("redrive publishes events: it needs a bus connection")
    s = run.settings
    backlog, oldest = await pipeline_backlog(run.broker, s)
    idle_s = redrive_idle_s(backlog, oldest, s.stuck_after_s)
    if idle_s is None:
        return {"redrive_deferred_backlog": backlog}
    async with maintenance_tx(run.pool) as conn:
        stuck = await stuck_drawers(conn, idle_s, MAX_REDRIVES)
    by_ws: dict[tuple[str, int], list[str]] = defaultdict(list)
    for ws, did, n in stuck:
        by_ws[(ws, n)].append(did)
    for (ws, n), ids in by_ws.items():
        for i in range(0, len(ids), 256):
            chunk = ids[i : i + 256]
            await publish_event(run.broker, s, DrawerCreated(
                event_id=event_id_for("drawer.redrive", ws, str(n), *chunk), workspace_id=ws, drawer_ids=chunk))
    await run.checkpoint(len(stuck))
    async with maintenance_tx(run.pool) as conn:
        failed = await fail_exhausted(conn, idle_s, MAX_REDRIVES)
    DRAWERS.labels("maintain", "redriven").inc(len(stuck))
    DRAWERS.labels("maintain", "failed").inc(failed)
    return {"redriven": len(stuck), "failed": failed}


async def retry_failed(pool: AsyncConnectionPool, broker: NatsBroker, settings: Settings, workspace_id: str,
                       progress: Callable[[int], None] | None = None) -> int:
    """Give a workspace's failed drawers another pass through the pipeline once their cause is fixed (the
    LLM back, the embedding endpoint repaired): each batch is made raw again in one short transaction, then
    announced to embed (which skips those that have a vector) and classify. Returns how many. A crash
    between the two leaves them raw, for maintain's re-drive."""
    import uuid

    from shared.bus import publish_event
    from shared.db.maintenance import revive_failed
    from shared.db.tenancy import workspace_tx
    from shared.events import DrawerCreated
    from shared.ids import event_id_for

    run_id = uuid.uuid4().hex  # a second retry of the same drawers is announced again, not de-duplicated
    total = 0
    after = None
    while True:
        async with workspace_tx(pool, workspace_id) as conn:
            ids, after = await revive_failed(conn, workspace_id, after, 256)
        if not ids:
            return total
        await publish_event(broker, settings, DrawerCreated(
            event_id=event_id_for("drawer.retry", workspace_id, run_id, *ids), workspace_id=workspace_id,
            drawer_ids=ids))
        total += len(ids)
        if progress is not None:
            progress(len(ids))


async def centroids(run: JobRun) -> dict[str, int]:
    """Recompute each workspace's type centroids from its LLM-labelled drawers, one workspace per
    short transaction. A workspace whose training set hashes as before is skipped without reading an
    embedding; types under ``PALACE_CENTROID_MIN_SAMPLES`` are stored but have no say when classifying.
    Kept off the classify path so labelling a batch never waits on a scan of the workspace's labels."""
    from shared.db.centroids import recompute_centroids

    ws = ""
    out = {"workspaces": 0, "recomputed": 0, "unchanged": 0}
    while True:
        async with maintenance_tx(run.pool) as conn:
            nxt = await sql.next_workspace(conn, ws)
            if nxt is None:
                break
            ws = nxt
            changed = await recompute_centroids(conn, ws)
        out["workspaces"] += 1
        out["recomputed" if changed else "unchanged"] += 1
        await run.checkpoint(out["workspaces"])
    return out
async def mentions(run: JobRun) -> dict[str, int]:
    """Bring up to date the mention counts no extraction refreshed: the inline linker's mentions (ingest
    never touches an entity's row, which a speaker's makes the busiest in the workspace) and those a
    lifecycle job removed. ``PALACE_MAINTAIN_BATCH`` entities per short transaction, walked in key order."""
    from shared.db.kg import pending_mention_entities, refresh_entities

    out = {"entities": 0}
    after = ("", "")
    while True:
        async with maintenance_tx(run.pool) as conn:
            batch = await pending_mention_entities(conn, after, run.settings.maintain_batch)
        if not batch:
            return out
        by_ws: dict[str, list[str]] = defaultdict(list)
        for ws, eid in batch:
            by_ws[ws].append(eid)
        for ws in sorted(by_ws):
            async with maintenance_tx(run.pool) as conn:
                out["entities"] += await refresh_entities(conn, ws, by_ws[ws])
        after = batch[-1]
        await run.checkpoint(out["entities"])


async def dreaming(run: JobRun) -> dict[str, int]:
    """Consolidate agent/user pairs' unpromoted episodes into the dreaming wing (shared.dreaming)."""
    from shared.dreaming import dreaming as dream

    return await dream(run)


# The registry: maintain runs every entry on its schedule and `palace maintain <name>` runs one now.
JOBS: dict[str, Job] = {j.name: j for j in (
    Job("redrive", "Re-announce drawers stuck in 'raw'; fail those still raw after every re-drive.",
        lambda s: s.maintain_interval_s / 2, redrive, needs_bus=True),
    Job("decay", "Lower the importance of old drawers nobody recalled lately (never below the floor).",
        lambda s: s.decay_every_s, decay),
    Job("prune", "Archive unimportant, rarely recalled drawers (restorable; keeps a minimum per workspace).",
        lambda s: s.prune_every_s, prune),
    Job("expire", "Delete expired episodes and archived drawers past the archive retention.",
        lambda s: s.expire_every_s, expire),
    Job("centroids", "Recompute type centroids from LLM-labelled drawers (skipped where the labels are unchanged).",
        lambda s: s.centroids_every_s, centroids),
    Job("mentions", "Bring entities' mention counts up to date where no extraction did (the inline linker's).",
        lambda s: s.maintain_interval_s, mentions),
    Job("dreaming", "Consolidate each agent/user pair's unpromoted episodes (from PALACE_DREAMING_THRESHOLD) into "
        "long-term drawers in the dreaming wing, once per threshold.", lambda s: s.dreaming_every_s, dreaming,
        needs_bus=True),
)}


async def run_job(job: Job, *, pool: AsyncConnectionPool, settings: Settings, holder: str,
                  broker: NatsBroker | None = None, manual: bool = False,
                  progress: Progress | None = None) -> dict[str, int] | None:
    """Run ``job`` if this holder wins its lease (and, unless ``manual``, its schedule is due).

    Returns its counts, or None when another holder has it (or it is not due yet).
    """
    async with maintenance_tx(pool) as conn:
        won = await take_lease(conn, job.name, holder, ttl_s=settings.job_lease_ttl_s,
                               every_s=0.0 if manual else job.every_s(settings))
    if not won:
        return None
    run = JobRun(job.name, pool, settings, holder, broker=broker, progress=progress)
    failed = True
    try:
        out = await job.run(run)
        failed = False
        return out
    finally:
        # A run that failed (a database blip mid-job) is due again at the next round, not a period later.
        with contextlib.suppress(Exception):  # an unreleased lease just expires after its TTL
            async with maintenance_tx(pool) as conn:
                await sql.release_lease(conn, job.name, holder, failed=failed)


async def restore(pool: AsyncConnectionPool, settings: Settings, workspace_id: str,
                  drawer_ids: list[str] | None = None, *, actor: str = "operator",
                  progress: Progress | None = None) -> int:
    """Bring drawers prune archived back into search (``drawer_ids`` None: the whole workspace's archive;
    drawers deleted otherwise stay deleted), importance raised to the prune threshold so that the next
    prune does not archive them again, in batches. Returns how many came back."""
    done = 0
    while True:
        async with maintenance_tx(pool) as conn:
            n = await sql.restore_batch(conn, workspace_id, drawer_ids=drawer_ids, limit=settings.maintain_batch,
                                        actor=actor, importance_floor=settings.prune_importance_below)
        done += n
        if progress is not None:
            progress(done, len(drawer_ids) if drawer_ids else None)
        if n < settings.maintain_batch:
            return done

