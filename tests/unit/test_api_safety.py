"""The API's safe defaults that need no server: bind check, bootstrap-key parsing, token buckets, and
the ASGI layer (error bodies, limits, metrics) on an app whose lifespan is not started."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from prometheus_client import REGISTRY

from services.api.app import create_app
from shared.config import Settings
from shared.ratelimit import TokenBuckets
from shared.security import (
    OPEN_BIND_SETTING,
    generate_key,
    is_loopback_host,
    parse_bootstrap_keys,
    unsafe_bind_reason,
)


@pytest.mark.parametrize("host", ["127.0.0.1", "127.1.2.3", "::1", "[::1]", "localhost", "LOCALHOST",
                                  "::ffff:127.0.0.1"])
def test_loopback_hosts(host: str) -> None:
    assert is_loopback_host(host)
    assert unsafe_bind_reason(host, auth=False, allow_unauthenticated=False) is None


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "", "10.0.0.5", "192.168.1.2", "example.com", "localhost.example",
                                  "::ffff:10.0.0.1"])
def test_exposed_hosts_need_auth_or_the_override(host: str) -> None:
    assert not is_loopback_host(host)
    reason = unsafe_bind_reason(host, auth=False, allow_unauthenticated=False)
    assert reason is not None and OPEN_BIND_SETTING in reason and "PALACE_API_AUTH=true" in reason
    assert unsafe_bind_reason(host, auth=True, allow_unauthenticated=False) is None
    assert unsafe_bind_reason(host, auth=False, allow_unauthenticated=True) is None


def test_bootstrap_keys_parse_and_errors_never_show_the_key() -> None:
    (_, k1), (_, k2) = generate_key(), generate_key()
    assert parse_bootstrap_keys(f" team-a={k1} , team.b@x={k2},") == [("team-a", k1), ("team.b@x", k2)]
    assert parse_bootstrap_keys("") == []
    openssl_style = "pk_0123456789ab_" + "f" * 48  # pk_$(openssl rand -hex 6)_$(openssl rand -hex 24)
    assert parse_bootstrap_keys(f"w={openssl_style}") == [("w", openssl_style)]
    for bad, why in [(k1, "workspace_id=key"), (f"bad ws={k1}", "invalid workspace"),
                     (f"w={k1[:-20]}", "not of the form"), ("w=", "workspace_id=key"), (f"={k1}", "workspace_id=key")]:
        with pytest.raises(ValueError, match=why) as e:
            parse_bootstrap_keys(bad)
        assert k1 not in str(e.value) and k1[:-20] not in str(e.value)


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_token_bucket_burst_refill_and_retry_after() -> None:
    clock = Clock()
    b = TokenBuckets(rate=2.0, burst=3, clock=clock)
    assert [b.take("a") for _ in range(3)] == [0.0, 0.0, 0.0]
    wait = b.take("a")
    assert wait == pytest.approx(0.5)
    assert TokenBuckets.retry_after_header(wait) == "1"
    assert b.take("b") == 0.0, "callers do not share a bucket"
    clock.t += 0.5
    assert b.take("a") == 0.0 and b.take("a") > 0
    clock.t += 100
    assert [b.take("a") for _ in range(4)][:3] == [0.0, 0.0, 0.0], "refills to the burst, never beyond"


def test_token_buckets_memory_is_bounded() -> None:
    clock = Clock()
    b = TokenBuckets(rate=1.0, burst=2, max_buckets=100, clock=clock)
    for i in range(1000):
        b.take(f"c{i}")
    assert len(b) == 100, "least recently used callers are forgotten beyond the cap"
    clock.t += 2.0  # every bucket has refilled: idle ones are indistinguishable from new ones
    b.take("fresh")
    assert len(b) == 1


def _app(**overrides: object) -> TestClient:
    """No `with`: the lifespan (database, NATS, embedder) does not run; routes that need it are not called."""
    return TestClient(create_app(Settings(**overrides)), base_url="http://localhost")  # type: ignore[arg-type]


def test_error_bodies_are_json_with_a_code_and_a_reason() -> None:
    c = _app(api_auth=True, api_rate_per_s=0)
    r = c.get("/v1/nothing-here")
    assert r.status_code == 404
    assert r.json() == {"error": "not_found", "detail": "no such resource: GET /v1/nothing-here"}
    r = c.delete("/v1/search")
    assert r.status_code == 405 and r.json()["error"] == "method_not_allowed"
    r = c.post("/v1/search", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"] == "bad_request" and "not valid JSON" in r.json()["detail"]
    r = c.post("/v1/search", json={"workspace_id": "bad ws", "query": "x"})
    assert r.status_code == 401, "no key: refused before the body is judged"
    r = c.get("/v1/workspaces/w/stats")
    assert r.status_code == 401 and r.json()["error"] == "unauthorized" and r.headers["www-authenticate"] == "Bearer"
    r = c.get("/v1/workspaces/w/stats", headers={"Authorization": "Bearer not-a-key"})
    assert r.status_code == 401 and "invalid" in r.json()["detail"]


def test_declared_oversized_body_is_refused_before_reading() -> None:
    c = _app(max_request_bytes=100, api_rate_per_s=0)
    r = c.post("/v1/sessions", content=b"x" * 101, headers={"content-type": "application/json"})
    assert r.status_code == 413
    assert r.json() == {"error": "payload_too_large", "detail": "request body over 100 bytes"}


def test_rate_limit_answers_429_with_retry_after_and_spares_probes() -> None:
    c = _app(api_rate_per_s=0.5, api_rate_burst=3)
    assert [c.get("/v1/nope").status_code for _ in range(3)] == [404, 404, 404]
    r = c.get("/v1/nope")
    assert r.status_code == 429 and r.json()["error"] == "rate_limited" and "client address" in r.json()["detail"]
    assert int(r.headers["retry-after"]) >= 1
    assert all(c.get("/livez").status_code == 200 for _ in range(10)), "probes are never limited"
    assert c.get("/metrics").status_code == 200


def test_metrics_served_directly_with_route_templates() -> None:
    c = _app(api_rate_per_s=0, api_auth=True)
    before = REGISTRY.get_sample_value("palace_http_requests_total",
                                       {"method": "GET", "route": "/v1/workspaces/{workspace_id}/stats",
                                        "status": "401"}) or 0.0
    assert c.get("/v1/workspaces/some-ws/stats").status_code == 401
    c.get("/v1/random/path/abc123")
    for path in ("/metrics", "/metrics/"):
        r = c.get(path, follow_redirects=False)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
        assert "palace_http_requests_total" in r.text and "palace_http_request_seconds_bucket" in r.text
    after = REGISTRY.get_sample_value("palace_http_requests_total",
                                      {"method": "GET", "route": "/v1/workspaces/{workspace_id}/stats",
                                       "status": "401"})
    assert after == before + 1
    assert 'route="/v1/random/path/abc123"' not in c.get("/metrics").text, "raw paths never become labels"
    assert REGISTRY.get_sample_value("palace_http_requests_total",
                                     {"method": "GET", "route": "unmatched", "status": "404"})
    assert c.get("/livez").json() == {"status": "ok"}


def test_under_auth_the_limit_follows_the_key_and_skips_keyless_requests() -> None:
    c = _app(api_auth=True, api_rate_per_s=0.5, api_rate_burst=2)
    (_, k1), (_, k2) = generate_key(), generate_key()
    h1, h2 = {"Authorization": f"Bearer {k1}"}, {"Authorization": f"Bearer {k2}"}
    assert [c.get("/v1/nope", headers=h1).status_code for _ in range(3)] == [404, 404, 429]
    assert c.get("/v1/nope", headers=h2).status_code == 404, "another key has its own bucket"
    assert {c.get("/v1/workspaces/w/stats").status_code for _ in range(10)} == {401}, \
        "keyless requests get their 401 (no database work) and use no one's allowance"


def test_openapi_documents_the_error_shape() -> None:
    spec = create_app(Settings()).openapi()
    responses = spec["paths"]["/v1/search"]["post"]["responses"]
    for status in ("400", "401", "403", "413", "422", "429"):
        assert responses[status]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorBody")
    assert set(spec["components"]["schemas"]["ErrorBody"]["required"]) == {"error", "detail"}
    assert {"/livez", "/readyz", "/healthz"} <= set(spec["paths"])


def test_alive_but_not_ready_before_connections_are_open() -> None:
    c = _app()
    assert c.get("/livez").status_code == 200
    r = c.get("/readyz")
    assert r.status_code == 503 and r.json()["error"] == "unavailable"
    assert r.json()["detail"]["failed"] == ["database", "nats", "startup"]
    assert r.json()["database"] is False and r.json()["nats"] is False
    r = c.get("/v1/search", params={"workspace_id": "w", "q": "x"})
    assert r.status_code == 503 and "starting" in r.json()["detail"]


def test_a_router_added_later_gets_the_same_errors_limits_and_metrics() -> None:
    from fastapi import APIRouter, HTTPException
    from structlog.testing import capture_logs

    extra = APIRouter(prefix="/v1/extra")

    @extra.post("/{name}")
    async def conflict(name: str) -> None:
        raise HTTPException(409, f"{name} already exists")

    @extra.get("/boom")
    async def boom() -> None:
        raise RuntimeError("a bug")

    app = create_app(Settings(api_rate_per_s=0))
    app.include_router(extra)
    c = TestClient(app, raise_server_exceptions=False, base_url="http://localhost")
    r = c.post("/v1/extra/thing")
    assert r.status_code == 409 and r.json() == {"error": "conflict", "detail": "thing already exists"}
    with capture_logs() as logs:
        r = c.get("/v1/extra/boom")
    assert [e["event"] for e in logs if e["log_level"] == "error"] == ["api_unhandled_error"], "the bug is logged"
    assert r.status_code == 500 and r.json()["error"] == "internal_error" and "a bug" not in r.text
    assert REGISTRY.get_sample_value("palace_http_requests_total",
                                     {"method": "GET", "route": "/v1/extra/boom", "status": "500"}) == 1.0
    assert REGISTRY.get_sample_value("palace_http_requests_total",
                                     {"method": "POST", "route": "/v1/extra/{name}", "status": "409"}) == 1.0


def test_an_unreachable_or_saturated_database_answers_503_with_retry_after() -> None:
    """The pool's wait running out, a statement timeout or a lost connection is not the caller's fault nor a
    bug: 503 and when to retry, not 500."""
    import psycopg
    from fastapi import APIRouter
    from psycopg_pool import PoolTimeout

    extra = APIRouter(prefix="/v1/busy")
    failures: dict[str, Exception] = {"pool": PoolTimeout("couldn't get a connection after 60.00 sec"),
                                      "cancel": psycopg.errors.QueryCanceled("canceling statement due to timeout"),
                                      "lost": psycopg.OperationalError("server closed the connection")}

    @extra.get("/{kind}")
    async def busy(kind: str) -> None:
        raise failures[kind]

    app = create_app(Settings(api_rate_per_s=0))
    app.include_router(extra)
    c = TestClient(app, raise_server_exceptions=False, base_url="http://localhost")
    for kind in failures:
        r = c.get(f"/v1/busy/{kind}")
        assert r.status_code == 503 and r.json()["error"] == "unavailable", (kind, r.text)
        assert int(r.headers["Retry-After"]) > 0


def test_without_keys_only_requests_to_a_loopback_name_are_served() -> None:
    """DNS rebinding: a page on evil.example re-points its name at 127.0.0.1 and calls the key-less api
    from its own origin; the browser sends Host: evil.example. Refused, whatever the route."""
    from services.api.middleware import host_name

    assert [host_name(h) for h in ("localhost:8080", "[::1]:8080", "127.0.0.1", "::1", "evil.example:80")] == [
        "localhost", "::1", "127.0.0.1", "::1", "evil.example"]
    for base in ("http://evil.example:8080", "http://palace.evil.example"):
        c = TestClient(create_app(Settings(api_rate_per_s=0)), base_url=base)  # type: ignore[arg-type]
        for method, path in (("GET", "/livez"), ("POST", "/v1/forget"), ("GET", "/openapi.json")):
            r = c.request(method, path)
            assert r.status_code == 400 and "is not this machine" in r.json()["detail"], (base, path, r.text)
    for base in ("http://localhost:8080", "http://127.0.0.1:8080", "http://[::1]:8080"):
        c = TestClient(create_app(Settings(api_rate_per_s=0)), base_url=base)  # type: ignore[arg-type]
        assert c.get("/livez").status_code == 200, base
    # With keys (or an operator-vouched open bind) the api answers to whatever name it is published under.
    for overrides in ({"api_auth": True}, {"api_allow_unauthenticated_bind": True}):
        c = TestClient(create_app(Settings(api_rate_per_s=0, **overrides)),  # type: ignore[arg-type]
                       base_url="http://palace.example.com")
        assert c.get("/livez").status_code == 200, overrides
