"""The noise filter drops greetings, acknowledgements and pleasantries at any length, never content."""

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.memory.noise import is_noise, lexicon_units, noise_tokens

ACKNOWLEDGEMENTS = [
    "Will do. Thanks!", "Sounds good!", "ok thanks", "Got it, thank you so much!", "Perfect, thanks!",
    "hi", "Hello!", "thanks", "Thank you so much!", "ok", "OK thanks, bye", "lol", "👍", "...", "   ",
    "good morning", "sounds good", "Okaaay, thanks a lot!!! 🙏", "Hahaha sooo cool", "Thanks! Take care!",
    "Sure thing! Bye for now!", "That\u2019s awesome, thank you so much for your help, see you soon!",
    "k.", "Great, that works for me. Cheers!",
]
CONTENT = [
    "Use Postgres.", "I'm allergic to nuts.", "Ship it on Friday.", "No, use Redis.", "I will do it tomorrow.",
    "I moved to Berlin last week.", "Hey Mel! Good to see you! How have you been?", "We chose PostgreSQL.",
    "I'm 34.", "PG 16 it is", "Thanks for the tip about the Lisbon apartment, I signed the lease.",
    "Thanks, Maria!", "Sure, Friday works.", "Okay, send it to Bob.", "Redis", "Go with option B.",
]


@pytest.mark.parametrize("text", ACKNOWLEDGEMENTS)
def test_acknowledgements_and_pleasantries_are_noise(text: str) -> None:
    assert is_noise(text)


@pytest.mark.parametrize("text", CONTENT)
def test_short_content_is_kept(text: str) -> None:
    assert not is_noise(text)


def test_length_is_not_the_rule() -> None:
    thanks = "Thank you so much, really, thanks again! " * 200
    assert len(thanks) > 8000 and is_noise(thanks)
    assert not is_noise(thanks + "The invoice is due on the 3rd.")


def test_min_chars_is_a_floor_for_fragments() -> None:
    assert is_noise("Paris trip", min_chars=20)
    assert not is_noise("Paris trip", min_chars=5)
    assert is_noise("Go.") and not is_noise("Go.", min_chars=1)


def test_normalisation() -> None:
    assert noise_tokens("That\u2019s GREAT — thanks!!") == ["thats", "great", "thanks"]
    assert ("will", "do") in lexicon_units() and ("will",) not in lexicon_units(), "units are phrases"


_UNITS = sorted(" ".join(u) for u in lexicon_units())
_SEPARATORS = st.sampled_from([" ", ", ", "! ", ". ", "... ", " 🙂 ", "\n", " - "])
_CONTENT_WORDS = st.sampled_from(["postgres", "friday", "nuts", "berlin", "invoice", "redis", "deploy", "Maria"])


@st.composite
def _acknowledgement(draw: st.DrawFn) -> str:
    units = draw(st.lists(st.sampled_from(_UNITS), min_size=1, max_size=8))
    seps = draw(st.lists(_SEPARATORS, min_size=len(units), max_size=len(units)))
    text = "".join(u + s for u, s in zip(units, seps, strict=True))
    return text.upper() if draw(st.booleans()) else text.capitalize()


@given(_acknowledgement())
def test_any_sequence_of_lexicon_units_is_noise(text: str) -> None:
    assert is_noise(text)


@given(_acknowledgement(), _CONTENT_WORDS, st.integers(min_value=0, max_value=8))
def test_one_content_word_keeps_the_message(ack: str, word: str, where: int) -> None:
    words = ack.split(" ")
    words.insert(min(where, len(words)), word)
    assert not is_noise(" ".join(words))


LOCOMO = Path(__file__).resolve().parents[2].parent / "shared" / "bench" / "locomo-dev.json"


@pytest.mark.skipif(not LOCOMO.exists(), reason="LoCoMo dev data not present")
def test_no_locomo_evidence_turn_is_noise() -> None:
    """Every turn a LoCoMo question cites as evidence must become a drawer."""
    dropped = []
    for conv in json.loads(LOCOMO.read_text()):
        evidence = {e for q in conv["questions"] for e in q["evidence"]}
        dropped += [t["text"] for s in conv["sessions"] for t in s["turns"]
                    if t["dia_id"] in evidence and is_noise(t["text"])]
    assert dropped == []
