"""A producer's first hour on the real stack: the README's snippets run as written, dead letters name
the session and event and can be read back whole, a long message is chunked instead of rejecting its
session, and the CLI's tables show the content when piped."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from shared.dlq import list_dead_letters
from shared.events import SessionCompleted
from shared.ids import session_event_id
from tests.integration.helpers import Stack, session, wait_for, ws

REPO = Path(__file__).resolve().parents[2]
SNIPPET = re.compile(r"^```(\w+) palace-snippet=([\w-]+)\n(.*?)^```$", re.MULTILINE | re.DOTALL)


def readme_snippets() -> dict[str, tuple[str, str]]:
    """name → (language, code) of every fenced block in docs/integrate.md tagged ``palace-snippet=name``."""
    return {name: (lang, code) for lang, name, code in SNIPPET.findall((REPO / "docs" / "integrate.md").read_text())}


def _env(stack: Stack) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    env.update(NATS_URL=stack.nats_url, PALACE_API=stack.api_url, PALACE_DATABASE_URL=stack.database_url,
               PALACE_NATS_URL=stack.nats_url, PALACE_LOG_JSON="false")
    return env


def run_snippet(stack: Stack, name: str, timeout: float = 90) -> str:
    lang, code = readme_snippets()[name]
    cmd = [sys.executable, "-c", code] if lang == "python" else ["bash", "-euo", "pipefail", "-c", code]
    done = subprocess.run(cmd, env=_env(stack), capture_output=True, text=True, timeout=timeout, cwd=REPO,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, f"README snippet {name!r} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def palace(stack: Stack, *args: str) -> str:
    """Run the CLI with stdout piped (so Rich sees no terminal), as `palace ... | less` would."""
    done = subprocess.run([sys.executable, "-m", "services.cli", *args], env=_env(stack), capture_output=True,
                          text=True, timeout=120, cwd=REPO, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, f"palace {args} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def _dead(stack: Stack, workspace: str) -> list:
    return asyncio.run(list_dead_letters(stack.settings, stack.nats_url, workspace=workspace, limit=100_000))


def _dead_at_least(stack: Stack, workspace: str, n: int) -> list:
    def enough() -> list | None:
        dead = _dead(stack, workspace)
        return dead if len(dead) >= n else None

    return wait_for(enough, timeout=60, what=f"{n} dead letters in {workspace}")


def test_readme_snippets_publish_recall_and_hear_of_dead_letters(stack: Stack) -> None:
    assert set(readme_snippets()) >= {"publish", "recall-curl", "recall-httpx", "dead-letters"}
    out = run_snippet(stack, "publish")
    assert re.search(r"stream PALACE, sequence \d+", out)
    stack.wait_processed("acme", 2)

    hits = json.loads(run_snippet(stack, "recall-curl"))["hits"]
    assert hits and "PostgreSQL" in hits[0]["content"]
    assert [h["score"] for h in hits] == sorted((h["score"] for h in hits), reverse=True)
    assert "PostgreSQL" in run_snippet(stack, "recall-httpx").splitlines()[0]

    line = run_snippet(stack, "dead-letters").strip()
    derived = session_event_id("acme", "chat-43", [("bot", "Hi!")])
    assert line.startswith(f"chat-43 {derived} "), line
    assert "messages.0.role" in line and "'user', 'assistant', 'system' or 'tool'" in line


def test_dead_letters_carry_session_and_event_ids(stack: Stack) -> None:
    w = ws()
    good = session(w, "no-event-id", ["The deploy moved to Thursday.", "Noted, Thursday it is."])
    bad_role = session(w, "bad-role", ["The deploy moved to Thursday."])
    bad_role["messages"][0]["role"] = "robot"
    stack.publish({**good, "surprise": True})  # invalid only because of a field the id does not cover
    stack.publish(bad_role)
    stack.publish({**session(w, "own-id", ["x"]), "event_id": "producer-77", "surprise": True})
    stack.publish({"workspace_id": w, "session_id": 17, "messages": "not a list"})
    dead = {d.info.session_id: d for d in _dead_at_least(stack, w, 4)}
    # Exactly the id ingest gives the event once the producer drops the stray field.
    assert dead["no-event-id"].info.event_id == SessionCompleted.model_validate(good).event_id
    turns = [(m["role"], m["content"]) for m in bad_role["messages"]]
    assert dead["bad-role"].info.event_id == session_event_id(w, "bad-role", turns)
    assert dead["own-id"].info.event_id == "producer-77"
    assert dead["17"].info.event_id is None, "no id can be derived from a payload without messages"
    for d in dead.values():
        assert d.headers["Palace-session_id"] == d.info.session_id
        assert d.info.workspace_id == w


def test_dlq_list_and_show_piped(stack: Stack) -> None:
    w = ws()
    long_field = "z" * 300_000
    stack.publish({**session(w, "huge", ["fine"]), "surprise": long_field})
    for i in range(4):
        stack.publish({**session(w, f"bad-{i}", [f"Message {i}"]), "schema_version": "9"})
    dead = _dead_at_least(stack, w, 5)

    listing = palace(stack, "dlq", "list", "--workspace", w)
    rows = [line for line in listing.splitlines() if w in line]
    assert len(rows) == 5, listing
    assert all(len(line) <= 80 for line in listing.splitlines()), "piped output fits 80 columns"
    assert sum("schema_version" in r for r in rows) == 4, "each row starts with its reason"

    huge = next(d for d in dead if d.info.session_id == "huge")
    shown = palace(stack, "dlq", "show", str(huge.seq))
    flat = " ".join(shown.split())
    assert "reason: invalid session.completed event: surprise: Extra inputs are not permitted" in flat
    assert "Palace-session_id huge" in flat and f"Palace-event_id {huge.info.event_id}" in flat
    assert f'\n  "workspace_id": "{w}",' in shown, "the payload is pretty JSON"
    assert "(+299,500 characters)" in flat and len(shown) < 30_000, "a huge payload is cut sensibly"
    full = palace(stack, "dlq", "show", str(huge.seq), "--full")
    assert full.count("z") >= 300_000
    missing = subprocess.run([sys.executable, "-m", "services.cli", "dlq", "show", "999999999"], env=_env(stack),
                             capture_output=True, text=True, timeout=60, cwd=REPO)
    assert missing.returncode == 1 and "no dead letter with sequence 999999999" in missing.stdout
    as_json = json.loads(palace(stack, "dlq", "show", str(huge.seq), "--json"))
    assert json.loads(as_json["payload"])["surprise"] == long_field
    assert as_json["headers"]["Palace-event_id"] == huge.info.event_id


@pytest.mark.parametrize("chars", [150_000])
def test_a_long_message_is_chunked_not_rejected(stack: Stack, chars: int) -> None:
    w = ws()
    filler = "The quarterly report lists routine figures for every regional office in detail. "
    needle = "The vault access code for the Lisbon office is 7421, changed on Monday. "
    body = filler * (chars // len(filler) // 2) + needle + filler * (chars // len(filler) // 2)
    assert len(body) > 100_000
    ev = session(w, "long", ["Here is the full report you asked for.", body, "Thanks, I will read it tonight."])
    stack.publish(ev)
    wait_for(lambda: stack.sql("SELECT count(*) FROM sessions WHERE workspace_id = %s", (w,))[0][0] == 1,
             timeout=60, what="the session stored")
    assert stack.sql("SELECT length(content) FROM messages WHERE workspace_id = %s AND seq = 1", (w,))[0][0] \
        == len(body), "stored raw, verbatim"
    n = stack.sql("SELECT count(*) FROM drawer_sources WHERE workspace_id = %s AND seq = 1", (w,))[0][0]
    assert n >= len(body) // stack.settings.chunk_chars, "chunked like any other content"
    assert not _dead(stack, w)
    drawers = stack.sql("SELECT count(*) FROM drawers WHERE workspace_id = %s", (w,))[0][0]
    stack.wait_processed(w, drawers, timeout=180)
    hits = stack.search(w, "What is the vault access code for the Lisbon office?", k=3)
    assert any("7421" in h["content"] for h in hits)



def test_search_table_shows_every_hit_when_piped(stack: Stack) -> None:
    w = ws()
    texts = ["We decided to keep the search index in PostgreSQL with pgvector, because running a separate vector "
             "database doubles the backups, the upgrades and the on-call rota for a team of three engineers.",
             "Maria prefers the staging database to be refreshed from production every Sunday night at 02:00.",
             "Use Postgres."]
    stack.publish(session(w, "s", texts))
    stack.wait_processed(w, 3)
    out = palace(stack, "search", "which database", "--workspace", w, "--api", stack.api_url, "-k", "3")
    assert all(len(line) <= 80 for line in out.splitlines())
    assert len(re.findall(r"^│\s*\d+\s*│", out, re.MULTILINE)) == 3, out
    shown = " ".join(" ".join(line.split("│")[-2] for line in out.splitlines() if line.startswith("│")).split())
    for text in texts:
        assert text in shown, "every hit's content is visible when piped"


def test_search_with_episodes_prints_them_under_the_hits(stack: Stack) -> None:
    """`palace search --episodes`, over the API and in-process: the nearest session's episode first."""
    w = ws()
    stack.publish(session(w, "orion-db", ["We decided to keep Orion's search index in PostgreSQL with pgvector.",
                                          "Good: one database to back up instead of two."]))
    stack.publish(session(w, "lunch", ["Maria booked the Thai place on Friday for the team lunch."]))
    wait_for(lambda: stack.sql("SELECT count(*) FROM episodes WHERE workspace_id = %s AND status = 'ready'"
                               " AND embedding IS NOT NULL", (w,))[0][0] == 2, 60, "two episodes")
    for where in (["--api", stack.api_url], []):
        out = palace(stack, "search", "which database for Orion", "--workspace", w, *where, "-k", "2", "--episodes")
        episodes = out[out.index("episodes for"):]
        shown = " ".join(" ".join(line.split("│")[-2] for line in episodes.splitlines()
                                  if line.startswith("│")).split())
        assert shown.index("orion-db") < shown.index("lunch") and "2 drawers" in shown, out
        as_json = json.loads(palace(stack, "search", "which database for Orion", "--workspace", w, *where,
                                    "--episodes", "--episodes-k", "1", "--json"))
        assert [e["session_id"] for e in as_json["episodes"]] == ["orion-db"] and as_json["hits"]
        assert isinstance(as_json["hits"][0]["explanation"], dict), "an object either way, not a repr"
