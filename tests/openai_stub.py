"""A local OpenAI-compatible embeddings server for tests (the one external service we stand in for).

Vectors are a deterministic function of the text (hashed bag of words), so similar texts get similar
vectors; ``mode`` switches it to failing (HTTP 500) or garbage answers for fault tests, and
``delay_s`` makes every request slow (a saturated endpoint: the pipeline falls behind its
publishers, which the backpressure tests and ``bench/soak.py`` need). It also records when each
call came and how many were in flight at once, so tests can check retries back off and
concurrency stays bounded.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response


def hashed_embedding(text: str, dim: int) -> list[float]:
    v = np.zeros(dim, dtype=np.float32)
    for w in re.findall(r"\w+", text.lower()):
        h = int.from_bytes(hashlib.blake2b(w.encode(), digest_size=8).digest(), "big")
        v[h % dim] += 1.0 if (h >> 32) & 1 else -1.0
    if not v.any():
        v[0] = 1.0
    return (v / np.linalg.norm(v)).tolist()


@dataclass
class StubState:
    dim: int = 384
    mode: str = "ok"  # ok | fail | garbage_shape | garbage_nan | garbage_count
    fail_remaining: int = 0
    delay_s: float = 0.0  # per request, before answering (any mode)
    calls: int = 0
    inputs: list[str] = field(default_factory=list)
    call_times: list[float] = field(default_factory=list)  # time.monotonic() of each request
    in_flight: int = 0
    max_in_flight: int = 0
    keep_inputs: bool = True  # off for long runs (bench/soak.py): the list would grow without bound


def build_app(state: StubState) -> FastAPI:
    app = FastAPI()

    @app.post("/v1/embeddings")
    async def embeddings(req: Request) -> Any:
        body = await req.json()
        state.calls += 1
        state.call_times.append(time.monotonic())
        texts = body["input"] if isinstance(body["input"], list) else [body["input"]]
        if state.keep_inputs:
            state.inputs.extend(texts)
        state.in_flight += 1
        state.max_in_flight = max(state.max_in_flight, state.in_flight)
        try:
            if state.delay_s > 0:
                await asyncio.sleep(state.delay_s)
        finally:
            state.in_flight -= 1
        if state.mode == "fail" or state.fail_remaining > 0:
            state.fail_remaining = max(0, state.fail_remaining - 1)
            return JSONResponse({"error": {"message": "upstream overloaded"}}, status_code=500)
        dim = state.dim - 1 if state.mode == "garbage_shape" else state.dim
        if state.mode == "garbage_count" and len(texts) > 1:
            texts = texts[:-1]  # one embedding short: the answer no longer lines up with the inputs
        elif state.mode == "garbage_count":
            texts = [*texts, texts[0]]
        data = []
        for i, t in enumerate(texts):
            vec = hashed_embedding(t, dim)
            if state.mode == "garbage_nan":
                vec[0] = float("nan")
            data.append({"object": "embedding", "index": i, "embedding": vec})
        # json.dumps writes NaN as a bare literal, as a misbehaving server would; JSONResponse refuses to.
        payload = {"object": "list", "data": data, "model": body.get("model", "stub"),
                   "usage": {"prompt_tokens": 0, "total_tokens": 0}}
        return Response(json.dumps(payload), media_type="application/json")

    return app


@contextmanager
def serve_stub(state: StubState) -> Iterator[str]:
    """Run the stub on a free loopback port; yields its base URL (``.../v1``)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(build_app(state), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.should_exit = True
        thread.join(5)
