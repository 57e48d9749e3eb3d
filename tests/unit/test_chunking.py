"""Chunking keeps drawers verbatim, bounded, overlapping, and cut at sentence ends."""

import itertools
import random

import pytest

from shared.memory.chunking import chunk_text, split_sentences


def _text(n_sentences: int, seed: int = 1) -> str:
    rnd = random.Random(seed)
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa".split()
    return " ".join(
        " ".join(rnd.choice(words) for _ in range(rnd.randint(3, 30))).capitalize() + rnd.choice(".!?")
        for _ in range(n_sentences)
    )


def test_short_content_is_one_chunk() -> None:
    assert [c.text for c in chunk_text("A short note.")] == ["A short note."]


def test_blank_content_gives_no_chunk() -> None:
    assert chunk_text("   ") == []


@pytest.mark.parametrize("seed", range(20))
def test_long_content_chunks_are_verbatim_bounded_and_overlap(seed: int) -> None:
    text = _text(80, seed)
    chunks = chunk_text(text, 800, 100)
    assert len(chunks) > 1
    assert chunks[0].start == 0 and chunks[-1].end == len(text)
    for c in chunks:
        assert text[c.start : c.end] == c.text
        assert len(c.text) <= 800
    for a, b in itertools.pairwise(chunks):
        assert b.start < a.end, "consecutive chunks must overlap"
        assert a.end - b.start <= 100, "overlap is bounded"
        assert b.start > a.start, "progress"


def test_chunks_end_at_sentence_boundaries() -> None:
    text = _text(60, 7)
    for c in chunk_text(text)[:-1]:
        assert c.text.rstrip()[-1] in ".!?"


def test_text_without_sentence_ends_is_hard_split() -> None:
    text = "x" * 2000
    chunks = chunk_text(text, 800, 100)
    assert "".join(c.text for c in chunks).replace("x", "") == ""
    assert all(len(c.text) <= 800 for c in chunks)
    assert chunks[-1].end == 2000


def test_sentence_spans_cover_text() -> None:
    text = "One. Two! Three? Four"
    spans = split_sentences(text)
    assert "".join(text[s:e] for s, e in spans) == text
    assert len(spans) == 4


def test_invalid_parameters_rejected() -> None:
    with pytest.raises(ValueError):
        chunk_text("abc", 100, 60)
