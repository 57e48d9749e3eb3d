"""The palace browser page end to end: Debian's chromium (headless, no network of its own) driven by
playwright against an API with authentication on, over the real stack.

A session is published to JetStream and processed by the pipeline; the page is then used as a person
would: give the key when asked, browse wing → room → drawer, read the drawer's citation, provenance
and history, search and read a highlighted hit with its explanation, delete the drawer and see it gone
from its room, from search and audited in memory_history. Content that looks like HTML stays text.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import uvicorn

from services.api.app import create_app
from shared.config import Settings
from shared.memory.citations import cite
from tests.integration.helpers import Stack, api_key_for, fresh_database, session, wait_for, ws

pytestmark = pytest.mark.integration

CHROMIUM = os.environ.get("PALACE_TEST_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
SCREENSHOT = Path(__file__).resolve().parents[1] / "artifacts" / "palace-browser.png"

# The emoji: positions in a message are counted in characters, a JS string in UTF-16 units.
TARGET = ("🚀🚀 We decided the billing service deploys only after the canary stage passes, never on Friday "
          "evenings, and the rollback plan is written down first.")
HOSTILE = ('My note has <b>bold</b> markup and <img src=x onerror="window.__pwned=1"> inside it, '
           "which must show as plain text in the browser.")
TEXTS = [
    "Let us go over the release process for the billing service before next week.",
    TARGET,
    "I prefer dark roast coffee in the morning and green tea after lunch, every single day.",
    HOSTILE,
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def chromium() -> str:
    if not (os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)):
        pytest.skip(f"chromium not installed at {CHROMIUM} (`make test` installs Debian's package with apt-get; "
                    "it could not here)")
    pytest.importorskip("playwright.sync_api", reason="playwright-python is not installed (pip install -e '.[dev]')")
    return CHROMIUM


@pytest.fixture(scope="module")
def authed_api(stack: Stack) -> Iterator[str]:
    """The API over the test stack's servers with PALACE_API_AUTH on, served over real HTTP for the browser."""
    settings = Settings(database_url=stack.database_url, nats_url=stack.nats_url, api_auth=True)
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(settings), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_for(lambda: server.started, 60, "the authenticated API to start")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(15)


def test_browse_search_and_delete_in_chromium(stack: Stack, chromium: str, authed_api: str) -> None:
    from playwright.sync_api import expect, sync_playwright

    w = ws()
    key = api_key_for(stack, w, "browser-test")
    stack.publish(session(w, "s-browser-1", TEXTS))
    stack.publish(session(w, "s-browser-2", ["The weekly planning meeting moved to Tuesday at ten in room four."],
                          agent_id="planner"))
    drawer_id, wing, room = stack.processed_drawer(w, TARGET)
    hostile_id, hostile_wing, hostile_room = stack.processed_drawer(w, HOSTILE)
    stack.processed_drawer(w, "The weekly planning meeting moved to Tuesday at ten in room four.")
    # The session's first message is filler-free but short enough to be filed too or not; either way
    # the page must agree with the API's own taxonomy, which is what the browser is checked against.
    tax = httpx.get(f"{authed_api}/v1/workspaces/{w}/palace/taxonomy", headers={"Authorization": f"Bearer {key}"},
                    timeout=10).json()
    room_count = next(r["drawers"] for wg in tax["wings"] if wg["wing"] == wing for r in wg["rooms"]
                      if r["room"] == room)

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1500, "height": 1000})
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            requests: list[dict[str, Any]] = []
            page.on("request", lambda r: requests.append({"url": r.url, "auth": r.headers.get("authorization")}))
            page.on("dialog", lambda d: d.accept())

            # 1. Without a key the API answers 401 and the page asks for one.
            page.goto(f"{authed_api}/ui/?workspace={w}")
            expect(page.locator("#status")).to_contain_text("needs a key")
            expect(page.locator("#apikey")).to_have_attribute("aria-invalid", "true")
            page.fill("#apikey", key)
            page.click("#connect button[type=submit]")
            expect(page.locator("#taxonomy .total")).to_contain_text(f"{tax['drawers']} live drawers")
            assert page.evaluate("sessionStorage.getItem('palace.apiKey')") == key
            api_calls = [r for r in requests if "/v1/" in r["url"]]
            assert api_calls[-1]["auth"] == f"Bearer {key}", "the stored key is sent as a bearer token"
            assert all(r["url"].startswith(authed_api) for r in requests), "nothing outside the API is fetched"

            # 2. Wing → room → drawer.
            wings = page.locator("#taxonomy .wing h3")
            expect(wings).to_have_count(len(tax["wings"]))
            expect(page.locator("#taxonomy")).to_contain_text("planner")
            room_button = page.locator(f'#taxonomy button.room[data-wing="{wing}"][data-room="{room}"]')
            expect(room_button).to_contain_text(str(room_count))
            room_button.click()
            expect(room_button).to_have_attribute("aria-current", "true")
            cards = page.locator("#list li.card")
            expect(cards).to_have_count(room_count)
            page.locator(f'#list li.card[data-drawer="{drawer_id}"] button.open').click()
            detail = page.locator("#drawer")
            expect(detail.locator(".cite .citation")).to_have_text(cite(wing, room, drawer_id))
            expect(detail.locator("p.content")).to_have_text(TARGET)
            # Provenance: the raw session and its messages, the source one marked with its chunk.
            expect(detail.locator(".session-id")).to_have_text("s-browser-1")
            expect(detail.locator(".provenance .msg.source .msg-text")).to_contain_text("canary stage passes")
            expect(detail.locator(".provenance .msg.source mark.chunk")).to_have_text(TARGET)  # all of it
            expect(detail.locator(".provenance .msg")).to_have_count(len(TEXTS))  # ±2 turns around seq 1
            # History: what the pipeline recorded about this drawer (classification at least).
            history = detail.locator(".history tbody tr")
            assert history.count() >= 1
            recorded = stack.sql("SELECT action FROM memory_history WHERE workspace_id = %s AND drawer_id = %s",
                                 (w, drawer_id))
            assert sorted(history.locator("td:nth-child(2)").all_text_contents()) == sorted(a for (a,) in recorded)

            # 3. Hostile content stays text: no element, no script ran.
            page.locator(f'#taxonomy button.room[data-wing="{hostile_wing}"][data-room="{hostile_room}"]').click()
            hostile_card = page.locator(f'#list li.card[data-drawer="{hostile_id}"]')
            expect(hostile_card.locator("p.content")).to_have_text(HOSTILE)
            assert hostile_card.locator("p.content b, p.content img").count() == 0
            assert page.evaluate("window.__pwned") is None

            # 4. Search: highlighted matches and each hit's explanation.
            page.fill("#q", "canary deploys billing")
            page.click("#search button[type=submit]")
            hit = page.locator(f'#list li.card[data-drawer="{drawer_id}"]')
            expect(hit).to_be_visible()
            marks = [m.lower() for m in hit.locator("p.content mark").all_text_contents()]
            assert {"canary", "deploys", "billing"} <= set(marks), marks
            expect(hit.locator(".why .why-h")).to_contain_text("score")
            signals = hit.locator(".explain li .signal").all_text_contents()
            assert signals and ({"vector", "full text"} & set(signals)), signals
            bars = hit.locator(".explain .bar")
            assert bars.count() == len(signals)
            expect(page.locator("#taxonomy button.room[aria-current]")).to_have_count(0)
            # The recall scores' per-signal explanation (shares of the score) when the API gives one: each
            # non-zero signal, largest first, the raw cosine and BM25 apart; feature-detected, so hits
            # without it (dense/text only, as above) still explain themselves.
            shown = page.evaluate("""() => { const b = explanation({score: 0.8, dense: 0.9, text: 0.4,
                explanation: {vector: 0.5, full_text: 0.25, speaker: 0, time_window: 0, neighbours: 0, session: 0.1,
                              graph: 0, importance: 0.02, recency: 0.01, diversity: -0.08, cosine: 0.71, bm25: 3.2}});
                return {signals: [...b.querySelectorAll('.signal')].map((e) => e.textContent),
                        values: [...b.querySelectorAll('.value')].map((e) => e.textContent),
                        raw: b.querySelector('.raw').textContent}; }""")
            assert shown == {"signals": ["vector", "full text", "session", "diversity", "importance", "recency"],
                             "values": ["+0.500", "+0.250", "+0.100", "-0.080", "+0.020", "+0.010"],
                             "raw": "cosine 0.710 · bm25 3.200"}, shown
            first_hit = page.locator("#list li.card").first
            assert first_hit.get_attribute("data-drawer") == drawer_id, "the best match comes first"
            SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
            hit.locator("button.open").click()
            expect(detail.locator(".cite .citation")).to_have_text(cite(wing, room, drawer_id))
            page.screenshot(path=str(SCREENSHOT), full_page=True)

            # 5. Delete: gone from its room and from search, audited, and restorable.
            page.locator(f'#taxonomy button.room[data-wing="{wing}"][data-room="{room}"]').click()
            expect(cards).to_have_count(room_count)
            page.locator(f'#list li.card[data-drawer="{drawer_id}"] button.open').click()
            detail.get_by_role("button", name="Delete drawer").click()
            expect(page.locator("#status")).to_contain_text("Drawer deleted")
            expect(page.locator(f'#list li.card[data-drawer="{drawer_id}"]')).to_have_count(0)
            if room_count > 1:
                expect(page.locator("#list li.card")).to_have_count(room_count - 1)
                expect(room_button).to_contain_text(str(room_count - 1))
            else:
                expect(page.locator(f'#taxonomy button.room[data-wing="{wing}"][data-room="{room}"]')).to_have_count(0)
            expect(detail.locator(".deleted")).to_contain_text("Deleted")
            expect(detail.locator('.history tbody tr[data-action="DELETE"] td').nth(2)).to_have_text("browser")
            audit = stack.sql("SELECT actor, reason FROM memory_history WHERE workspace_id = %s AND drawer_id = %s"
                              " AND action = 'DELETE'", (w, drawer_id))
            assert audit == [("browser", "deleted in the palace browser")]
            assert stack.sql("SELECT deleted_at IS NOT NULL FROM drawers WHERE workspace_id = %s AND id = %s",
                             (w, drawer_id)) == [(True,)], "soft delete: the row stays"
            page.fill("#q", "canary deploys billing")
            page.click("#search button[type=submit]")
            expect(page.locator("#status")).to_contain_text("results for")
            expect(page.locator(f'#list li.card[data-drawer="{drawer_id}"]')).to_have_count(0)

            page.goto(f"{authed_api}/ui/?workspace={w}")  # the key survives a reload of the tab
            expect(page.locator("#taxonomy .total")).to_contain_text(f"{tax['drawers'] - 1} live drawers")

            # 6. Another workspace: the last one's drawer and key go (that key would only get 403 there).
            page.fill("#q", "dark roast coffee")
            page.click("#search button[type=submit]")
            page.locator("#list li.card button.open").first.click()
            expect(detail.locator(".cite .citation")).to_have_count(1)
            page.fill("#workspace", ws())
            page.click("#connect button[type=submit]")
            expect(page.locator("#status")).to_contain_text("needs a key")
            expect(detail.locator(".cite .citation")).to_have_count(0)
            assert page.evaluate("sessionStorage.getItem('palace.apiKey')") is None
            assert not errors, errors
        finally:
            browser.close()
    assert SCREENSHOT.stat().st_size > 10_000


def test_palace_endpoints_scope_and_page(stack: Stack, authed_api: str) -> None:
    """The read endpoints: 401 without a key, 403 for another workspace, keyset pages, 404, bad cursor."""
    w, other = ws(), ws()
    key = api_key_for(stack, w, "pages")
    texts = [f"Page test memory number {i}: the shelf in the archive holds box {i * 7} of the ledgers." for i in
             range(7)]
    stack.publish(session(w, "s-pages", texts, agent_id="archivist"))
    ids = {stack.processed_drawer(w, t)[0] for t in texts}
    auth = {"Authorization": f"Bearer {key}"}
    base = f"{authed_api}/v1/workspaces"
    with httpx.Client(timeout=10) as c:
        assert c.get(f"{base}/{w}/palace/taxonomy").status_code == 401
        documented = set(c.get(f"{authed_api}/openapi.json").json()["paths"])
        assert {"/v1/workspaces/{workspace_id}/palace/taxonomy", "/v1/workspaces/{workspace_id}/palace/drawers",
                "/v1/workspaces/{workspace_id}/palace/drawers/{drawer_id}",
                "/v1/workspaces/{workspace_id}/palace/drawers/{drawer_id}/restore",
                "/v1/workspaces/{workspace_id}/palace/citations/{citation}"} <= documented
        assert c.get(f"{base}/{other}/palace/taxonomy", headers=auth).status_code == 403
        some = sorted(ids)[0]
        assert c.get(f"{base}/{w}/palace/citations/{some}").status_code == 401
        assert c.get(f"{base}/{other}/palace/citations/{some}", headers=auth).status_code == 403
        assert c.get(f"{base}/{w}/palace/citations/{some}", headers=auth).json()["drawer_id"] == some
        assert c.delete(f"{base}/{other}/palace/drawers/x", headers=auth).status_code == 403
        tax = c.get(f"{base}/{w}/palace/taxonomy", headers=auth).json()
        rooms = [(wg["wing"], r["room"], r["drawers"]) for wg in tax["wings"] for r in wg["rooms"]]
        assert sum(n for *_, n in rooms) == len(texts) == tax["drawers"]
        seen: list[str] = []
        for wing, room, _n in rooms:
            after = None
            while True:
                params: dict[str, Any] = {"wing": wing, "room": room, "limit": 2}
                if after:
                    params["after"] = after
                r = c.get(f"{base}/{w}/palace/drawers", params=params, headers=auth)
                assert r.status_code == 200, r.text
                page = r.json()
                assert len(page["drawers"]) <= 2
                filed = [d["filed_at"] for d in page["drawers"]]
                assert filed == sorted(filed, reverse=True)
                seen += [d["drawer_id"] for d in page["drawers"]]
                after = page["next"]
                if not after:
                    break
        assert sorted(seen) == sorted(ids), "every drawer exactly once across the pages"
        assert c.get(f"{base}/{w}/palace/drawers", params={"wing": "a", "room": "b", "after": "!!"},
                     headers=auth).status_code == 400
        assert c.get(f"{base}/{w}/palace/drawers", params={"wing": "a", "room": "b", "limit": 1000},
                     headers=auth).status_code == 422
        assert c.get(f"{base}/{w}/palace/drawers/nope", headers=auth).status_code == 404
        one = seen[0]
        assert c.delete(f"{base}/{w}/palace/drawers/{one}", headers=auth).json()["deleted"] is True
        assert c.delete(f"{base}/{w}/palace/drawers/{one}", headers=auth).json()["deleted"] is False
        assert c.get(f"{base}/{w}/palace/taxonomy", headers=auth).json()["drawers"] == len(texts) - 1
        assert c.post(f"{base}/{w}/palace/drawers/{one}/restore", headers=auth).json()["restored"] is True
        d = c.get(f"{base}/{w}/palace/drawers/{one}", headers=auth).json()
        assert d["deleted_at"] is None and [h["action"] for h in d["history"]][:2] == ["RESTORE", "DELETE"]
        assert d["sessions"][0]["session_id"] == "s-pages" and any(m["is_source"] for m in d["sessions"][0]["messages"])
        assert c.get(f"{base}/{w}/palace/taxonomy", headers=auth).json()["drawers"] == len(texts)


def test_room_pages_use_their_index(stack: Stack) -> None:
    """In a room of thousands of drawers a page is an index range of drawers_room_pages, first page and
    later ones alike, never a read and sort of the whole room. In a database of its own, so what other tests
    wrote first does not decide the plan, and its statistics stay out of theirs.

    Beside the room, 100,000 drawers of 2,000 other workspaces: taken as independent, workspace, wing and
    room made the room look a few rows long once the table held some 70,000 drawers, and the page was a
    sort of the whole room (it flaked so in the shared test database; migration 0059)."""
    from shared.db.migrate import apply_migrations

    w = ws()
    with fresh_database(stack, "palace_rooms") as url:
        apply_migrations(url, stack.settings.embed_dim)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO drawers (workspace_id, id, content, content_hash, wing, room, state, filed_at,"
                "                     dedup_bands)"
                " SELECT %s, md5(g::text), 'drawer ' || g, md5(g::text), 'big', 'hall', 'processed',"
                "        now() - g * interval '1 second', '{}' FROM generate_series(1, 5000) g", (w,))
            conn.execute(
                "INSERT INTO drawers (workspace_id, id, content, content_hash, wing, room, state, filed_at,"
                "                     dedup_bands)"
                " SELECT %s || '-' || (g %% 2000), 'o' || g, 'drawer ' || g, md5(g::text), 'agent-' || (g %% 3),"
                "        (ARRAY['general', 'fact', 'decision', 'event'])[1 + g %% 4], 'processed', now(), '{}'"
                "   FROM generate_series(1, 100000) g", (w,))
            conn.execute("ANALYZE drawers")
            page = ("EXPLAIN SELECT id, content FROM drawers WHERE workspace_id = %s AND wing = 'big'"
                    " AND room = 'hall' AND deleted_at IS NULL AND state <> 'merged' {}"
                    " ORDER BY filed_at DESC, id DESC LIMIT 26")
            for keyset in ("", "AND (filed_at, id) < (now() - interval '100 seconds', 'zz')"):
                rows = conn.execute(page.format(keyset), (w,)).fetchall()  # type: ignore[call-overload]
                plan = "\n".join(r[0] for r in rows)
                assert "drawers_room_pages" in plan and "Sort" not in plan, plan


def test_the_cli_reads_an_authenticated_api_with_its_key(stack: Stack, authed_api: str) -> None:
    """`palace search --api` and `palace quality --api` sent no key: against an api with authentication on
    (any beyond loopback) they always ended in a 401 traceback."""
    from typer.testing import CliRunner

    from services.cli import app

    w = ws()
    key = api_key_for(stack, w, "cli-test")
    stack.publish(session(w, "s-cli", ["The staging database is refreshed from production every Sunday."]))
    stack.processed_drawer(w, "The staging database is refreshed from production every Sunday.")
    runner = CliRunner()
    for args in (["search", "staging database", "-w", w, "--api", authed_api, "--json"],
                 ["quality", "-w", w, "--api", authed_api, "--json"]):
        r = runner.invoke(app, args, env={"PALACE_API_KEY": key})
        assert r.exit_code == 0 and (args[0] != "search" or "staging" in r.output), r.output
        r = runner.invoke(app, args, env={"PALACE_API_KEY": ""})
        assert r.exit_code == 1 and isinstance(r.exception, SystemExit | None), r.output  # a line, no traceback
        assert "401" in r.output or "refused" in r.output, r.output
