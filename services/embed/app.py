"""Build and run the embed service."""

from __future__ import annotations

from services._runtime import WorkerSpec, run_worker
from services.embed.handlers import register

SPEC = WorkerSpec(name="embed", register=register, needs_embedder=True)


def main() -> None:
    run_worker(SPEC)
