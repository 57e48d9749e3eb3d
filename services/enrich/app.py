"""Build and run the enrich service."""

from __future__ import annotations

from services._runtime import WorkerSpec, run_worker
from services.enrich.handlers import episode_sweeper, kg_sweeper, register

SPEC = WorkerSpec(name="enrich", register=register, background=[episode_sweeper, kg_sweeper])


def main() -> None:
    run_worker(SPEC)
