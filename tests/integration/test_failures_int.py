"""Failure paths on the real stack: poison input, dead letters and re-drive, killed and stopped services,
stuck drawers. Nothing already stored is ever lost, and good events keep flowing."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import time
from collections.abc import Iterator

import httpx
import psycopg

from palace_dev.supervisor import ALL_SERVICES
from shared.dlq import list_dead_letters, redrive
from tests.integration.helpers import Stack, session, wait_for, ws


def _dead(stack: Stack, workspace: str | None = None) -> list:
    items = asyncio.run(list_dead_letters(stack.settings, stack.nats_url, limit=100_000))
    return [i for i in items if workspace is None or i.info.workspace_id == workspace]


def _metric(stack: Stack, service: str, name: str) -> float:
    port = stack.supervisor.metrics_base_port + ALL_SERVICES.index(service)
    text = httpx.get(f"http://127.0.0.1:{port}/metrics/", timeout=5).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name) and not line.startswith("#"))


def test_malformed_event_is_dead_lettered_and_next_good_one_goes_through(stack: Stack) -> None:
    w = ws()
    before = _metric(stack, "ingest", "palace_messages_dead_lettered_total")
    stack.publish({"workspace_id": w, "session_id": 17, "messages": "not a list"})
    stack.publish(session(w, "good", ["The staging database moved to the eu-west region last night."]))
    stack.wait_processed(w, 1)
    dead = wait_for(lambda: _dead(stack, w), what="dead letter")
    assert len(dead) == 1
    info = dead[0].info
    assert info.subject == "session.completed" and info.service == "ingest" and info.error_type == "invalid"
    assert "session_id" in info.reason and "messages" in info.reason
    assert json.loads(dead[0].data)["session_id"] == 17, "the dead letter keeps the payload verbatim"
    assert _metric(stack, "ingest", "palace_messages_dead_lettered_total") >= before + 1


def test_bad_inputs_each_get_a_reason_and_services_survive(stack: Stack) -> None:
    w = ws()
    good = session(w, "g", ["x"])
    bad: dict[str, bytes] = {
        "empty session": json.dumps({**good, "messages": []}).encode(),
        "wrong types": json.dumps({**good, "messages": [{"role": "user", "content": 5}]}).encode(),
        "unknown field": json.dumps({**good, "surprise": 1}).encode(),
        "unknown version": json.dumps({**good, "schema_version": "7"}).encode(),
        "non-utf8": b'{"workspace_id": "' + w.encode() + b'", "session_id": "\xff\xfe"}',
        "nul byte": json.dumps({**good, "messages": [{"role": "user", "content": "a\u0000b"}]}).encode(),
        "oversized": json.dumps({**good, "messages": [{"role": "user", "content": "y" * 1_200_000}]}).encode(),
        "not json": b"{{{{",
        "too many messages": json.dumps({**good, "messages": [{"role": "user", "content": "m"}] * 10_001}).encode(),
    }
    for payload in bad.values():
        stack.publish(payload)
    stack.publish(session(w, "after", ["After the storm, the deploy pipeline is green again."]))
    stack.wait_processed(w, 1)
    def ours() -> list | None:
        d = [x for x in _dead(stack) if w.encode() in x.data or x.data == b"{{{{"]
        return d if len(d) >= len(bad) else None

    dead = wait_for(ours, what="all bad inputs dead-lettered")
    reasons = " | ".join(d.info.reason for d in dead)
    for needle in ("messages", "Input should be a valid string", "surprise", "schema_version", "UTF-8", "NUL",
                   "exceeds", "invalid session.completed"):
        assert needle in reasons, needle
    for name in ("ingest", "embed", "classify"):
        assert stack.supervisor.children[name].proc.poll() is None, f"{name} must not crash"


def test_dlq_redrive_republishes_to_the_original_subject(stack: Stack) -> None:
    w = ws()
    stack.publish({"workspace_id": w, "session_id": "redrive-me", "messages": []})
    first = wait_for(lambda: _dead(stack, w), what="dead letter")[0]
    assert asyncio.run(redrive(stack.settings, stack.nats_url, [first.seq])) == 1
    # Still invalid, so it comes back as a new dead letter, and the old one is gone.
    again = wait_for(lambda: [d for d in _dead(stack, w) if d.seq != first.seq], what="re-driven dead letter")
    assert again[0].data == first.data
    assert first.seq not in {d.seq for d in _dead(stack, w)}


def test_killed_service_mid_stream_loses_nothing(stack: Stack) -> None:
    w = ws()
    n = 40
    for i in range(n):
        stack.publish(session(w, f"s{i}", [f"Session {i}: the inventory count for warehouse {i} is {i * 13} units."]))
    time.sleep(0.3)
    stack.supervisor.kill("embed", signal.SIGKILL)
    stack.supervisor.kill("classify", signal.SIGKILL)
    wait_for(lambda: (stack.supervisor.poll() or True) and all(
        stack.supervisor.children[s].proc.poll() is None and stack.supervisor.children[s].restarts > 0
        for s in ("embed", "classify")), timeout=60, what="restart")
    stack.supervisor.wait_healthy()
    stack.wait_processed(w, n, timeout=120)
    assert stack.sql("SELECT count(*), count(DISTINCT content_hash) FROM drawers WHERE workspace_id = %s",
                     (w,))[0] == (n, n)


def test_sigterm_drains_and_exits_cleanly(stack: Stack) -> None:
    w = ws()
    for i in range(20):
        stack.publish(session(w, f"s{i}", [f"Ticket {i}: customer {i} asked for a refund of {i * 3} euros."]))
    child = stack.supervisor.children["ingest"]
    child.proc.send_signal(signal.SIGTERM)
    code = child.proc.wait(stack.settings.shutdown_grace_s + 10)
    assert code == 0, "graceful stop exits 0"
    stack.supervisor.spawn("ingest")
    stack.supervisor.wait_healthy()
    stack.wait_processed(w, 20, timeout=90)
    assert stack.sql("SELECT count(*) FROM sessions WHERE workspace_id = %s", (w,))[0][0] == 20


def test_maintain_redrives_stuck_raw_drawers(stack: Stack) -> None:
    w = ws()
    # A drawer whose drawer.created was lost: raw, idle for a while, never announced.
    from shared.ids import content_hash, drawer_id

    text = "The backup bucket is replicated to a second region every six hours."
    did = drawer_id(w, content_hash(text))
    with psycopg.connect(stack.database_url) as conn:
        conn.execute(
            "INSERT INTO drawers (workspace_id, id, content, content_hash, updated_at)"
            " VALUES (%s, %s, %s, %s, now() - interval '1 hour')", (w, did, text, content_hash(text)))
    stack.wait_processed(w, 1, timeout=60)
    row = stack.sql("SELECT state, retry_count, embedding IS NOT NULL FROM drawers WHERE workspace_id = %s", (w,))
    assert row[0][0] == "processed" and row[0][1] >= 1 and row[0][2]


def test_a_malformed_drawer_created_is_dead_lettered_and_the_rest_embedded(stack: Stack) -> None:
    """A drawer.created that names no drawer is dead-lettered with the reason; what comes after it on the
    subject is embedded. (One bad event sharing a batch with good ones: test_external_faults_int.)"""
    w = ws()
    stack.publish(session(w, "s", ["The quarterly planning offsite is in Porto this year."]))
    stack.wait_processed(w, 1)
    # A malformed drawer.created published among good traffic on the same subject.
    stack.publish({"workspace_id": w, "event_id": "x", "drawer_ids": ["not-a-drawer-id"]}, subject="drawer.created")
    stack.publish(session(w, "s2", ["Our on-call rotation now starts on Wednesdays at noon."]))
    stack.wait_processed(w, 2)
    dead = wait_for(lambda: [d for d in _dead(stack, w) if d.info.subject == "drawer.created"], what="dead letter")
    assert dead[0].info.service == "embed" and "drawer_ids" in dead[0].info.reason



@contextlib.contextmanager
def _refusing(stack: Stack, service: str, table: str, when: str, condition: str, message: str) -> Iterator[None]:
    """A trigger that makes ``table``'s rows meeting ``condition`` fail with ``message``, and ``service``
    stopped while the test queues its events, so that its restart fetches them as one batch (the test
    then calls ``_resume``). Both undone on the way out."""
    with psycopg.connect(stack.database_url, autocommit=True) as conn:
        conn.execute(f"""CREATE OR REPLACE FUNCTION test_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
                         BEGIN
                           IF {condition} THEN RAISE EXCEPTION '{message}'; END IF;
                           RETURN NEW;
                         END $$""")
        conn.execute(f"CREATE TRIGGER test_refuse BEFORE {when} ON {table} FOR EACH ROW EXECUTE FUNCTION test_refuse()")
    child = stack.supervisor.children[service]
    try:
        child.proc.send_signal(signal.SIGTERM)
        child.proc.wait(stack.settings.shutdown_grace_s + 10)
        yield
    finally:
        with psycopg.connect(stack.database_url, autocommit=True) as conn:
            conn.execute(f"DROP TRIGGER IF EXISTS test_refuse ON {table}")
            conn.execute("DROP FUNCTION IF EXISTS test_refuse()")
        if stack.supervisor.children[service].proc.poll() is not None:
            _resume(stack, service)


def _resume(stack: Stack, service: str) -> None:
    stack.supervisor.spawn(service)
    stack.supervisor.wait_healthy()


def _dead_on(stack: Stack, workspace: str, subject: str) -> list:
    return [d for d in _dead(stack, workspace) if d.info.subject == subject]


def test_a_failing_event_in_a_classify_batch_fails_alone(stack: Stack) -> None:
    """Classify takes drawer.embedded in batches, one transaction a batch: when that transaction fails
    (here a trigger refuses one drawer), each event is run alone, its batch-mates are committed and
    acknowledged, and only the failing one is retried and dead-lettered."""
    good, bad = ws(), ws()
    marker = "CLASSIFY-REFUSED"
    with _refusing(stack, "classify", "drawers", "UPDATE", "NEW.state = 'processed' AND OLD.state <> 'processed'"
                   f" AND NEW.content LIKE '%{marker}%'", "refused by the test"):
        stack.publish(session(good, "g1", ["The staging cluster moves to the new datacenter in March."]))
        stack.publish(session(bad, "b1", [f"This drawer is {marker} by the database on purpose."]))
        stack.publish(session(good, "g2", ["Our design review happens every other Thursday afternoon."]))
        embedded = "SELECT count(*) FROM drawers WHERE workspace_id = ANY(%s) AND embedding IS NOT NULL"
        wait_for(lambda: stack.sql(embedded, ([good, bad],))[0][0] == 3, what="drawers embedded")
        _resume(stack, "classify")
        stack.wait_processed(good, 2)
        dead = wait_for(lambda: _dead_on(stack, bad, "drawer.embedded"), what="the refused event dead-lettered")
        assert dead[0].info.service == "classify" and "refused by the test" in dead[0].info.reason
        assert not _dead_on(stack, good, "drawer.embedded")
        assert stack.sql("SELECT state FROM drawers WHERE workspace_id = %s", (bad,)) != [("processed",)]


def test_a_failing_episode_in_an_extraction_batch_fails_alone(stack: Stack) -> None:
    """Without a model, enrich extracts episodic.created in batches, one transaction a batch: when it fails
    (here a trigger refuses one workspace's facts), each episode is extracted alone; its batch-mates get
    their graph and are acknowledged, and only the failing one is retried and dead-lettered."""
    from tests.integration.test_kg_extract_int import TURNS, _session

    good, bad = ws(), ws()
    # Enrich stopped while the sessions are filed, so that their episodes come out together.
    with _refusing(stack, "enrich", "triples", "INSERT", f"NEW.workspace_id = '{bad}'", "facts refused by the test"):
        for w in (good, bad):
            stack.publish(_session(w))
        for w in (good, bad):
            stack.wait_processed(w, len(TURNS))
        _resume(stack, "enrich")
        wait_for(lambda: stack.sql("SELECT count(*) FROM triples WHERE workspace_id = %s", (good,))[0][0] > 0, 90,
                 "the good episode's facts")
        dead = wait_for(lambda: _dead_on(stack, bad, "episodic.created"), what="the refused episodes dead-lettered")
        assert {d.info.service for d in dead} == {"enrich"} and "facts refused by the test" in dead[0].info.reason
        assert not _dead_on(stack, good, "episodic.created")
        assert stack.sql("SELECT count(*) FROM triples WHERE workspace_id = %s", (bad,)) == [(0,)]


def test_a_failing_workspace_in_an_entity_dedup_batch_fails_alone(stack: Stack) -> None:
    """Cluster takes entity.upserted in batches, a workspace's events together: when one workspace's
    dedup fails (here a trigger refuses its dedup keys), the other workspaces' events are done and
    acknowledged, and only the failing one is retried and dead-lettered."""
    from tests.integration.test_kg_extract_int import _session

    good, bad = ws(), ws()
    # Cluster stopped while the graphs are extracted, so that their entity.upserted come out together.
    with _refusing(stack, "cluster", "entity_keys", "INSERT", f"NEW.workspace_id = '{bad}'",
                   "keys refused by the test"):
        for w in (good, bad):
            stack.publish(_session(w))
        for w in (good, bad):
            wait_for(lambda w=w: stack.sql("SELECT count(*) FROM triples WHERE workspace_id = %s", (w,))[0][0] > 0,
                     90, "the extracted facts")
        _resume(stack, "cluster")
        wait_for(lambda: stack.sql("SELECT count(*) FROM entity_keys WHERE workspace_id = %s", (good,))[0][0] > 0,
                 60, "the good workspace's entities keyed")
        dead = wait_for(lambda: _dead_on(stack, bad, "entity.upserted"),
                        what="the refused workspace's event dead-lettered")
        assert {d.info.service for d in dead} == {"cluster"} and "keys refused by the test" in dead[0].info.reason
        assert not _dead_on(stack, good, "entity.upserted")
