"""The Python SDK against the real stack: both clients publish, recall through every layer, add and
forget memories and keep facts in the knowledge graph; errors arrive as their exceptions; a key only
reaches its own workspace; the README's SDK example runs as written."""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from palace_sdk import (
    AsyncPalaceClient,
    Episode,
    EventInvalid,
    Forbidden,
    InvalidRequest,
    NotFound,
    PalaceClient,
    PayloadTooLarge,
    RateLimited,
    Unauthorized,
)
from tests.integration.helpers import Stack, api_key_for, session, wait_for, ws
from tests.integration.test_producer_int import palace, run_snippet

ORION = ["We decided to use PostgreSQL with pgvector as Orion's database.",
         "Noted: Orion stores its embeddings in PostgreSQL, not in a separate vector store."]
TEA = "Maria prefers green tea over coffee at the Monday planning meetings."


class Awaited:
    """The blocking client seen through awaits (each call in a thread), so one scenario drives both."""

    def __init__(self, target: Any) -> None:
        self._t = target

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._t, name)
        if name == "kg":
            return Awaited(value)
        if not callable(value):
            return value

        async def call(*args: Any, **kwargs: Any) -> Any:
            return await asyncio.to_thread(value, *args, **kwargs)

        return call


async def scenario(c: Any, stack: Stack) -> None:
    w = c.workspace
    event = session(w, "chat-1", ORION, metadata={"wing": "orion"})
    first = await c.publish_session(event)
    assert first.stream == "PALACE" and first.seq > 0 and not first.duplicate
    again = await c.publish_session(event)
    assert again.duplicate and again.event_id == first.event_id, "the same event is stored once"
    with pytest.raises(EventInvalid, match="role"):
        await c.publish_session({**event, "session_id": "chat-2", "messages": [{"role": "bot", "content": "hi"}]})
    acc = await c.add(TEA, wing="maria", room="preferences", agent="atlas")
    assert (acc.status, acc.wing, acc.room) == ("accepted", "maria", "preferences") and len(acc.drawer_ids) == 1
    await asyncio.to_thread(stack.wait_processed, w, 3)
    assert stack.sql("SELECT count(*) FROM sessions WHERE workspace_id = %s", (w,)) == [(2,)], "chat-2 never sent"

    found = await c.search("Which database did we choose for Orion?", k=3)
    assert "PostgreSQL" in found.hits[0].content and found.hits[0].citation.startswith("orion/")
    assert [h.score for h in found.hits] == sorted((h.score for h in found.hits), reverse=True)
    assert found.episodes is None
    # Episodes on request: chat-1's first (typed), citing its drawers, readable with get.
    await asyncio.to_thread(wait_for, lambda: stack.sql(
        "SELECT count(*) FROM episodes WHERE workspace_id = %s AND status = 'ready' AND embedding IS NOT NULL",
        (w,))[0][0] == 2, 60, "two episodes")
    recalled = await c.search("Which database did we choose for Orion?", k=3, include_episodes=True, episodes_k=2)
    assert [h.id for h in recalled.hits] == [h.id for h in found.hits]
    assert recalled.episodes is not None and len(recalled.episodes) == 2
    episode = recalled.episodes[0]
    assert isinstance(episode, Episode) and episode.session_id == "chat-1" and episode.drawer_count == 2
    assert 1 >= episode.score >= recalled.episodes[1].score >= 0 and "PostgreSQL" in episode.summary
    assert (await c.get(episode.drawers[0])).content == ORION[0]
    cited = await c.get(found.hits[0].citation)
    assert (cited.drawer_id, cited.citation, cited.content) == (found.hits[0].id, found.hits[0].citation,
                                                                found.hits[0].content)
    assert (await c.get(found.hits[0].id)).citation == found.hits[0].citation
    with pytest.raises(NotFound, match="no live drawer"):
        await c.get("orion/decisions/0123456789ab")
    assert found.hits[0].explanation is not None and found.hits[0].explanation.vector > 0

    with pytest.raises(NotFound):
        await c.get_identity()
    ident = await c.set_identity("I am Atlas, Orion's engineering assistant.")
    assert (await c.get_identity()).text == ident.text
    woke = await c.wake_up()
    assert woke.identity == ident.text and woke.text.startswith(ident.text)
    assert len(woke.drawers) == 3 and len(woke.essential) <= 2000
    assert {d.wing for d in (await c.wake_up(wing="maria")).drawers} == {"maria"}
    l2 = await c.recall(wing="orion")
    assert len(l2.drawers) == 2 and {d.wing for d in l2.drawers} == {"orion"} and len(l2.text) <= 1200

    assert (await c.inject("ok thanks!")).skipped == "trivial"
    inj = await c.inject("What does Maria like to drink at the planning meetings?")
    assert inj.skipped is None and "green tea" in inj.block and inj.citations[0].startswith("maria/preferences/")
    assert inj.tokens <= 200 and inj.injected_count <= inj.match_count

    gone = await c.delete(acc.drawer_ids[0], reason="asked to forget")
    assert gone.deleted and gone.drawer_id == acc.drawer_ids[0]
    assert TEA not in {h.content for h in (await c.search("Maria green tea coffee", k=10)).hits}
    with pytest.raises(NotFound, match="no live drawer"):
        await c.delete(acc.drawer_ids[0])

    with pytest.raises(InvalidRequest) as too_long:
        await c.set_identity("x" * 401)
    assert too_long.value.status == 422 and "text" in str(too_long.value.detail)
    with pytest.raises(InvalidRequest):
        await c.search("database", k=500)
    with pytest.raises(PayloadTooLarge):
        await c.inject("word " * 250_000)

    # Knowledge graph: MemPalace's example, with an as-of question about the time before the switch.
    mongo = await c.kg.add("Orion", "uses", "MongoDB", valid_from="2024-06-01")
    assert mongo.created and mongo.fact.current and mongo.fact.valid_from.isoformat().startswith("2024-06-01")
    assert not (await c.kg.add("Orion", "uses", "MongoDB", valid_from="2024-07-01")).created, "already held"
    await c.kg.add("Orion", "uses", "PostgreSQL", valid_from="2025-01-15")
    ended = await c.kg.invalidate("Orion", "uses", "MongoDB", ended="2025-01-14")
    assert [f.object for f in ended.ended] == ["MongoDB"] and not ended.ended[0].current
    with pytest.raises(NotFound):
        await c.kg.invalidate("Orion", "uses", "MongoDB")
    then = await c.kg.query("Orion", as_of="2024-12-01")
    assert [(f.predicate, f.object) for f in then.facts] == [("uses", "MongoDB")]
    now = await c.kg.query("Orion", as_of="2025-06-01", direction="outgoing")
    assert [f.object for f in now.facts] == ["PostgreSQL"]
    assert [f.subject for f in (await c.kg.query("PostgreSQL", direction="incoming")).facts] == ["Orion"]
    story = await c.kg.timeline("Orion")
    assert [(f.object, f.current) for f in story.facts] == [("MongoDB", False), ("PostgreSQL", True)]
    stats = await c.kg.stats()
    # Entities also come from enrich (names in the drawers); facts only from these calls.
    assert (stats.triples, stats.current_facts, stats.expired_facts) == (2, 1, 1) and stats.entities >= 3
    assert stats.relationship_types == {"uses": 2}
    with pytest.raises(InvalidRequest, match="ISO 8601"):
        await c.kg.query("Orion", as_of="last tuesday")


def test_blocking_client(stack: Stack) -> None:
    with PalaceClient(ws(), stack.api_url, nats_url=stack.nats_url) as c:
        asyncio.run(scenario(Awaited(c), stack))


async def test_async_client(stack: Stack) -> None:
    async with AsyncPalaceClient(ws(), stack.api_url, nats_url=stack.nats_url) as c:
        await scenario(c, stack)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def auth_api(stack: Stack) -> Iterator[str]:
    """A second api process of the same stack, with authentication on and a small rate limit (20 requests
    at once, then one every 5 s, per key)."""
    port = _free_port()
    env = {**os.environ, "PALACE_DATABASE_URL": stack.database_url, "PALACE_NATS_URL": stack.nats_url,
           "PALACE_API_AUTH": "true", "PALACE_API_PORT": str(port), "PALACE_API_HOST": "127.0.0.1",
           "PALACE_API_RATE_PER_S": "0.2", "PALACE_API_RATE_BURST": "20"}
    log = (Path(stack.settings.devstack_dir) / "logs" / "api-auth.log").open("w")
    proc = subprocess.Popen([sys.executable, "-m", "services.api"], env=env, stdout=log, stderr=log,
                            stdin=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            return httpx.get(f"{url}/readyz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return proc.poll() is not None
    try:
        wait_for(up, 120, "the authenticating api")
        assert proc.poll() is None, "the api exited"
        yield url
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()


def test_keys_reach_only_their_workspace(stack: Stack, auth_api: str) -> None:
    a, b = ws(), ws()
    key_a, key_b = api_key_for(stack, a), api_key_for(stack, b)
    with PalaceClient(a, auth_api) as anonymous, pytest.raises(Unauthorized) as e:
        anonymous.search("anything")
    assert e.value.status == 401
    with PalaceClient(a, auth_api, api_key="pk_000000000000_" + "x" * 40) as bad, pytest.raises(Unauthorized):
        bad.wake_up()
    with PalaceClient(a, auth_api, api_key=key_b) as wrong:
        for call in (lambda: wrong.search("anything"), wrong.wake_up, lambda: wrong.add("A memory for a."),
                     wrong.kg.stats, lambda: wrong.kg.add("A", "knows", "B")):
            with pytest.raises(Forbidden):
                call()
    with PalaceClient(a, auth_api, api_key=key_a) as own:
        assert own.search("anything").hits == []
        assert own.kg.add("Ada", "knows", "Grace").created
        assert own.kg.stats().triples == 1
    assert stack.sql("SELECT count(*) FROM triples WHERE workspace_id = %s", (b,)) == [(0,)]


def test_rate_limit_is_an_exception_with_its_retry_time(stack: Stack, auth_api: str) -> None:
    c = ws()
    # retries=0: by default the SDK asks again after Retry-After, and these calls would all end well.
    with PalaceClient(c, auth_api, api_key=api_key_for(stack, c), retries=0) as client:
        with pytest.raises(RateLimited) as e:
            for _ in range(25):
                client.kg.stats()
        assert e.value.status == 429 and e.value.code == "rate_limited"
        assert e.value.retry_after is not None and 0 < e.value.retry_after <= 6


def test_readme_sdk_example(stack: Stack) -> None:
    out = run_snippet(stack, "sdk").splitlines()
    assert out[0].startswith("stored: stream PALACE, sequence ")
    assert "Orion uses PostgreSQL since 2025-01-15" in out


def test_cli_covers_the_sdk_operations_at_80_columns(stack: Stack) -> None:
    """``palace`` with stdout piped (80 columns, as Rich assumes then), against the stack's API."""
    w = ws()
    added = palace(stack, "add", "Orion's backups run nightly at two o'clock to the Frankfurt bucket.", "-w", w,
                   "--wing", "orion", "--room", "ops")
    drawer = re.search(r"accepted: drawer ([0-9a-f]{32}) in orion/ops", added)
    assert drawer, added
    stack.wait_processed(w, 1)
    assert palace(stack, "identity", "-w", w, "--set", "I am Atlas, Orion's assistant.").strip() == \
        "I am Atlas, Orion's assistant."
    outputs = [woke := palace(stack, "wake-up", "-w", w)]
    assert "identity (L0): I am Atlas, Orion's assistant." in woke and re.search(r"orion/[^\n]*\n\s+ops\b", woke)
    assert drawer[1][:12] in woke
    outputs.append(l2 := palace(stack, "recall", "-w", w, "--wing", "orion"))
    assert "recall (L2) of orion: 1 drawers" in l2 and "backups" in l2
    outputs.append(inj := palace(stack, "inject", "When do the Orion backups run each night?", "-w", w))
    assert "<memory_context>" in inj and "Frankfurt" in inj and "1 of 1 matching" in inj
    assert "nothing injected: the message is trivial" in palace(stack, "inject", "ok thanks!", "-w", w)

    outputs.append(palace(stack, "kg", "add", "Orion", "uses", "MongoDB", "-w", w, "--from", "2024-06-01"))
    assert "added" in outputs[-1] and "MongoDB" in outputs[-1]
    palace(stack, "kg", "add", "Orion", "uses", "PostgreSQL", "-w", w, "--from", "2025-01-15")
    outputs.append(palace(stack, "kg", "invalidate", "Orion", "uses", "MongoDB", "-w", w, "--ended", "2025-01-14"))
    assert "2025-01-14" in outputs[-1]
    outputs.append(then := palace(stack, "kg", "query", "Orion", "-w", w, "--as-of", "2024-12-01"))
    assert "MongoDB" in then and "PostgreSQL" not in then and "1 facts" in then
    outputs.append(story := palace(stack, "kg", "timeline", "Orion", "-w", w))
    assert story.index("MongoDB") < story.index("PostgreSQL") and "now" in story
    outputs.append(st := palace(stack, "kg", "stats", "-w", w))
    assert "2 facts (1 current, 1 ended)" in st and "uses" in st
    facts = json.loads(palace(stack, "kg", "query", "Orion", "-w", w, "--json"))["facts"]
    assert sorted(f["object"] for f in facts) == ["MongoDB", "PostgreSQL"]
    cite = f"orion/ops/{drawer[1][:12]}"
    outputs.append(shown := palace(stack, "show", cite, "-w", w))
    assert shown.startswith(f"{cite}  drawer {drawer[1]}") and "Frankfurt bucket" in shown
    assert json.loads(palace(stack, "show", drawer[1], "-w", w, "--json"))["citation"] == cite
    for out in outputs:
        assert max(len(line) for line in out.splitlines()) <= 80, out

    assert f"deleted: {drawer[1]}" in palace(stack, "delete", cite, "-w", w)
    again = subprocess.run([sys.executable, "-m", "services.cli", "delete", drawer[1], "-w", w],
                           env={**os.environ, "PALACE_API": stack.api_url}, capture_output=True, text=True,
                           timeout=120, stdin=subprocess.DEVNULL)
    assert again.returncode == 1 and "refused: 404" in again.stdout and "Traceback" not in again.stderr
