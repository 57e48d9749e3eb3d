"""Noise filter: turns that carry no memory (greetings, acknowledgements, very short replies).

Noise is still stored raw in ``messages``; it just does not become a drawer.
"""

from __future__ import annotations

import re

__all__ = ["is_noise"]

# Whole-message phrases only: "hi" is noise, "hi, I moved to Berlin last week" is not.
_NOISE_PHRASES = {
    "hi", "hello", "hey", "hiya", "yo", "sup", "good morning", "good afternoon", "good evening",
    "good night", "gn", "bye", "goodbye", "see you", "see ya", "cya", "later", "talk later",
    "thanks", "thank you", "thx", "ty", "thanks a lot", "thank you so much", "many thanks", "cheers",
    "ok", "okay", "k", "kk", "sure", "yes", "no", "yep", "nope", "yeah", "nah", "alright", "all right",
    "cool", "nice", "great", "awesome", "perfect", "got it", "sounds good", "makes sense", "noted",
    "lol", "haha", "hahaha", "hmm", "hm", "uh", "um", "wow", "np", "no problem", "you're welcome",
    "welcome", "done", "continue", "go on", "please continue", "ok thanks", "okay thanks",
    "thanks!", "how are you", "what's up", "whats up",
}
_STRIP = re.compile(r"[\s\W_]+", re.UNICODE)
_WORD = re.compile(r"\w+", re.UNICODE)


def _canonical(text: str) -> str:
    return " ".join(_WORD.findall(text.lower()))


def is_noise(text: str, min_chars: int = 12) -> bool:
    """True when the text should not become a drawer.

    Args:
        text: the message content.
        min_chars: messages with fewer meaningful characters (letters and digits) are noise.
    """
    letters = _STRIP.sub("", text)
    if len(letters) < min_chars:
        # Short but dense facts ("I'm 34.", "PG 16") survive if they hold a digit and a word.
        has_digit = any(c.isdigit() for c in letters)
        has_alpha = any(c.isalpha() for c in letters)
        if not (has_digit and has_alpha and len(letters) >= 4):
            return True
    canon = _canonical(text)
    if canon in _NOISE_PHRASES:
        return True
    # "thanks, bye!" / "ok ok ok": every word is filler.
    words = canon.split()
    return bool(words) and len(words) <= 4 and all(w in _FILLER_WORDS for w in words)


_FILLER_WORDS = {
    "hi", "hello", "hey", "thanks", "thank", "you", "ok", "okay", "bye", "yes", "no", "yeah", "yep",
    "sure", "cool", "nice", "great", "lol", "haha", "so", "much", "a", "lot", "again", "very",
    "good", "night", "morning", "see", "ya", "later", "cheers", "alright", "awesome", "oh", "ah",
}
