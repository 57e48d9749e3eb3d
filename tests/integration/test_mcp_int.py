"""The MCP server against the real stack: an MCP client session over stdio (``palace mcp`` as a
subprocess) and over streamable HTTP (the api's /mcp) lists the tools and calls every one of them;
a key of one workspace never reaches another's drawers."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import httpx2
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from shared.security import key_id_of
from tests.integration.helpers import Stack, api_key_for, restore, wait_for, ws

EXPECTED_TOOLS = {
    "memory_status", "memory_list_wings", "memory_list_rooms", "memory_get_taxonomy", "memory_search",
    "memory_check_duplicate", "memory_traverse", "memory_find_tunnels", "memory_graph_stats", "memory_add_drawer",
    "memory_delete_drawer", "memory_set_identity", "memory_diary_write", "memory_diary_read", "memory_wake_up",
    "memory_inject", "memory_kg_query", "memory_kg_add", "memory_kg_invalidate", "memory_kg_timeline",
    "memory_kg_stats", "memory_get_drawer", "memory_forget", "memory_recall",
}

# (content, wing, room): alice/{music, hiking}, bob/{music, cooking}; music is the tunnel.
MEMORIES = [
    ("Alice takes violin lessons every Tuesday evening at the conservatory.", "alice", "music"),
    ("Alice hiked the whole Kungsleden trail in Lapland last August.", "alice", "hiking"),
    ("Bob plays bass guitar in a jazz trio on Friday nights.", "bob", "music"),
    ("Bob bakes sourdough bread with a starter he calls Gerald.", "bob", "cooking"),
]


async def call(session: ClientSession, name: str, **args: Any) -> dict[str, Any]:
    result = await session.call_tool(name, args)
    assert not result.is_error, f"{name}: {result.content}"
    assert result.structured_content is not None, name
    return result.structured_content


async def call_error(session: ClientSession, name: str, **args: Any) -> str:
    result = await session.call_tool(name, args)
    assert result.is_error, f"{name} should have failed: {result.structured_content}"
    return " ".join(getattr(c, "text", "") for c in result.content)


def _live_drawers(stack: Stack, w: str) -> int:
    return stack.sql("SELECT count(*) FROM drawers WHERE workspace_id = %s AND deleted_at IS NULL", (w,))[0][0]


async def exercise_every_tool(session: ClientSession, stack: Stack, w: str, requester: str = "mcp",
                              broad_forget: bool = False) -> dict[str, str]:
    """Call all tools in a fresh workspace ``w`` and check what they return. Returns content → drawer id.
    ``broad_forget``: the server lets memory_forget take a user, an agent or everything."""
    tools = await session.list_tools()
    assert {t.name for t in tools.tools} == EXPECTED_TOOLS
    for t in tools.tools:
        assert t.description and len(t.description) > 40, t.name
        assert "workspace" not in t.input_schema.get("properties", {}), f"{t.name} must not take a workspace"

    empty = await call(session, "memory_status")
    assert empty["drawers"] == 0 and empty["identity"] is None

    # Writes go raw-first through the bus; ingest, embed and classify file them.
    ids: dict[str, str] = {}
    for content, wing, room in MEMORIES:
        acc = await call(session, "memory_add_drawer", content=content, wing=wing, room=room, agent="tester")
        assert acc["status"] == "accepted" and acc["wing"] == wing and acc["room"] == room
        assert len(acc["drawer_ids"]) == 1
        ids[content] = acc["drawer_ids"][0]
    again = await call(session, "memory_add_drawer", content=MEMORIES[0][0], wing="alice", room="music")
    assert again["drawer_ids"] == [ids[MEMORIES[0][0]]], "the same text is the same drawer"
    await asyncio.to_thread(stack.wait_processed, w, len(MEMORIES))
    assert stack.sql("SELECT count(*) FROM messages WHERE workspace_id = %s", (w,))[0][0] == len(MEMORIES)
    assert "noise" in await call_error(session, "memory_add_drawer", content="ok")

    status = await call(session, "memory_status")
    assert (status["drawers"], status["wings"], status["rooms"], status["tunnels"]) == (4, 2, 3, 1)
    wings = await call(session, "memory_list_wings")
    assert wings["wings"] == [{"wing": "alice", "drawers": 2}, {"wing": "bob", "drawers": 2}]
    rooms = await call(session, "memory_list_rooms", wing="bob")
    assert rooms["rooms"] == [{"room": "cooking", "drawers": 1}, {"room": "music", "drawers": 1}]
    all_rooms = await call(session, "memory_list_rooms")
    assert {r["room"]: r["drawers"] for r in all_rooms["rooms"]} == {"cooking": 1, "hiking": 1, "music": 2}
    tax = await call(session, "memory_get_taxonomy")
    assert tax == {"total_drawers": 4, "wings": {"alice": {"hiking": 1, "music": 1}, "bob": {"cooking": 1, "music": 1}}}

    near = await call(session, "memory_traverse", start_room="cooking", max_hops=1)
    assert [(r["room"], r["hop"], r["via_wing"]) for r in near["rooms"]] == [("cooking", 0, None), ("music", 1, "bob")]
    far = await call(session, "memory_traverse", start_room="cooking", max_hops=2)
    assert [(r["room"], r["hop"]) for r in far["rooms"]] == [("cooking", 0), ("music", 1), ("hiking", 2)]
    assert (await call(session, "memory_traverse", start_room="nowhere"))["found"] is False

    tunnels = await call(session, "memory_find_tunnels")
    assert tunnels["tunnels"] == [{"room": "music", "wings": ["alice", "bob"], "drawers": 2}]
    assert len((await call(session, "memory_find_tunnels", wing_a="alice", wing_b="bob"))["tunnels"]) == 1
    assert (await call(session, "memory_find_tunnels", wing_a="alice", wing_b="carol"))["tunnels"] == []
    gstats = await call(session, "memory_graph_stats")
    assert (gstats["wings"], gstats["rooms"], gstats["tunnels"], gstats["edges"]) == (2, 3, 1, 2)

    found = await call(session, "memory_search", query="When are Alice's violin lessons?", limit=3)
    top = found["hits"][0]
    assert top["content"] == MEMORIES[0][0]
    assert top["citation"] == f"alice/music/{ids[MEMORIES[0][0]][:12]}"
    # The model reads the hits as text (citation, score, words), the client the structured result.
    read = (await session.call_tool("memory_search", {"query": "When are Alice's violin lessons?", "limit": 3})).content
    text = read[0].text  # type: ignore[union-attr]
    assert len(read) == 1 and f"[1] {top['citation']} · score " in text and MEMORIES[0][0] in text
    # A citation reads back to its drawer (so does the whole id); a wrong or malformed one is refused.
    cited = await call(session, "memory_get_drawer", drawer=top["citation"])
    assert (cited["drawer_id"], cited["content"], cited["citation"]) == (ids[MEMORIES[0][0]], MEMORIES[0][0],
                                                                         top["citation"])
    assert (await call(session, "memory_get_drawer", drawer=f"[{ids[MEMORIES[0][0]]}]"))["citation"] == top["citation"]
    assert "no live drawer" in await call_error(session, "memory_get_drawer", drawer="alice/music/0123456789ab")
    assert "not a" in await call_error(session, "memory_get_drawer", drawer="alice/music/violin")
    scores = [h["score"] for h in found["hits"]]
    assert scores == sorted(scores, reverse=True)
    assert "limit" in await call_error(session, "memory_search", query="x", limit=500)
    # Another interface's name for an argument is refused with the right one (it was ignored: 5 hits, every wing).
    wrong = await call_error(session, "memory_search", query="x", k=20, wing="alice")
    assert "unknown argument 'k' (did you mean 'limit'?)" in wrong and "unknown argument 'wing'" in wrong, wrong
    # Episodes on request (each memory here is a one-message session): the violin lesson's first, citing
    # its drawer; the hits stay the same, and without the option there are none.
    assert found["episodes"] is None
    await asyncio.to_thread(wait_for, lambda: stack.sql(
        "SELECT count(*) FROM episodes WHERE workspace_id = %s AND status = 'ready' AND embedding IS NOT NULL",
        (w,))[0][0] == len(MEMORIES), 60, "an episode per memory")
    with_eps = await call(session, "memory_search", query="When are Alice's violin lessons?", limit=3,
                          include_episodes=True, episodes_limit=2)
    assert [h["drawer_id"] for h in with_eps["hits"]] == [h["drawer_id"] for h in found["hits"]]
    eps = with_eps["episodes"]
    assert len(eps) == 2 and eps[0]["drawers"] == [top["citation"]] and eps[0]["drawer_count"] == 1
    assert eps[0]["session_id"] == top["session_id"] and 1 >= eps[0]["score"] >= eps[1]["score"] >= 0
    assert "violin" in eps[0]["summary"].lower()
    assert "episodes_limit" in await call_error(session, "memory_search", query="x", include_episodes=True,
                                                episodes_limit=99)

    dup = await call(session, "memory_check_duplicate", content=MEMORIES[3][0])
    assert dup["is_duplicate"] and dup["matches"][0]["drawer_id"] == ids[MEMORIES[3][0]]
    assert dup["matches"][0]["similarity"] >= 0.99 and dup["matches"][0]["duplicate"]
    assert dup["matches"][0]["citation"] == f"bob/cooking/{ids[MEMORIES[3][0]][:12]}"
    # Similar is not the same memory: another bread is an update; the same words but for filler are a repeat.
    bread = ids[MEMORIES[3][0]]
    rye = await call(session, "memory_check_duplicate", content="Bob bakes rye bread with a starter he calls Gerald.",
                     threshold=0.5)
    assert [m["duplicate"] for m in rye["matches"] if m["drawer_id"] == bread] == [False] and not rye["is_duplicate"]
    again = await call(session, "memory_check_duplicate", threshold=0.5,
                       content="Bob bakes sourdough bread with a starter that he calls Gerald!")
    assert [m["duplicate"] for m in again["matches"] if m["drawer_id"] == bread] == [True] and again["is_duplicate"]
    fresh = await call(session, "memory_check_duplicate", content="The quarterly VAT return is due on the 7th.")
    assert fresh == {"threshold": 0.9, "is_duplicate": False, "matches": []}

    first = await call(session, "memory_set_identity", text="I am Atlas, the household's scheduling assistant.")
    assert first["previous"] is None
    second = await call(session, "memory_set_identity", text="I am Atlas; I keep the family calendar.")
    assert second["previous"] == "I am Atlas, the household's scheduling assistant."
    assert (await call(session, "memory_status"))["identity"] == "I am Atlas; I keep the family calendar."
    await call_error(session, "memory_set_identity", text="x" * 401)

    # Wake-up: L0 then L1 (every drawer here, grouped by room), within L1's budget; one wing on request.
    woke = await call(session, "memory_wake_up")
    assert woke["identity"] == "I am Atlas; I keep the family calendar."
    assert woke["text"].startswith(woke["identity"] + "\n\n") and woke["text"].endswith(woke["essential"])
    assert {d["drawer_id"] for d in woke["drawers"]} == set(ids.values()) and not woke["truncated"]
    assert len(woke["essential"]) <= 2000
    for d in woke["drawers"]:
        assert f"[{d['wing']}/{d['room']}]" in woke["essential"] and d["snippet"] in woke["essential"]
    # What the model reads is the text, once (as JSON it read the essential story three times over).
    # The identity is the model's to follow; the memories after it come as data (as memory_inject's block).
    read = (await session.call_tool("memory_wake_up", {})).content
    assert [c.text for c in read] == [  # type: ignore[union-attr]
        f"{woke['identity']}\n\n<memory_context>\n{woke['essential']}\n</memory_context>"]
    bob = await call(session, "memory_wake_up", wing="bob")
    assert {d["wing"] for d in bob["drawers"]} == {"bob"} and len(bob["drawers"]) == 2
    # L2: one wing's (or room's) most important memories, read as text by the model.
    l2 = await call(session, "memory_recall", wing="bob")
    assert {d["wing"] for d in l2["drawers"]} == {"bob"} and len(l2["drawers"]) == 2
    assert l2["text"].startswith("## L2 — bob") and all(d["citation"][-12:] in l2["text"] for d in l2["drawers"])
    music = await call(session, "memory_recall", room="music")
    assert {d["drawer_id"] for d in music["drawers"]} == {ids[MEMORIES[0][0]], ids[MEMORIES[2][0]]}
    assert "give a wing" in await call_error(session, "memory_recall")

    # Inject: nothing for a trivial message; the violin lessons for a question about them, within budget.
    trivial = await call(session, "memory_inject", message="ok thanks!")
    assert (trivial["block"], trivial["skipped"], trivial["match_count"]) == ("", "trivial", 0)
    asked = await call(session, "memory_inject", message="When does Alice take her violin lessons?")
    assert asked["skipped"] is None and asked["block"].startswith("<memory_context>")
    assert asked["citations"][0].startswith("alice/music/") and "violin" in asked["block"]
    assert asked["injected_count"] == len(asked["citations"]) <= asked["match_count"]
    assert asked["threshold"] <= asked["top_score"] <= 1 and asked["tokens"] <= 200
    assert asked["threshold"] == stack.settings.inject_threshold
    # A question about nothing anyone said here gets nothing, though it names Alice and an evening: it scores
    # above the 0.3 that used to be the default, below today's.
    unrelated = await call(session, "memory_inject", message="Which evening does Alice see her dentist?")
    assert unrelated["skipped"] == "no_match" and 0.3 < unrelated["top_score"] < unrelated["threshold"], unrelated
    small = await call(session, "memory_inject", message="When does Alice take her violin lessons?", token_budget=40)
    assert small["tokens"] <= 40 and small["injected_count"] <= 1
    strict = await call(session, "memory_inject", message="When does Alice take her violin lessons?", threshold=1.0)
    assert strict["block"] == "" and strict["skipped"] == "no_match" and strict["top_score"] < 1.0
    assert "token_budget" in await call_error(session, "memory_inject", message="violin lessons", token_budget=1)

    # Knowledge graph (MemPalace's example): a fact ends, a new one begins; the past stays answerable.
    bass = ids[MEMORIES[2][0]]
    assert "no live drawer" in await call_error(session, "memory_kg_add", subject="Orion", predicate="uses",
                                                object="MongoDB", source_drawer_id="bob/music/0123456789ab")
    mongo = await call(session, "memory_kg_add", subject="Orion", predicate="uses", object="MongoDB",
                       valid_from="2024-06-01", source_drawer_id=f"bob/music/{bass[:12]}")  # a citation
    assert mongo["created"] and mongo["fact"]["current"] and mongo["fact"]["source_drawer"] == bass
    assert not (await call(session, "memory_kg_add", subject="orion", predicate="Uses", object="mongodb",
                           valid_from="2024-08-01"))["created"], "the same fact, already holding"
    await call(session, "memory_kg_add", subject="Orion", predicate="uses", object="PostgreSQL",
               valid_from="2025-01-15")
    ended = await call(session, "memory_kg_invalidate", subject="Orion", predicate="uses", object="MongoDB",
                       ended="2025-01-14")
    assert ended["invalidated"] == 1 and ended["facts"][0]["valid_to"].startswith("2025-01-14")
    assert (await call(session, "memory_kg_invalidate", subject="Orion", predicate="uses",
                       object="MongoDB"))["invalidated"] == 0
    then = await call(session, "memory_kg_query", entity="Orion", as_of="2024-12-01")
    assert [(f["predicate"], f["object"], f["current"]) for f in then["facts"]] == [("uses", "MongoDB", False)]
    now = await call(session, "memory_kg_query", entity="Orion", as_of="2025-06-01", direction="outgoing")
    assert [f["object"] for f in now["facts"]] == ["PostgreSQL"] and now["entity_found"]
    # Known, with no fact then, is not the same as unknown.
    before = await call(session, "memory_kg_query", entity="Orion", as_of="2020-01-01")
    assert (before["facts"], before["entity_found"]) == ([], True)
    nobody = await call(session, "memory_kg_query", entity="Zanzibar Holdings")
    assert (nobody["facts"], nobody["entity_found"]) == ([], False)
    into = await call(session, "memory_kg_query", entity="PostgreSQL", direction="incoming")
    assert [(f["subject"], f["direction"]) for f in into["facts"]] == [("Orion", "incoming")]
    story = await call(session, "memory_kg_timeline", entity="Orion")
    assert [(f["object"], f["current"]) for f in story["facts"]] == [("MongoDB", False), ("PostgreSQL", True)]
    whole = await call(session, "memory_kg_timeline")
    assert len(whole["facts"]) == 2 and whole["entity_found"] is None
    kstats = await call(session, "memory_kg_stats")
    assert (kstats["triples"], kstats["current_facts"], kstats["expired_facts"]) == (2, 1, 1)
    assert kstats["relationship_types"] == {"uses": 2} and kstats["entities"] >= 3
    assert "ISO 8601" in await call_error(session, "memory_kg_query", entity="Orion", as_of="last spring")
    assert "before" in await call_error(session, "memory_kg_add", subject="A", predicate="knows", object="B",
                                        valid_from="2025-02-01", valid_to="2025-01-01")

    # Soft delete: gone from search and the graph (the cached taxonomy is invalidated), audited, reversible.
    hiking = ids[MEMORIES[1][0]]
    gone = await call(session, "memory_delete_drawer", drawer_id=f"alice/hiking/{hiking[:12]}",
                      reason="asked to forget")
    assert gone["drawer_id"] == hiking
    assert gone["deleted"] is True
    assert (await call(session, "memory_get_taxonomy"))["wings"]["alice"] == {"music": 1}
    hits = (await call(session, "memory_search", query="Kungsleden trail Lapland hike", limit=10))["hits"]
    assert hiking not in {h["drawer_id"] for h in hits}
    assert (await call(session, "memory_delete_drawer", drawer_id=hiking))["deleted"] is False
    audit = stack.sql("SELECT action, actor, reason FROM memory_history WHERE workspace_id = %s AND drawer_id = %s"
                      " AND action = 'DELETE'", (w, hiking))
    assert audit == [("DELETE", "mcp", "asked to forget")]
    assert stack.sql("SELECT deleted_at IS NOT NULL FROM drawers WHERE workspace_id = %s AND id = %s",
                     (w, hiking)) == [(True,)], "the row stays: soft delete"
    assert await restore(stack, w, hiking)
    assert (await call(session, "memory_get_taxonomy"))["wings"]["alice"] == {"hiking": 1, "music": 1}
    # The same text added again says where it already is; deleted, it comes back (it was "accepted" and
    # never seen again: the drawer stayed deleted).
    here = await call(session, "memory_add_drawer", content=MEMORIES[1][0], wing="bob", room="elsewhere")
    assert (here["status"], here["wing"], here["room"], here["drawer_ids"]) == ("exists", "alice", "hiking", [hiking])
    await call(session, "memory_delete_drawer", drawer_id=hiking)
    back = await call(session, "memory_add_drawer", content=MEMORIES[1][0], wing="alice", room="hiking")
    assert (back["status"], back["drawer_ids"]) == ("restored", [hiking])
    hits = (await call(session, "memory_search", query="Kungsleden trail Lapland hike", limit=10))["hits"]
    assert hiking in {h["drawer_id"] for h in hits}
    assert stack.sql("SELECT reason FROM memory_history WHERE workspace_id = %s AND drawer_id = %s"
                     " AND action = 'RESTORE' AND actor = 'mcp'", (w, hiking)) == [("the same text was added again",)]
    # Archived by prune: back with the prune threshold's importance (or the next prune archives it again).
    stack.sql("WITH d AS (UPDATE drawers SET deleted_at = now(), importance = 0.1 WHERE workspace_id = %s AND id = %s"
              "           RETURNING deleted_at)"
              " INSERT INTO memory_history (workspace_id, id, drawer_id, action, actor, created_at)"
              " SELECT %s, 'archive-test', %s, 'ARCHIVE', 'maintain.prune', deleted_at FROM d RETURNING 1",
              (w, hiking, w, hiking))
    assert (await call(session, "memory_add_drawer", content=MEMORIES[1][0], wing="alice",
                       room="hiking"))["status"] == "restored"
    assert stack.sql("SELECT deleted_at IS NULL, importance >= %s FROM drawers WHERE workspace_id = %s AND id = %s",
                     (stack.settings.prune_importance_below, w, hiking)) == [(True, True)]
    assert stack.sql("SELECT count(*) FROM memory_history WHERE workspace_id = %s AND drawer_id = %s AND action ="
                     " 'RESTORE' AND reason = 'the same text was added again'", (w, hiking)) == [(2,)]

    # The diary: wing 'diary', hall = the agent, newest first.
    for entry in ("Helped plan the Saturday market trip and the grocery list.",
                  "Rescheduled the dentist appointment to next Thursday morning."):
        acc = await call(session, "memory_diary_write", agent="atlas", entry=entry)
        assert (acc["wing"], acc["hall"], acc["room"]) == ("diary", "atlas", "journal")
        ids[entry] = acc["drawer_ids"][0]
        await asyncio.sleep(0.05)  # distinct filing times
    await asyncio.to_thread(stack.wait_processed, w, len(MEMORIES) + 2)
    diary = await call(session, "memory_diary_read", agent="atlas", last_n=5)
    assert [e["content"] for e in diary["entries"]] == [
        "Rescheduled the dentist appointment to next Thursday morning.",
        "Helped plan the Saturday market trip and the grocery list."]
    assert (await call(session, "memory_diary_read", agent="someone-else"))["entries"] == []
    assert (await call(session, "memory_list_wings"))["wings"][-1] == {"wing": "diary", "drawers": 2}

    # Forget, for good: one scope at a time, proved gone everywhere.
    entry = "Helped plan the Saturday market trip and the grocery list."
    assert "exactly one" in await call_error(session, "memory_forget", user_id="someone", everything=True)
    assert "exactly one" in await call_error(session, "memory_forget")
    if broad_forget:  # allowed by the operator: then only with the person's confirmation
        assert "confirm='forget user someone'" in await call_error(session, "memory_forget", user_id="someone",
                                                                    confirm="yes")
    else:  # by default one tool call never erases a whole user, agent or workspace
        assert "PALACE_MCP_FORGET_SCOPES" in await call_error(session, "memory_forget", user_id="someone",
                                                               confirm="forget user someone")
    cite = (await call(session, "memory_get_drawer", drawer=ids[entry]))["citation"]
    out = await call(session, "memory_forget", drawer=cite, verify=True)
    assert out["scope"] == f"drawer:{ids[entry]}" and out["counts"]["drawers"] == 1
    assert not any(out["remaining"].values()), out["remaining"]
    assert not stack.sql("SELECT 1 FROM drawers WHERE workspace_id = %s AND id = %s", (w, ids[entry]))
    audits = stack.sql("SELECT requested_by, scope_kind FROM forget_audit WHERE workspace_id = %s", (w,))
    assert audits == [(requester, "drawer")]  # over HTTP, the API key that asked (as over REST)
    assert len((await call(session, "memory_diary_read", agent="atlas"))["entries"]) == 1
    # Forgotten is forgotten: the same words written again are refused, not "accepted" and dropped by ingest.
    assert "forgotten on request" in await call_error(session, "memory_diary_write", agent="atlas", entry=entry)
    return ids


def _stdio_params(stack: Stack, w: str) -> StdioServerParameters:
    env = {k: v for k, v in os.environ.items() if k.startswith("PALACE_")}
    env.update(PALACE_DATABASE_URL=stack.database_url, PALACE_NATS_URL=stack.nats_url, PALACE_MCP_WORKSPACE=w)
    return StdioServerParameters(command=str(Path(sys.executable).parent / "palace"), args=["mcp"], env=env,
                                 cwd=os.getcwd())


@asynccontextmanager
async def http_session(stack: Stack, key: str | None) -> AsyncIterator[ClientSession]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with (httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(60, read=300)) as client,
                streamable_http_client(f"{stack.api_url}/mcp", http_client=client) as (read, write),
                ClientSession(read, write) as session):
        await session.initialize()
        yield session


async def test_stdio_session_calls_every_tool(stack: Stack) -> None:
    w = ws()
    with (Path(stack.settings.devstack_dir) / "mcp-stdio.log").open("w") as errlog:
        params = _stdio_params(stack, w)
        assert params.env is not None
        params.env["PALACE_MCP_FORGET_SCOPES"] = '["drawer", "session", "user", "agent", "workspace"]'
        async with (stdio_client(params, errlog=errlog) as (read, write),
                    ClientSession(read, write) as session):
            init = await session.initialize()
            assert init.server_info.name == "palace"
            await exercise_every_tool(session, stack, w, broad_forget=True)


async def test_stdio_needs_a_workspace(stack: Stack) -> None:
    env = {**os.environ, "PALACE_DATABASE_URL": stack.database_url, "PALACE_NATS_URL": stack.nats_url}
    env.pop("PALACE_MCP_WORKSPACE", None)
    proc = await asyncio.create_subprocess_exec(
        str(Path(sys.executable).parent / "palace"), "mcp", env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, stdin=asyncio.subprocess.DEVNULL)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 2 and out == b"" and b"workspace" in err


async def test_http_session_calls_every_tool_and_is_bound_to_its_key(stack: Stack) -> None:
    a, b = ws(), ws()
    key_a, key_b = await asyncio.to_thread(api_key_for, stack, a), await asyncio.to_thread(api_key_for, stack, b)
    async with http_session(stack, key_a) as session:
        ids = await exercise_every_tool(session, stack, a, requester=f"api-key:{key_id_of(key_a)}")
    violin = ids[MEMORIES[0][0]]

    async with http_session(stack, key_b) as other:
        # Workspace B sees none of A's memory through any tool, and cannot delete it.
        assert (await call(other, "memory_status"))["drawers"] == 0
        assert (await call(other, "memory_get_taxonomy"))["wings"] == {}
        assert (await call(other, "memory_search", query="Alice violin lessons Tuesday", limit=10))["hits"] == []
        assert (await call(other, "memory_check_duplicate", content=MEMORIES[0][0]))["matches"] == []
        assert (await call(other, "memory_diary_read", agent="atlas"))["entries"] == []
        assert (await call(other, "memory_delete_drawer", drawer_id=violin))["deleted"] is False
        assert "no live drawer" in await call_error(other, "memory_get_drawer", drawer=f"alice/music/{violin[:12]}")
        assert "no live drawer" in await call_error(other, "memory_forget", drawer=f"alice/music/{violin[:12]}")
        assert "PALACE_MCP_FORGET_SCOPES" in await call_error(other, "memory_forget", everything=True,
                                                              confirm="forget everything")
        # B's application forgets B entirely (over REST): A's memory is untouched.
        async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {key_b}"}, timeout=120) as rest:
            r = await rest.post(f"{stack.api_url}/v1/forget", json={"workspace_id": b, "all": True, "verify": True})
        assert r.status_code == 200 and not any(r.json()["remaining"].values()), r.text
        assert (await call(other, "memory_find_tunnels"))["tunnels"] == []
        assert (await call(other, "memory_status"))["identity"] is None
        assert (await call(other, "memory_kg_query", entity="Orion"))["facts"] == []
        assert (await call(other, "memory_kg_stats"))["triples"] == 0
        assert (await call(other, "memory_kg_invalidate", subject="Orion", predicate="uses",
                           object="PostgreSQL"))["invalidated"] == 0
    assert _live_drawers(stack, a) == len(MEMORIES) + 1, "A's drawers are untouched (one diary entry forgotten)"

    # No key, a malformed key or a revoked one: 401 before any MCP handling.
    async with httpx.AsyncClient(timeout=30) as client:
        body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
        hdrs = {"Accept": "application/json, text/event-stream"}
        assert (await client.post(f"{stack.api_url}/mcp", json=body, headers=hdrs)).status_code == 401
        bad = {**hdrs, "Authorization": "Bearer pk_000000000000_" + "x" * 40}
        assert (await client.post(f"{stack.api_url}/mcp", json=body, headers=bad)).status_code == 401
    stack.sql("UPDATE api_keys SET revoked_at = now() WHERE workspace_id = %s RETURNING 1", (b,))
    async with httpx.AsyncClient(timeout=30) as client:
        revoked = {**hdrs, "Authorization": f"Bearer {key_b}"}
        assert (await client.post(f"{stack.api_url}/mcp", json=body, headers=revoked)).status_code == 401


def _tear_down(stack_dir: Path) -> None:
    """Whatever a failed test left in ``stack_dir``: its keeper, then its servers."""
    import signal

    from palace_dev.devstack import DevStack

    st = DevStack(stack_dir)
    keeper = st.read_state().get("keeper_pid")
    if keeper:
        with contextlib.suppress(OSError, ValueError, TypeError):
            os.kill(int(keeper), signal.SIGTERM)  # type: ignore[call-overload]
    wait_for(lambda: st.read_state().get("keeper_pid") is None or not _alive(keeper), 60, "the keeper gone")
    st.stop()


def _alive(pid: object) -> bool:
    try:
        os.kill(int(pid), 0)  # type: ignore[call-overload]
    except (OSError, ValueError, TypeError):
        return False
    return True


@contextlib.contextmanager
def _cleaned(stack_dir: Path) -> Iterator[None]:
    """Run the block; if it fails, take down what it left running."""
    try:
        yield
    except BaseException:
        _tear_down(stack_dir)
        raise


async def _filed_and_found(session: ClientSession, content: str, query: str) -> list[Any]:
    """Add a drawer through the tool, then search until the pipeline has filed and embedded it (a minute at
    most); returns the hits."""
    await call(session, "memory_add_drawer", content=content, wing="w", room="r")
    for _ in range(120):
        hits: list[Any] = (await call(session, "memory_search", query=query))["hits"]
        if hits:
            return hits
        await asyncio.sleep(0.5)
    raise AssertionError(f"{content!r} was not filed, embedded and found")


def _embedded_params(stack_dir: Path) -> StdioServerParameters:
    """``palace mcp`` with no server URLs, on the embedded stack in ``stack_dir``."""
    # The services' health ports follow PALACE_METRICS_PORT (the test worker's own range: see conftest.py).
    env = {k: v for k, v in os.environ.items() if k.startswith("PALACE_") and k not in (
        "PALACE_DATABASE_URL", "PALACE_NATS_URL")}
    env.update(PALACE_DEVSTACK_DIR=str(stack_dir), PALACE_MCP_WORKSPACE="embedded", PALACE_MCP_STACK_IDLE_S="1")
    return StdioServerParameters(command=str(Path(sys.executable).parent / "palace"), args=["mcp"], env=env,
                                 cwd=os.getcwd())


async def test_stdio_clients_share_the_embedded_stack_until_the_last_one_ends(tmp_path: Path) -> None:
    """No server URLs and no running stack: the first ``palace mcp`` brings up the embedded servers and the
    pipeline in the background; a second client uses them; the first one ending (it started them) leaves the
    second working; once the last has ended, everything is taken down. A registration left by a client
    killed outright (a dead pid) keeps nothing up."""
    from palace_dev.devstack import DevStack

    stack_dir = tmp_path / "stack"
    (stack_dir / "clients").mkdir(parents=True)
    (stack_dir / "clients" / "999999999-1.00").touch()  # a killed client's leftover
    params = _embedded_params(stack_dir)
    st = DevStack(stack_dir)
    a_ready, b_up, a_release, a_gone = asyncio.Event(), asyncio.Event(), asyncio.Event(), asyncio.Event()

    async def first(errlog: Any) -> None:
        async with (stdio_client(params, errlog=errlog) as (read, write), ClientSession(read, write) as session):
            await session.initialize()
            assert st.info() is not None
            await call(session, "memory_add_drawer", content="The embedded stack files this sentence.", wing="w",
                       room="r")
            a_ready.set()
            await a_release.wait()

    async def second(errlog: Any) -> None:
        async with (stdio_client(params, errlog=errlog) as (read, write), ClientSession(read, write) as session):
            await session.initialize()
            b_up.set()
            await a_gone.wait()
            for _ in range(120):
                if (await call(session, "memory_status"))["drawers"] == 1:
                    break
                await asyncio.sleep(0.5)
            hits = (await call(session, "memory_search", query="embedded stack sentence"))["hits"]
            assert hits and hits[0]["citation"].startswith("w/r/")

    with (tmp_path / "a.log").open("w") as a_log, (tmp_path / "b.log").open("w") as b_log, _cleaned(stack_dir):
        task_a = asyncio.create_task(first(a_log))
        await asyncio.wait_for(a_ready.wait(), 300)
        task_b = asyncio.create_task(second(b_log))
        await asyncio.wait_for(b_up.wait(), 60)
        a_release.set()
        await task_a
        await asyncio.sleep(3)  # three times PALACE_MCP_STACK_IDLE_S
        assert st.pg_alive() and st.nats_alive(), "the stack stays up while the second client uses it"
        a_gone.set()
        await task_b
    with _cleaned(stack_dir):
        await asyncio.to_thread(wait_for, lambda: not st.pg_alive() and not st.nats_alive(), 60,
                                "the stack stopped once the last client ended")
    assert not list((stack_dir / "clients").iterdir()), "every registration removed"


async def test_stdio_brings_back_the_pipeline_of_a_stack_whose_keeper_was_killed(tmp_path: Path) -> None:
    """The process running the embedded stack killed outright: its services end with it and its servers
    stay. The next ``palace mcp`` does not file memories into a stack nothing processes: it starts it again."""
    import signal

    import psutil

    from palace_dev.devstack import DevStack

    stack_dir = tmp_path / "stack"
    params = _embedded_params(stack_dir)
    st = DevStack(stack_dir)
    with (tmp_path / "mcp.log").open("w") as errlog, _cleaned(stack_dir):
        async with (stdio_client(params, errlog=errlog) as (read, write), ClientSession(read, write) as session):
            await session.initialize()
            keeper = int(st.read_state()["keeper_pid"])  # type: ignore[call-overload]
            os.kill(keeper, signal.SIGKILL)
            await asyncio.to_thread(wait_for, lambda: not psutil.pid_exists(keeper) or psutil.Process(
                keeper).status() == psutil.STATUS_ZOMBIE, 30, "the keeper killed")
        assert st.pg_alive(), "its servers outlive it"
        async with (stdio_client(params, errlog=errlog) as (read, write), ClientSession(read, write) as session):
            await session.initialize()
            assert int(st.read_state()["keeper_pid"]) != keeper  # type: ignore[call-overload]
            hits = await _filed_and_found(session, "A second keeper processes this sentence.", "second keeper sentence")
            assert hits[0]["citation"].startswith("w/r/")
    with _cleaned(stack_dir):
        await asyncio.to_thread(wait_for, lambda: not st.pg_alive() and not st.nats_alive(), 60,
                                "the stack stopped once the client ended")


async def test_stdio_runs_the_pipeline_on_servers_started_alone_and_stack_stop_ends_it(tmp_path: Path) -> None:
    """``palace stack start`` runs the servers only: ``palace mcp`` does not file memories nothing would
    process, it runs the pipeline on them (through a keeper). ``palace stack stop`` then stops that keeper,
    its services and the servers, not the servers alone under a keeper restarting what dies."""
    import subprocess

    import psutil

    from palace_dev.devstack import DevStack

    stack_dir = tmp_path / "stack"
    params = _embedded_params(stack_dir)
    assert params.env is not None
    palace = [params.command]
    env = {**{k: v for k, v in os.environ.items() if k not in ("PALACE_DATABASE_URL", "PALACE_NATS_URL")},
           **params.env}
    st = DevStack(stack_dir)
    with (tmp_path / "mcp.log").open("w") as errlog, _cleaned(stack_dir):
        out = await asyncio.to_thread(subprocess.run, [*palace, "stack", "start"], env=env, capture_output=True,
                                      text=True, timeout=180)
        assert out.returncode == 0, out.stderr
        assert st.pg_alive() and not st.read_state().get("keeper_pid")
        async with (stdio_client(params, errlog=errlog) as (read, write), ClientSession(read, write) as session):
            await session.initialize()
            keeper = int(st.read_state()["keeper_pid"])  # type: ignore[call-overload]
            await _filed_and_found(session, "Servers started alone still get a pipeline.",
                                   "servers started alone pipeline")
            out = await asyncio.to_thread(subprocess.run, [*palace, "stack", "stop"], env=env, capture_output=True,
                                          text=True, timeout=120)
            assert out.returncode == 0, out.stderr
            assert not psutil.pid_exists(keeper) or psutil.Process(keeper).status() == psutil.STATUS_ZOMBIE
            assert not st.pg_alive() and not st.nats_alive()
