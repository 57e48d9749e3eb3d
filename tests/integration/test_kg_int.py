"""The temporal knowledge graph against real PostgreSQL (row-level security on, as the services run)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from shared.db.kg import (
    add_aliases,
    add_triple,
    ensure_entities,
    entity_timeline,
    invalidate_triple,
    kg_stats,
    link_drawers,
    query_entity,
    resolve_entity,
)
from shared.db.pool import open_pool
from shared.db.tenancy import workspace_tx
from shared.memory.kg import KgError, entity_id
from tests.integration.helpers import Stack, session, wait_for, ws


@pytest.fixture
async def pool(stack: Stack) -> AsyncIterator[AsyncConnectionPool]:
    p = await open_pool(stack.database_url, name="test-kg", max_size=2)
    try:
        yield p
    finally:
        await p.close()


def _d(s: str) -> datetime:
    return datetime.fromisoformat(s).replace(tzinfo=UTC)


async def test_what_did_we_use_before_postgresql(pool: AsyncConnectionPool, stack: Stack) -> None:
    w = ws()
    async with workspace_tx(pool, w) as c:
        mongo = await add_triple(c, w, "Crawbl Backend", "uses", "MongoDB", valid_from="2024-06-01",
                                 subject_type="service", object_type="technology")
        pg = await add_triple(c, w, "crawbl backend", "Uses", "PostgreSQL", valid_from="2025-01-15")
        assert mongo.created and mongo.subject_created and mongo.object_created
        assert pg.created and not pg.subject_created and pg.fact.subject == "Crawbl Backend"
        ended = await invalidate_triple(c, w, "Crawbl Backend", "uses", "MongoDB", ended="2025-01-14")
        assert [f.object for f in ended] == ["MongoDB"] and ended[0].valid_to == _d("2025-01-14")
        # Nothing current is left to end: a second invalidation changes nothing.
        assert await invalidate_triple(c, w, "Crawbl Backend", "uses", "MongoDB") == []

    async with workspace_tx(pool, w) as c:
        before = await query_entity(c, w, "Crawbl Backend", as_of="2024-12-01", direction="outgoing")
        assert [(f.object, f.current) for f in before] == [("MongoDB", False)]
        # The end is included (a fact ended on the 14th held that day); right after it, it no longer holds.
        assert [f.object for f in await query_entity(c, w, "crawbl backend", as_of="2025-01-14")] == ["MongoDB"]
        assert [f.object for f in await query_entity(c, w, "Crawbl Backend", as_of=_d("2025-01-14"))] == ["MongoDB"]
        assert await query_entity(c, w, "Crawbl Backend", as_of=_d("2025-01-14T00:00:01")) == []
        assert [f.object for f in await query_entity(c, w, "Crawbl Backend", as_of="2025-02-01")] == ["PostgreSQL"]
        everything = await query_entity(c, w, "Crawbl Backend")
        assert [(f.object, f.current, f.direction) for f in everything] == [
            ("MongoDB", False, "outgoing"), ("PostgreSQL", True, "outgoing")]
        incoming = await query_entity(c, w, "PostgreSQL", direction="in")
        assert [(f.subject, f.predicate, f.direction) for f in incoming] == [("Crawbl Backend", "uses", "incoming")]
        assert await query_entity(c, w, "PostgreSQL", direction="outgoing") == []
        assert await query_entity(c, w, "Nobody") == []

        timeline = await entity_timeline(c, w, "Crawbl Backend")
        assert [(f.object, f.valid_from, f.valid_to) for f in timeline] == [
            ("MongoDB", _d("2024-06-01"), _d("2025-01-14")), ("PostgreSQL", _d("2025-01-15"), None)]
        assert [f.object for f in await entity_timeline(c, w)] == ["MongoDB", "PostgreSQL"]

        stats = await kg_stats(c, w)
        assert (stats.entities, stats.triples, stats.current_facts, stats.expired_facts) == (3, 2, 1, 1)
        assert stats.relationship_types == {"uses": 2}

    async with workspace_tx(pool, w) as c:
        # Said again while it held (an older session ingested late): the same fact, nothing added.
        again = await add_triple(c, w, "Crawbl Backend", "uses", "MongoDB", valid_from="2024-08-01")
        assert not again.created and again.fact.id == mongo.fact.id and again.fact.valid_to == _d("2025-01-14")
        # Replayed: nothing added.
        assert not (await add_triple(c, w, "Crawbl Backend", "uses", "PostgreSQL", valid_from="2025-01-15")).created
        # Said before it was first recorded: the current fact's start moves back, it is not doubled.
        earlier = await add_triple(c, w, "Crawbl Backend", "uses", "PostgreSQL", valid_from="2025-01-14T23:00:00Z")
        assert not earlier.created and earlier.fact.id == pg.fact.id
        assert earlier.fact.valid_from == _d("2025-01-14T23:00:00")
        with pytest.raises(KgError, match="after the end"):
            await invalidate_triple(c, w, "Crawbl Backend", "uses", "PostgreSQL", ended="2020-01-01")
    assert stack.sql("SELECT count(*) FROM triples WHERE workspace_id = %s", (w,))[0][0] == 2
    assert stack.sql("SELECT count(*) FROM memory_history WHERE workspace_id = %s AND action = 'KG_INVALIDATE'",
                     (w,))[0][0] == 1
    # Another workspace sees none of it.
    async with workspace_tx(pool, ws()) as c:
        assert await query_entity(c, ws(), "Crawbl Backend") == []


async def test_a_late_statement_never_reopens_a_fact_across_its_invalidation(pool: AsyncConnectionPool) -> None:
    """Said on Jan 10, ended Mar 1, said again Jun 1 (a second fact, current): a session from Jan 1 imported
    late moves the first fact's start back, not the current one's, so April still has no such fact."""
    w = ws()
    async with workspace_tx(pool, w) as c:
        await add_triple(c, w, "Ines", "works_at", "Acme", valid_from="2025-01-10")
        await invalidate_triple(c, w, "Ines", "works_at", "Acme", ended="2025-03-01")
        await add_triple(c, w, "Ines", "works_at", "Acme", valid_from="2025-06-01")
        late = await add_triple(c, w, "Ines", "works_at", "Acme", valid_from="2025-01-01")
        assert not late.created
        timeline = await entity_timeline(c, w, "Ines")
        assert [(f.valid_from, f.valid_to) for f in timeline] == [
            (_d("2025-01-01"), _d("2025-03-01")), (_d("2025-06-01"), None)]
        assert await query_entity(c, w, "Ines", as_of="2025-04-15") == []
        assert [f.object for f in await query_entity(c, w, "Ines", as_of="2025-01-05")] == ["Acme"]


async def test_past_the_limit_the_facts_holding_now_and_the_latest_are_kept(pool: AsyncConnectionPool) -> None:
    """A busy entity read with a small limit: what holds now and the latest facts come back, in the order
    they started (oldest first, the read ended before today's facts)."""
    w = ws()
    async with workspace_tx(pool, w) as c:
        await add_triple(c, w, "Vega", "lives_in", "Lisbon", valid_from="2015-03-01")  # still true
        for year, tool in ((2020, "Jira"), (2021, "Linear"), (2022, "Asana")):
            await add_triple(c, w, "Vega", "uses", tool, valid_from=f"{year}-01-01")
            await invalidate_triple(c, w, "Vega", "uses", tool, ended=f"{year}-12-31")
        got = await query_entity(c, w, "Vega", limit=2)
        assert [(f.object, f.current) for f in got] == [("Lisbon", True), ("Asana", False)]
        assert [f.object for f in await entity_timeline(c, w, "Vega", limit=2)] == ["Lisbon", "Asana"]
        assert [f.object for f in await query_entity(c, w, "Vega", as_of="2021-06-01", limit=1)] == ["Linear"]
        assert [f.object for f in await entity_timeline(c, w, None, limit=2)] == ["Linear", "Asana"]


async def test_a_fact_is_stamped_with_when_it_was_said(pool: AsyncConnectionPool, stack: Stack) -> None:
    w = ws()
    msg = session(w, "s1", ["We are moving the billing service from MySQL to PostgreSQL next month.",
                            "Good, PostgreSQL will make the reporting queries much easier for the team."])
    msg["messages"][1]["created_at"] = "2026-10-03T08:15:00Z"
    await asyncio.to_thread(stack.publish, msg)
    rows = await asyncio.to_thread(wait_for, lambda: stack.sql(
        "SELECT id, seq FROM drawers WHERE workspace_id = %s AND seq = 1", (w,)), 60, "drawer")
    drawer, seq = rows[0]
    async with workspace_tx(pool, w) as c:
        added = await add_triple(c, w, "billing service", "uses", "PostgreSQL", source_drawer=drawer,
                                 source_episode="e" * 32)
    f = added.fact
    assert f.valid_from == _d("2026-10-03T08:15:00"), "valid_from is the message's time, not the processing time"
    assert (f.source_drawer, f.source_session, f.source_seq, f.source_episode) == (drawer, "s1", seq, "e" * 32)
    assert f.created_at > f.valid_from


async def test_bad_input_is_a_clear_error(pool: AsyncConnectionPool) -> None:
    w = ws()
    async with workspace_tx(pool, w) as c:
        for args, kw, msg in [
            (("", "uses", "X"), {}, "subject is empty"),
            (("A", "  ", "X"), {}, "predicate is empty"),
            (("A", "uses", "X"), {"confidence": 1.5}, "confidence"),
            (("A", "uses", "X"), {"valid_from": "soon"}, "ISO 8601"),
            (("A", "uses", "X"), {"valid_from": "2025-02-01", "valid_to": "2025-01-01"}, "before valid_from"),
        ]:
            with pytest.raises(KgError, match=msg):
                await add_triple(c, w, *args, **kw)
        with pytest.raises(KgError, match="direction"):
            await query_entity(c, w, "A", direction="up")
    async with workspace_tx(pool, w) as c:
        assert (await kg_stats(c, w)).entities == 0


async def test_concurrent_adds_make_one_fact(pool: AsyncConnectionPool, stack: Stack) -> None:
    w = ws()

    async def add() -> bool:
        async with workspace_tx(pool, w) as c:
            return (await add_triple(c, w, "Alice", "owns", "Auth Module", valid_from="2025-03-01")).created

    created = await asyncio.gather(add(), add())
    assert sorted(created) == [False, True]
    assert stack.sql("SELECT count(*) FROM triples WHERE workspace_id = %s", (w,))[0][0] == 1


async def test_entity_lookups_use_the_indexes(pool: AsyncConnectionPool, stack: Stack) -> None:
    w = ws()
    with psycopg.connect(stack.database_url, autocommit=True) as admin:
        admin.execute("""INSERT INTO triples (workspace_id, id, subject_id, predicate, object_id, valid_from)
                         SELECT %s, 't' || i, 's' || (i %% 200), 'p' || i, 'o' || (i %% 300),
                                now() - i * interval '1 day'
                           FROM generate_series(1, 3000) i""", (w,))
        admin.execute("ANALYZE triples")
    async with workspace_tx(pool, w) as c:
        for sql, index in [
            ("SELECT id FROM triples WHERE workspace_id = %s AND subject_id = 's7' AND valid_from <= now()",
             "triples_subject_from"),
            ("SELECT id FROM triples WHERE workspace_id = %s AND object_id = 'o7' AND valid_from <= now()",
             "triples_object_from"),
        ]:
            plan = "\n".join(r[0] for r in await (await c.execute("EXPLAIN " + sql, (w,))).fetchall())
            assert index in plan, plan


async def test_inline_linker_links_existing_entities_and_creates_none(pool: AsyncConnectionPool,
                                                                      stack: Stack) -> None:
    w = ws()
    async with workspace_tx(pool, w) as c:
        await add_triple(c, w, "Caroline", "lives_in", "Lisbon", valid_from="2025-01-01")
        await add_triple(c, w, "Max", "is_a", "dog", valid_from="2025-01-01")
        (orion,) = await ensure_entities(c, w, [("Orion Project", "project")])
        assert await add_aliases(c, w, orion, ["Orion", "orion"]) == 1  # one key, added once
    before = stack.sql("SELECT count(*) FROM entities WHERE workspace_id = %s", (w,))[0][0]
    texts = ["Caroline walked Max along the river in Lisbon yesterday evening.",
             "We ran at max speed towards the Orion launch pad, Caroline's idea.",
             "Zebulon Quartz has never been mentioned before in this workspace."]
    drawers = [(f"{i:032x}", t) for i, t in enumerate(texts)]
    stack.sql("INSERT INTO drawers (workspace_id, id, content, content_hash) SELECT %s, d, t, d"
              " FROM unnest(%s::text[], %s::text[]) AS x(d, t) RETURNING 1",
              (w, [d for d, _ in drawers], texts))
    async with workspace_tx(pool, w) as c:
        res = await link_drawers(c, w, drawers)
    eid = {n: entity_id(w, n) for n in ("Caroline", "Max", "Lisbon", "Orion Project")}
    assert res.links == {drawers[0][0]: {eid["Caroline"], eid["Max"], eid["Lisbon"]},
                         drawers[1][0]: {eid["Orion Project"], eid["Caroline"]}}
    assert res.new_mentions == 5
    assert stack.sql("SELECT count(*) FROM entities WHERE workspace_id = %s", (w,))[0][0] == before
    counts = dict(stack.sql("SELECT e.name, count(m.drawer_id) FROM entities e LEFT JOIN entity_mentions m"
                            " ON m.workspace_id = e.workspace_id AND m.entity_id = e.id WHERE e.workspace_id = %s"
                            " GROUP BY e.name", (w,)))
    assert counts["Caroline"] == 2 and counts["Orion Project"] == 1 and counts["dog"] == 0
    assert stack.sql("SELECT entity_count FROM drawers WHERE workspace_id = %s AND id = %s",
                     (w, drawers[0][0]))[0][0] == 3
    async with workspace_tx(pool, w) as c:
        again = await link_drawers(c, w, drawers)  # replay: same links, nothing new
        assert again.new_mentions == 0 and again.links == res.links
        # The alias also names the entity in graph queries.
        assert await resolve_entity(c, w, "orion") == orion


def test_ingest_links_a_new_drawer_to_an_existing_entity(stack: Stack) -> None:
    """Through the pipeline: the link comes from ingest's linker (the pattern extractor would file
    'Orion' as an entity of its own, never as the alias of 'Orion Project')."""
    w = ws()

    async def seed() -> str:
        p = await open_pool(stack.database_url, name="test-kg-seed", max_size=1)
        try:
            async with workspace_tx(p, w) as c:
                (orion,) = await ensure_entities(c, w, [("Orion Project", "project")])
                await add_aliases(c, w, orion, ["Orion"])
                return orion
        finally:
            await p.close()

    orion = asyncio.run(seed())
    stack.publish(session(w, "s1", ["The Orion launch moved to March because the venue fell through."]))
    rows = wait_for(lambda: stack.sql("SELECT drawer_id FROM entity_mentions WHERE workspace_id = %s"
                                      " AND entity_id = %s", (w, orion)), 60, "the linker's mention")
    assert stack.sql("SELECT content FROM drawers WHERE workspace_id = %s AND id = %s", (w, rows[0][0]))[0][0] \
        .startswith("The Orion launch")


async def test_the_linker_probe_uses_the_alias_index(pool: AsyncConnectionPool, stack: Stack) -> None:
    w = ws()
    with psycopg.connect(stack.database_url, autocommit=True) as admin:
        admin.execute("INSERT INTO entities (workspace_id, id, name) SELECT %s, 'e' || i, 'name ' || i"
                      " FROM generate_series(1, 3000) i", (w,))
        admin.execute("INSERT INTO entity_aliases (workspace_id, alias_key, anchor, entity_id, alias, cased)"
                      " SELECT %s, 'name ' || i, 'name' || i, 'e' || i, 'Name ' || i, true"
                      " FROM generate_series(1, 3000) i", (w,))
        admin.execute("ANALYZE entity_aliases")
    async with workspace_tx(pool, w) as c:
        plan = "\n".join(r[0] for r in await (await c.execute(
            "EXPLAIN SELECT alias_key, entity_id, cased FROM entity_aliases WHERE workspace_id = %s"
            " AND anchor = ANY(%s)", (w, ["name7", "walked", "the", "river"]))).fetchall())
        assert "entity_aliases_anchor" in plan, plan


async def test_an_extraction_writes_its_facts_as_one_at_a_time_would(pool: AsyncConnectionPool, stack: Stack) -> None:
    """record_extraction decides the facts said once together and the others in order: a new fact, one
    already true (found, its start kept), one said before the current row began (the start moves earlier),
    one said again later in the same extraction, one said first late then early, one said twice at the same
    time, and one with no time (the turn's message, else the drawer's). A replay writes nothing."""
    from shared.db.kg import record_extraction
    from shared.memory.kg import Sighting

    w = ws()
    stack.sql("INSERT INTO drawers (workspace_id, id, content, content_hash, occurred_at)"
              " SELECT %s, d, 'text of ' || d, d, '2024-05-05T00:00:00Z' FROM unnest('{d-1,d-2,d-3}'::text[]) d"
              " RETURNING 1", (w,))
    async with workspace_tx(pool, w) as c:
        await add_triple(c, w, "Ann", "likes", "tea", valid_from="2024-03-01")
        await add_triple(c, w, "Ann", "owns", "bike", valid_from="2024-06-01")

    def sg(drawer: str, when: str | None, *facts: tuple[str, str, str]) -> Sighting:
        return Sighting(drawer, _d(when) if when else None, "s-1" if when else None, 1 if when else None,
                        triples=tuple((s, p, o, 0.6) for s, p, o in facts))

    sightings = [
        sg("d-1", "2024-04-01", ("Ann", "visited", "Rome"), ("Ann", "likes", "tea"), ("Ann", "owns", "bike"),
           ("Ann", "reads", "Dune")),
        sg("d-2", "2024-04-20", ("Ann", "reads", "Dune"), ("Ann", "plays", "chess")),
        sg("d-3", "2024-04-10", ("Ann", "plays", "chess")),
        sg("d-3", None, ("Ann", "from", "Oslo")),
        sg("d-2", "2024-04-01", ("Ann", "visited", "Rome")),  # the same fact at the same time: one row
    ]
    async with workspace_tx(pool, w) as c:
        first = await record_extraction(c, w, sightings)
    assert first.new_facts == 4 and not first.skipped  # Rome, Dune, chess, Oslo
    rows = stack.sql("SELECT o.name, t.predicate, t.valid_from, t.source_drawer FROM triples t"
                     " JOIN entities o ON o.workspace_id = t.workspace_id AND o.id = t.object_id"
                     " WHERE t.workspace_id = %s ORDER BY lower(o.name)", (w,))
    assert rows == [
        ("bike", "owns", _d("2024-04-01"), "d-1"),  # said before it was recorded as starting: moved earlier
        ("chess", "plays", _d("2024-04-10"), "d-3"),  # said late, then early: one row, the earlier start
        ("Dune", "reads", _d("2024-04-01"), "d-1"),  # said again later: the same row
        ("Oslo", "from", _d("2024-05-05"), "d-3"),  # no time given: the drawer's
        ("Rome", "visited", _d("2024-04-01"), "d-1"),
        ("tea", "likes", _d("2024-03-01"), None),  # already true: kept as it was
    ]
    evidence = stack.sql("SELECT o.name, v.drawer_id, v.said_at FROM triple_evidence v"
                         " JOIN triples t ON t.workspace_id = v.workspace_id AND t.id = v.triple_id"
                         " JOIN entities o ON o.workspace_id = t.workspace_id AND o.id = t.object_id"
                         " WHERE v.workspace_id = %s ORDER BY lower(o.name), 2", (w,))
    assert evidence == [
        ("bike", "d-1", _d("2024-04-01")), ("chess", "d-2", _d("2024-04-20")), ("chess", "d-3", _d("2024-04-10")),
        ("Dune", "d-1", _d("2024-04-01")), ("Dune", "d-2", _d("2024-04-01")), ("Oslo", "d-3", _d("2024-05-05")),
        ("Rome", "d-1", _d("2024-04-01")), ("Rome", "d-2", _d("2024-04-01")), ("tea", "d-1", _d("2024-03-01")),
    ]
    async with workspace_tx(pool, w) as c:
        again = await record_extraction(c, w, sightings)
    assert again.new_facts == 0
    assert stack.sql("SELECT count(*) FROM triples WHERE workspace_id = %s", (w,)) == [(6,)]
    assert stack.sql("SELECT count(*) FROM triple_evidence WHERE workspace_id = %s", (w,)) == [(9,)]
