"""Where the servers are: explicit PALACE_* URLs, or the running embedded stack's state file."""

from __future__ import annotations

import json
import os

from shared.config import Settings

__all__ = ["StackNotRunning", "resolve_urls"]


class StackNotRunning(RuntimeError):
    """No external servers configured and no embedded stack is up."""


def resolve_urls(settings: Settings, *, database: bool = True, nats: bool = True) -> tuple[str, str]:
    """(database_url, nats_url) for this process: each from its PALACE_* variable, else from the running
    embedded stack. Only those asked for must be found (an operator's database-only command needs no NATS
    URL); one not asked for and not found comes back as ''."""
    db, bus = settings.database_url, settings.nats_url
    if (db or not database) and (bus or not nats):
        return db or "", bus or ""
    state_file = settings.devstack_dir / "stack.json"
    try:
        state = json.loads(state_file.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        state = {}
    # A state file outlives its servers (a kill, a reboot, a stop that left its URLs): only servers whose
    # processes still run count, or every command would retry a dead address for minutes.
    db = db or (state.get("database_url") if _postmaster_alive(settings) else None)
    bus = bus or (state.get("nats_url") if _alive(state.get("nats_pid")) else None)
    missing = [name for name, want, got in (("PALACE_DATABASE_URL", database, db), ("PALACE_NATS_URL", nats, bus))
               if want and not got]
    if missing:
        raise StackNotRunning(
            f"no {' / '.join(missing)} and no embedded stack in {settings.devstack_dir}: "
            "start it with 'palace up' (or 'palace stack start')"
        )
    return db or "", bus or ""


def _alive(pid: object) -> bool:
    """Whether a process with this pid runs (signal 0 checks without signalling)."""
    try:
        os.kill(int(pid), 0)  # type: ignore[call-overload]
    except (TypeError, ValueError, ProcessLookupError):
        return False
    except PermissionError:
        return True  # someone else's process: it runs
    return True


def _postmaster_alive(settings: Settings) -> bool:
    """The embedded PostgreSQL's postmaster (its pid file's first line) runs."""
    try:
        first = (settings.devstack_dir / "pg" / "data" / "postmaster.pid").read_text().splitlines()[0]
    except (FileNotFoundError, IndexError, NotADirectoryError):
        return False
    return _alive(first)
