"""Contradiction and supersession through the real pipeline (no LLM: the lexical detector)."""

from __future__ import annotations

from tests.integration.helpers import Stack, session, wait_for, ws


def _id_of(stack: Stack, w: str, content: str) -> str:
    return stack.sql("SELECT id FROM drawers WHERE workspace_id = %s AND content = %s", (w, content))[0][0]


def test_a_contradicted_drawer_is_superseded_ranks_below_and_is_kept(stack: Stack) -> None:
    w = ws()
    old_text = "Dark mode is enabled for the billing dashboard"
    new_text = "Dark mode is disabled for the billing dashboard"
    other = "The billing dashboard shows invoices for the last twelve months"
    stack.publish(session(w, "s1", [old_text, other]))
    stack.wait_processed(w, 2)
    stack.publish(session(w, "s2", [new_text]))
    stack.wait_processed(w, 3)
    old_id, new_id, other_id = (_id_of(stack, w, t) for t in (old_text, new_text, other))
    wait_for(lambda: stack.sql("SELECT superseded_by FROM drawers WHERE workspace_id = %s AND id = %s",
                               (w, old_id))[0][0] == new_id, 60, "old drawer superseded by the new one")
    rows = dict(stack.sql("SELECT id, state FROM drawers WHERE workspace_id = %s", (w,)))
    assert rows == {old_id: "processed", new_id: "processed", other_id: "processed"}  # nothing deleted or merged
    assert stack.sql("SELECT superseded_by FROM drawers WHERE workspace_id = %s AND id IN (%s, %s)",
                     (w, new_id, other_id)) == [(None,), (None,)]
    (hist,) = stack.sql("SELECT reason, old_value, new_value FROM memory_history WHERE workspace_id = %s"
                        " AND action = 'SUPERSEDE'", (w,))
    assert "enabled/disabled" in hist[0]
    assert hist[1] == {"superseded_by": None} and hist[2]["superseded_by"] == new_id
    hits = [h["id"] for h in stack.search(w, "is dark mode enabled for the billing dashboard", k=3)]
    assert hits.index(new_id) < hits.index(old_id)
    quality = stack.sql("SELECT count(*) FROM drawers WHERE workspace_id = %s AND superseded_by IS NOT NULL", (w,))
    assert quality == [(1,)]


def test_reverting_a_supersession_restores_the_older_drawer(stack: Stack) -> None:
    import os
    import subprocess
    import sys

    w = ws()
    stack.publish(session(w, "s1", ["The nightly backup job is enabled on the staging cluster"]))
    stack.wait_processed(w, 1)
    stack.publish(session(w, "s2", ["The nightly backup job is disabled on the staging cluster"]))
    stack.wait_processed(w, 2)
    wait_for(lambda: stack.sql("SELECT id FROM memory_history WHERE workspace_id = %s AND action = 'SUPERSEDE'",
                               (w,)), 60, "a supersession")
    ((hid, drawer),) = stack.sql("SELECT id, drawer_id FROM memory_history WHERE workspace_id = %s"
                                 " AND action = 'SUPERSEDE'", (w,))
    env = {**os.environ, "PALACE_DATABASE_URL": stack.database_url, "PALACE_NATS_URL": stack.nats_url}
    out = subprocess.run([sys.executable, "-m", "services.cli", "revert", hid, "-w", w], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert stack.sql("SELECT superseded_by FROM drawers WHERE workspace_id = %s AND id = %s", (w, drawer)) == [(None,)]
    # without an LLM every other drawer is kept as new (ADD), and that too is audited
    assert stack.sql("SELECT count(*) FROM memory_history WHERE workspace_id = %s AND action = 'ADD'", (w,)) == [(2,)]
