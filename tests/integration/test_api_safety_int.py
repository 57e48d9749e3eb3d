"""The API's safe defaults against the real servers: bind refusal and its override, bootstrap keys,
the body limit on chunked uploads, probes, request metrics, rate limits and JSON errors."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from services.api.app import create_app
from shared.config import Settings
from shared.security import OPEN_BIND_SETTING, generate_key, hash_key
from tests.integration.helpers import Stack, api_key_for, session, wait_for, ws

ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _settings(stack: Stack, **overrides: object) -> Settings:
    return Settings(database_url=stack.database_url, nats_url=stack.nats_url, **overrides)  # type: ignore[arg-type]


def _api_env(stack: Stack, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PALACE_API_")}
    return {**env, "PALACE_DATABASE_URL": stack.database_url, "PALACE_NATS_URL": stack.nats_url,
            "PALACE_API_PORT": str(_free_port()), **extra}


def test_api_refuses_an_unauthenticated_public_bind(stack: Stack) -> None:
    for host in ("0.0.0.0", "::"):
        p = subprocess.run([sys.executable, "-m", "services.api"], cwd=ROOT, capture_output=True, text=True,
                           timeout=60, env=_api_env(stack, PALACE_API_HOST=host, PALACE_API_AUTH="false"))
        assert p.returncode != 0, p.stderr
        assert OPEN_BIND_SETTING in p.stderr and "PALACE_API_AUTH=true" in p.stderr, p.stderr


def _serve(env: dict[str, str]) -> subprocess.Popen[str]:
    """`python -m services.api` as a deployment runs it, ready once /readyz answers 200."""
    proc = subprocess.Popen([sys.executable, "-m", "services.api"], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    def ready() -> bool:
        if proc.poll() is not None:
            raise AssertionError(proc.stderr.read() if proc.stderr else "api exited")
        try:
            return httpx.get(f"http://127.0.0.1:{env['PALACE_API_PORT']}/readyz", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    try:
        wait_for(ready, 120, f"the api on {env['PALACE_API_HOST']}")
    except BaseException:
        proc.kill()
        raise
    return proc


def _stop(proc: subprocess.Popen[str]) -> str:
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    return err


def test_public_bind_with_auth_needs_a_key_from_the_environment(stack: Stack) -> None:
    """What the manifests do: all interfaces, PALACE_API_AUTH=true, keys from a Secret."""
    w = ws()
    _, key = generate_key()
    env = _api_env(stack, PALACE_API_HOST="0.0.0.0", PALACE_API_AUTH="true",
                   PALACE_API_BOOTSTRAP_KEYS=f"{w}={key}")
    proc = _serve(env)
    try:
        url = f"http://127.0.0.1:{env['PALACE_API_PORT']}/v1/search"
        body = {"workspace_id": w, "query": "anything", "k": 3}
        r = httpx.post(url, json=body, timeout=30)
        assert r.status_code == 401 and r.json()["error"] == "unauthorized", r.text
        r = httpx.post(url, json=body, headers={"Authorization": f"Bearer {key}"}, timeout=30)
        assert r.status_code == 200, r.text
        r = httpx.post(url, json={**body, "workspace_id": ws()}, headers={"Authorization": f"Bearer {key}"},
                       timeout=30)
        assert r.status_code == 403, r.text
    finally:
        err = _stop(proc)
    assert key not in err, "the secret never reaches the log"


def test_override_lets_it_listen_on_all_interfaces_without_auth(stack: Stack) -> None:
    env = _api_env(stack, PALACE_API_HOST="0.0.0.0", **{OPEN_BIND_SETTING: "true"})
    proc = _serve(env)
    try:
        r = httpx.get(f"http://127.0.0.1:{env['PALACE_API_PORT']}/v1/workspaces/{ws()}/stats", timeout=10)
        assert r.status_code == 200, r.text
    finally:
        err = _stop(proc)
    assert "api_listening_without_authentication" in err, "the override is logged as a warning"


def test_alive_while_the_database_is_unreachable_and_exits_on_a_failed_start(stack: Stack) -> None:
    """Liveness is the process; readiness the dependencies: waiting for a database is not a reason to be
    restarted. A start that cannot succeed (one key for two workspaces) ends the process with an error."""
    env = {**_api_env(stack, PALACE_API_HOST="127.0.0.1"),
           "PALACE_DATABASE_URL": f"postgresql://palace@127.0.0.1:{_free_port()}/palace?connect_timeout=1"}
    base = f"http://127.0.0.1:{env['PALACE_API_PORT']}"
    proc = subprocess.Popen([sys.executable, "-m", "services.api"], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        def up() -> bool:
            try:
                return httpx.get(f"{base}/livez", timeout=2).status_code == 200
            except httpx.TransportError:
                return False
        wait_for(up, 60, "/livez while the database is unreachable")
        r = httpx.get(f"{base}/readyz", timeout=10)
        assert r.status_code == 503 and "database" in r.json()["detail"]["failed"], r.text
        assert httpx.get(f"{base}/v1/workspaces/w/stats", timeout=10).status_code == 503
        assert proc.poll() is None
    finally:
        _stop(proc)

    a = ws()
    key_a = api_key_for(stack, a)
    p = subprocess.run([sys.executable, "-m", "services.api"], cwd=ROOT, capture_output=True, text=True,
                       timeout=120, env=_api_env(stack, PALACE_API_BOOTSTRAP_KEYS=f"{ws()}={key_a}"))
    assert p.returncode != 0 and f"already stored for workspace {a}" in p.stderr, p.stderr[-2000:]
    assert key_a not in p.stderr


def test_bootstrap_keys_are_stored_hashed_idempotently_and_scoped(stack: Stack) -> None:
    a, b = ws(), ws()
    (_, key_a), (_, key_b) = generate_key(), generate_key()
    cfg = _settings(stack, api_auth=True, api_bootstrap_keys=f"{a}={key_a}, {b}={key_b}")
    for _ in range(2):  # a second start (another replica, a restart) changes nothing
        with TestClient(create_app(cfg), base_url="http://localhost") as client:
            assert client.get(f"/v1/workspaces/{a}/stats", headers={"Authorization": f"Bearer {key_a}"}
                              ).status_code == 200
            r = client.get(f"/v1/workspaces/{a}/stats", headers={"Authorization": f"Bearer {key_b}"})
            assert r.status_code == 403 and r.json()["error"] == "forbidden", r.text
    rows = stack.sql("SELECT workspace_id, key_hash, name FROM api_keys WHERE workspace_id IN (%s, %s)"
                     " ORDER BY workspace_id = %s DESC", (a, b, a))
    assert rows == [(a, hash_key(key_a), "bootstrap"), (b, hash_key(key_b), "bootstrap")], "hashes only, once each"
    # A revoked bootstrap key stays revoked across restarts.
    stack.sql("UPDATE api_keys SET revoked_at = now() WHERE key_hash = %s RETURNING key_id", (hash_key(key_b),))
    with TestClient(create_app(cfg), base_url="http://localhost") as client:
        r = client.get(f"/v1/workspaces/{b}/stats", headers={"Authorization": f"Bearer {key_b}"})
        assert r.status_code == 401 and r.json()["error"] == "unauthorized"
    # One key can never open two workspaces: the start fails, naming the workspaces, not the key.
    clash = _settings(stack, api_auth=True, api_bootstrap_keys=f"{ws()}={key_a}")
    with pytest.raises(ValueError, match=f"already stored for workspace {a}") as e, TestClient(create_app(clash), base_url="http://localhost"):
        pass
    assert key_a not in str(e.value)


def _chunks(total: int, size: int = 64 * 1024) -> Iterator[bytes]:
    sent = 0
    while sent < total:
        n = min(size, total - sent)
        sent += n
        yield b" " * n


def test_body_limit_holds_for_chunked_uploads(stack: Stack) -> None:
    limit = stack.settings.max_request_bytes
    url = f"{stack.api_url}/v1/sessions"
    r = httpx.post(url, content=_chunks(limit + 200_000), headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == 413, r.text
    assert r.json() == {"error": "payload_too_large", "detail": f"request body over {limit} bytes"}

    w = ws()
    body = json.dumps(session(w, "chunked", ["We moved the nightly backup to 02:00 UTC."])).encode()

    def small() -> Iterator[bytes]:
        for i in range(0, len(body), 7):
            yield body[i:i + 7]

    r = httpx.post(url, content=small(), headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == 202, r.text
    assert r.request.headers.get("transfer-encoding") == "chunked" and "content-length" not in r.request.headers
    stack.wait_processed(w, 1)


def test_probes_and_metrics(stack: Stack) -> None:
    api = stack.api_url
    assert httpx.get(f"{api}/livez", timeout=5).json() == {"status": "ok"}
    assert httpx.get(f"{api}/readyz", timeout=5).json() == {"database": True, "nats": True}
    assert httpx.get(f"{api}/healthz", timeout=5).json() == {"database": True, "nats": True}
    w = ws()
    stack.search(w, "anything at all", k=3)
    httpx.get(f"{api}/v1/workspaces/{w}/stats", timeout=10)
    for path in ("/metrics", "/metrics/"):
        r = httpx.get(f"{api}{path}", timeout=10, follow_redirects=False)
        assert r.status_code == 200, (path, r.status_code)
        assert 'palace_http_requests_total{method="POST",route="/v1/search",status="200"}' in r.text
        assert 'palace_http_request_seconds_count{method="GET",route="/livez"}' in r.text
        assert 'route="/v1/workspaces/{workspace_id}/stats"' in r.text and w not in r.text


def test_readiness_names_the_failed_dependency_and_liveness_ignores_it(stack: Stack) -> None:
    with TestClient(create_app(_settings(stack)), base_url="http://localhost") as client:
        assert client.get("/readyz").status_code == 200
        app = client.app
        client.portal.call(app.state.broker._connection.close)  # type: ignore[attr-defined,union-attr]
        r = client.get("/readyz")
        assert r.status_code == 503 and r.json()["error"] == "unavailable", r.text
        assert r.json()["detail"]["failed"] == ["nats"] and r.json()["database"] is True
        assert client.get("/healthz").status_code == 503
        assert client.get("/livez").status_code == 200
        client.portal.call(app.state.pool.close)  # type: ignore[attr-defined,union-attr]
        r = client.get("/readyz")
        assert r.status_code == 503 and r.json()["detail"]["failed"] == ["database", "nats"], r.text
        # Anyone may ask: the error's own text (hosts, user names) stays in the log.
        assert r.json()["detail"]["database"].startswith("unreachable (") and "closed" not in r.text, r.text
        assert client.get("/livez").json() == {"status": "ok"}


def test_rate_limit_per_key_and_per_address(stack: Stack) -> None:
    a, b = ws(), ws()
    key_a, key_b = api_key_for(stack, a), api_key_for(stack, b)
    with TestClient(create_app(_settings(stack, api_auth=True, api_rate_per_s=0.2, api_rate_burst=3))) as client:
        ha, hb = {"Authorization": f"Bearer {key_a}"}, {"Authorization": f"Bearer {key_b}"}
        assert [client.get(f"/v1/workspaces/{a}/stats", headers=ha).status_code for _ in range(3)] == [200] * 3
        r = client.get(f"/v1/workspaces/{a}/stats", headers=ha)
        assert r.status_code == 429 and r.json()["error"] == "rate_limited" and "per API key" in r.json()["detail"]
        assert 1 <= int(r.headers["retry-after"]) <= 5
        assert client.get(f"/v1/workspaces/{b}/stats", headers=hb).status_code == 200, "keys have their own buckets"
        assert client.get("/readyz").status_code == 200, "probes are never limited"
    with TestClient(create_app(_settings(stack, api_rate_per_s=0.2, api_rate_burst=2)),
                    base_url="http://localhost") as client:
        codes = [client.get(f"/v1/workspaces/{a}/stats").status_code for _ in range(3)]
        assert codes == [200, 200, 429], "without authentication: one bucket per client address"


def test_errors_are_json_with_reasons(stack: Stack) -> None:
    a, b = ws(), ws()
    key_a = api_key_for(stack, a)
    with TestClient(create_app(_settings(stack, api_auth=True))) as client:
        h = {"Authorization": f"Bearer {key_a}"}
        r = client.post("/v1/search", json={"workspace_id": a, "query": "x"})
        assert r.status_code == 401 and r.json()["error"] == "unauthorized" and "bearer" in r.json()["detail"]
        r = client.post("/v1/search", json={"workspace_id": b, "query": "x"}, headers=h)
        assert r.status_code == 403 and r.json() == {"error": "forbidden",
                                                     "detail": "this API key belongs to another workspace"}
        r = client.post("/v1/search", json={"workspace_id": a, "query": "", "k": 99}, headers=h)
        assert r.status_code == 422 and r.json()["error"] == "invalid_request"
        assert {tuple(e["loc"]) for e in r.json()["detail"]} == {("body", "query"), ("body", "k")}
        r = client.post("/v1/sessions", content=b'{"workspace_id": ', headers={**h, "content-type": "application/json"})
        assert r.status_code == 400 and r.json()["error"] == "bad_request"
        r = client.get(f"/v1/workspaces/{a}/nothing", headers=h)
        assert r.status_code == 404 and r.json()["error"] == "not_found"
