"""`palace migrate --check`: the gate a Kubernetes initContainer polls until the migration Job has run.
It changes nothing, fails while any shipped migration is missing, and passes once `palace migrate` ran."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import psycopg
import pytest

from shared.db.migrate import load_migrations
from tests.integration.helpers import Stack, fresh_database


@pytest.fixture
def empty_database(stack: Stack) -> Iterator[str]:
    with fresh_database(stack, "palace_check") as url:
        yield url


def _palace(stack: Stack, database_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PALACE_DATABASE_URL": database_url, "PALACE_NATS_URL": stack.nats_url}
    return subprocess.run([sys.executable, "-m", "services.cli", *args], env=env, capture_output=True, text=True,
                          timeout=120)


def _tables(database_url: str) -> set[str]:
    with psycopg.connect(database_url) as conn:
        rows = conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'").fetchall()
    return {r[0] for r in rows}


def test_check_fails_until_migrated_and_changes_nothing(stack: Stack, empty_database: str) -> None:
    every = [f"{m.version:04d}_{m.name}" for m in load_migrations()]

    before = _palace(stack, empty_database, "migrate", "--check")
    assert before.returncode == 1, before.stdout + before.stderr
    assert every[0] in before.stdout and every[-1] in before.stdout
    assert _tables(empty_database) == set(), "--check applied something"

    applied = _palace(stack, empty_database, "migrate")
    assert applied.returncode == 0, applied.stdout + applied.stderr

    after = _palace(stack, empty_database, "migrate", "--check")
    assert after.returncode == 0, after.stdout + after.stderr
    assert "up to date" in after.stdout


def test_check_passes_on_the_running_stack(stack: Stack) -> None:
    run = _palace(stack, stack.database_url, "migrate", "--check")
    assert run.returncode == 0, run.stdout + run.stderr
