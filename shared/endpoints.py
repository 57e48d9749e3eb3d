"""Where the servers are: explicit PALACE_* URLs, or the running embedded stack's state file."""

from __future__ import annotations

import json

from shared.config import Settings

__all__ = ["StackNotRunning", "resolve_urls"]


class StackNotRunning(RuntimeError):
    """No external servers configured and no embedded stack is up."""


def resolve_urls(settings: Settings) -> tuple[str, str]:
    """(database_url, nats_url) for this process."""
    db, nats = settings.database_url, settings.nats_url
    if db and nats:
        return db, nats
    state_file = settings.devstack_dir / "stack.json"
    try:
        state = json.loads(state_file.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        state = {}
    db = db or state.get("database_url")
    nats = nats or state.get("nats_url")
    if not db or not nats:
        raise StackNotRunning(
            f"no PALACE_DATABASE_URL / PALACE_NATS_URL and no embedded stack in {settings.devstack_dir}: "
            "start it with 'palace up' (or 'palace stack start')"
        )
    return db, nats
