"""Subscribers of the cluster service."""

from __future__ import annotations

import asyncio
import contextlib

from nats.aio.msg import Msg

from services._runtime import Deps
from shared.bus import decode_event
from shared.db.drawers import drawers_by_id, drawers_missing_bands, older_twins, record_history, set_dedup_bands
from shared.db.tenancy import maintenance_tx, workspace_tx
from shared.events import DrawerClassified, EntityUpserted
from shared.memory.dedup import decide, wording_bands
from shared.metrics import DRAWERS

__all__ = ["DURABLE", "DURABLE_ENTITIES", "backfill_bands", "register"]

DURABLE = "cluster"
DURABLE_ENTITIES = "cluster-entities"


def register(deps: Deps) -> None:
    s = deps.settings

    @deps.handle(DURABLE)
    async def on_drawer_classified(body: bytes, raw: Msg) -> None:
        """drawer.classified → merge near-duplicates into their older twin (audit in memory_history)."""
        ev: DrawerClassified = decode_event(DrawerClassified, body, s)
        async with workspace_tx(deps.pool, ev.workspace_id) as conn:
            rows = await drawers_by_id(conn, ev.workspace_id, ev.drawer_ids, with_embedding=True)
            decisions = []
            for r in rows:
                if r.state != "processed" or r.embedding is None:
                    continue
                # Ingest stored the bands with the row (the backfill below covers older drawers).
                twins = await older_twins(conn, ev.workspace_id, r.id, r.embedding,
                                          wording_bands(ev.workspace_id, r.content))
                d = decide(r.content, twins, s.dedup_threshold)
                if d.action == "MERGE":
                    decisions.append((r.id, d))
        for did, d in decisions:
            async with workspace_tx(deps.pool, ev.workspace_id) as conn:
                # Merge only while the target is still a live, processed drawer (checked in the same statement).
                cur = await conn.execute(
                    """UPDATE drawers SET state = 'merged', cluster_id = %(t)s, updated_at = now()
                        WHERE workspace_id = %(ws)s AND id = %(id)s AND state = 'processed'
                          AND EXISTS (SELECT 1 FROM drawers t WHERE t.workspace_id = %(ws)s AND t.id = %(t)s
                                         AND t.state = 'processed' AND t.deleted_at IS NULL)""",
                    {"t": d.target, "ws": ev.workspace_id, "id": did},
                )
                if cur.rowcount:
                    await record_history(conn, ev.workspace_id, drawer_id=did, action="MERGE", actor="cluster",
                                         event_id=ev.event_id, reason=d.reason, new_value={"cluster_id": d.target})
                    DRAWERS.labels(deps.service, "merged").inc()

    @deps.handle(DURABLE_ENTITIES)
    async def on_entity_upserted(body: bytes, raw: Msg) -> None:
        """entity.upserted → refresh mention counts of the entities."""
        ev: EntityUpserted = decode_event(EntityUpserted, body, s)
        async with workspace_tx(deps.pool, ev.workspace_id) as conn:
            await conn.execute(
                """UPDATE entities e SET mention_count = m.n, updated_at = now()
                     FROM (SELECT entity_id, count(*) AS n FROM entity_mentions
                            WHERE workspace_id = %(ws)s AND entity_id = ANY(%(ids)s) GROUP BY entity_id) m
                    WHERE e.workspace_id = %(ws)s AND e.id = m.entity_id""",
                {"ws": ev.workspace_id, "ids": ev.entity_ids},
            )


async def backfill_bands(deps: Deps, stop: asyncio.Event) -> None:
    """Give drawers processed before wording bands existed their bands, in small batches, so the
    near-duplicate check finds them too. Idempotent: replicas racing on a batch write the same values."""
    while not stop.is_set():
        done = 0
        with contextlib.suppress(Exception):  # retried next round; a failure here never stops the service
            async with maintenance_tx(deps.pool) as conn:
                rows = await drawers_missing_bands(conn, 500)
                by_ws: dict[str, list[tuple[str, list[int]]]] = {}
                for ws, did, content in rows:
                    by_ws.setdefault(ws, []).append((did, wording_bands(ws, content)))
                for ws, items in by_ws.items():
                    await set_dedup_bands(conn, ws, items)
                done = len(rows)
        if done < 500:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 60.0)
