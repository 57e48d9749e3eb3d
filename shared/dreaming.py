"""The dreaming job (``palace maintain dreaming``; maintain runs it every PALACE_DREAMING_EVERY_S):
consolidate each agent/user pair's unpromoted episodes into long-term drawers in the 'dreaming' wing.

Per due pair: claim (a short transaction: shared.db.dreaming.claim_run), synthesise outside any
transaction (the LLM when configured, else the extractive note; a failing, slow or unreadable LLM
falls back), store what was synthesised, publish it as a session.completed (raw first: ingest files
it like any producer's, so it is embedded, classified and searchable), then mark the episodes
promoted. Every step is keyed by the run id, so a crash anywhere is finished by the next attempt
without a second set of drawers.
"""

from __future__ import annotations

import socket
from typing import TYPE_CHECKING, Any

from shared.adapters.llm import LlmClient, Usage
from shared.bus import publish_event
from shared.db import dreaming as sql
from shared.db.curation import record_usage
from shared.db.drawers import record_history
from shared.db.tenancy import maintenance_tx, workspace_tx
from shared.logging import get_logger
from shared.memory import dreaming as dm
from shared.memory.filing import plan_session

if TYPE_CHECKING:
    from shared.lifecycle import JobRun

__all__ = ["dream_pair", "dreaming"]

log = get_logger("palace.dreaming")


async def _synthesise(run: JobRun, ws: str, episodes: list[dm.EpisodeIn]) -> tuple[list[dm.Memory], str, list[str]]:
    s = run.settings
    if s.llm_base_url:
        usage: list[Usage] = []
        try:
            answer = await LlmClient(s).chat(dm.build_messages(episodes), purpose="dreaming", usage=usage)
            memories, warnings = dm.parse_synthesis(answer, [e.id for e in episodes])
            if memories:
                return memories, "llm", warnings
            fallback = ["the LLM answered no valid memory", *warnings]
        except Exception as e:  # a failing, slow or unreadable LLM: the extractive note instead
            fallback = [f"LLM unavailable ({type(e).__name__}): extractive fallback"]
            log.warning("dreaming_llm_fallback", workspace_id=ws, error=repr(e)[:300])
        finally:
            if usage:
                async with workspace_tx(run.pool, ws) as conn:
                    await record_usage(conn, ws, s.llm_model, usage)
        return dm.extractive(episodes), "extractive", fallback
    return dm.extractive(episodes), "extractive", []


async def dream_pair(run: JobRun, ws: str, agent: str, user: str) -> dict[str, Any]:
    """One pair's run: 'busy', 'debounced', 'below_threshold', or what it promoted and filed."""
    s = run.settings
    async with workspace_tx(run.pool, ws) as conn:
        claim = await sql.claim_run(conn, ws, agent, user, holder=run.holder, threshold=s.dreaming_threshold,
                                    max_episodes=s.dreaming_max_episodes, debounce_s=s.dreaming_debounce_s,
                                    stale_s=s.job_lease_ttl_s)
    if isinstance(claim, str):
        return {"outcome": claim}
    memories, source = claim.memories, claim.source or "extractive"
    if memories is None:
        made, source, warnings = await _synthesise(run, ws, claim.episodes)
        async with workspace_tx(run.pool, ws) as conn:
            memories = await sql.save_memories(conn, ws, claim.run_id, run.holder, made, source, warnings)
        if memories is None:
            return {"outcome": "busy"}  # taken over meanwhile: the new holder finishes it
    event = dm.session_event(ws, claim.run_id, agent, user, memories, source, at=claim.claimed_at,
                             episode_times={e.id: e.when for e in claim.episodes if e.when})
    plan = plan_session(event, chunk_chars=s.chunk_chars, chunk_overlap=s.chunk_overlap, min_chars=s.min_chars)
    if run.broker is None:
        raise RuntimeError("dreaming publishes its memories: it needs a bus connection")
    await publish_event(run.broker, s, event)
    drawer_ids = [d.id for d in plan.drawers]
    async with workspace_tx(run.pool, ws) as conn:
        promoted = await sql.finish_run(conn, ws, claim.run_id, run.holder, drawer_ids)
        if promoted:
            await record_history(conn, ws, drawer_id=None, action="DREAM", actor="dreaming",
                                 event_id=f"dreaming:{claim.run_id}", reason=f"{len(claim.episodes)} episodes "
                                 f"consolidated ({source})",
                                 new_value={"run": claim.run_id, "episodes": [e.id for e in claim.episodes],
                                            "drawers": drawer_ids, "agent_id": agent, "user_id": user})
    return {"outcome": "done" if promoted else "busy", "episodes": promoted, "drawers": len(drawer_ids),
            "source": source}


async def dreaming(run: JobRun) -> dict[str, int]:
    """The job: every due pair, one at a time (each its own claim), with progress."""
    s = run.settings
    async with maintenance_tx(run.pool) as conn:
        pairs = await sql.due_pairs(conn, s.dreaming_threshold)
    out = {"pairs_due": len(pairs), "runs": 0, "episodes_promoted": 0, "drawers_filed": 0, "llm": 0,
           "extractive": 0, "skipped": 0}
    for i, (ws, agent, user, _) in enumerate(pairs):
        r = await dream_pair(run, ws, agent, user)
        if r["outcome"] == "done":
            out["runs"] += 1
            out["episodes_promoted"] += r["episodes"]
            out["drawers_filed"] += r["drawers"]
            out[r["source"]] += 1
        else:
            out["skipped"] += 1
        await run.checkpoint(i + 1, len(pairs))
    if out["runs"]:
        log.info("dreaming_done", host=socket.gethostname(), **out)
    return out
