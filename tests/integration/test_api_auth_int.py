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


def test_an_operator_lists_and_revokes_keys_and_a_revoked_key_stays_refused(stack: Stack) -> None:
    """The docs said to revoke an old key after a rotation; nothing could (a leaked key lived on)."""
    from typer.testing import CliRunner

    from services.cli import app
    from shared.security import key_id_of

    w = ws()
    env = {"PALACE_DATABASE_URL": stack.database_url, "PALACE_NATS_URL": stack.nats_url}
    runner = CliRunner()
    r = runner.invoke(app, ["apikey", "create", "-w", w, "--name", "ci"], env=env)
    assert r.exit_code == 0, r.output
    key = r.output.strip().split()[-1]
    key_id = key_id_of(key)
    assert key_id is not None
    r = runner.invoke(app, ["apikey", "list", "-w", w], env=env)
    assert r.exit_code == 0 and key_id in r.output and key not in r.output, r.output
    settings = Settings(database_url=stack.database_url, nats_url=stack.nats_url, api_auth=True,
                        api_bootstrap_keys=f"{w}={key}")  # type: ignore[arg-type]
    with TestClient(create_app(settings)) as client:
        auth = {"Authorization": f"Bearer {key}"}
        assert client.get(f"/v1/workspaces/{w}/stats", headers=auth).status_code == 200
        r = runner.invoke(app, ["apikey", "revoke", key_id, "-w", w], env=env)
        assert r.exit_code == 0 and f"revoked {key_id}" in r.output, r.output
        assert client.get(f"/v1/workspaces/{w}/stats", headers=auth).status_code == 401, "refused at once"
    # A restart with the key still among the bootstrap keys leaves it revoked.
    with TestClient(create_app(settings)) as client:
        assert client.get(f"/v1/workspaces/{w}/stats", headers={"Authorization": f"Bearer {key}"}).status_code == 401
    assert "already revoked" in runner.invoke(app, ["apikey", "revoke", key, "-w", w], env=env).output
    r = runner.invoke(app, ["apikey", "revoke", "0123456789ab", "-w", w], env=env)
    assert r.exit_code == 1
