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


def _named(w: str, sid: str, lines: list[tuple[str, str]]) -> dict[str, object]:
    return session(w, sid, [t for _, t in lines]) | {"messages": [
        {"role": "user", "name": name, "content": t, "created_at": "2026-11-01T10:00:00Z"} for name, t in lines]}


def test_only_a_speakers_own_statement_is_superseded(stack: Stack) -> None:
    """Two named people disagreeing is two facts: Melanie's "no" does not supersede Caroline's "yes";
    Caroline's own later "no" does."""
    w = ws()
    caroline = "The pottery class on Saturdays is enabled for beginners"
    melanie = "The pottery class on Saturdays is disabled for beginners"
    stack.publish(session(w, "s1", []) | _named(w, "s1", [("Caroline", caroline)]))
    stack.wait_processed(w, 1)
    stack.publish(session(w, "s2", []) | _named(w, "s2", [("Melanie", melanie)]))
    stack.wait_processed(w, 2)
    old_id, other_id = _id_of(stack, w, caroline), _id_of(stack, w, melanie)
    # cluster has decided on Melanie's drawer (every drawer gets an audited ADD without an LLM)
    wait_for(lambda: stack.sql("SELECT 1 FROM memory_history WHERE workspace_id = %s AND drawer_id = %s"
                               " AND action = 'ADD'", (w, other_id)), 60, "cluster's decision on the second drawer")
    assert stack.sql("SELECT count(*) FROM drawers WHERE workspace_id = %s AND superseded_by IS NOT NULL",
                     (w,)) == [(0,)]
    # Worded apart from Melanie's, so that it is not her drawer's near-verbatim twin (merged, not compared).
    later = "Sadly the Saturday pottery class for beginners is disabled from this month"
    stack.publish(session(w, "s3", []) | _named(w, "s3", [("caroline", later)]))
    stack.wait_processed(w, 3)
    new_id = _id_of(stack, w, later)
    wait_for(lambda: stack.sql("SELECT superseded_by FROM drawers WHERE workspace_id = %s AND id = %s",
                               (w, old_id))[0][0] == new_id, 60, "Caroline's drawer superseded by her own")
    assert stack.sql("SELECT superseded_by FROM drawers WHERE workspace_id = %s AND id = %s",
                     (w, other_id)) == [(None,)]


def test_two_people_saying_the_same_words_keep_two_drawers(stack: Stack) -> None:
    """A near-verbatim repeat by the same person merges into the older drawer; the same words by someone
    else stay their own drawer (merged, the second speaker's statement would leave recall)."""
    w = ws()
    said = "We moved the weekly sync to Thursdays at 10am."
    stack.publish(session(w, "s1", []) | _named(w, "s1", [("Caroline", said)]))
    stack.wait_processed(w, 1)
    melanie, again = "we moved the weekly sync to thursdays at 10am!", "We moved the weekly sync to Thursdays at 10am"
    stack.publish(session(w, "s2", []) | _named(w, "s2", [("Melanie", melanie), ("Caroline", again)]))
    wait_for(lambda: stack.sql("SELECT count(*) FROM drawers WHERE workspace_id = %s AND state = 'merged'",
                               (w,))[0][0] == 1, what="Caroline's repeat merged")
    # cluster's audited decision on Melanie's drawer (NONE: the same normalised content is already known)
    wait_for(lambda: stack.sql("SELECT h.action FROM memory_history h JOIN drawers d ON d.workspace_id = h.workspace_id"
                               " AND d.id = h.drawer_id WHERE h.workspace_id = %s AND d.speaker = 'Melanie'",
                               (w,)), what="cluster's decision on Melanie's drawer")
    rows = {(r[0], r[1]): r[2] for r in stack.sql(
        "SELECT speaker, content, state FROM drawers WHERE workspace_id = %s", (w,))}
    assert rows == {("Caroline", said): "processed",
                    ("Melanie", melanie): "processed",
                    ("Caroline", again): "merged"}


def test_an_events_merges_and_supersessions_are_written_together_with_their_rules(stack: Stack) -> None:
    """Cluster writes an event's supersessions in one statement and its merges in another
    (shared.db.clustering): each keeps the rule it had one by one. A drawer merges only while processed (and
    not pinned) and only into a live, processed twin; an older drawer named by two newer ones keeps the
    first; one already superseded keeps its mark; another workspace's drawers are neither touched nor taken
    for twins (its 'gone' is live)."""
    import asyncio

    import psycopg

    from shared.db.clustering import merge_many, supersede_many
    from shared.db.pool import open_pool
    from shared.db.tenancy import workspace_tx

    w, other = ws(), ws()
    rows = {"twin": ("processed", False), "gone": ("processed", True), "merged": ("merged", False),
            "x1": ("processed", False), "x2": ("processed", False), "x3": ("processed", False),
            "x4": ("merged", False), "x5": ("processed", False), "y": ("processed", False),
            "old1": ("processed", False), "old2": ("processed", False), "marked": ("processed", False)}
    with psycopg.connect(stack.database_url, autocommit=True) as conn:
        for workspace in (w, other):
            for did, (state, deleted) in rows.items():
                # dedup_bands '{}': the running stack's own backfill must not race this test
                conn.execute("INSERT INTO drawers (workspace_id, id, content, content_hash, state, deleted_at,"
                             " dedup_bands) VALUES (%s, %s, %s, md5(%s), %s, CASE WHEN %s THEN now() END, '{}')",
                             (workspace, did, did, did, state, deleted and workspace == w))
        conn.execute("UPDATE drawers SET superseded_by = 'y' WHERE id = 'marked'")
        conn.execute("UPDATE drawers SET pinned = true WHERE id = 'x5'")  # kept as it is: never merged away

    async def write() -> tuple[set[str], set[str]]:
        pool = await open_pool(stack.database_url, name="test-cluster-writes", max_size=1)
        try:
            async with workspace_tx(pool, w) as conn:
                marked = await supersede_many(conn, w, [("old1", "x1"), ("old1", "x2"), ("old2", "x3"),
                                                        ("marked", "x1"), ("gone", "x1")])
                merged = await merge_many(conn, w, [("x1", "twin"), ("x2", "gone"), ("x3", "merged"),
                                                    ("x4", "twin"), ("x5", "twin"), ("y", "x1")])
                assert await merge_many(conn, w, []) == set() and await supersede_many(conn, w, []) == set()
                return marked, merged
        finally:
            await pool.close()

    marked, merged = asyncio.run(write())
    assert marked == {"old1", "old2"}
    # y's twin x1 was processed when the statement began, so y merges into it as x1 merges into its own.
    assert merged == {"x1", "y"}
    got = {i: (st, c, sb) for i, st, c, sb in stack.sql(
        "SELECT id, state, cluster_id, superseded_by FROM drawers WHERE workspace_id = %s", (w,))}
    assert got["old1"][2] == "x1" and got["old2"][2] == "x3" and got["marked"][2] == "y"
    assert got["gone"][2] is None
    assert got["x1"][:2] == ("merged", "twin") and got["y"][:2] == ("merged", "x1")
    assert [got[i][:2] for i in ("x2", "x3", "x4", "x5")] == [("processed", None), ("processed", None),
                                                              ("merged", None), ("processed", None)]
    assert stack.sql("SELECT count(*) FROM drawers WHERE workspace_id = %s AND (state = 'merged' AND id <> 'x4'"
                     " AND id <> 'merged' OR superseded_by IS NOT NULL AND id <> 'marked')", (other,)) == [(0,)]


def test_a_correction_later_in_the_same_session_supersedes_what_it_corrects(stack: Stack) -> None:
    """Both turns are filed together, so which one cluster finds as the older candidate falls to their ids
    (content hashes); what is superseded is decided by when each was said: the later turn stands."""
    from shared.ids import content_hash, drawer_id

    first = "Dark mode is enabled for the billing dashboard"
    correction = "Dark mode is disabled for the billing dashboard"
    # A workspace where the correction's drawer sorts first, so it is the candidate found for the other.
    w = next(x for x in (ws() for _ in range(100))
             if drawer_id(x, content_hash(correction)) < drawer_id(x, content_hash(first)))
    msgs = [{"role": "user", "name": "Nora", "content": t, "created_at": "2026-11-01T10:00:00Z"}
            for t in (first, "Let me check the settings page.", correction)]
    stack.publish({"workspace_id": w, "session_id": "s1", "messages": msgs,
                   "started_at": "2026-11-01T10:00:00Z", "completed_at": "2026-11-01T10:30:00Z"})
    stack.wait_processed(w, 3)
    old_id, new_id = _id_of(stack, w, first), _id_of(stack, w, correction)
    wait_for(lambda: stack.sql("SELECT count(*) FROM drawers WHERE workspace_id = %s AND superseded_by IS NOT NULL",
                               (w,)) == [(1,)], 60, "one drawer superseded")
    assert stack.sql("SELECT id, superseded_by FROM drawers WHERE workspace_id = %s AND superseded_by IS NOT NULL",
                     (w,)) == [(old_id, new_id)]


def test_a_pair_is_found_by_whichever_of_its_drawers_is_processed_last(stack: Stack) -> None:
    """Drawers are not always processed in the order they were filed (a retried batch, a slow model): here
    the drawers filed last are processed first, and find nothing. The pair is found when the drawer filed
    first is processed, and the filing order still says which one merges into which (the later into the
    earlier) and, said at the same time in two sessions, which one is superseded."""
    w = ws()
    twin, negated = "we moved the weekly sync to thursdays at 10am!", "The nightly backup job is disabled on staging"
    stack.publish(session(w, "s2", [twin, negated]))
    stack.wait_processed(w, 2)
    # Filed an hour from now: the drawers below are filed before them, but processed after.
    stack.sql("UPDATE drawers SET filed_at = now() + interval '1 hour' WHERE workspace_id = %s RETURNING 1", (w,))
    original, stated = "We moved the weekly sync to Thursdays at 10am.", "The nightly backup job is enabled on staging"
    stack.publish(session(w, "s1", [original, stated]))
    stack.wait_processed(w, 4)
    twin_id, negated_id, original_id, stated_id = (_id_of(stack, w, t) for t in (twin, negated, original, stated))
    wait_for(lambda: stack.sql("SELECT count(*) FROM drawers WHERE workspace_id = %s AND (state = 'merged'"
                               " OR superseded_by IS NOT NULL)", (w,)) == [(2,)], 60, "a merge and a supersession")
    got = {i: (st, c, sb) for i, st, c, sb in stack.sql(
        "SELECT id, state, cluster_id, superseded_by FROM drawers WHERE workspace_id = %s", (w,))}
    assert got == {original_id: ("processed", None, None), twin_id: ("merged", original_id, None),
                   stated_id: ("processed", None, negated_id), negated_id: ("processed", None, None)}
    # Audited under the event that found them, with the prior state `palace revert` restores.
    assert sorted(stack.sql("SELECT action, drawer_id FROM memory_history WHERE workspace_id = %s"
                            " AND action IN ('MERGE', 'SUPERSEDE')", (w,))) == [("MERGE", twin_id),
                                                                                  ("SUPERSEDE", stated_id)]
