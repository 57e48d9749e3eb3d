"""An edited message: a session published again with new words at a position (a chat platform's edit).

The new words are stored as the message's current revision and the old ones kept; the drawer the old words
were filed as leaves search (audited, restorable); the next turn is embedded again with the new words as
its context; the first version delivered again changes nothing; a forget takes every revision."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from shared.db.pool import open_pool
from shared.events import SessionCompleted
from shared.forget import Scope, forget, verify
from tests.integration.helpers import Stack, restore, session, wait_for, ws

OLD = "The quarterly board meeting moved to the Harbour Room on the third floor."
NEW = "The quarterly board meeting moved to the Lighthouse Suite on the ninth floor."
TURNS = ["Did anything change for the board meeting this quarter?", OLD,
         "Thanks, I'll update the invitation for everyone."]


def _state(stack: Stack, w: str) -> list[tuple[object, ...]]:
    """Everything an edit or a replay could change, in a stable order."""
    return (stack.sql("SELECT seq, content, revision FROM messages WHERE workspace_id = %s ORDER BY seq", (w,))
            + stack.sql("SELECT seq, revision, content FROM message_revisions WHERE workspace_id = %s"
                        " ORDER BY seq, revision", (w,))
            + stack.sql("SELECT id, deleted_at, state, context, embedding IS NULL FROM drawers WHERE workspace_id = %s"
                        " ORDER BY id", (w,))
            # What ingest audits (the other stages may still be auditing their own decisions meanwhile).
            + stack.sql("SELECT count(*) FROM memory_history WHERE workspace_id = %s AND actor = 'ingest'", (w,)))


def test_an_edited_message_replaces_its_drawer_and_keeps_its_first_text(stack: Stack) -> None:
    w = ws()
    first = session(w, "s1", TURNS)
    stack.publish(first)
    stack.wait_processed(w, 3)
    (old_id,), = stack.sql("SELECT id FROM drawers WHERE workspace_id = %s AND content = %s", (w, OLD))
    (after_id, old_context), = stack.sql("SELECT id, context FROM drawers WHERE workspace_id = %s AND content = %s",
                                         (w, TURNS[2]))
    assert "Harbour Room" in old_context

    stack.publish(session(w, "s1", [TURNS[0], NEW, TURNS[2]]))
    new_id = stack.processed_drawer(w, NEW)[0]
    # The raw message holds the new words, as revision 1; the first words are kept as revision 0.
    assert stack.sql("SELECT content, revision FROM messages WHERE workspace_id = %s AND seq = 1", (w,)) == [(NEW, 1)]
    assert stack.sql("SELECT revision, content, replaced_by IS NOT NULL FROM message_revisions"
                     " WHERE workspace_id = %s", (w,)) == [(0, OLD, True)]
    # The operator sees it in the quality report.
    rep = httpx.get(f"{stack.api_url}/v1/workspaces/{w}/quality", timeout=30).json()
    assert rep["edits"] == {"messages_edited": 1, "earlier_texts_kept": 1}
    # The old words' drawer left search, audited as a deletion a restore undoes.
    (deleted_at,), = stack.sql("SELECT deleted_at FROM drawers WHERE workspace_id = %s AND id = %s", (w, old_id))
    assert deleted_at is not None
    (actor, reason), = stack.sql("SELECT actor, reason FROM memory_history WHERE workspace_id = %s AND drawer_id = %s"
                                 " AND action = 'DELETE'", (w, old_id))
    assert actor == "ingest" and reason.startswith("message edited")
    # The next turn was embedded with the old words as its context: it is embedded again with the new ones.
    wait_for(lambda: stack.sql("SELECT state, context, embedding IS NOT NULL FROM drawers WHERE workspace_id = %s"
                               " AND id = %s", (w, after_id)) == [("processed", NEW, True)],
             what="the next turn embedded again with the new context")
    hits = [h["id"] for h in stack.search(w, "Which room and floor is the quarterly board meeting on?", k=5)]
    assert new_id in hits[:2] and old_id not in hits, hits
    # The episode is rebuilt from the session as it reads now.
    wait_for(lambda: (r := stack.sql("SELECT summary FROM episodes WHERE workspace_id = %s"
                                     " AND announced_at IS NOT NULL AND status = 'ready'", (w,)))
             and "Harbour Room" not in r[0][0], what="the episode rebuilt without the old words")

    # The first version delivered again (a redelivery, a re-drive, a replay) changes nothing, and neither does
    # the edit itself.
    before = _state(stack, w)
    stack.redeliver(SessionCompleted.model_validate(first), "ingest")
    stack.redeliver(SessionCompleted.model_validate(session(w, "s1", [TURNS[0], NEW, TURNS[2]])), "ingest")
    stack.wait_processed(w, 4)
    assert _state(stack, w) == before

    # Reversible: the old drawer comes back with a restore.
    assert asyncio.run(restore(stack, w, old_id))
    assert stack.sql("SELECT deleted_at FROM drawers WHERE workspace_id = %s AND id = %s", (w, old_id)) == [(None,)]

    # Forgetting the new drawer forgets the message with every text it held (and the old drawer cut from it).
    async def forget_new() -> dict[str, int]:
        pool = await open_pool(stack.database_url, name="test-edits-forget", max_size=2)
        try:
            scope = Scope(w, "drawer", new_id)
            r = await forget(pool, stack.settings, stack.nats_url, scope, requested_by="test")
            assert r.counts["message_revisions"] == 1 and r.counts["messages"] == 1
            return await verify(pool, stack.settings, stack.nats_url, scope, r.targets)
        finally:
            await pool.close()
    remaining = asyncio.run(forget_new())
    assert remaining["message_revisions"] == 0 and remaining["messages"] == 0, remaining
    assert stack.sql("SELECT count(*) FROM message_revisions WHERE workspace_id = %s", (w,)) == [(0,)]
    assert stack.sql("SELECT count(*) FROM drawers WHERE workspace_id = %s AND id = ANY(%s)",
                     (w, [old_id, new_id])) == [(0,)]


def test_a_session_edited_back_and_forth_by_two_versions_side_by_side_stores_one_current_text(stack: Stack) -> None:
    """Two versions of a new session handled side by side: one of them is stored first, the other is an edit of
    it; whichever, every drawer filed has its raw text stored (the current text or a revision)."""
    w = ws()
    a = session(w, "s1", [TURNS[0], OLD])
    b = session(w, "s1", [TURNS[0], NEW])
    stack.publish(a)
    stack.publish(b)
    wait_for(lambda: stack.sql("SELECT count(*) FROM drawers WHERE workspace_id = %s AND content = ANY(%s)",
                               (w, [OLD, NEW]))[0][0] == 2, what="both versions handled")
    wait_for(lambda: not stack.sql("SELECT 1 FROM drawers WHERE workspace_id = %s AND state = 'raw'"
                                   " AND deleted_at IS NULL", (w,)), what="the live drawers processed")
    stored = {r[0] for r in stack.sql("SELECT content FROM messages WHERE workspace_id = %s UNION ALL"
                                      " SELECT content FROM message_revisions WHERE workspace_id = %s", (w, w))}
    assert {OLD, NEW} <= stored
    live = stack.sql("SELECT content FROM drawers WHERE workspace_id = %s AND content = ANY(%s) AND deleted_at IS NULL",
                     (w, [OLD, NEW]))
    (current,), = stack.sql("SELECT content FROM messages WHERE workspace_id = %s AND seq = 1", (w,))
    assert live == [(current,)]


def test_words_said_in_another_session_stay_until_no_message_says_them(stack: Stack) -> None:
    """The same words in two sessions are one drawer (its id is the normalised text: here the line breaks
    differ): editing them away in one keeps it (still said in the other); editing them away in the other too
    retires it; a third session saying them again brings it back."""
    w = ws()
    said = "The board approved the budget.\r\nWe ship the release on Friday."
    stack.publish(session(w, "s1", [TURNS[0], said]))
    stack.wait_processed(w, 2)
    s2 = session(w, "s2", ["Quick summary for the directors:", said.replace("\r\n", "\n")])
    s2["messages"][1] |= {"name": "Dana", "created_at": "2026-11-03T09:15:00Z", "metadata": {"thread": "t-7"}}
    stack.publish(s2)
    stack.wait_processed(w, 3)
    (old_id,), = stack.sql("SELECT id FROM drawers WHERE workspace_id = %s AND content LIKE 'The board approved%%'",
                           (w,))
    assert stack.sql("SELECT count(*) FROM drawer_sources WHERE workspace_id = %s AND drawer_id = %s",
                     (w, old_id)) == [(2,)]
    assert stack.sql("SELECT session_id, speaker FROM drawers WHERE id = %s", (old_id,)) == [("s1", None)]
    stack.publish(session(w, "s1", [TURNS[0], NEW]))
    stack.processed_drawer(w, NEW)
    assert stack.sql("SELECT deleted_at FROM drawers WHERE workspace_id = %s AND id = %s", (w, old_id)) == [(None,)]
    # It no longer reports the edited message: it was said by Dana in s2, after the turn before it there,
    # and it is embedded again with that speaker and context.
    wait_for(lambda: stack.sql(
        "SELECT session_id, seq, speaker, occurred_at = '2026-11-03T09:15:00Z', metadata->'message', context, state"
        " FROM drawers"
        " WHERE id = %s", (old_id,)) == [("s2", 1, "Dana", True, {"thread": "t-7"},
                                          "Quick summary for the directors:", "processed")],
        what="the drawer kept by s2 repointed to it and embedded again")
    stack.publish(session(w, "s2", ["Quick summary for the directors:", "It is in the Lighthouse Suite now."]))
    stack.processed_drawer(w, "It is in the Lighthouse Suite now.")
    (deleted_at,), = stack.sql("SELECT deleted_at FROM drawers WHERE workspace_id = %s AND id = %s", (w, old_id))
    assert deleted_at is not None
    # Both sightings stay, stale: a forget of the drawer still finds both messages.
    assert stack.sql("SELECT session_id, revision FROM drawer_sources WHERE workspace_id = %s AND drawer_id = %s"
                     " ORDER BY session_id", (w, old_id)) == [("s1", 0), ("s2", 0)]
    stack.publish(session(w, "s3", ["Repeating it for the record:", said]))
    # Back, and reporting the message that says it now (not s2's, which says other words since).
    wait_for(lambda: stack.sql("SELECT deleted_at IS NULL, state, session_id, speaker, context FROM drawers"
                               " WHERE workspace_id = %s AND id = %s", (w, old_id))
             == [(True, "processed", "s3", None, "Repeating it for the record:")],
             what="the words said again brought back")
    assert stack.sql("SELECT actor FROM memory_history WHERE workspace_id = %s AND drawer_id = %s"
                     " AND action = 'RESTORE'", (w, old_id)) == [("ingest",)]


def test_forgetting_a_drawer_edited_away_twice_takes_every_text_its_message_held(stack: Stack) -> None:
    """Three versions of one message: the first's drawer, retired by the second, keeps its sighting through the
    third, so forgetting it finds the message and all its revisions, and the proof finds none left."""
    w = ws()
    third = "The quarterly board meeting is cancelled this time."
    for text in (OLD, NEW, third):
        stack.publish(session(w, "s1", [TURNS[0], text]))
        stack.processed_drawer(w, text)
    (old_id,), = stack.sql("SELECT id FROM drawers WHERE workspace_id = %s AND content = %s", (w, OLD))
    assert [r[0] for r in stack.sql("SELECT content FROM message_revisions WHERE workspace_id = %s ORDER BY revision",
                                    (w,))] == [OLD, NEW]

    async def go() -> tuple[dict[str, int], dict[str, int]]:
        pool = await open_pool(stack.database_url, name="test-edits-forget", max_size=2)
        try:
            scope = Scope(w, "drawer", old_id)
            r = await forget(pool, stack.settings, stack.nats_url, scope, requested_by="test")
            return dict(r.counts), await verify(pool, stack.settings, stack.nats_url, scope, r.targets)
        finally:
            await pool.close()
    counts, remaining = asyncio.run(go())
    assert counts["message_revisions"] == 2 and counts["messages"] == 1, counts
    assert not any(remaining.values()), {k: v for k, v in remaining.items() if v}
    assert stack.sql("SELECT count(*) FROM message_revisions WHERE workspace_id = %s", (w,)) == [(0,)]
    assert stack.sql("SELECT count(*) FROM messages WHERE workspace_id = %s AND content = ANY(%s)",
                     (w, [OLD, NEW, third])) == [(0,)]


def test_forgetting_the_user_who_still_says_it_takes_a_drawer_another_session_edited_away(stack: Stack) -> None:
    """Maria says it; Tom said it too and edited it away. Forgetting Maria must not keep the drawer alive on Tom's
    stale sighting (a message that says something else now) or move it there."""
    w = ws()
    stack.publish(session(w, "s-maria", [TURNS[0], OLD], user_id="maria"))
    stack.publish(session(w, "s-tom", ["Reminder for the directors:", OLD], user_id="tom"))
    stack.wait_processed(w, 3)
    (old_id,), = stack.sql("SELECT id FROM drawers WHERE workspace_id = %s AND content = %s", (w, OLD))
    stack.publish(session(w, "s-tom", ["Reminder for the directors:", NEW], user_id="tom"))
    stack.processed_drawer(w, NEW)
    assert stack.sql("SELECT deleted_at FROM drawers WHERE workspace_id = %s AND id = %s", (w, old_id)) == [(None,)]

    async def go() -> dict[str, int]:
        pool = await open_pool(stack.database_url, name="test-edits-forget", max_size=2)
        try:
            r = await forget(pool, stack.settings, stack.nats_url, Scope(w, "user", "maria"), requested_by="test")
            return dict(r.counts)
        finally:
            await pool.close()
    counts = asyncio.run(go())
    assert counts["drawers"] >= 1, counts
    assert stack.sql("SELECT count(*) FROM drawers WHERE workspace_id = %s AND id = %s", (w, old_id)) == [(0,)]
    # Tom's own history stays: his message says the new words, the old ones kept as its revision.
    assert stack.sql("SELECT content FROM message_revisions WHERE workspace_id = %s AND session_id = 's-tom'",
                     (w,)) == [(OLD,)]


async def test_an_edit_retiring_words_another_session_says_at_that_moment_leaves_them_live(stack: Stack) -> None:
    """Session c edits its words away (the last current sighting elsewhere went with an earlier edit) while
    session b, ingested at that moment, says them. b's ingest waits for c's lock on the drawer, then finds it
    retired and brings it back: it is live, said by b. (Unordered, b's sighting was invisible to c's check and
    c's retirement to b's, and the drawer stayed deleted although b says it.)"""
    from shared.db.forget import writer_tx
    from shared.ingest import file_session
    from shared.memory.filing import plan_session

    w = ws()

    def plan(sid: str, texts: list[str]) -> Any:
        return plan_session(SessionCompleted.model_validate(session(w, sid, texts)))

    pool = await open_pool(stack.database_url, name="test-edits-race", max_size=3)
    try:
        async def ingest(p: Any) -> None:
            async with writer_tx(pool, w) as conn:
                assert await file_session(conn, p, actor="ingest", episode_wait_s=600) is not None

        await ingest(plan("a", [TURNS[0], OLD]))
        await ingest(plan("c", ["Reminder for the directors:", OLD]))
        await ingest(plan("a", [TURNS[0], NEW]))  # a's sighting goes stale; c still says it
        (old_id,), = await asyncio.to_thread(
            stack.sql, "SELECT id FROM drawers WHERE workspace_id = %s AND content = %s", (w, OLD))
        c_locked, release = asyncio.Event(), asyncio.Event()

        async def edit_c() -> None:
            async with writer_tx(pool, w) as conn:
                filed = await file_session(conn, plan("c", ["Reminder for the directors:", "Cancelled."]),
                                           actor="ingest", episode_wait_s=600)
                assert filed is not None and filed.settled.retired == [old_id]
                c_locked.set()
                await release.wait()  # committed only once b is under way

        c = asyncio.create_task(edit_c())
        await c_locked.wait()
        b = asyncio.create_task(ingest(plan("b", ["For the minutes:", OLD])))
        await asyncio.sleep(1.0)
        assert not b.done(), "b's ingest must wait for the drawer c is retiring"
        release.set()
        await asyncio.wait_for(asyncio.gather(c, b), 30)
    finally:
        await pool.close()
    assert stack.sql("SELECT deleted_at IS NULL FROM drawers WHERE workspace_id = %s AND id = %s",
                     (w, old_id)) == [(True,)]
    assert [r[0] for r in stack.sql("SELECT action FROM memory_history WHERE workspace_id = %s AND drawer_id = %s"
                                    " AND action IN ('DELETE', 'RESTORE') ORDER BY created_at", (w, old_id))] == [
        "DELETE", "RESTORE"]
