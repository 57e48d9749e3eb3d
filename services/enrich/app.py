"""Build and run the enrich service."""

from __future__ import annotations

from services._runtime import WorkerSpec, run_worker
from services.enrich.handlers import DURABLE, DURABLE_EPISODE, DURABLE_KG, episode_sweeper, register

SPEC = WorkerSpec(name="enrich", consumers=[(DURABLE, "session.stored"), (DURABLE_EPISODE, "drawer.embedded"),
                                            (DURABLE_KG, "episodic.created")],
                  register=register, background=[episode_sweeper])


def main() -> None:
    run_worker(SPEC)
