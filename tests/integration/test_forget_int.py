"""Forget against the real stack: a user forgotten while their sessions are still being published and
processed leaves nothing anywhere once the pipeline drains (proved by ``verify``), every other user's
data is intact (counts and content hashes compared), and nothing comes back after a redelivery or a
dead-letter re-drive. Also: the API route, drawer and workspace scopes, idempotence, the audit."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from datetime import UTC, datetime
from typing import Any

import httpx
import nats
import psycopg

from shared.consumers import CONSUMERS
from shared.db.pool import open_pool
from shared.db.vector_indexes import build_vector_index, index_name_for
from shared.dlq import redrive
from shared.events import DeadLetterInfo
from shared.forget import ForgetResult, Scope, Targets, forget, verify
from shared.ids import content_hash
from shared.memory.filing import embedding_text
from tests.integration.helpers import Stack, analyze, session, wait_for, ws

SHARED_LINE = "the quarterly offsite moves to the lighthouse in Brest next spring"


def _texts(who: str, i: int) -> list[str]:
    tag = uuid.uuid4().hex[:6]
    return [f"{who} keeps the {tag} violin bow in the cedar drawer number {i}",
            f"Noted: {who} practises scales every morning before the {tag} rehearsal",
            f"{who} said the {tag} tram pass expires at the end of month {i}"]


def _publish_user(stack: Stack, w: str, user: str, n: int, prefix: str, shared: bool = False) -> list[list[str]]:
    out = []
    for i in range(n):
        texts = _texts(user, i) + ([SHARED_LINE] if shared and i == 0 else [])
        stack.publish(session(w, f"{prefix}-{i}", texts, user_id=user, agent_id=f"agent-{user}",
                              event_id=uuid.uuid4().hex))
        out.append(texts)
    return out


def _drained(stack: Stack) -> bool:
    async def go() -> bool:
        nc = await nats.connect(stack.nats_url)
        try:
            js = nc.jetstream()
            for c in CONSUMERS:
                info = await js.consumer_info(stack.settings.stream_name, c.durable)
                if info.num_pending or info.num_ack_pending:
                    return False
            return True
        finally:
            await nc.close()
    return asyncio.run(go())


def _dlq_count(stack: Stack, w: str) -> int:
    from shared.dlq import list_dead_letters

    return len([d for d in asyncio.run(list_dead_letters(stack.settings, stack.nats_url, limit=100_000))
                if d.info.workspace_id == w])


def _fingerprint(stack: Stack, w: str, user: str) -> dict[str, Any]:
    """Everything of one user, as counts and content hashes."""
    q = {
        "sessions": "SELECT session_id, content_hash FROM sessions WHERE workspace_id = %s AND user_id = %s",
        "messages": """SELECT m.session_id, m.seq, m.content_hash FROM messages m JOIN sessions s USING (workspace_id,
                        session_id) WHERE m.workspace_id = %s AND s.user_id = %s""",
        "drawers": """SELECT DISTINCT d.id, d.content_hash, d.deleted_at IS NULL FROM drawers d
                        JOIN drawer_sources ds ON ds.workspace_id = d.workspace_id AND ds.drawer_id = d.id
                        JOIN sessions s ON s.workspace_id = ds.workspace_id AND s.session_id = ds.session_id
                       WHERE d.workspace_id = %s AND s.user_id = %s""",
        "episodes": """SELECT e.id, e.abstract FROM episodes e JOIN sessions s USING (workspace_id, session_id)
                        WHERE e.workspace_id = %s AND s.user_id = %s""",
    }
    return {k: sorted(stack.sql(v, (w, user))) for k, v in q.items()}


def _run_forget(stack: Stack, scope: Scope) -> tuple[ForgetResult, dict[str, int]]:
    async def go() -> tuple[ForgetResult, dict[str, int]]:
        pool = await open_pool(stack.database_url, name="test-forget", max_size=2)
        try:
            r = await forget(pool, stack.settings, stack.nats_url, scope, requested_by="test")
            return r, await verify(pool, stack.settings, stack.nats_url, scope, r.targets)
        finally:
            await pool.close()
    return asyncio.run(go())


def _verify(stack: Stack, scope: Scope, targets: Targets) -> dict[str, int]:
    async def go() -> dict[str, int]:
        pool = await open_pool(stack.database_url, name="test-verify", max_size=1)
        try:
            return await verify(pool, stack.settings, stack.nats_url, scope, targets)
        finally:
            await pool.close()
    return asyncio.run(go())


def _stream_leftovers(stack: Stack, scope: Scope, targets: Targets) -> list[Any]:
    """What of the scope the pipeline stream still holds, and where each consumer stands (for a failure's
    message)."""
    from shared.forget import _matcher, _scan

    async def go() -> list[Any]:
        nc = await nats.connect(stack.nats_url)
        try:
            js = nc.jetstream()
            name = stack.settings.stream_name
            out: list[Any] = []
            for seq, body in await _scan(js, name, _matcher(scope, targets)):
                m = await js.get_msg(name, seq)
                out.append((seq, m.subject, body.get("session_id"), body.get("drawer_ids"), m.headers))
            for c in CONSUMERS:
                i = await js.consumer_info(name, c.durable)
                out.append((c.durable, i.delivered.stream_seq, i.ack_floor.stream_seq, i.num_pending,
                            i.num_ack_pending, i.num_redelivered))
            return out
        finally:
            await nc.close()
    return asyncio.run(go())


def _dead_letter(stack: Stack, event: dict[str, Any]) -> int:
    """Put an event into the DLQ as the consumers do (a failure that landed after the forget)."""
    import json

    info = DeadLetterInfo(subject="session.completed", service="ingest", reason="test", error_type="test",
                          deliveries=3, failed_at=datetime.now(UTC), workspace_id=event["workspace_id"],
                          size=10)
    headers = {f"Palace-{k}": str(v) for k, v in info.model_dump(mode="json", exclude_none=True).items()}

    async def go() -> int:
        nc = await nats.connect(stack.nats_url)
        try:
            ack = await nc.jetstream().publish("dlq.session.completed", json.dumps(event).encode(), headers=headers,
                                               stream=stack.settings.dlq_stream_name)
            return int(ack.seq)
        finally:
            await nc.close()
    return asyncio.run(go())


def test_forgetting_a_user_mid_stream_leaves_nothing_and_spares_everyone_else(stack: Stack) -> None:
    w = ws()
    alice, bob = "alice", "bob"
    early = _publish_user(stack, w, alice, 3, "a-early", shared=True)
    bob_texts = _publish_user(stack, w, bob, 3, "b", shared=True)
    # One alice event goes to the DLQ (a session without messages is invalid): forget must take it
    # out of there too.
    stack.publish({"workspace_id": w, "session_id": "a-poison", "user_id": alice, "messages": []})
    stack.wait_processed(w, 3 * 3 * 2 + 1)
    wait_for(lambda: _dlq_count(stack, w) == 1, 30, "alice's dead letter")
    wait_for(lambda: _drained(stack), 60, "pipeline drained")
    bob_before = _fingerprint(stack, w, bob)
    assert bob_before["drawers"] and bob_before["messages"]
    alice_hashes = {content_hash(t) for s in early for t in s if t != SHARED_LINE}

    # Alice keeps publishing while she is forgotten.
    stop = threading.Event()
    late: list[list[str]] = []

    def publisher() -> None:
        i = 0
        while not stop.is_set() and i < 30:
            late.extend(_publish_user(stack, w, alice, 1, f"a-late-{i}"))
            i += 1
            time.sleep(0.05)

    th = threading.Thread(target=publisher)
    th.start()
    time.sleep(0.5)
    result, _ = _run_forget(stack, Scope(w, "user", alice))
    time.sleep(0.5)
    stop.set()
    th.join()
    alice_hashes |= {content_hash(t) for s in late for t in s}
    assert result.counts["sessions"] >= 3 and result.counts["drawers"] >= 9
    assert result.counts["stream_events"] >= 1 and _dlq_count(stack, w) == 0

    # Once the pipeline drains, nothing of alice remains anywhere (the late sessions included).
    wait_for(lambda: _drained(stack), 90, "pipeline drained after the forget")
    result.targets.content_hashes |= alice_hashes
    remaining = _verify(stack, Scope(w, "user", alice), result.targets)
    assert not any(remaining.values()), ({k: v for k, v in remaining.items() if v},
                                         _stream_leftovers(stack, Scope(w, "user", alice), result.targets))
    assert stack.sql("SELECT count(*) FROM drawers WHERE workspace_id = %s AND user_id = %s", (w, alice))[0][0] == 0
    assert stack.sql("SELECT count(*) FROM messages WHERE workspace_id = %s AND content_hash = ANY(%s)",
                     (w, sorted(alice_hashes)))[0][0] == 0

    # Bob is untouched: same sessions, messages, drawers (the line both said stays, as bob's).
    wait_for(lambda: stack.sql("SELECT count(*) FROM drawers WHERE workspace_id = %s AND state = 'raw'",
                               (w,))[0][0] == 0, 60, "the shared drawer re-embedded")
    assert _fingerprint(stack, w, bob) == bob_before
    shared = stack.sql("SELECT user_id, session_id, context FROM drawers WHERE workspace_id = %s AND content_hash = %s",
                       (w, content_hash(SHARED_LINE)))
    assert shared and shared[0][0] == bob and shared[0][1].startswith("b-")
    assert {content_hash(t) for s in bob_texts for t in s} <= {
        r[0] for r in stack.sql("SELECT content_hash FROM messages WHERE workspace_id = %s", (w,))}
    assert any(h["session_id"].startswith("b-") for h in stack.search(w, "violin bow cedar drawer", k=10))

    # A redelivery (same session, new event id) and a dead-letter re-drive bring nothing back.
    stack.publish(session(w, "a-early-0", early[0], user_id=alice, event_id=uuid.uuid4().hex))
    seq = _dead_letter(stack, session(w, "a-early-1", early[1], user_id=alice, event_id=uuid.uuid4().hex))
    assert asyncio.run(redrive(stack.settings, stack.nats_url, [seq])) == 1
    stack.publish(session(w, "a-brand-new", _texts(alice, 99), user_id=alice, event_id=uuid.uuid4().hex))
    time.sleep(1)
    wait_for(lambda: _drained(stack), 60, "pipeline drained after the replays")
    assert stack.sql("SELECT count(*) FROM sessions WHERE workspace_id = %s AND user_id = %s", (w, alice))[0][0] == 0
    assert stack.sql("SELECT count(*) FROM drawers WHERE workspace_id = %s AND user_id = %s", (w, alice))[0][0] == 0

    # Idempotent, and audited with counts only.
    again, remaining = _run_forget(stack, Scope(w, "user", alice))
    assert not any(remaining.values()), {k: v for k, v in remaining.items() if v}
    assert not again.counts.get("drawers") and not again.counts.get("sessions")
    audits = stack.sql("SELECT requested_by, scope_kind, scope_value, status, counts FROM forget_audit "
                       "WHERE workspace_id = %s ORDER BY started_at", (w,))
    # The forgotten id is not kept in clear: the audit and the tombstones hold its digest.
    (key,), = stack.sql("SELECT palace_forget_key(%s, 'user', %s)", (w, alice))
    assert key.startswith("sha256:") and alice not in key
    assert [a[:4] for a in audits] == [("test", "user", key, "done")] * 2
    assert stack.sql("SELECT count(*) FROM forget_tombstones WHERE workspace_id = %s AND value = %s", (w, alice)) == [
        (0,)]
    assert stack.sql("SELECT count(*) FROM forget_tombstones WHERE workspace_id = %s AND kind = 'user'"
                     " AND value = %s", (w, key)) == [(1,)]
    # An earlier release's pod still running during an upgrade writes the id in clear: it is keyed as it is
    # inserted. And the proof looks for the id in clear there too, and finds it when it is (written here past
    # the trigger, as a database restored from before the upgrade would hold it).
    stack.sql("INSERT INTO forget_tombstones (workspace_id, kind, value, forget_id) VALUES (%s, 'agent', 'a1', 'old')"
              " RETURNING 1", (w,))
    assert stack.sql("SELECT value FROM forget_tombstones WHERE workspace_id = %s AND forget_id = 'old'", (w,)) == [
        stack.sql("SELECT palace_forget_key(%s, 'agent', 'a1')", (w,))[0]]
    with psycopg.connect(stack.database_url, autocommit=True) as conn:
        conn.execute("SET session_replication_role = replica")  # triggers off, for this connection only
        conn.execute("INSERT INTO forget_tombstones (workspace_id, kind, value, forget_id) VALUES (%s, 'user', %s,"
                     " 'older')", (w, alice))
    assert _verify(stack, Scope(w, "user", alice), again.targets)["forget_records_in_clear"] == 1
    stack.sql("DELETE FROM forget_tombstones WHERE workspace_id = %s AND forget_id IN ('old', 'older') RETURNING 1",
              (w,))
    assert audits[0][4]["drawers"] == result.counts["drawers"]
    assert all(isinstance(v, int) for v in audits[0][4].values())


def test_forget_by_drawer_and_whole_workspace_through_the_api(stack: Stack) -> None:
    w, other = ws(), ws()
    _publish_user(stack, w, "carol", 2, "c")
    _publish_user(stack, other, "dave", 1, "d")
    stack.wait_processed(w, 6)
    stack.wait_processed(other, 3)
    other_before = _fingerprint(stack, other, "dave")
    (did, text_hash), = stack.sql("SELECT id, content_hash FROM drawers WHERE workspace_id = %s"
                                  " AND state = 'processed' ORDER BY id LIMIT 1",
                                  (w,))
    # The proof can fail: before the forget it finds the drawer everywhere it lives.
    (content, emb), = stack.sql("SELECT content, embedding::text FROM drawers WHERE workspace_id = %s AND id = %s",
                                (w, did))
    before = _verify(stack, Scope(w, "drawer", did), Targets(
        drawer_ids={did}, content_hashes={text_hash}, probes=[(content, [float(x) for x in emb[1:-1].split(",")])]))
    assert before["drawers"] == 1 and before["messages"] == 1 and before["drawer_sources"] == 1
    assert before["search_exact_and_full_text"] >= 1 and before["search_hnsw_and_full_text"] >= 1
    r = httpx.post(f"{stack.api_url}/v1/forget", json={"workspace_id": w, "drawer_id": did, "verify": True},
                   timeout=60)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["counts"]["drawers"] == 1 and body["counts"]["messages"] == 1
    assert not any(body["remaining"].values()), body["remaining"]
    assert stack.sql("SELECT count(*) FROM messages WHERE workspace_id = %s AND content_hash = %s",
                     (w, text_hash))[0][0] == 0
    assert stack.sql("SELECT count(*) FROM drawers WHERE workspace_id = %s", (w,))[0][0] == 5

    # The workspace has its own vector index (as maintain builds it once a workspace grows): it goes too,
    # request row and all, and the proof looks for both.
    name = index_name_for(w)
    # Asked for, as search and cluster ask, and built by the stack's maintain (a build of the test's own beside
    # it could find the other's half-built index and drop it).
    stack.sql("INSERT INTO vector_indexes (workspace_id, index_name, state, drawers) VALUES (%s, %s, 'wanted', 5)"
              " RETURNING 1", (w, name))
    wait_for(lambda: stack.sql("SELECT state FROM vector_indexes WHERE workspace_id = %s", (w,)) == [("ready",)],
             90, "maintain to build the workspace's vector index")
    before = _verify(stack, Scope(w, "workspace", "*"), Targets())
    assert (before["vector_index_requests"], before["vector_indexes"]) == (1, 1)
    r = httpx.post(f"{stack.api_url}/v1/forget", json={"workspace_id": w, "all": True, "verify": True}, timeout=60)
    assert r.status_code == 200, r.text
    assert not any(r.json()["remaining"].values()), r.json()["remaining"]
    assert r.json()["remaining"]["vector_indexes"] == 0 and r.json()["counts"]["vector_indexes"] == 1
    assert stack.sql("SELECT to_regclass(%s) IS NULL", (name,)) == [(True,)]
    for table in ("sessions", "messages", "drawers", "embedding_cache", "episodes", "entities", "entity_mentions"):
        assert stack.sql(f"SELECT count(*) FROM {table} WHERE workspace_id = %s", (w,))[0][0] == 0, table  # noqa: S608
    assert _fingerprint(stack, other, "dave") == other_before
    bad = httpx.post(f"{stack.api_url}/v1/forget", json={"workspace_id": w, "user_id": "x", "all": True}, timeout=10)
    assert bad.status_code == 422


def test_an_index_build_that_outlives_its_forgotten_workspace_drops_what_it_built(stack: Stack) -> None:
    """Forget removed the request (and found no index yet) while maintain was still building: the build
    sees its request gone and drops the index instead of leaving it behind."""
    w = ws()
    _publish_user(stack, w, "erin", 1, "e")
    stack.wait_processed(w, 3)
    name = index_name_for(w)
    asyncio.run(build_vector_index(stack.database_url, w, name))  # no request row: as after a forget
    assert stack.sql("SELECT to_regclass(%s) IS NULL", (name,)) == [(True,)]
    assert not stack.sql("SELECT 1 FROM vector_indexes WHERE workspace_id = %s", (w,))


def test_forgetting_a_drawer_releases_what_named_it(stack: Stack) -> None:
    """What another row says about a forgotten drawer goes with it: the drawer it superseded ranks as
    itself again, an entity only it mentioned goes with the look-alike flag naming that entity; the
    proof looks for both (and finds them before the forget)."""
    w = ws()
    stack.publish(session(w, "s1", ["Carolina moved to Lisbon in May for the new office",
                                    "Caroline still lives in Porto near the river"], user_id="fay"))
    stack.wait_processed(w, 2)
    rows = dict(stack.sql("SELECT content, id FROM drawers WHERE workspace_id = %s", (w,)))
    gone, stays = rows["Carolina moved to Lisbon in May for the new office"], rows[
        "Caroline still lives in Porto near the river"]
    stack.sql("UPDATE drawers SET superseded_by = %s WHERE workspace_id = %s AND id = %s RETURNING 1", (gone, w, stays))
    stack.sql("INSERT INTO entities (workspace_id, id, name, entity_type) VALUES (%s, 'ent-a', 'Caroline', 'person'),"
              " (%s, 'ent-b', 'Carolina', 'person') ON CONFLICT DO NOTHING RETURNING 1", (w, w))
    stack.sql("INSERT INTO entity_mentions (workspace_id, entity_id, drawer_id) VALUES (%s, 'ent-a', %s),"
              " (%s, 'ent-b', %s) ON CONFLICT DO NOTHING RETURNING 1", (w, stays, w, gone))
    stack.sql("INSERT INTO entity_flags (workspace_id, entity_a, entity_b, rule, reason) VALUES"
              " (%s, 'ent-a', 'ent-b', 'spelling', 'Caroline / Carolina differ by one letter') RETURNING 1", (w,))
    scope = Scope(w, "drawer", gone)
    before = _verify(stack, scope, Targets(drawer_ids={gone}, entity_ids={"ent-b"}))
    assert (before["drawers_pointing_at_forgotten"], before["entities"], before["entity_flags"]) == (1, 1, 1)

    result, remaining = _run_forget(stack, scope)
    assert not any(remaining.values()), {k: v for k, v in remaining.items() if v}
    assert "ent-b" in result.targets.entity_ids and result.counts["entity_flags"] >= 1
    assert result.counts["drawers_unsuperseded"] == 1
    assert stack.sql("SELECT superseded_by FROM drawers WHERE workspace_id = %s AND id = %s", (w, stays)) == [(None,)]
    assert stack.sql("SELECT id FROM entities WHERE workspace_id = %s AND id LIKE 'ent-%%'", (w,)) == [("ent-a",)]
    assert stack.sql("SELECT count(*) FROM entity_flags WHERE workspace_id = %s AND 'ent-b' IN (entity_a, entity_b)",
                     (w,)) == [(0,)]


def test_what_forget_reaches_through_migration_0040_it_finds_by_index(stack: Stack) -> None:
    """The dreaming runs of an episode, the drawers a drawer superseded, the flags naming an entity
    second: each lookup reads its index, never a scan of the workspace."""
    import psycopg

    w = ws()
    with psycopg.connect(stack.database_url, autocommit=True) as conn:
        # A workspace with many runs and flags, as a real one has (on a near-empty table the planner
        # rightly walks the workspace's few rows instead).
        conn.execute("""INSERT INTO dreaming_runs (workspace_id, id, episode_ids, session_id, holder, status)
                        SELECT %s, 'r' || i, ARRAY['ep' || i, 'ep' || (i + 1)], 'dreaming:r' || i, 'h', 'done'
                          FROM generate_series(1, 3000) i""", (w,))
        conn.execute("""INSERT INTO entity_flags (workspace_id, entity_a, entity_b, rule, reason)
                        SELECT %s, 'a' || i, 'b' || i, 'spelling', 'x' FROM generate_series(1, 3000) i""", (w,))
        conn.execute("ANALYZE dreaming_runs")
        conn.execute("ANALYZE entity_flags")
        conn.execute("SET enable_seqscan = off")  # plans on the shared test database, not its size
        for q, index in [
            ("SELECT session_id FROM dreaming_runs WHERE workspace_id = %s AND episode_ids && %s::text[]",
             "dreaming_runs_episodes"),
            ("UPDATE drawers SET superseded_by = NULL WHERE workspace_id = %s AND superseded_by = ANY(%s)",
             "drawers_superseded_by"),
            ("DELETE FROM entity_flags WHERE workspace_id = %s AND entity_b = ANY(%s)", "entity_flags_b"),
        ]:
            plan = "\n".join(r[0] for r in conn.execute("EXPLAIN " + q, (w, ["x"])).fetchall())
            assert index in plan, plan
        # The facts of forgotten drawers, and the evidence of kept ones, by the drawer. (Evidence rows with
        # no drawers behind them: foreign keys off for the insert, rows removed after.)
        from shared.db import forget as sql

        conn.execute("""INSERT INTO triples (workspace_id, id, subject_id, predicate, object_id, source_drawer,
                                             source_session)
                        SELECT %s, 't' || i, 'a' || i, 'p', 'b' || i, 'd' || i, 's' || i
                          FROM generate_series(1, 3000) i""", (w,))
        with conn.transaction():
            conn.execute("SET LOCAL session_replication_role = replica")
            conn.execute("""INSERT INTO triple_evidence (workspace_id, triple_id, drawer_id, confidence, session_id)
                            SELECT %s, 't' || i, 'd' || i, 1, 's' || i FROM generate_series(1, 3000) i""", (w,))
        conn.execute("""INSERT INTO entity_merges (workspace_id, id, survivor_id, merged_id, rule, reason, snapshot,
                                                   actor)
                        SELECT %s, 'm' || i, 'a' || i, 'b' || i, 'operator', 'x',
                               jsonb_build_object('mentions', jsonb_build_array('d' || i)), 't'
                          FROM generate_series(1, 3000) i""", (w,))
        # Extraction's notes, on episodes and on drawers, as a workspace that extracts for a while has them
        # (with none, the workspace's few history rows were walked, or not, as other tests left the table).
        conn.execute("""INSERT INTO memory_history (workspace_id, id, action, actor, new_value)
                        SELECT %s, 'kg' || i, 'KG_EXTRACT', 'enrich',
                               CASE WHEN i %% 2 = 0 THEN jsonb_build_object('episode_id', 'ep' || i)
                                    ELSE jsonb_build_object('drawers', jsonb_build_array('d' || i)) END
                          FROM generate_series(1, 3000) i""", (w,))
        conn.execute("ANALYZE triples")
        conn.execute("ANALYZE triple_evidence")
        conn.execute("ANALYZE entity_merges")
        conn.execute("ANALYZE memory_history")
        for q, index in [(sql._RESOURCE_TRIPLES_SQL, "triples_source_drawer"),
                         (sql._REHOME_EVIDENCE_SQL, "triple_evidence_drawer"),
                         (sql._REHOME_FACTS_SQL, "triples_source_drawer"),
                         (sql.SCRUB_KG_NOTES_SQL, "memory_history_kg_"),
                         (sql.MERGES_NAMING_SQL, "entity_merges_mentions")]:
            plan = "\n".join(r[0] for r in conn.execute("EXPLAIN " + q, {"ws": w, "ids": ["x"], "s": ["s"],
                                                                        "q": [0], "e": ["x"], "d": ["x"]}))
            assert index in plan, plan
        conn.execute("DELETE FROM entity_merges WHERE workspace_id = %s", (w,))
        conn.execute("DELETE FROM memory_history WHERE workspace_id = %s AND action = 'KG_EXTRACT'", (w,))
        conn.execute("DELETE FROM triple_evidence WHERE workspace_id = %s", (w,))
        conn.execute("DELETE FROM triples WHERE workspace_id = %s", (w,))


def test_the_other_chunks_of_a_forgotten_message_are_found_by_index(stack: Stack) -> None:
    """The drawers cut from a forgotten message: by the message's key in drawer_sources, then by primary key,
    in a workspace of 3,000 drawers, never a walk of it."""
    import psycopg

    from shared.db import forget as sql

    w = ws()
    with psycopg.connect(stack.database_url, autocommit=True) as conn:
        conn.execute("""INSERT INTO drawers (workspace_id, id, content, content_hash, state, session_id, seq,
                                             dedup_bands)
                        SELECT %s, md5(g::text), 'chunk ' || g, md5(g::text), 'processed', 's' || (g / 10), g %% 10,
                               '{}'
                          FROM generate_series(1, 3000) g""", (w,))
        conn.execute("""INSERT INTO drawer_sources (workspace_id, drawer_id, session_id, seq)
                        SELECT %s, md5(g::text), 's' || (g / 10), g %% 10 FROM generate_series(1, 3000) g""", (w,))
        analyze(conn, "drawers")
        analyze(conn, "drawer_sources")
        try:
            plan = "\n".join(r[0] for r in conn.execute("EXPLAIN " + sql._SIBLINGS_SQL,
                                                        {"ws": w, "ids": ["x"], "s": ["s1"], "q": [3]}))
        finally:
            conn.execute("DELETE FROM drawers WHERE workspace_id = %s", (w,))
    assert "drawer_sources_session" in plan and "drawers_pkey" in plan, plan
    assert "Seq Scan" not in plan, plan


def test_a_drawer_someone_else_said_too_keeps_nothing_of_the_forgotten_sighting(stack: Stack) -> None:
    """The line both said stays, as the survivor's: speaker, role, time, wing and the message's metadata
    all come from the surviving sighting, not only the session and user ids."""
    w = ws()
    line = "the new office opens on the third floor of the old tram depot in March"
    stack.publish({"workspace_id": w, "session_id": "erin-1", "agent_id": "erins-agent", "user_id": "erin",
                   "messages": [{"role": "user", "name": "Erin", "content": line, "created_at": "2026-10-01T09:00:00Z",
                                 "metadata": {"client": "erins-phone"}}],
                   "started_at": "2026-10-01T09:00:00Z", "completed_at": "2026-10-01T09:05:00Z"})
    stack.wait_processed(w, 1)
    stack.publish({"workspace_id": w, "session_id": "finn-1", "agent_id": "finns-agent", "user_id": "finn",
                   "messages": [{"role": "assistant", "name": "Finn", "content": line,
                                 "created_at": "2026-10-05T15:00:00Z"}],
                   "started_at": "2026-10-05T15:00:00Z", "completed_at": "2026-10-05T15:05:00Z"})
    wait_for(lambda: stack.sql("SELECT count(*) FROM drawer_sources WHERE workspace_id = %s", (w,)) == [(2,)],
             30, "the second sighting")
    before = stack.sql("SELECT speaker, wing, user_id FROM drawers WHERE workspace_id = %s", (w,))
    assert before == [("Erin", "erins-agent", "erin")]
    # What the graph read there, as extraction records it: said by erin, in erin's session, at her time.
    (did,) = stack.sql("SELECT id FROM drawers WHERE workspace_id = %s", (w,))[0]
    erin_time = datetime(2026, 10, 1, 9, tzinfo=UTC)
    stack.sql("INSERT INTO entities (workspace_id, id, name) VALUES (%s, 'e-office', 'new office'),"
              " (%s, 'e-depot', 'tram depot') RETURNING 1", (w, w))
    stack.sql("INSERT INTO triples (workspace_id, id, subject_id, predicate, object_id, valid_from, source_drawer,"
              " source_session, source_seq) VALUES (%s, 't-1', 'e-office', 'located in', 'e-depot', %s, %s,"
              " 'erin-1', 0) RETURNING 1", (w, erin_time, did))
    stack.sql("INSERT INTO triple_evidence (workspace_id, triple_id, drawer_id, confidence, said_at, session_id, seq)"
              " VALUES (%s, 't-1', %s, 0.9, %s, 'erin-1', 0) RETURNING 1", (w, did, erin_time))
    _run_forget(stack, Scope(w, "user", "erin"))
    finn_time = datetime(2026, 10, 5, 15, tzinfo=UTC)
    assert stack.sql("SELECT session_id, said_at FROM triple_evidence WHERE workspace_id = %s", (w,)) \
        == [("finn-1", finn_time)]
    assert stack.sql("SELECT source_session, valid_from FROM triples WHERE workspace_id = %s", (w,)) \
        == [("finn-1", finn_time)]
    wait_for(lambda: stack.sql("SELECT state FROM drawers WHERE workspace_id = %s", (w,)) == [("processed",)],
             60, "the kept drawer re-embedded and classified")
    (row,) = stack.sql("SELECT speaker, role, wing, user_id, agent_id, occurred_at, metadata::text, context"
                       " FROM drawers WHERE workspace_id = %s", (w,))
    speaker, role, wing, user, agent, occurred, metadata, context = row
    assert (speaker, role, wing, user, agent) == ("Finn", "assistant", "finns-agent", "finn", "finns-agent")
    assert occurred.isoformat().startswith("2026-10-05T15:00:00")
    assert "erin" not in metadata.lower() and context is None


def test_forgetting_a_drawer_takes_it_out_of_the_next_turns_context(stack: Stack) -> None:
    """The turn after a forgotten one was embedded with it as its context: that context goes, and the turn
    is embedded again without it."""
    w = ws()
    secret = "My bank PIN is 4815, please remember it for the card in the blue wallet."
    reply = "Understood, I will keep that in mind whenever you ask about the blue wallet card."
    stack.publish(session(w, "s-pin", ["Can you hold on to something private for me?", secret, reply]))
    stack.wait_processed(w, 3)
    (did,) = stack.sql("SELECT id FROM drawers WHERE workspace_id = %s AND content = %s", (w, secret))[0]
    (ctx,) = stack.sql("SELECT context FROM drawers WHERE workspace_id = %s AND content = %s", (w, reply))[0]
    assert "4815" in ctx
    result, remaining = _run_forget(stack, Scope(w, "drawer", did))
    assert result.counts["contexts_cleared"] == 1 and not any(remaining.values())
    assert stack.sql("SELECT count(*) FROM drawers WHERE workspace_id = %s AND context LIKE '%%4815%%'",
                     (w,)) == [(0,)]
    assert stack.sql("SELECT count(*) FROM embedding_cache WHERE workspace_id = %s AND content_hash = %s",
                     (w, content_hash(embedding_text(reply, None, ctx)))) == [(0,)]
    wait_for(lambda: stack.sql("SELECT state FROM drawers WHERE workspace_id = %s AND content = %s",
                               (w, reply)) == [("processed",)], 60, "the next turn embedded again")


def test_a_fact_someone_else_also_stated_outlives_a_forgotten_drawer(stack: Stack) -> None:
    """Forgetting the drawer a fact was first read from keeps the fact when another drawer states it too:
    it is sourced from that statement, from when that was said. Only a fact no surviving drawer states goes."""
    w = ws()
    first, second = ("Priya said the Lisbon office runs on PostgreSQL now.",
                     "Confirmed again today: the Lisbon office runs on PostgreSQL.")
    stack.publish(session(w, "s-facts", [first, second]))
    stack.wait_processed(w, 2)
    d1 = stack.sql("SELECT id FROM drawers WHERE workspace_id = %s AND content = %s", (w, first))[0][0]
    d2 = stack.sql("SELECT id FROM drawers WHERE workspace_id = %s AND content = %s", (w, second))[0][0]
    said1, said2 = datetime(2026, 9, 1, tzinfo=UTC), datetime(2026, 9, 20, tzinfo=UTC)
    stack.sql("INSERT INTO entities (workspace_id, id, name) VALUES (%s, 'e-lisbon', 'Lisbon office'),"
              " (%s, 'e-pg', 'PostgreSQL') ON CONFLICT DO NOTHING RETURNING 1", (w, w))
    stack.sql("INSERT INTO triples (workspace_id, id, subject_id, predicate, object_id, valid_from, source_drawer,"
              " source_session, source_seq) VALUES (%s, 't-db', 'e-lisbon', 'uses', 'e-pg', %s, %s, 's-facts', 0)"
              " RETURNING 1", (w, said1, d1))
    stack.sql("INSERT INTO triple_evidence (workspace_id, triple_id, drawer_id, confidence, said_at, session_id, seq)"
              " VALUES (%s, 't-db', %s, 0.9, %s, 's-facts', 0), (%s, 't-db', %s, 0.8, %s, 's-facts', 1) RETURNING 1",
              (w, d1, said1, w, d2, said2))
    result, _ = _run_forget(stack, Scope(w, "drawer", d1))
    assert result.counts["triples_resourced"] == 1 and not result.counts.get("triples")
    assert stack.sql("SELECT source_drawer, source_seq, valid_from FROM triples WHERE workspace_id = %s"
                     " AND id = 't-db'", (w,)) == [(d2, 1, said2)]
    result, _ = _run_forget(stack, Scope(w, "drawer", d2))
    assert result.counts["triples"] == 1
    assert stack.sql("SELECT count(*) FROM triples WHERE workspace_id = %s", (w,)) == [(0,)]


def test_what_extraction_noted_on_a_forgotten_session_is_scrubbed(stack: Stack) -> None:
    """Extraction's notes (KG_EXTRACT rows, no drawer_id) quote the names and facts it refused: they are
    emptied with the episode or drawers they were about, and verify would find one left."""
    from shared.ids import stable_id

    w = ws()
    stack.publish(session(w, "s-notes", ["Gwen told me her sister Ines moved to Porto last winter."]))
    stack.wait_processed(w, 1)
    (did,) = stack.sql("SELECT id FROM drawers WHERE workspace_id = %s", (w,))[0]
    episode = stable_id("episode", w, "s-notes")
    stack.sql("""INSERT INTO memory_history (workspace_id, id, drawer_id, action, actor, reason, new_value) VALUES
                 (%s, 'kg-1', NULL, 'KG_EXTRACT', 'enrich', 'skipped triple (Ines, moved to, Porto)',
                  jsonb_build_object('episode_id', %s::text, 'tier', 'llm')),
                 (%s, 'kg-2', NULL, 'KG_EXTRACT', 'enrich', 'skipped entity Gwen',
                  jsonb_build_object('drawers', jsonb_build_array(%s::text), 'tier', 'llm')),
                 (%s, 'kg-3', NULL, 'KG_EXTRACT', 'enrich', 'about another session',
                  jsonb_build_object('episode_id', 'other', 'tier', 'llm')) RETURNING 1""",
              (w, episode, w, did, w))
    result, remaining = _run_forget(stack, Scope(w, "session", "s-notes"))
    assert result.counts["kg_notes_scrubbed"] == 2 and remaining["kg_extract_notes"] == 0
    assert stack.sql("SELECT id, reason FROM memory_history WHERE workspace_id = %s AND action = 'KG_EXTRACT'"
                     " ORDER BY id", (w,)) == [("kg-1", None), ("kg-2", None), ("kg-3", "about another session")]


def test_forgetting_one_chunk_of_a_long_message_forgets_the_message_whole(stack: Stack) -> None:
    """A long message is filed as overlapping chunks, so each holds some of its neighbours' text: forgetting
    one chunk forgets the message with every chunk cut from it. A chunk someone also said on its own stays,
    as theirs (only its sighting in the forgotten message goes)."""
    from shared.memory.chunking import chunk_text

    w = ws()
    sentences = [f"Sentence {i} of the lease notes: the {uuid.uuid4().hex[:8]} clause covers the boiler, "
                 f"the garden and the shed at number {i}." for i in range(24)]
    long = " ".join(sentences)
    chunks = [c.text for c in chunk_text(long, stack.settings.chunk_chars, stack.settings.chunk_overlap)]
    assert len(chunks) >= 3
    stack.publish({"workspace_id": w, "session_id": "lease", "user_id": "gwen",
                   "messages": [{"role": "user", "name": "Gwen", "content": "Here are my lease notes."},
                                {"role": "user", "name": "Gwen", "content": long},
                                {"role": "assistant", "content": "Thanks, I have filed the lease notes."}],
                   "started_at": "2026-10-01T09:00:00Z", "completed_at": "2026-10-01T09:05:00Z"})
    stack.wait_processed(w, 2 + len(chunks))
    # Hal quotes the last chunk on its own, later: that drawer is his too.
    stack.publish({"workspace_id": w, "session_id": "quote", "user_id": "hal",
                   "messages": [{"role": "user", "name": "Hal", "content": chunks[-1],
                                 "created_at": "2026-10-09T10:00:00Z"}],
                   "started_at": "2026-10-09T10:00:00Z", "completed_at": "2026-10-09T10:05:00Z"})
    wait_for(lambda: stack.sql("SELECT count(*) FROM drawer_sources WHERE workspace_id = %s AND session_id = 'quote'",
                               (w,)) == [(1,)], 30, "the quote's sighting")
    (did,) = stack.sql("SELECT id FROM drawers WHERE workspace_id = %s AND content = %s", (w, chunks[1]))[0]
    result, remaining = _run_forget(stack, Scope(w, "drawer", did))
    assert not any(remaining.values()), remaining
    left = None
    assert result.counts.get("chunks_with_message") == len(chunks) - 1 and result.counts["messages"] == 1
    left = stack.sql("SELECT content, speaker, session_id FROM drawers WHERE workspace_id = %s ORDER BY content",
                     (w,))
    assert [c for c, _, _ in left] == sorted(["Here are my lease notes.", "Thanks, I have filed the lease notes.",
                                             chunks[-1]])
    assert ("Hal", "quote") in [(s, x) for c, s, x in left if c == chunks[-1]]
    assert stack.sql("SELECT count(*) FROM drawer_sources WHERE workspace_id = %s AND session_id = 'lease' AND seq = 1",
                     (w,)) == [(0,)]
    # Not a word of the message is left in any drawer or context, but what Hal quoted.
    tags = [t.split(": the ", 1)[1][:8] for t in sentences]
    spoken = [t for t in tags if t not in chunks[-1]]
    assert len(spoken) > len(tags) // 2
    for tag in spoken:
        assert stack.sql("SELECT count(*) FROM drawers WHERE workspace_id = %s"
                         " AND (content LIKE %s OR coalesce(context, '') LIKE %s)",
                         (w, f"%{tag}%", f"%{tag}%")) == [(0,)], tag
    # A redelivered session brings none of it back.
    stack.publish({"workspace_id": w, "session_id": "lease", "user_id": "gwen", "event_id": uuid.uuid4().hex,
                   "messages": [{"role": "user", "name": "Gwen", "content": "Here are my lease notes."},
                                {"role": "user", "name": "Gwen", "content": long},
                                {"role": "assistant", "content": "Thanks, I have filed the lease notes."}],
                   "started_at": "2026-10-01T09:00:00Z", "completed_at": "2026-10-01T09:05:00Z"})
    time.sleep(0.5)
    wait_for(lambda: _drained(stack), 60, "the redelivered session handled")  # not merely not there yet
    assert not any(_verify(stack, Scope(w, "drawer", did), result.targets).values())


def test_an_embedding_made_for_another_speaker_is_not_saved(stack: Stack) -> None:
    """embed reads a drawer, a forget re-points it to a surviving sighting (another speaker, whose name is
    part of the embedded text), then embed saves: the vector of the forgotten speaker's text must not land,
    nor its cache entry."""
    import numpy as np

    from shared.db.drawers import save_embeddings
    from shared.db.tenancy import workspace_tx

    w = ws()
    stack.sql("INSERT INTO drawers (workspace_id, id, content, content_hash, state, speaker, dedup_bands)"
              " VALUES (%s, 'd1', 'the tram depot opens in March', 'h1', 'processed', 'Finn', '{}') RETURNING 1", (w,))
    vec = np.full(stack.settings.embed_dim, 0.05, dtype=np.float32)
    # (processed, so that maintain's re-drive of raw drawers leaves it to this test)

    async def save(who: str) -> None:
        pool = await open_pool(stack.database_url, name="test-embed", max_size=1)
        try:
            async with workspace_tx(pool, w) as conn:
                await save_embeddings(conn, w, "m", [("d1", "eh-" + who, vec, "h1", None, who)])
        finally:
            await pool.close()

    asyncio.run(save("Erin"))
    assert stack.sql("SELECT embedding IS NULL FROM drawers WHERE workspace_id = %s", (w,)) == [(True,)]
    assert stack.sql("SELECT count(*) FROM embedding_cache WHERE workspace_id = %s", (w,)) == [(0,)]
    asyncio.run(save("Finn"))
    assert stack.sql("SELECT embedding IS NULL FROM drawers WHERE workspace_id = %s", (w,)) == [(False,)]


def test_a_forget_deletes_its_own_dead_letters_and_no_one_elses(stack: Stack) -> None:
    """Events are deleted from the streams whole, so only those carrying the scope go: another user's
    dead-lettered session that also says something alice said stays (it was deleted, unprocessed, for a
    shared "thanks"), and a forgotten session that never reached the database (dead-lettered) does go."""
    w = ws()
    words = ["Thanks, see you at the climbing gym on Thursday.", "My locker code is four nine one seven."]
    stack.publish(session(w, "alice-1", words, user_id="alice"))
    stack.wait_processed(w, 2)
    bob_letter = _dead_letter(stack, session(w, "bob-1", [words[0], "Bring the blue rope."], user_id="bob",
                                             event_id=uuid.uuid4().hex))
    never_stored = _dead_letter(stack, session(w, "carol-1", ["Carol's only message."], user_id="carol",
                                               event_id=uuid.uuid4().hex))
    assert _dlq_count(stack, w) == 2

    result, remaining = _run_forget(stack, Scope(w, "user", "alice"))
    assert result.counts["sessions"] == 1 and not any(remaining.values()), remaining
    assert _dlq_count(stack, w) == 2, "bob's dead letter (and carol's) stay"

    result, remaining = _run_forget(stack, Scope(w, "session", "carol-1"))
    assert result.counts["stream_events"] == 1 and not any(remaining.values()), remaining
    from shared.dlq import list_dead_letters

    left = [d.seq for d in asyncio.run(list_dead_letters(stack.settings, stack.nats_url, limit=100_000))
            if d.info.workspace_id == w]
    assert left == [bob_letter] and never_stored not in left


def test_a_forget_takes_the_entities_only_its_facts_named(stack: Stack) -> None:
    """The patterns make the speaker a fact's subject without a mention of its own ("Carol works at
    Globex"): forgetting the user took the facts and the mentioned entities, and left "Carol" behind."""
    w = ws()
    event = session(w, "s-carol", ["I moved to Lisbon in May and I work at Globex now."], user_id="alice")
    event["messages"][0]["name"] = "Carol"
    stack.publish(event)
    stack.publish(session(w, "s-dan", ["Dan here: the Orion launch moved to Tuesday."], user_id="dan"))
    wait_for(lambda: stack.sql("SELECT count(*) FROM triples t JOIN entities e ON e.workspace_id = t.workspace_id"
                               " AND e.id = t.subject_id WHERE t.workspace_id = %s AND e.name = 'Carol'",
                               (w,))[0][0] >= 1, 90, "Carol's facts extracted")
    stack.wait_processed(w, 2)
    # Ending one of Carol's facts is audited with its subject, predicate and object.
    r = httpx.post(f"{stack.api_url}/v1/workspaces/{w}/kg/facts/invalidate", timeout=30,
                   json={"subject": "Carol", "predicate": "works_at", "object": "Globex"})
    assert r.status_code == 200, r.text
    others = stack.sql("SELECT id FROM entities WHERE workspace_id = %s AND id IN (SELECT entity_id FROM"
                       " entity_mentions m JOIN drawers d ON d.workspace_id = m.workspace_id AND d.id = m.drawer_id"
                       " WHERE d.workspace_id = %s AND d.user_id = 'dan')", (w, w))
    _, remaining = _run_forget(stack, Scope(w, "user", "alice"))
    assert not any(remaining.values()), remaining
    names = {r[0] for r in stack.sql("SELECT name FROM entities WHERE workspace_id = %s", (w,))}
    assert not names & {"Carol", "Lisbon", "Globex"}, names
    assert stack.sql("SELECT count(*) FROM triples WHERE workspace_id = %s AND source_session = 's-carol'",
                     (w,)) == [(0,)]
    assert set(others) <= set(stack.sql("SELECT id FROM entities WHERE workspace_id = %s", (w,))), "dan's stay"
    assert stack.sql("SELECT reason, new_value FROM memory_history WHERE workspace_id = %s"
                     " AND action = 'KG_INVALIDATE'", (w,)) == [(None, None)], "the audit row stays, without the names"


def test_a_forget_leaves_no_revert_that_would_write_the_forgotten_turn_back(stack: Stack) -> None:
    """The next turn's drawer stays but loses the forgotten turn as its context; a decision archived its
    earlier state, vector (embedded with that context) and message metadata included, and a revert of it
    wrote them back. The archive keeps neither; a revert then has the drawer embedded again."""
    from typer.testing import CliRunner

    from services.cli import app

    w = ws()
    turns = ["My therapist's name is Dr. Ilse Brandt, Tuesdays at four.", "Noted, I will keep that in mind.",
             "Anything else for today?"]
    stack.publish(session(w, "s-ctx", turns, user_id="erin"))
    stack.wait_processed(w, 3)
    forgotten, = stack.sql("SELECT id FROM drawers WHERE workspace_id = %s AND content = %s", (w, turns[0]))[0]
    nxt, ctx = stack.sql("SELECT id, context FROM drawers WHERE workspace_id = %s AND content = %s", (w, turns[1]))[0]
    assert ctx and "Brandt" in ctx
    # An UPDATE decision archived the next turn's state (as shared.db.decisions.snapshot does).
    stack.sql("""INSERT INTO memory_history (workspace_id, id, drawer_id, action, actor, old_value)
                 SELECT workspace_id, 'test-update', id, 'UPDATE', 'test',
                        jsonb_build_object('content', content, 'embedding', embedding::real[],
                                           'metadata', metadata || '{"message": {"note": "Brandt"}}'::jsonb)
                   FROM drawers WHERE workspace_id = %s AND id = %s RETURNING id""", (w, nxt))
    _, remaining = _run_forget(stack, Scope(w, "drawer", forgotten))
    assert not any(remaining.values()), remaining
    old, = stack.sql("SELECT old_value FROM memory_history WHERE workspace_id = %s AND id = 'test-update'", (w,))[0]
    assert set(old) == {"content", "embedding_stale"}, old
    wait_for(lambda: stack.sql("SELECT state FROM drawers WHERE workspace_id = %s AND id = %s", (w, nxt))
             == [("processed",)], 60, "the next turn embedded again without the context")
    env = {"PALACE_DATABASE_URL": stack.database_url, "PALACE_NATS_URL": stack.nats_url}
    r = CliRunner().invoke(app, ["revert", "--workspace", w, "test-update"], env=env)
    assert r.exit_code == 0, r.output
    state, emb, meta = stack.sql("SELECT state, embedding IS NULL, metadata FROM drawers WHERE workspace_id = %s"
                                 " AND id = %s", (w, nxt))[0]
    assert (state, emb) == ("raw", True) and "Brandt" not in str(meta)  # embedded again, from what it holds now


def test_a_forget_takes_the_type_centroids_its_drawers_trained(stack: Stack) -> None:
    """A centroid is the mean of a type's LLM-labelled vectors: of one drawer, it is that drawer's vector.
    The centroids of the types a forgotten drawer trained go (maintain computes them again); others stay."""
    w = ws()
    stack.publish(session(w, "s-cent", ["I am allergic to penicillin, it gives me hives."], user_id="fay"))
    stack.wait_processed(w, 1)
    did, mtype = stack.sql("SELECT id, memory_type FROM drawers WHERE workspace_id = %s", (w,))[0]
    other = "preference" if mtype != "preference" else "fact"
    stack.sql("UPDATE drawers SET pipeline_tier = 'llm' WHERE workspace_id = %s AND id = %s RETURNING id", (w, did))
    stack.sql("""INSERT INTO type_centroids (workspace_id, memory_type, centroid, sample_count, source_hash)
                 SELECT workspace_id, t, embedding, 1, 'test' FROM drawers, unnest(%s::text[]) AS t
                  WHERE workspace_id = %s AND id = %s RETURNING 1""", ([mtype, other], w, did))
    result, remaining = _run_forget(stack, Scope(w, "user", "fay"))
    assert not any(remaining.values()), remaining
    assert result.counts["type_centroids"] == 1
    assert stack.sql("SELECT memory_type FROM type_centroids WHERE workspace_id = %s", (w,)) == [(other,)]


def test_a_forget_key_is_a_digest_of_workspace_kind_and_id_only_for_people_agents_and_sessions(stack: Stack) -> None:
    """Migration 0056: users, agents and sessions are tombstoned as a digest bound to their workspace (the same id
    in another workspace gets another key); a drawer's id (already a digest) and the workspace's '*' stay."""
    import hashlib

    rows = stack.sql("SELECT palace_forget_key('w1', 'user', 'maria'), palace_forget_key('w2', 'user', 'maria'),"
                     " palace_forget_key('w1', 'drawer', 'abc'), palace_forget_key('w1', 'workspace', '*'),"
                     " palace_forget_key('w1', 'user', NULL) IS NULL")[0]
    assert rows[0] == "sha256:" + hashlib.sha256(b"w1\x1fuser\x1fmaria").hexdigest()
    assert rows[1] != rows[0] and rows[2:] == ("abc", "*", True)
