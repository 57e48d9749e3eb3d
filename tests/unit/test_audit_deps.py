"""The dependency audit's verdicts, against canned PyPI JSON documents."""

from __future__ import annotations

import asyncio

import httpx

from tools.audit_deps import _check

DOCS = {
    "clean": {"info": {"version": "1.2.0"}, "vulnerabilities": []},
    "bad": {"info": {"version": "2.0.0"}, "vulnerabilities": [{"id": "PYSEC-1", "fixed_in": ["2.0.1"]}]},
    "old": {"info": {"version": "3.0.0"}, "vulnerabilities": []},
}


def _handler(request: httpx.Request) -> httpx.Response:
    name = request.url.path.split("/")[2]
    if name == "down":
        return httpx.Response(503)
    return httpx.Response(200, json=DOCS[name]) if name in DOCS else httpx.Response(404)


def test_verdicts() -> None:
    async def run() -> dict[str, str]:
        sem = asyncio.Semaphore(2)
        async with httpx.AsyncClient(transport=httpx.MockTransport(_handler)) as c:
            pairs = [("clean", "1.2.0"), ("bad", "2.0.0"), ("old", "2.9.0"), ("gone", "1.0"), ("down", "1.0")]
            found = [await _check(c, sem, n, v, "https://pypi.test") for n, v in pairs]
        return {f.name: f.status for f in found}

    assert asyncio.run(run()) == {"clean": "ok", "bad": "vulnerable", "old": "unchecked", "gone": "unchecked",
                                  "down": "lookup-failed"}
