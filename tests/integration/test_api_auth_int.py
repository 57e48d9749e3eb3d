"""With PALACE_API_AUTH, every API call needs a bearer key, and a key reaches only its own workspace."""

from __future__ import annotations

from fastapi.testclient import TestClient

from services.api.app import create_app
from shared.config import Settings
from tests.integration.helpers import Stack, api_key_for, ws


def test_bearer_keys_are_required_and_scoped(stack: Stack) -> None:
    a, b = ws(), ws()
    key_a = api_key_for(stack, a)
    stored = stack.sql("SELECT key_hash FROM api_keys WHERE workspace_id = %s", (a,))[0][0]
    assert key_a not in stored and len(stored) == 64, "only the hash is stored"
    settings = Settings(database_url=stack.database_url, nats_url=stack.nats_url, api_auth=True)
    with TestClient(create_app(settings), base_url="http://localhost") as client:
        body = {"workspace_id": a, "query": "anything", "k": 3}
        assert client.post("/v1/search", json=body).status_code == 401
        assert client.post("/v1/search", json=body, headers={"Authorization": "Bearer pk_nope"}).status_code == 401
        ok = client.post("/v1/search", json=body, headers={"Authorization": f"Bearer {key_a}"})
        assert ok.status_code == 200, ok.text
        other = client.post("/v1/search", json={**body, "workspace_id": b},
                            headers={"Authorization": f"Bearer {key_a}"})
        assert other.status_code == 403
        assert client.get(f"/v1/workspaces/{b}/stats", headers={"Authorization": f"Bearer {key_a}"}).status_code == 403
        assert client.get("/healthz").status_code == 200, "health stays open for probes"
