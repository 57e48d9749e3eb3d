"""Build and run the cluster service."""

from __future__ import annotations

from services._runtime import WorkerSpec, run_worker
from services.cluster.handlers import backfill_bands, backfill_entity_keys, register

SPEC = WorkerSpec(name="cluster", register=register, background=[backfill_bands, backfill_entity_keys])


def main() -> None:
    run_worker(SPEC)
