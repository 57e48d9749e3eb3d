"""The reduced fault suite inside `make test` (the full 10,000-session run is `make fault`)."""

from __future__ import annotations

import re
from pathlib import Path

from tests.fault_suite import SuiteConfig, run_suite


def test_reduced_fault_suite_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    cfg = SuiteConfig(events=300, workspaces=4, rate=25.0, kills=5, devstack_dir=tmp_path / "stack",
                      drain_timeout_s=240)
    r = run_suite(cfg)
    assert re.fullmatch(r"published=\d+ stored=\d+ lost=\d+ duplicates=\d+ dead_lettered=\d+ drain_s=[\d.]+",
                        r.line()), r.line()
    kinds = [what.split(" (")[0] for _, what in r.faults]
    assert sum(k.startswith("SIGKILL") for k in kinds) == 5 and "restart PostgreSQL" in kinds
    assert "restart NATS" in kinds
    assert r.details["drained"] == 1, r.line()
    assert r.details["service_restarts"] >= 5, r.details
    assert r.ok, (r.line(), r.details)
    assert r.published == r.stored == 300
