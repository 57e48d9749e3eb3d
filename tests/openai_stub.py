"""A local OpenAI-compatible embeddings server for tests (the one external service we stand in for).

Vectors are a deterministic function of the text (hashed bag of words), so similar texts get similar
vectors; ``mode`` switches it to failing (HTTP 500) or garbage answers for fault tests.
"""

from __future__ import annotations

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
    mode: str = "ok"  # ok | fail | garbage_shape | garbage_nan
    fail_remaining: int = 0
    calls: int = 0
    inputs: list[str] = field(default_factory=list)


def build_app(state: StubState) -> FastAPI:
    app = FastAPI()

    @app.post("/v1/embeddings")
    async def embeddings(req: Request) -> Any:
        body = await req.json()
        state.calls += 1
        texts = body["input"] if isinstance(body["input"], list) else [body["input"]]
        state.inputs.extend(texts)
        if state.mode == "fail" or state.fail_remaining > 0:
            state.fail_remaining = max(0, state.fail_remaining - 1)
            return JSONResponse({"error": {"message": "upstream overloaded"}}, status_code=500)
        dim = state.dim - 1 if state.mode == "garbage_shape" else state.dim
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
