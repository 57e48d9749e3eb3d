"""The noise filter drops greetings and fillers, never content."""

import pytest

from shared.memory.noise import is_noise


@pytest.mark.parametrize("text", ["hi", "Hello!", "thanks", "Thank you so much!", "ok", "OK thanks, bye",
                                  "lol", "👍", "...", "   ", "good morning", "sounds good"])
def test_noise(text: str) -> None:
    assert is_noise(text)


@pytest.mark.parametrize("text", [
    "I moved to Berlin last week.",
    "Hey Mel! Good to see you! How have you been?",
    "We chose PostgreSQL.",
    "I'm 34.",
    "PG 16 it is",
    "Thanks for the tip about the Lisbon apartment, I signed the lease.",
])
def test_content(text: str) -> None:
    assert not is_noise(text)


def test_min_chars_is_configurable() -> None:
    assert is_noise("Paris trip", min_chars=20)
    assert not is_noise("Paris trip", min_chars=5)
