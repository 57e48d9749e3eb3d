"""`palace publish` on a file it cannot send: a clear line and exit status, never a traceback, and nothing
published from a list with one bad event in it (every event is checked before the first is sent)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from services.cli import app

# No server answers here: a test that got as far as connecting would fail on it.
ENV = {"PALACE_NATS_URL": "nats://127.0.0.1:1", "PALACE_DATABASE_URL": "postgresql://x@127.0.0.1:1/x"}
GOOD = {"workspace_id": "w", "session_id": "s", "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize(("content", "says", "code"), [
    (None, "does not exist", 2),
    ("{not json", "is not JSON", 2),
    (json.dumps([GOOD, {"workspace_id": "w"}]), "event 2 of 2", 1),
    (json.dumps({**GOOD, "messages": [{"role": "user", "content": "x" * 2_000_000}]}), "split the session", 1),
])
def test_a_file_that_cannot_be_sent_is_refused_before_anything_is(tmp_path: Path, content: str | None, says: str,
                                                                   code: int) -> None:
    f = tmp_path / "events.json"
    if content is not None:
        f.write_text(content)
    r = CliRunner().invoke(app, ["publish", str(f)], env=ENV)
    flat = " ".join(re.sub(r"[│╭╮╰╯─]", " ", r.output).split())  # the message as read, out of its box
    assert r.exit_code == code and says in flat, r.output
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
