"""The hybrid-SQL path of another commit, for ``bench/search.py --compare REF``.

Why a process of its own: a change to the search path is judged by its ratio to the path before it,
and on a shared machine only figures taken side by side, query by query, compare. The bench exports
REF's tree (``git archive``) and starts this script with that tree first on ``PYTHONPATH``, so
``shared`` is REF's code, unchanged; the bench sends one query at a time and this process answers with
the milliseconds its ``Recaller.search`` took, timed here as the bench times its own paths (the pipe
is outside the timing). Query vectors come precomputed, as for the bench's ``sql`` path.

Protocol, one JSON object a line: in ``{"ws": ..., "q": ..., "k": ...}``, out ``{"ms": ..., "cpu_ms": ..., "n": ...}``
(``cpu_ms``: the CPU time of this process's event-loop thread and its pooled backends, for the search);
the first line out is ``{"shared": <path of the shared package imported>}``.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np


class _Vectors:
    """Answers ``embed_query`` from the vectors the bench computed (the ``Precomputed`` of search.py)."""

    def __init__(self, model_name: str, vectors: dict[str, np.ndarray]) -> None:
        self.model_name, self._v = model_name, vectors
        self.dim = len(next(iter(vectors.values())))

    async def embed_query(self, text: str) -> np.ndarray:
        return self._v[text]

    async def embed_documents(self, texts: Sequence[str]) -> np.ndarray:
        raise NotImplementedError("queries only")

    async def aclose(self) -> None:
        return None


async def _main(database_url: str, vectors_path: str) -> None:
    import shared
    from shared.db.pool import open_pool
    from shared.recall import Recaller

    with np.load(vectors_path) as f:
        queries = json.loads(str(f["queries"]))
        vectors = {q: f["vectors"][i] for i, q in enumerate(queries)}
        model = str(f["model"])
    loop = asyncio.get_running_loop()
    pool = await open_pool(database_url, name="bench-search-ref", min_size=2, max_size=2)
    try:
        recaller = Recaller(pool, _Vectors(model, vectors), touch=False, cache_size=0)
        _say({"shared": str(shared.__path__[0])})
        backends = []
        async with pool.connection() as c1, pool.connection() as c2:  # both pooled connections at once
            for c in (c1, c2):
                cur = await c.execute("SELECT pg_backend_pid()")
                row = await cur.fetchone()
                backends.append(int(row[0]) if row else 0)
        while line := await loop.run_in_executor(None, sys.stdin.readline):
            req = json.loads(line)
            cpu0 = time.thread_time() + _server_cpu(backends)
            t0 = time.perf_counter()
            hits = await recaller.search(req["ws"], req["q"], req["k"])
            ms = (time.perf_counter() - t0) * 1000
            _say({"ms": ms, "cpu_ms": (time.thread_time() + _server_cpu(backends) - cpu0) * 1000, "n": len(hits)})
    finally:
        await pool.close()


def _server_cpu(pids: list[int]) -> float:
    """CPU seconds the given PostgreSQL backends have run (``/proc/<pid>/schedstat``, nanoseconds)."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/schedstat") as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return total / 1e9


def _say(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    from shared.logging import configure_logging

    configure_logging("WARNING", json=False)
    asyncio.run(_main(sys.argv[1], sys.argv[2]))
