"""Build and run the ingest service."""

from __future__ import annotations

from services._runtime import WorkerSpec, run_worker
from services.ingest.handlers import register

SPEC = WorkerSpec(name="ingest", register=register)


def main() -> None:
    run_worker(SPEC)
