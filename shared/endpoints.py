"""Where the servers are: explicit PALACE_* URLs, or the running embedded stack's state file."""

from __future__ import annotations

import json

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
    db = db or state.get("database_url")
    bus = bus or state.get("nats_url")
    missing = [name for name, want, got in (("PALACE_DATABASE_URL", database, db), ("PALACE_NATS_URL", nats, bus))
               if want and not got]
    if missing:
        raise StackNotRunning(
            f"no {' / '.join(missing)} and no embedded stack in {settings.devstack_dir}: "
            "start it with 'palace up' (or 'palace stack start')"
        )
    return db or "", bus or ""
