"""Build and run the classify service."""

from __future__ import annotations

from services._runtime import WorkerSpec, run_worker
from services.classify.handlers import register

SPEC = WorkerSpec(name="classify", register=register)


def main() -> None:
    run_worker(SPEC)
