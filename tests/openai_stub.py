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
    reject_marker: str | None = None  # a text containing it gets a NaN vector: one bad input spoils its call
    chat: ChatStub = field(default_factory=lambda: ChatStub())


@dataclass
class ChatStub:
    """The chat endpoint's behaviour. Each request takes the next mode from ``script`` (then ``mode``):

    ok            a good answer, wrapped in a <think> block and a code fence as reasoning models do
    malformed     prose with no JSON in it
    batch_broken  unreadable JSON for a batch of several items, a good answer for a single item
    hallucinated  a batch answer whose ids are invented (a single item gets a good answer)
    partial       good types, but an importance out of range and a triple missing its object
    slow          a good answer after ``slow_s`` seconds (past the client's timeout)
    fail500 / fail429 / fail400 / fail401   that HTTP status

    The type of an item is the first memory-type name its content mentions, else ``default_type``.
    """

    mode: str = "ok"
    script: list[str] = field(default_factory=list)
    slow_s: float = 3.0
    latency_s: float = 0.0  # every chat answer waits this long first (a model's fixed response time)
    default_type: str = "fact"
    calls: int = 0  # classification calls only (the ones ``script`` and ``mode`` apply to)
    requests: int = 0  # every chat request, counted as it arrives (``calls`` and the others count answers)
    modes_seen: list[str] = field(default_factory=list)
    items_per_call: list[int] = field(default_factory=list)
    ids_per_call: list[list[str]] = field(default_factory=list)
    # Write decisions: UPDATE / DELETE / NONE name the first candidate; HALLUCINATE names an invented
    # id; LOWCONF answers under the confidence gate. Contradiction checks answer ``contradicts``.
    decision: str = "ADD"
    decision_calls: int = 0
    decision_latency_s: float = 0.0  # a write decision's answer waits this long first
    decision_requests: int = 0
    contradicts: bool = False
    contradiction_calls: int = 0
    # Dreaming syntheses: ok (two memories citing the first episodes, in a <think> block and a fence),
    # partial (one good memory, one without content, one citing an invented episode), malformed,
    # slow (after ``slow_s``), fail500.
    dreaming: str = "ok"
    dreaming_calls: int = 0
    # Knowledge-graph extraction (a list of numbered turns): ``extract_mode`` is ok | partial |
    # malformed | failNNN, answered after ``extract_delay_s`` (a fixed latency, for the benchmark).
    extract_mode: str = "ok"
    extract_delay_s: float = 0.0
    extract_calls: int = 0
    # Episode summaries (a {"session": [...]} of turns): ``summary_mode`` is ok | malformed | failNNN.
    summary_mode: str = "ok"
    summary_calls: int = 0


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
            if state.mode == "garbage_nan" or (state.reject_marker and state.reject_marker in t):
                vec[0] = float("nan")
            data.append({"object": "embedding", "index": i, "embedding": vec})
        # json.dumps writes NaN as a bare literal, as a misbehaving server would; JSONResponse refuses to.
        payload = {"object": "list", "data": data, "model": body.get("model", "stub"),
                   "usage": {"prompt_tokens": 0, "total_tokens": 0}}
        return Response(json.dumps(payload), media_type="application/json")

    @app.post("/v1/chat/completions")
    async def chat(req: Request) -> Any:
        body = await req.json()
        st = state.chat
        st.requests += 1
        if st.latency_s > 0:
            await asyncio.sleep(st.latency_s)
        items = json.loads(body["messages"][-1]["content"])
        if isinstance(items, dict) and "episodes" in items:
            return await _dreaming_answer(body, st, items)
        if isinstance(items, dict) and "session" in items:
            return _summary_answer(body, st, items["session"])
        if isinstance(items, dict):
            if "older" not in items:
                st.decision_requests += 1  # asked (the answer, after decision_latency_s, counts as a call)
                if st.decision_latency_s > 0:
                    await asyncio.sleep(st.decision_latency_s)
            return _chat_reply(body, json.dumps(_side_answer(st, items)))
        if items and isinstance(items[0], dict) and "turn" in items[0]:
            return await _extract_answer(st, body, items)
        st.calls += 1
        mode = st.script.pop(0) if st.script else st.mode
        st.modes_seen.append(mode)
        st.items_per_call.append(len(items))
        st.ids_per_call.append([it["id"] for it in items])
        if mode.startswith("fail"):
            code = int(mode[4:])
            return JSONResponse({"error": {"message": f"stub says {code}"}}, status_code=code)
        if mode == "slow":
            await asyncio.sleep(st.slow_s)
        if mode == "malformed":
            text = "Sure! These look like decisions and facts to me."
        elif mode == "batch_broken" and len(items) > 1:
            text = '{"items": [{"id": "' + items[0]["id"] + '", "memory_type": '
        else:
            answers = [_chat_item(it, st.default_type, partial=mode == "partial") for it in items]
            if mode == "hallucinated" and len(items) > 1:
                for a in answers:
                    a["id"] = "d-" + a["id"][::-1]
            text = "<think>Let me classify {these} carefully.</think>\n```json\n" + json.dumps(
                {"items": answers}) + "\n```"
        return _chat_reply(body, text)

    return app


async def _extract_answer(st: ChatStub, body: dict[str, Any], turns: list[dict[str, Any]]) -> Any:
    """A session's graph: each turn's capitalised words (past a sentence start) as entities, and a
    fact linking its speaker to the first of them; ``partial`` adds invalid items around the good ones."""
    st.extract_calls += 1
    if st.extract_delay_s > 0:
        await asyncio.sleep(st.extract_delay_s)
    if st.extract_mode.startswith("fail"):
        code = int(st.extract_mode[4:])
        return JSONResponse({"error": {"message": f"stub says {code}"}}, status_code=code)
    if st.extract_mode == "malformed":
        return _chat_reply(body, "I found several people and places in this conversation.")
    entities: list[dict[str, Any]] = []
    triples: list[dict[str, Any]] = []
    for t in turns:
        names = list(dict.fromkeys(re.findall(r"(?<=[a-z,] )[A-Z][a-z]+\b", t["text"])))[:3]  # not sentence starts
        entities += [{"name": n, "type": "concept", "turn": t["turn"]} for n in names]
        if names and t["speaker"] != "unknown":
            triples.append({"source": t["speaker"], "relation": "talked about", "target": names[0], "turn": t["turn"]})
    if st.extract_mode == "partial":
        entities += [{"name": "", "type": "concept", "turn": 1}, {"name": "Nowhere", "turn": 99}]
        entities += [{"name": f"Extra{i}", "type": "concept", "turn": 1} for i in range(60)]
        triples += [{"source": "orphan", "relation": "lacks", "turn": 1}, {"source": "A", "relation": " ",
                                                                          "target": "B", "turn": 1}]
    graph = json.dumps({"entities": entities, "triples": triples})
    text = "<think>Who is in {this}?</think>\n```json\n" + graph + "\n```"
    return _chat_reply(body, text)


def summary_of(turns: list[dict[str, Any]]) -> str:
    """What the stub answers for a session: who spoke and how many turns (so a test can recognise it)."""
    speakers = ", ".join(dict.fromkeys(t["speaker"] for t in turns))
    return f"A conversation of {len(turns)} turns between {speakers}."


def _summary_answer(body: dict[str, Any], st: ChatStub, turns: list[dict[str, Any]]) -> Any:
    st.summary_calls += 1
    if st.summary_mode.startswith("fail"):
        code = int(st.summary_mode[4:])
        return JSONResponse({"error": {"message": f"stub says {code}"}}, status_code=code)
    if st.summary_mode == "malformed":
        return _chat_reply(body, "Here is a lovely summary of the conversation.")
    return _chat_reply(body, "<think>Who talked?</think>\n```json\n" + json.dumps({"summary": summary_of(turns)})
                       + "\n```")


def _chat_reply(body: dict[str, Any], text: str) -> dict[str, Any]:
    prompt = sum(len(m["content"]) for m in body["messages"])
    return {"id": "stub", "object": "chat.completion", "model": body.get("model", "stub"),
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}],
            "usage": {"prompt_tokens": prompt // 4, "completion_tokens": len(text) // 4,
                      "total_tokens": prompt // 4 + len(text) // 4}}


def _side_answer(st: ChatStub, payload: dict[str, Any]) -> dict[str, Any]:
    if "older" in payload:
        st.contradiction_calls += 1
        return {"contradicts": st.contradicts, "reason": "stub verdict"}
    st.decision_calls += 1
    first = payload["candidates"][0] if payload.get("candidates") else {"id": None, "content": ""}
    d = st.decision
    if d == "HALLUCINATE":
        return {"action": "DELETE", "target_id": "d-invented", "reason": "stub", "confidence": 0.9}
    if d == "LOWCONF":
        return {"action": "DELETE", "target_id": first["id"], "reason": "stub", "confidence": 0.3}
    out = {"action": d, "target_id": None if d == "ADD" else first["id"], "reason": f"stub says {d}",
           "confidence": 0.9}
    if d == "UPDATE":
        out["content"] = f"{first['content']} (now: {payload['fact']})"
    return out


async def _dreaming_answer(body: dict[str, Any], st: ChatStub, payload: dict[str, Any]) -> Any:
    st.dreaming_calls += 1
    mode = st.dreaming
    if mode.startswith("fail"):
        return JSONResponse({"error": {"message": "stub says no"}}, status_code=int(mode[4:]))
    if mode == "slow":
        await asyncio.sleep(st.slow_s)
    if mode == "malformed":
        return _chat_reply(body, "I would say these sessions were mostly about travel plans.")
    ids = [e["id"] for e in payload["episodes"]]
    memories: list[dict[str, Any]] = [
        {"content": f"The user keeps planning trips ({len(ids)} sessions).", "kind": "pattern", "episode_ids": ids},
        {"content": "The user prefers window seats on long flights.", "kind": "preference", "episode_ids": ids[:2]},
    ]
    if mode == "partial":
        memories[1:] = [{"kind": "fact", "episode_ids": ids[:1]},
                        {"content": "The user owns a red bicycle.", "kind": "bogus", "episode_ids": ["ep-invented"]}]
    text = "<think>Which facts last?</think>\n```json\n" + json.dumps({"memories": memories}) + "\n```"
    return _chat_reply(body, text)


_TYPES = ("decision", "preference", "milestone", "problem", "emotional", "fact", "task")


def _chat_item(item: dict[str, str], default_type: str, *, partial: bool) -> dict[str, Any]:
    content = item["content"]
    words = re.findall(r"\w+", content.lower())
    mtype = next((w for w in words if w in _TYPES), default_type)
    names = list(dict.fromkeys(re.findall(r"\b[A-Z][a-z]+\b", content)))[:3]
    triples = [{"subject": names[0], "predicate": "mentioned_with", "object": names[1]}] if len(names) > 1 else []
    if partial:
        triples.append({"subject": "orphan", "predicate": "lacks"})
    return {"id": item["id"], "memory_type": mtype, "importance": 7 if partial else 4,
            "summary": content[:60], "entities": [{"name": n, "type": "concept"} for n in names],
            "triples": triples}


@contextmanager
def serve_stub(state: StubState) -> Iterator[str]:
    """Run the stub on a free loopback port; yields its base URL (``.../v1``)."""
    sock = socket.socket()  # bound here and handed to uvicorn: no other process can take the port between
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(build_app(state), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError("the OpenAI-compatible stub did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.should_exit = True
        thread.join(5)
