"""A revert (``palace revert``, or forget undoing a curation UPDATE) of a state archived before
``palace reembed`` moved the palace to another model: the archived vector is not written into the new
space (another dimension would fail the statement, and abort the forget that needed the revert; the same
dimension would mix two models' vectors). The words come back, and the pipeline embeds them again."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import numpy as np
import pytest

from shared.db.decisions import revert, snapshot
from shared.db.drawers import record_history
from shared.db.pool import open_pool
from shared.db.tenancy import workspace_tx
from tests.integration.helpers import Stack, session, wait_for, ws


def _archive_then_revert(stack: Stack, w: str, did: str, archived: dict[str, Any]) -> dict[str, Any]:
    """Archive ``archived`` over the drawer's current state in an UPDATE audit row, rewrite the drawer, revert."""
    async def go() -> dict[str, Any]:
        pool = await open_pool(stack.database_url, name="test-revert", max_size=1, role=stack.settings.db_role)
        try:
            async with workspace_tx(pool, w) as conn:
                old = {**(await snapshot(conn, w, did) or {}), **archived}
                await record_history(conn, w, drawer_id=did, action="UPDATE", actor="test", event_id="e-" + did,
                                     old_value=old, new_value={"outcome": "applied"})
                await conn.execute("UPDATE drawers SET content = content || ' (now: moved)' WHERE workspace_id = %s"
                                   " AND id = %s", (w, did))
                (hid,) = await (await conn.execute(
                    "SELECT id FROM memory_history WHERE workspace_id = %s AND drawer_id = %s AND action = 'UPDATE'",
                    (w, did))).fetchone()  # type: ignore[misc]
                return await revert(conn, w, hid)
        finally:
            await pool.close()
    return asyncio.run(go())


@pytest.mark.parametrize("space", ["another dimension", "another model"])
def test_a_vector_archived_in_another_space_is_not_restored_the_drawer_is_embedded_again(
        stack: Stack, space: str) -> None:
    w = ws()
    line = "The greenhouse heater switches on below four degrees at night"
    stack.publish(session(w, "s1", [line]))
    stack.wait_processed(w, 1)
    (did, model, emb), = stack.sql("SELECT id, embedding_model, embedding::text FROM drawers WHERE workspace_id = %s",
                                   (w,))
    current = np.asarray(json.loads(emb), dtype=np.float32)
    rng = np.random.default_rng(7)
    if space == "another dimension":  # the archive predates embedding_model in snapshots: its dimension tells
        archived = {"embedding": rng.normal(size=64).round(4).tolist()}
        archived_model = None
    else:
        archived = {"embedding": rng.normal(size=len(current)).round(4).tolist(), "embedding_model": "retired-model"}
        archived_model = "retired-model"
    assert archived_model != model
    out = _archive_then_revert(stack, w, did, archived)
    assert "embedding" in out["restored"]
    (content, state), = stack.sql("SELECT content, state FROM drawers WHERE workspace_id = %s", (w,))
    assert content == line and state in ("raw", "processed")
    # Embedded again in the active space, not left with the archived (or the rewritten content's) vector.
    wait_for(lambda: stack.sql("SELECT state FROM drawers WHERE workspace_id = %s", (w,)) == [("processed",)],
             60, "the reverted drawer embedded again")
    (emb2, model2), = stack.sql("SELECT embedding::text, embedding_model FROM drawers WHERE workspace_id = %s", (w,))
    again = np.asarray(json.loads(emb2), dtype=np.float32)
    assert model2 == model and len(again) == len(current)
    assert np.allclose(again, current, atol=1e-4), "the words came back, so does their vector in this space"


def test_a_vector_archived_in_this_space_is_restored_as_it_was(stack: Stack) -> None:
    w = ws()
    stack.publish(session(w, "s1", ["The bike lock code is the year the lighthouse was built"]))
    stack.wait_processed(w, 1)
    (did, model, emb), = stack.sql("SELECT id, embedding_model, embedding::text FROM drawers WHERE workspace_id = %s",
                                   (w,))
    archived = np.asarray(json.loads(emb), dtype=np.float32)[::-1].round(4)  # a vector this space could hold
    _archive_then_revert(stack, w, did, {"embedding": archived.tolist(), "embedding_model": model})
    (state, emb2), = stack.sql("SELECT state, embedding::text FROM drawers WHERE workspace_id = %s", (w,))
    assert state == "processed" and np.allclose(np.asarray(json.loads(emb2), dtype=np.float32), archived, atol=1e-4)
