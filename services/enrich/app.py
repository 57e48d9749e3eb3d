"""Build and run the enrich service."""

from __future__ import annotations

from services._runtime import WorkerSpec, run_worker
from services.enrich.handlers import DURABLE, DURABLE_KG, register

SPEC = WorkerSpec(name="enrich", consumers=[(DURABLE, "session.stored"), (DURABLE_KG, "episodic.created")],
                  register=register)


def main() -> None:
    run_worker(SPEC)
