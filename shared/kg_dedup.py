"""Entity dedup after an extraction batch (the cluster service's entity.upserted consumer) and the
operator's side of it (list flags and merges, revert a merge, keep a pair apart, merge a flagged pair).

One read-mostly transaction decides every pair the batch's entities form with their candidates
(flags are written there); each merge then runs in its own short transaction that re-checks both
entities under their row locks, so replicas and redeliveries never merge twice.
"""

from __future__ import annotations

from dataclasses import dataclass

from psycopg_pool import AsyncConnectionPool

from shared.db import entity_dedup as sql
from shared.db.kg import refresh_entities
from shared.db.tenancy import workspace_tx
from shared.logging import get_logger
from shared.memory.entity_dedup import Decision, decide_pair

__all__ = ["DedupOutcome", "dedup_entities", "operator_merge"]

log = get_logger("palace.kg_dedup")


@dataclass(frozen=True)
class DedupOutcome:
    merged: list[str]       # merge ids
    flagged: int
    followups: int          # merged-away entities whose new mentions or facts moved to the survivor


async def dedup_entities(pool: AsyncConnectionPool, workspace_id: str, entity_ids: list[str], *,
                         context_threshold: float, actor: str = "cluster",
                         event_id: str | None = None) -> DedupOutcome:
    """Refresh the entities' mention counts, then merge each into the entity it is the same as, or
    flag it with a look-alike for an operator (shared.memory.entity_dedup says which)."""
    ids = sorted(set(entity_ids))
    merges: list[Decision] = []
    flagged = 0
    # The recount commits on its own: inside the dedup transaction below, its row locks on the entities
    # (a speaker's is in every session) were held through the candidate search, and every extraction
    # refreshing the same entities queued behind it.
    # The entities' dedup keys commit with it, before any search: two new spellings of one entity handled
    # side by side (batches, replicas), each searching before the other's keys were visible, would never meet;
    # with the keys committed first, whichever searches last finds the other.
    async with workspace_tx(pool, workspace_id) as conn:
        await refresh_entities(conn, workspace_id, ids)
        live = [r for r in await sql.live_entities(conn, workspace_id, ids) if r.merged_into is None]
        await sql.index_entity_keys(conn, workspace_id, live)
    async with workspace_tx(pool, workspace_id) as conn:
        followups = await sql.absorb_followups(conn, workspace_id, ids)
        live = [r for r in await sql.live_entities(conn, workspace_id, ids) if r.merged_into is None]
        decided = [(a, b, decide_pair(a, b, context_threshold=context_threshold))
                   for a, b in await sql.candidates_of(conn, workspace_id, live)]
        apart = await sql.kept_apart_pairs(conn, workspace_id,
                                           [(a.id, b.id) for a, b, d in decided if d.action != "none"])
        flags = []
        for a, b, d in decided:
            pair = tuple(sorted((a.id, b.id)))
            if d.action != "none" and pair in apart:
                continue  # an operator (or a revert) said these are different
            if d.action == "flag":
                flags.append((pair, d))
            elif d.action == "merge":
                merges.append(d)
        # In one order, the pairs': two events naming the same look-alikes (extractions running side by
        # side) otherwise upserted the same flags in different orders and deadlocked on them.
        for (lo, hi), d in sorted(flags, key=lambda f: f[0]):
            await sql.flag_pair(conn, workspace_id, lo, hi, d)
            flagged += 1
    done = []
    for d in merges:
        async with workspace_tx(pool, workspace_id) as conn:
            mid = await sql.merge_entities(conn, workspace_id, d, actor=actor, event_id=event_id,
                                           unless_kept_apart=True)
        if mid is not None:
            done.append(mid)
            log.info("entity_merged", workspace_id=workspace_id, merge_id=mid, rule=d.rule, reason=d.reason)
    return DedupOutcome(done, flagged, followups)


async def operator_merge(pool: AsyncConnectionPool, workspace_id: str, survivor: str, loser: str, *,
                         actor: str) -> str:
    """An operator's merge of a flagged (or any) pair: audited and reversible like the automatic ones."""
    if survivor == loser:
        raise sql.MergeError("an entity cannot be merged into itself")
    d = Decision("merge", "operator", f"merged by {actor}", survivor=survivor, loser=loser, score=1.0)
    async with workspace_tx(pool, workspace_id) as conn:
        mid = await sql.merge_entities(conn, workspace_id, d, actor=actor, event_id=None)
    if mid is None:
        raise sql.MergeError("both entities must exist and neither may be merged already")
    return mid
