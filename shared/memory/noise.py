"""Noise filter: turns that carry no memory (greetings, acknowledgements, pleasantries, fillers).

Noise is still stored raw in ``messages``; it just does not become a drawer.

The rule is lexical, not a length cut: a message is noise when its words, once normalised, can be
read entirely as a sequence of units from an acknowledgement / pleasantry / filler lexicon
("Got it, thank you so much!" = *got it* + *thank you so much*). One word outside the lexicon keeps
the message ("No, use Redis." holds *use* and *redis*), so short instructions and facts survive
however few characters they have, and a long string of thanks is dropped however many it has.
Proper names are never in the lexicon, so "Thanks, Maria!" is kept: the filter errs on the side of
remembering.
"""

from __future__ import annotations

import re
import unicodedata
from functools import lru_cache

__all__ = ["is_noise", "lexicon_units", "noise_tokens"]

# Units are phrases: "will do" is an acknowledgement, but "will" and "do" alone are not filler,
# so "I will do the migration" can never be read as noise. Written naturally; normalised below.
_ACKNOWLEDGEMENTS = """
ok | okay | okey | okie | k | kk | alright | all right | sure | sure thing | of course | yes | yeah | yep | yup
| ya | yea | no | nope | nah | right | got it | gotcha | understood | noted | roger | roger that | will do
| can do | on it | i'm on it | done | fine | fair enough | makes sense | that makes sense | sounds good
| sounds great | sounds perfect | sounds like a plan | that sounds good | that sounds great | deal | agreed
| absolutely | definitely | totally | exactly | indeed | true | correct | perfect | great | good | nice | cool
| awesome | excellent | wonderful | amazing | fantastic | lovely | brilliant | neat | sweet | super
| good to know | good idea | great idea | i see | i understand | that's great | that's awesome | that's cool
| that's amazing | that's wonderful | that's good | that's nice | that's fine | that's perfect
| that's right | that's true | that works | works for me | that works for me 
| go ahead | go on | continue | please continue | carry on | keep going
"""
_THANKS = """
thanks | thank you | thank u | thx | ty | tysm | tyvm | thanks a lot | thanks a bunch | many thanks
| much appreciated | appreciate it | i appreciate it | appreciated | cheers | no problem | no worries | np
| you're welcome | welcome | anytime | my pleasure | for the help | for your help | for that | for this
| for everything
"""
_GREETINGS = """
hi | hello | hey | hiya | yo | sup | howdy | greetings | good morning | good afternoon | good evening
| good night | gn | gm | morning | bye | goodbye | bye bye | see you | see ya | see you later | see you soon
| cya | later | talk later | talk to you later | ttyl | take care | have a good day | have a good one
| have a nice day | have a great day | how are you | how are you doing | what's up | whats up
| how's it going | good to see you | nice to meet you | how have you been | you too | same to you
| same here | keep it up
"""
# Interjections and intensifiers that only ever decorate the units above.
_FILLERS = """
oh | ah | aw | wow | oops | yay | woohoo | omg | lol | lmao | rofl | hmm | hm | uh | um | uhh | umm | er
| well | so | very | really | much | so much | a lot | too | again | just | and | then | for now | please
| indeed | haha | hehe
"""
# Spelling variants with repeated letters: "hahaha", "sooo", "okkk", "thanksss", "yesss", "hmmm".
_PATTERNS = re.compile(
    r"(?:ha)+h?|(?:he)+h?|(?:hi)+|lo+l+|x+d+|o+k+a*y*|so+|ye+s+|ya+y+|wo+w+|hm+|u+m+|u+h+|a+h+|o+h+|thanks+"
    r"|ok+ie*|ye+a+h*|no+pe*|co+l+|ni+ce+|gre+a+t+"
)
_APOSTROPHES = str.maketrans({"\u2019": "'", "\u2018": "'", "\u02bc": "'", "`": "'"})
_TOKEN = re.compile(r"[^\W_]+(?:'[^\W_]+)*", re.UNICODE)


def noise_tokens(text: str) -> list[str]:
    """Lower-cased words with apostrophes removed ("That's" → "thats"); punctuation and emoji dropped."""
    text = unicodedata.normalize("NFKC", text).translate(_APOSTROPHES).lower()
    return [t.replace("'", "") for t in _TOKEN.findall(text)]


@lru_cache(maxsize=1)
def lexicon_units() -> frozenset[tuple[str, ...]]:
    """Every lexicon unit as a tuple of normalised tokens."""
    units = set()
    for block in (_ACKNOWLEDGEMENTS, _THANKS, _GREETINGS, _FILLERS):
        for phrase in block.split("|"):
            toks = tuple(noise_tokens(phrase))
            if toks:
                units.add(toks)
    return frozenset(units)


@lru_cache(maxsize=1)
def _longest_unit() -> int:
    return max(len(u) for u in lexicon_units())


def _only_lexicon(tokens: list[str]) -> bool:
    """True when ``tokens`` split entirely into lexicon units (dynamic programming, linear in length)."""
    units = lexicon_units()
    longest = _longest_unit()
    reach = [False] * (len(tokens) + 1)
    reach[0] = True
    for i in range(len(tokens)):
        if not reach[i]:
            continue
        if _PATTERNS.fullmatch(tokens[i]):
            reach[i + 1] = True
        for n in range(1, min(longest, len(tokens) - i) + 1):
            if tuple(tokens[i : i + n]) in units:
                reach[i + n] = True
        if not any(reach[i + 1 :]):
            return False  # nothing past i is reachable: stop early on long content
    return reach[len(tokens)]


def is_noise(text: str, min_chars: int = 4) -> bool:
    """True when the text should not become a drawer.

    Args:
        text: the message content.
        min_chars: messages with fewer letters and digits than this are noise (fragments such as
            "k." or "…"); acknowledgements and pleasantries are noise at any length.
    """
    tokens = noise_tokens(text)
    if sum(len(t) for t in tokens) < max(min_chars, 1):
        return True
    return _only_lexicon(tokens)
