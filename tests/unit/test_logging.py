"""Log lines: JSON only when JSON logs are on (library records included), tracebacks on failures."""

from __future__ import annotations

import json
import logging

import pytest

from shared.logging import configure_logging, get_logger


def test_json_logs_are_json_lines_for_our_records_and_every_library(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("INFO", json=True)
    get_logger("palace.test").info("ours", workspace_id="w1")
    logging.getLogger("uvicorn.error").warning("theirs %s", "too")
    logging.getLogger("nats.aio.client").error("a library error")
    try:
        raise ValueError("boom")
    except ValueError as e:
        get_logger("palace.test").warning("handler_failed", exc_info=e)
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    records = [json.loads(ln) for ln in lines]  # every line parses: no coloured text in between
    assert [r["event"] for r in records] == ["ours", "theirs too", "a library error", "handler_failed"]
    assert records[0]["workspace_id"] == "w1" and records[0]["logger"] == "palace.test"
    assert "ValueError: boom" in records[3]["exception"] and "Traceback" in records[3]["exception"]
    assert not any("\x1b[" in ln for ln in lines)


def test_console_logs_for_people_have_no_colour_codes_when_piped(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("INFO", json=False)
    get_logger("palace.test").info("readable", n=1)
    err = capsys.readouterr().err
    assert "readable" in err and "n=1" in err and "\x1b[" not in err
    configure_logging("INFO", json=True)
