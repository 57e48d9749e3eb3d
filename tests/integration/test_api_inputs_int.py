"""What the API does with inputs that used to be mishandled, over the real stack: a forget by citation
erases the drawer it names, text no table can hold and sessions ingest would refuse are answered 4xx
before anything is published, references resolve to 404/409/422 everywhere, an identity set over REST is
audited, and made-up keys rotated from one address run into a limit."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from services.api.app import create_app
from shared.config import Settings
from shared.memory.citations import cite
from shared.security import generate_key
from tests.integration.helpers import Stack, api_key_for, session, wait_for, ws

pytestmark = pytest.mark.integration


def _settings(stack: Stack, **overrides: object) -> Settings:
    return Settings(database_url=stack.database_url, nats_url=stack.nats_url, **overrides)  # type: ignore[arg-type]


def test_forget_by_citation_erases_the_drawer_it_names(stack: Stack) -> None:
    w = ws()
    keep = "The quarterly report goes to the finance team every first Monday of the month."
    secret = "My home alarm code is the year my grandmother was born, written backwards on a sticky note."
    stack.publish(session(w, "s-cite", [keep, secret]))
    drawer_id, wing, room = stack.processed_drawer(w, secret)
    stack.processed_drawer(w, keep)
    with TestClient(create_app(_settings(stack)), base_url="http://localhost") as c:
        r = c.post("/v1/forget", json={"workspace_id": w, "drawer_id": cite(wing, room, drawer_id), "verify": True})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["scope"] == {"kind": "drawer", "value": drawer_id}, "the citation is resolved to the drawer"
        assert body["counts"]["drawers"] == 1 and not any(body["remaining"].values())
        r = c.post("/v1/forget", json={"workspace_id": w, "drawer_id": "general/fact/0123456789ab"})
        assert r.status_code == 404 and r.json()["error"] == "not_found"
    assert stack.sql("SELECT count(*) FROM drawers WHERE workspace_id = %s AND content = %s", (w, secret)) == [(0,)]
    assert stack.sql("SELECT count(*) FROM drawers WHERE workspace_id = %s AND content = %s", (w, keep)) == [(1,)]


def test_text_no_table_can_hold_is_refused_not_accepted_or_a_500(stack: Stack) -> None:
    w = ws()
    with TestClient(create_app(_settings(stack)), base_url="http://localhost") as c:
        r = c.post(f"/v1/workspaces/{w}/drawers", json={"content": "I prefer dark roast coffee\u0000 in the morning"})
        assert r.status_code == 422 and "NUL" in r.json()["detail"], r.text
        r = c.put(f"/v1/workspaces/{w}/identity", json={"text": "I am Atlas\u0000"})
        assert r.status_code == 422 and "NUL" in r.json()["detail"], r.text
        r = c.post("/v1/wake_up", json={"workspace_id": w, "wing": "a\u0000b"})
        assert r.status_code == 422, r.text
        r = c.get(f"/v1/workspaces/{w}/palace/drawers", params={"wing": "a\u0000", "room": "b"})
        assert r.status_code == 422, r.text
    assert stack.sql("SELECT count(*) FROM identities WHERE workspace_id = %s", (w,)) == [(0,)]


def test_sessions_ingest_would_refuse_are_refused_before_publishing(stack: Stack) -> None:
    w = ws()
    msgs = [{"role": "user", "content": f"message number {i} about the garden"} for i in range(30)]
    event = {"workspace_id": w, "session_id": "too-many", "messages": msgs}
    with TestClient(create_app(_settings(stack, max_messages_per_session=20)), base_url="http://localhost") as c:
        r = c.post("/v1/sessions", json=event)
        assert r.status_code == 422 and "the limit is 20" in r.json()["detail"], r.text
    # Under the request limit, over the event limit once published (defaults filled in): 413, not a 202
    # followed by a dead letter.
    with TestClient(create_app(_settings(stack, max_event_bytes=2_000)), base_url="http://localhost") as c:
        r = c.post("/v1/sessions", json={**event, "session_id": "too-big"})
        assert r.status_code == 413 and "split it" in r.json()["detail"], r.text
        assert c.post("/v1/sessions", json={**event, "session_id": "fits", "messages": msgs[:3]}).status_code == 202
    # Once the session published after them is stored, one of them published anyway would be too.
    wait_for(lambda: stack.sql("SELECT count(*) FROM sessions WHERE workspace_id = %s", (w,))[0][0] >= 1, 60,
             "the session that fits")
    assert stack.sql("SELECT count(*) FROM sessions WHERE workspace_id = %s AND session_id <> 'fits'", (w,)) == [(0,)]


def test_two_workspaces_may_use_one_event_id_and_a_repeat_is_reported(stack: Stack) -> None:
    """A producer chooses its event ids: another tenant's session under the same id (within JetStream's
    duplicate window) was dropped as a repeat of the first, and the API answered 202 all the same."""
    a, b = ws(), ws()
    event_id = f"evt-{a}"
    with TestClient(create_app(_settings(stack)), base_url="http://localhost") as c:
        for w, words in ((a, "The greenhouse tomatoes need water every second morning."),
                         (b, "Our release train leaves on Thursdays at noon sharp.")):
            body = {"workspace_id": w, "event_id": event_id, "session_id": "s-1",
                    "messages": [{"role": "user", "content": words}]}
            r = c.post("/v1/sessions", json=body)
            assert r.status_code == 202 and r.json()["duplicate"] is False, r.text
        r = c.post("/v1/sessions", json=body)
        assert r.status_code == 202 and r.json()["duplicate"] is True, r.text
    stack.processed_drawer(a, "The greenhouse tomatoes need water every second morning.")
    stack.processed_drawer(b, "Our release train leaves on Thursdays at noon sharp.")


def test_references_and_dates_answer_4xx_and_the_identity_is_audited(stack: Stack) -> None:
    w = ws()
    with TestClient(create_app(_settings(stack)), base_url="http://localhost") as c:
        r = c.delete(f"/v1/workspaces/{w}/palace/drawers/0123456789ab")
        assert r.status_code == 404 and r.json()["error"] == "not_found", r.text
        r = c.delete(f"/v1/workspaces/{w}/palace/drawers/abc")
        assert r.status_code == 422, r.text
        r = c.get(f"/v1/workspaces/{w}/kg/facts", params={"entity": "Orion", "as_of": "9999-12-31"})
        assert r.status_code == 200 and r.json()["facts"] == [], r.text
        for text in ("I am Atlas, the team's assistant.", "I am Atlas, Maria's assistant."):
            assert c.put(f"/v1/workspaces/{w}/identity", json={"text": text}).status_code == 200
    rows = stack.sql("SELECT old_value->>'text', new_value->>'text' FROM memory_history"
                     " WHERE workspace_id = %s AND action = 'SET_IDENTITY' ORDER BY created_at", (w,))
    assert rows == [(None, "I am Atlas, the team's assistant."),
                    ("I am Atlas, the team's assistant.", "I am Atlas, Maria's assistant.")]


def test_made_up_keys_from_one_address_run_into_the_limit(stack: Stack) -> None:
    w = ws()
    good = api_key_for(stack, w)
    with TestClient(create_app(_settings(stack, api_auth=True, api_rate_per_s=0.2, api_rate_burst=3))) as c:
        assert c.get(f"/v1/workspaces/{w}/stats", headers={"Authorization": f"Bearer {good}"}).status_code == 200
        codes = [c.get(f"/v1/workspaces/{w}/stats",
                       headers={"Authorization": f"Bearer {generate_key()[1]}"}).status_code for _ in range(6)]
        assert codes == [401, 401, 401, 429, 429, 429], "each new key used to get a bucket of its own"
        r = c.get(f"/v1/workspaces/{w}/stats", headers={"Authorization": f"Bearer {generate_key()[1]}"})
        assert "unrecognised API keys" in r.json()["detail"]
        assert c.get(f"/v1/workspaces/{w}/stats", headers={"Authorization": f"Bearer {good}"}).status_code == 200, \
            "a key seen to work goes on from the same address"


def test_a_made_up_key_is_not_known_for_reaching_a_route_that_asks_for_none(stack: Stack) -> None:
    """Only a key that authenticated passes as known: any answer but a 401 used to make it one (a
    made-up key sent to /openapi.json first then skipped the limit on unrecognised keys). Two
    Authorization headers are refused: the limiter read the first and MCP the last."""
    w = ws()
    good = api_key_for(stack, w)
    with TestClient(create_app(_settings(stack, api_auth=True, api_rate_per_s=0.2, api_rate_burst=3))) as c:
        assert c.get(f"/v1/workspaces/{w}/stats", headers={"Authorization": f"Bearer {good}"}).status_code == 200
        made_up = [generate_key()[1] for _ in range(5)]
        for k in made_up:
            assert c.get("/openapi.json", headers={"Authorization": f"Bearer {k}"}).status_code == 200
        codes = [c.get(f"/v1/workspaces/{w}/stats", headers={"Authorization": f"Bearer {k}"}).status_code
                 for k in made_up]
        assert codes == [401, 401, 401, 429, 429], codes
        two = [("Authorization", f"Bearer {generate_key()[1]}"), ("Authorization", f"Bearer {good}")]
        for path in (f"/v1/workspaces/{w}/stats", "/mcp/"):
            r = c.request("GET" if path != "/mcp/" else "POST", path, headers=two)
            assert r.status_code == 400 and "one Authorization header" in r.json()["detail"], (path, r.text)
        assert c.get(f"/v1/workspaces/{w}/stats", headers={"Authorization": f"Bearer {good}"}).status_code == 200
