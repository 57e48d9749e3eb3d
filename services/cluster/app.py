"""Build and run the cluster service."""

from __future__ import annotations

from services._runtime import WorkerSpec, run_worker
from services.cluster.handlers import DURABLE, DURABLE_ENTITIES, register

SPEC = WorkerSpec(name="cluster", consumers=[(DURABLE, "drawer.classified"), (DURABLE_ENTITIES, "entity.upserted")],
                  register=register)


def main() -> None:
    run_worker(SPEC)
