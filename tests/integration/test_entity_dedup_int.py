"""Entity dedup on entity.upserted against the real stack: the cluster service merges the same entity
(audited, reversible), flags look-alikes and never merges them, and replays change nothing."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import nats
import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from shared.consumers import CONSUMERS
from shared.db.entity_dedup import MergeError, revert_merge
from shared.db.kg import add_triple, ensure_entities, entity_timeline, kg_stats, query_entity, recount_entities
from shared.db.pool import open_pool
from shared.db.tenancy import workspace_tx
from shared.memory.kg import entity_id
from tests.integration.helpers import Stack, session, wait_for, ws


@pytest.fixture
async def pool(stack: Stack) -> AsyncIterator[AsyncConnectionPool]:
    p = await open_pool(stack.database_url, name="test-dedup", max_size=2)
    try:
        yield p
    finally:
        await p.close()


def _upserted(w: str, names: list[str]) -> dict[str, Any]:
    return {"event_id": f"test-{uuid.uuid4().hex}", "workspace_id": w,
            "entity_ids": [entity_id(w, n) for n in names], "names": names}


def _idle(stack: Stack) -> bool:
    """Every consumer of the pipeline has nothing pending or un-acked."""
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


def _settle(stack: Stack) -> None:
    """Wait until the pipeline is idle twice in a row (a handler may publish the next stage's event)."""
    wait_for(lambda: _idle(stack), 60, "the pipeline to drain")
    import time
    time.sleep(1.0)
    wait_for(lambda: _idle(stack), 60, "the pipeline to drain")


def _graph(stack: Stack, w: str) -> dict[str, list[tuple[Any, ...]]]:
    """Every knowledge-graph row of the workspace (updated_at aside: an upsert touches it)."""
    return {
        "entities": stack.sql("SELECT id, name, entity_type, properties, mention_count, merged_into, created_at"
                              " FROM entities WHERE workspace_id = %s ORDER BY id", (w,)),
        "aliases": stack.sql("SELECT * FROM entity_aliases WHERE workspace_id = %s ORDER BY alias_key, entity_id",
                             (w,)),
        "mentions": stack.sql("SELECT entity_id, drawer_id, confidence FROM entity_mentions WHERE workspace_id = %s"
                              " ORDER BY 1, 2", (w,)),
        "triples": stack.sql("SELECT * FROM triples WHERE workspace_id = %s ORDER BY id", (w,)),
        "evidence": stack.sql("SELECT triple_id, drawer_id, confidence, said_at FROM triple_evidence"
                              " WHERE workspace_id = %s ORDER BY 1, 2", (w,)),
        "drawer_counts": stack.sql("SELECT id, entity_count, triple_count FROM drawers WHERE workspace_id = %s"
                                   " ORDER BY id", (w,)),
    }


async def _seed(pool: AsyncConnectionPool, stack: Stack, w: str) -> None:
    async with workspace_tx(pool, w) as c:
        # One person written two ways, with a fact under each name.
        await add_triple(c, w, "Tomás", "works_at", "Acme", valid_from="2024-11-01", subject_type="person",
                         source_drawer="d-1")
        await add_triple(c, w, "Tomas", "lives_in", "Lisbon", valid_from="2025-02-01", source_drawer="d-2")
        await add_triple(c, w, "Tomas", "works_at", "Acme", valid_from="2025-01-10", source_drawer="d-2")
        await add_triple(c, w, "Maria", "knows", "Tomas", valid_from="2025-03-01", source_drawer="d-3")
        # Look-alikes with everything in common but the name: Caroline / Carolina.
        await add_triple(c, w, "Caroline", "likes", "Painting", valid_from="2025-01-01", subject_type="person")
        await add_triple(c, w, "Carolina", "likes", "Painting", valid_from="2025-01-02", subject_type="person")
        # Mel the person, Mel's the diner: the same name once the possessive goes, different kinds of thing.
        await add_triple(c, w, "Mel", "lives_in", "Lisbon", valid_from="2025-01-01", subject_type="person")
        await add_triple(c, w, "Mel's", "located_in", "Lisbon", valid_from="2025-01-01", subject_type="place")
        # A person called by their first name, with a relation in common: Jon / Jon Snow.
        await add_triple(c, w, "Jon Snow", "member_of", "Night Watch", valid_from="2025-01-01")
        await add_triple(c, w, "Jon", "member_of", "Night Watch", valid_from="2025-01-05", subject_type="person")
        # ... but Lisbon is not the Lisbon office, whatever they share.
        await ensure_entities(c, w, [("Lisbon Office", "concept")])
        await add_triple(c, w, "Lisbon Office", "located_in", "Portugal", valid_from="2025-01-01")
        await add_triple(c, w, "Lisbon", "located_in", "Portugal", valid_from="2025-01-01")
    stack.sql("INSERT INTO drawers (workspace_id, id, content, content_hash) SELECT %s, d, 'text of ' || d, d"
              " FROM unnest('{d-1,d-2,d-9}'::text[]) d RETURNING 1", (w,))
    # Tomas is the better known of the two (more mentions): the survivor.
    stack.sql("INSERT INTO entity_mentions (workspace_id, entity_id, drawer_id) VALUES"
              " (%s, %s, 'd-1'), (%s, %s, 'd-2'), (%s, %s, 'd-9') RETURNING 1",
              (w, entity_id(w, "Tomás"), w, entity_id(w, "Tomas"), w, entity_id(w, "Tomas")))
    # The counters from the mention rows, dropping the changes those rows left pending in the same statement:
    # set by hand, the stack's maintain (its mention-count job) could add the pending ones on top.
    async with workspace_tx(pool, w) as c:
        cur = await c.execute("SELECT id FROM entities WHERE workspace_id = %s", (w,))
        await recount_entities(c, w, [str(r[0]) for r in await cur.fetchall()])


NAMES = ["Tomás", "Tomas", "Maria", "Caroline", "Carolina", "Mel", "Mel's", "Jon", "Jon Snow", "Lisbon",
         "Lisbon Office"]


async def test_dedup_merges_the_same_entity_refuses_look_alikes_and_reverts_exactly(
        pool: AsyncConnectionPool, stack: Stack) -> None:
    w = ws()
    await _seed(pool, stack, w)
    # What extraction recorded of the sightings: a mention's confidence, and each "works_at Acme" fact's
    # evidence (the two facts become one in the merge; a revert gives each its own again).
    tomas_acc, tomas_ = (entity_id(w, "Tomás"), entity_id(w, "Tomas"))
    acme = {s: stack.sql("SELECT id FROM triples WHERE workspace_id = %s AND subject_id = %s"
                          " AND predicate = 'works_at'", (w, s))[0][0] for s in (tomas_acc, tomas_)}
    stack.sql("INSERT INTO triple_evidence (workspace_id, triple_id, drawer_id, confidence, said_at) VALUES"
              " (%s, %s, 'd-1', 0.6, '2024-11-01'), (%s, %s, 'd-2', 0.9, '2025-01-10') RETURNING 1",
              (w, acme[tomas_acc], w, acme[tomas_]))
    stack.sql("UPDATE triples SET confidence = CASE WHEN id = %s THEN 0.6 ELSE 0.9 END WHERE workspace_id = %s"
              " AND id = ANY(%s) RETURNING 1", (acme[tomas_acc], w, list(acme.values())))
    stack.sql("UPDATE entity_mentions SET confidence = 0.7 WHERE workspace_id = %s AND entity_id = %s RETURNING 1",
              (w, tomas_acc))
    before = _graph(stack, w)
    await asyncio.to_thread(stack.publish, _upserted(w, NAMES), "entity.upserted")
    await asyncio.to_thread(wait_for, lambda: len(stack.sql(
        "SELECT 1 FROM entity_merges WHERE workspace_id = %s", (w,))) >= 2, 60, "two merges")
    await asyncio.to_thread(_settle, stack)
    merges = stack.sql("SELECT survivor_id, merged_id, rule, id FROM entity_merges WHERE workspace_id = %s"
                       " ORDER BY rule", (w,))
    e = {n: entity_id(w, n) for n in NAMES}
    assert [(s, m, r) for s, m, r, _ in merges] == [
        (e["Tomas"], e["Tomás"], "same_name"), (e["Jon Snow"], e["Jon"], "short_name")]
    flags = stack.sql("SELECT entity_a, entity_b, rule, status FROM entity_flags WHERE workspace_id = %s"
                      " ORDER BY rule", (w,))
    pair = lambda a, b: tuple(sorted((e[a], e[b])))  # noqa: E731
    assert {(f[0], f[1]): (f[2], f[3]) for f in flags} == {
        pair("Caroline", "Carolina"): ("spelling", "open"),
        pair("Mel", "Mel's"): ("type_conflict", "open"),
        pair("Lisbon", "Lisbon Office"): ("short_name", "open"),
    }

    async with workspace_tx(pool, w) as c:
        # Either name reaches the one entity, which holds every fact said under both.
        facts = await query_entity(c, w, "Tomás")
        assert sorted((f.subject, f.predicate, f.object) for f in facts) == [
            ("Maria", "knows", "Tomas"), ("Tomas", "lives_in", "Lisbon"), ("Tomas", "works_at", "Acme")]
        # "works_at Acme" was said under both names: one fact, starting when it was first said.
        works = next(f for f in facts if f.predicate == "works_at")
        assert works.valid_from.date().isoformat() == "2024-11-01"
        assert [f.object for f in await query_entity(c, w, "Jon")] == ["Night Watch"]
        assert {f.subject for f in await entity_timeline(c, w, "Carolina")} == {"Carolina"}
        stats = await kg_stats(c, w)
        assert stats.entities == len(before["entities"]) - 2
        # A fact said again under the merged name lands on the survivor, not on a revived duplicate.
        again = await add_triple(c, w, "Tomás", "lives_in", "Lisbon", valid_from="2025-02-03")
        assert not again.created and again.fact.subject_id == e["Tomas"]
    mentions = stack.sql("SELECT drawer_id, confidence FROM entity_mentions WHERE workspace_id = %s AND entity_id = %s"
                         " ORDER BY 1", (w, e["Tomas"]))
    assert [m[0] for m in mentions] == ["d-1", "d-2", "d-9"] and abs(mentions[0][1] - 0.7) < 1e-6
    # The folded fact's sightings count for the one it joined: both drawers, and their mean confidence.
    assert stack.sql("SELECT drawer_id FROM triple_evidence WHERE workspace_id = %s AND triple_id = %s ORDER BY 1",
                     (w, acme[tomas_])) == [("d-1",), ("d-2",)]
    assert abs(stack.sql("SELECT confidence FROM triples WHERE workspace_id = %s AND id = %s",
                         (w, acme[tomas_]))[0][0] - 0.75) < 1e-6
    assert stack.sql("SELECT mention_count, entity_type FROM entities WHERE workspace_id = %s AND id = %s",
                     (w, e["Tomas"])) == [(3, "person")]
    hist = stack.sql("SELECT action, new_value->>'survivor' FROM memory_history WHERE workspace_id = %s"
                     " AND action LIKE 'ENTITY%%' ORDER BY 2", (w,))
    assert sorted(hist) == sorted([("ENTITY_MERGE", e["Tomas"]), ("ENTITY_MERGE", e["Jon Snow"])])

    # Replayed: nothing changes.
    merged = _graph(stack, w)
    await asyncio.to_thread(stack.publish, _upserted(w, NAMES), "entity.upserted")
    await asyncio.to_thread(_settle, stack)
    assert _graph(stack, w) == merged
    assert len(stack.sql("SELECT 1 FROM entity_merges WHERE workspace_id = %s", (w,))) == 2

    # Reverted: every row the merge touched is as it was, and the pair stays apart from then on.
    tomas_merge = next(m[3] for m in merges if m[2] == "same_name")
    async with workspace_tx(pool, w) as c:
        r = await revert_merge(c, w, tomas_merge, actor="test")
        assert r.status == "reverted"
    async with workspace_tx(pool, w) as c:
        with pytest.raises(MergeError, match="already reverted"):
            await revert_merge(c, w, tomas_merge, actor="test")
    jon = {e["Jon"], e["Jon Snow"]}
    after = _graph(stack, w)
    # The survivor's mention count was refreshed by the first upsert event; everything else is exact.
    for k in ("aliases", "mentions", "triples", "evidence"):
        keep = [row for row in after[k] if not jon & set(map(str, row))]
        assert keep == [row for row in before[k] if not jon & set(map(str, row))], k
    ents = {row[0]: row for row in after["entities"]}
    old = {row[0]: row for row in before["entities"]}
    assert ents[e["Tomás"]] == old[e["Tomás"]]
    assert ents[e["Tomas"]] == old[e["Tomas"]]
    await asyncio.to_thread(stack.publish, _upserted(w, ["Tomás", "Tomas"]), "entity.upserted")
    await asyncio.to_thread(_settle, stack)
    assert stack.sql("SELECT status FROM entity_merges WHERE workspace_id = %s AND merged_id = %s",
                     (w, e["Tomás"])) == [("reverted",)]
    assert stack.sql("SELECT merged_into FROM entities WHERE workspace_id = %s AND id = %s",
                     (w, e["Tomás"])) == [(None,)]
    assert stack.sql("SELECT status FROM entity_flags WHERE workspace_id = %s AND entity_a = %s AND entity_b = %s",
                     (w, *sorted((e["Tomás"], e["Tomas"])))) == [("kept_apart",)]


async def test_candidate_lookup_is_an_index_probe(pool: AsyncConnectionPool, stack: Stack) -> None:
    w = ws()
    with psycopg.connect(stack.database_url, autocommit=True) as admin:
        admin.execute("INSERT INTO entities (workspace_id, id, name) SELECT %s, 'e' || i, 'Name' || i"
                      " FROM generate_series(1, 3000) i", (w,))
        admin.execute("INSERT INTO entity_keys (workspace_id, key, entity_id)"
                      " SELECT %s, k || i, 'e' || i FROM generate_series(1, 3000) i, unnest('{n:name,b:}'::text[]) k",
                      (w,))
        admin.execute("ANALYZE entity_keys")
    async with workspace_tx(pool, w) as c:
        plan = "\n".join(r[0] for r in await (await c.execute(
            """EXPLAIN SELECT q.i, c.entity_id FROM unnest(%(i)s::int[], %(k)s::text[]) AS q(i, key)
               CROSS JOIN LATERAL (SELECT DISTINCT entity_id FROM entity_keys
                                    WHERE workspace_id = %(ws)s AND key = q.key LIMIT 51) c""",
            {"ws": w, "i": [0, 0, 1], "k": ["n:name7", "w:name7", "b:name"]})).fetchall())
        assert "entity_keys_pkey" in plan and "Seq Scan" not in plan, plan


def test_the_chain_from_one_session_to_dedup_and_replaying_every_event_changes_nothing(stack: Stack) -> None:
    """session.completed → drawers → episode → episodic.created → entities → entity.upserted → dedup,
    all through the services; then every event the pipeline published is published again."""
    w = ws()
    seen: list[tuple[str, bytes]] = []

    async def capture(ready: asyncio.Event, stop: asyncio.Event) -> None:
        nc = await nats.connect(stack.nats_url)

        async def cb(msg: Any) -> None:
            if json.loads(msg.data).get("workspace_id") == w:
                seen.append((msg.subject, msg.data))
        for subject in dict.fromkeys(c.subject for c in CONSUMERS):
            await nc.subscribe(subject, cb=cb)
        await nc.flush()
        ready.set()
        await stop.wait()
        await nc.drain()

    import threading
    loop = asyncio.new_event_loop()
    ready, stop = asyncio.Event(), asyncio.Event()
    th = threading.Thread(target=loop.run_until_complete, args=(capture(ready, stop),), daemon=True)
    th.start()
    wait_for(ready.is_set, 10, "the capture subscription")
    try:
        turns = ["Tomás booked the venue in Lisbon for the Orion launch next March.",
                 "Tomas said the Lisbon venue has room for forty people and a small stage.",
                 "We asked Caroline to paint the posters, and Carolina handles the catering budget.",
                 "We need the final guest list from Tomás by Friday for the Orion launch."]
        stack.publish(session(w, "s1", turns))
        e = {n: entity_id(w, n) for n in ("Tomás", "Tomas", "Caroline", "Carolina")}
        wait_for(lambda: stack.sql("SELECT 1 FROM entity_merges WHERE workspace_id = %s AND merged_id IN (%s, %s)",
                                   (w, e["Tomás"], e["Tomas"])), 90, "the Tomás/Tomas merge")
        _settle(stack)
        merges = stack.sql("SELECT survivor_id, merged_id, rule FROM entity_merges WHERE workspace_id = %s"
                           " ORDER BY 1, 2", (w,))
        assert (e["Tomás"], e["Tomas"], "same_name") in merges or (e["Tomas"], e["Tomás"], "same_name") in merges
        live = dict(stack.sql("SELECT name, merged_into FROM entities WHERE workspace_id = %s", (w,)))
        assert live["Caroline"] is None and live["Carolina"] is None  # look-alikes are never merged
        subjects = {s for s, _ in seen}
        assert {"session.completed", "drawer.created", "drawer.embedded", "session.stored", "episodic.created",
                "entity.upserted"} <= subjects, subjects
        state = _graph(stack, w)
        episodes = stack.sql("SELECT id, status, summary, announced_at FROM episodes WHERE workspace_id = %s", (w,))
        drawers = stack.sql("SELECT id, state, wing, room FROM drawers WHERE workspace_id = %s ORDER BY id", (w,))
        n = len(seen)
        for subject, data in list(seen):
            stack.publish(data, subject)  # no Nats-Msg-Id: the stream takes every copy
        wait_for(lambda: len(seen) >= 2 * n, 30, "the replays to be published")
        _settle(stack)
        assert _graph(stack, w) == state
        assert stack.sql("SELECT id, status, summary, announced_at FROM episodes WHERE workspace_id = %s",
                         (w,)) == episodes
        assert stack.sql("SELECT id, state, wing, room FROM drawers WHERE workspace_id = %s ORDER BY id",
                         (w,)) == drawers
        assert stack.sql("SELECT survivor_id, merged_id, rule FROM entity_merges WHERE workspace_id = %s"
                         " ORDER BY 1, 2", (w,)) == merges
    finally:
        loop.call_soon_threadsafe(stop.set)
        th.join(10)


async def test_entities_from_before_dedup_get_their_keys_and_are_found(pool: AsyncConnectionPool,
                                                                       stack: Stack) -> None:
    from shared.db.entity_dedup import key_entities_span
    from shared.db.tenancy import maintenance_tx

    w = ws()
    old = entity_id(w, "Zoë Quill")
    # Written as an older release did: no dedup keys.
    stack.sql("INSERT INTO entities (workspace_id, id, name, entity_type, mention_count) VALUES"
              " (%s, %s, 'Zoë Quill', 'person', 3) RETURNING 1", (w, old))
    after: tuple[str, str] | None = (w, "")
    async with maintenance_tx(pool) as conn:  # the walk cluster makes at start, from this workspace on
        while after is not None and after[0] == w:
            after = await key_entities_span(conn, after, 500)
    assert ("n:zoequill",) in stack.sql("SELECT key FROM entity_keys WHERE workspace_id = %s AND entity_id = %s",
                                        (w, old))
    async with workspace_tx(pool, w) as c:
        await ensure_entities(c, w, [("Zoe Quill", "concept")])
    await asyncio.to_thread(stack.publish, _upserted(w, ["Zoe Quill"]), "entity.upserted")
    rows = await asyncio.to_thread(wait_for, lambda: stack.sql(
        "SELECT survivor_id, rule FROM entity_merges WHERE workspace_id = %s", (w,)), 60, "the merge")
    assert rows == [(old, "same_name")]


async def test_a_chain_of_merges_resolves_to_its_end_on_write(pool: AsyncConnectionPool, stack: Stack) -> None:
    """A merged into B, then B into C: what is written under A lands on C, and what A gained meanwhile
    moves on along both merges, each revertible."""
    from shared.db.kg import record_extraction, resolve_entity
    from shared.kg_dedup import dedup_entities, operator_merge
    from shared.memory.kg import Sighting

    w = ws()
    e = {n: entity_id(w, n) for n in ("Bobby", "Bob", "Robert")}
    async with workspace_tx(pool, w) as c:
        await ensure_entities(c, w, [(n, "person") for n in e])
    stack.sql("INSERT INTO drawers (workspace_id, id, content, content_hash) SELECT %s, d, 'text of ' || d, d"
              " FROM unnest('{d-1,d-2,d-3}'::text[]) d RETURNING 1", (w,))
    m1 = await operator_merge(pool, w, e["Bob"], e["Bobby"], actor="test")
    m2 = await operator_merge(pool, w, e["Robert"], e["Bob"], actor="test")
    async with workspace_tx(pool, w) as c:
        assert await resolve_entity(c, w, "Bobby") == e["Robert"]
        added = await add_triple(c, w, "Bobby", "lives_in", "Lisbon", valid_from="2025-01-01")
        assert added.fact.subject_id == e["Robert"]
        await record_extraction(c, w, [Sighting("d-1", None, None, None, entities=(("Bobby", "person", 0.9),))])
    assert stack.sql("SELECT entity_id FROM entity_mentions WHERE workspace_id = %s AND drawer_id = 'd-1'",
                     (w,)) == [(e["Robert"],)]
    # Something written straight onto the first loser (an older writer): absorbed along the chain.
    stack.sql("INSERT INTO entity_mentions (workspace_id, entity_id, drawer_id) VALUES (%s, %s, 'd-2') RETURNING 1",
              (w, e["Bobby"]))
    out = await dedup_entities(pool, w, [e["Bobby"]], context_threshold=0.8)
    assert out.followups == 2
    assert stack.sql("SELECT entity_id FROM entity_mentions WHERE workspace_id = %s AND drawer_id = 'd-2'",
                     (w,)) == [(e["Robert"],)]
    # Reverting the later merge, then the earlier one, gives each entity back what it had.
    async with workspace_tx(pool, w) as c:
        await revert_merge(c, w, m2, actor="test")
    assert stack.sql("SELECT entity_id FROM entity_mentions WHERE workspace_id = %s AND drawer_id = 'd-2'",
                     (w,)) == [(e["Bob"],)]
    async with workspace_tx(pool, w) as c:
        await revert_merge(c, w, m1, actor="test")
    assert stack.sql("SELECT entity_id FROM entity_mentions WHERE workspace_id = %s AND drawer_id = 'd-2'",
                     (w,)) == [(e["Bobby"],)]
    assert stack.sql("SELECT count(*) FROM entities WHERE workspace_id = %s AND merged_into IS NOT NULL",
                     (w,)) == [(0,)]


async def test_forgetting_what_named_a_merged_entity_reaches_the_merge(pool: AsyncConnectionPool, stack: Stack) -> None:
    """Dedup moved the merged entity's mentions to the survivor and kept them, with its name and aliases, in
    the merge for a revert. Forgetting the only drawer that named it forgets it there too (no revert can
    bring the name back); forgetting one of several leaves the merge, without that drawer."""
    from shared.forget import Scope, forget
    from shared.kg_dedup import operator_merge

    w = ws()
    e = {n: entity_id(w, n) for n in ("Robert", "Bobby", "Rob")}
    async with workspace_tx(pool, w) as c:
        await ensure_entities(c, w, [(n, "person") for n in e])
    stack.sql("INSERT INTO drawers (workspace_id, id, content, content_hash) SELECT %s, d, 'text of ' || d, d"
              " FROM unnest('{d-1,d-2,d-3,d-4}'::text[]) d RETURNING 1", (w,))
    stack.sql("INSERT INTO entity_mentions (workspace_id, entity_id, drawer_id) VALUES (%s, %s, 'd-1'),"
              " (%s, %s, 'd-2'), (%s, %s, 'd-3'), (%s, %s, 'd-4') RETURNING 1",
              (w, e["Robert"], w, e["Bobby"], w, e["Rob"], w, e["Rob"]))
    only = await operator_merge(pool, w, e["Robert"], e["Bobby"], actor="test")
    several = await operator_merge(pool, w, e["Robert"], e["Rob"], actor="test")
    assert {r[0] for r in stack.sql("SELECT alias FROM entity_aliases WHERE workspace_id = %s AND entity_id = %s",
                                    (w, e["Robert"]))} >= {"Bobby", "Rob"}

    async def drop(drawer: str) -> dict[str, int]:
        return dict((await forget(pool, stack.settings, stack.nats_url, Scope(w, "drawer", drawer),
                                  requested_by="test")).counts)

    counts = await drop("d-2")
    assert counts["entity_merges_scrubbed"] == 1
    assert stack.sql("SELECT id FROM entities WHERE workspace_id = %s AND id = %s", (w, e["Bobby"])) == []
    assert stack.sql("SELECT id FROM entity_merges WHERE workspace_id = %s ORDER BY id", (w,)) == [(several,)]
    aliases = {r[0] for r in stack.sql("SELECT alias FROM entity_aliases WHERE workspace_id = %s", (w,))}
    assert "Bobby" not in aliases and "Rob" in aliases
    assert stack.sql("SELECT count(*) FROM memory_history WHERE workspace_id = %s AND action = 'ENTITY_MERGE'"
                     " AND (old_value::text LIKE '%%Bobby%%' OR new_value::text LIKE %s)", (w, f"%{only}%")) == [(0,)]
    counts = await drop("d-3")
    assert counts["entity_merges_scrubbed"] == 1
    (snap,) = stack.sql("SELECT snapshot FROM entity_merges WHERE workspace_id = %s AND id = %s", (w, several))[0]
    assert snap["mentions"] == ["d-4"]
    assert stack.sql("SELECT merged_into FROM entities WHERE workspace_id = %s AND id = %s",
                     (w, e["Rob"])) == [(e["Robert"],)]


async def test_a_merge_whose_survivor_was_merged_since_is_reverted_last_first(
        pool: AsyncConnectionPool, stack: Stack) -> None:
    """A into B, then B into C: what the first merge gave B went on to C, so reverting it alone would leave A's
    name on C (and the next upsert would merge A again through it). It is refused until B→C is reverted."""
    from shared.db.entity_dedup import merge_entities
    from shared.memory.entity_dedup import Decision

    w = ws()
    a, b, c = (entity_id(w, n) for n in ("Alpha Centauri Ltd", "Beta Ltd", "Gamma Ltd"))
    async with workspace_tx(pool, w) as conn:
        await ensure_entities(conn, w, [("Alpha Centauri Ltd", "organization"), ("Beta Ltd", "organization"),
                                        ("Gamma Ltd", "organization")])
        first = await merge_entities(conn, w, Decision("merge", "operator", "test", survivor=b, loser=a),
                                     actor="test", event_id=None)
        second = await merge_entities(conn, w, Decision("merge", "operator", "test", survivor=c, loser=b),
                                      actor="test", event_id=None)
    assert first and second
    async with workspace_tx(pool, w) as conn:
        with pytest.raises(MergeError, match=f"merge {second}.*revert that merge first"):
            await revert_merge(conn, w, first, actor="test")
    async with workspace_tx(pool, w) as conn:
        await revert_merge(conn, w, second, actor="test")
        await revert_merge(conn, w, first, actor="test")
    assert stack.sql("SELECT id FROM entities WHERE workspace_id = %s AND merged_into IS NULL ORDER BY id",
                     (w,)) == sorted([(a,), (b,), (c,)])


async def test_two_spellings_deduplicated_side_by_side_still_meet(pool: AsyncConnectionPool, stack: Stack,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Two new spellings of one name, each in its own entity.upserted, handled at the same moment (two
    batches, two replicas): both search for candidates before either is done, and they still merge."""
    from shared import kg_dedup
    from shared.db import entity_dedup as dedup_sql

    w = ws()
    async with workspace_tx(pool, w) as c:
        await ensure_entities(c, w, [("Zoë Quill", "person"), ("Zoe Quill", "person")])
    both_searching = asyncio.Barrier(2)
    real = dedup_sql.candidates_of

    async def side_by_side(*args: Any, **kwargs: Any) -> Any:
        await asyncio.wait_for(both_searching.wait(), 30)
        return await real(*args, **kwargs)

    monkeypatch.setattr(dedup_sql, "candidates_of", side_by_side)
    threshold = stack.settings.entity_context_similarity
    await asyncio.gather(*(kg_dedup.dedup_entities(pool, w, [entity_id(w, n)], context_threshold=threshold)
                           for n in ("Zoë Quill", "Zoe Quill")))
    assert stack.sql("SELECT rule FROM entity_merges WHERE workspace_id = %s", (w,)) == [("same_name",)]


async def test_a_merge_decided_before_the_pair_was_kept_apart_is_not_written(pool: AsyncConnectionPool,
                                                                              stack: Stack) -> None:
    """Dedup decides a merge in one transaction and writes it in another; an operator keeping the pair apart
    in between wins. An operator's own merge of the pair is still theirs to make."""
    from shared.db.entity_dedup import keep_apart, merge_entities
    from shared.kg_dedup import operator_merge
    from shared.memory.entity_dedup import Decision

    w = ws()
    a, b = entity_id(w, "Ines Duarte"), entity_id(w, "Inês Duarte")
    async with workspace_tx(pool, w) as c:
        await ensure_entities(c, w, [("Ines Duarte", "person"), ("Inês Duarte", "person")])
    decided = Decision("merge", "same_name", "same name", survivor=a, loser=b, score=1.0)
    async with workspace_tx(pool, w) as c:
        await keep_apart(c, w, a, b, actor="operator", reason="two people")
    async with workspace_tx(pool, w) as c:
        assert await merge_entities(c, w, decided, actor="cluster", event_id=None, unless_kept_apart=True) is None
    assert stack.sql("SELECT count(*) FROM entity_merges WHERE workspace_id = %s", (w,)) == [(0,)]
    assert await operator_merge(pool, w, a, b, actor="operator")
