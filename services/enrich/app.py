"""Build and run the enrich service."""

from __future__ import annotations

from services._runtime import WorkerSpec, run_worker
from services.enrich.handlers import register

SPEC = WorkerSpec(name="enrich", register=register)


def main() -> None:
    run_worker(SPEC)
