"""Relationship triples without a model (the no-LLM path): first-person statements read by patterns.

Conversations state facts mostly about the people talking ("I went to Paris yesterday", "my
daughter Sara", "your studio"), so the patterns resolve "I"/"we"/"my"/"our" to the speaker and
"you"/"your" to the addressee, and a clause with no subject at all ("Took a trip to Rome") to the
speaker too, as chat drops it. A statement about a third person is left alone: without a parser,
guessing who "he" is costs more precision than it brings recall.

The object of a verb is the noun phrase that follows it, cut at the first word that cannot be part
of one (a preposition, a time word, a conjunction) and stripped of its determiner; phrases that
name nothing ("a blast", "it", "time") are dropped. Every pattern carries its own confidence, lower
for the loose ones, so a running average over many sightings says how much a fact is believed.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from shared.memory.entities import Name, find_names, known_names
from shared.memory.kg import normalize_name

__all__ = ["Extraction", "Triple", "extract_graph", "known_names"]


@dataclass(frozen=True)
class Triple:
    source: str
    relation: str
    target: str
    confidence: float


@dataclass
class Extraction:
    """What one text yields: entities written in it (name → type, confidence) and triples."""

    entities: dict[str, tuple[str, str, float]] = field(default_factory=dict)  # key → (name, type, conf)
    triples: list[Triple] = field(default_factory=list)

    def add_entity(self, name: str, etype: str, confidence: float) -> None:
        key = normalize_name(name)
        old = self.entities.get(key)
        if old is None or (old[1] == "concept" and etype != "concept"):
            self.entities[key] = (name, etype, max(confidence, old[2] if old else 0.0))

    def add_triple(self, t: Triple) -> None:
        k = (normalize_name(t.source), t.relation, normalize_name(t.target))
        if k[0] != k[2] and all((normalize_name(x.source), x.relation, normalize_name(x.target)) != k
                                for x in self.triples):
            self.triples.append(t)


# --- noun phrases --------------------------------------------------------------------------------

_DETERMINERS = frozenset("""a an the my your our his her their its this these those some another any
every each such one two three few several many lots of bunch couple new own whole first""".split())
# Words that end a noun phrase: prepositions, conjunctions, time words, pronouns, auxiliaries.
_STOP = frozenset("""and but or nor so because since though although while when where which who whom whose that
to for with without at in on from by about into onto over under after before during until than as like
last yesterday today tonight tomorrow recently ago now then there here again soon later lately just really
also too very even still already yet ever never always sometimes back together away up down out off
i i'm i've i'll i'd me we we're we've us you you're you've he she they them him it it's is was were are
am be been being had has have do does did will would could should can may might must gonna wanna
if not this that these those which what how why all both""".split())
# Heads that name nothing worth a node.
_EMPTY_HEADS = frozenset("""blast time times fun lot lots bit way thing things stuff something anything
everything nothing it one ones kind sort part break look chance shot go try day week weeks month
months year years moment moments while place memories memory experience experiences idea ideas
feeling news luck care sense rest break reminder journey life difference compliments compliment support help
advice feedback progress success sure work""".split())
# Heads too general to name anything on their own ("a trip"; "a camping trip" does).
_GENERIC_ALONE = frozenset("""trip vacation holiday event class group place meeting show game stuff project
thing job""".split())
# Evaluative words that open a phrase without naming anything ("amazing fantasy series" is a fantasy series).
_VAGUE = frozenset("""amazing awesome great good nice cool fun wonderful fantastic incredible beautiful lovely
short long quick little big small huge recent wild crazy special favorite favourite perfect real whole
new old latest ideal""".split())
# Verbs that follow a noun and end its phrase ("my car broke down", "my dance crew took home").
_VERBS = frozenset("""took made got went came gave broke ran saw felt kept left brought sent told won lost began
grew knew thought taught found met paid sat stood wrote drove flew fell spent built crashed
motivates inspires helps makes keeps gets goes means needs""".split())
_WORD = re.compile(r"[\w'’&-]+|\"[^\"]+\"|“[^”]+”")

# Kinds of heads, for the relation (visited a place, attended an event, volunteers at a shelter...).
EVENT_HEADS = frozenset("""class classes workshop meeting meetings conference convention fair event events
festival concert contest competition comp show tournament tourney party game match seminar seminars
session sessions retreat camp lecture talk talks course program programme group meetup gala parade
ceremony wedding trip race marathon expo exhibition exhibit rally protest service interview interviews
audition recital play musical screening""".split())
PLACE_HEADS = frozenset("""beach park museum center centre city town country village lake mountain mountains
island gym library church school university college cafe restaurant bar zoo aquarium store shop mall
market farm garden studio forest trail trails river coast shelter hospital office house home""".split())
GROUP_HEADS = frozenset("""club team crew band group community church choir league society organization
organisation union association squad troupe""".split())
OWNABLE_HEADS = frozenset("""car truck bike bicycle motorcycle house apartment flat home laptop computer phone
camera guitar piano violin drum drums studio store shop business biz company startup bakery restaurant
necklace ring bracelet watch hoodie jacket shoes collection garden boat tank setup blog channel
podcast website app""".split())
ACTIVITY_WORDS = frozenset("""yoga pottery painting art dance dancing drawing photography gardening
cooking baking hiking camping swimming running jogging cycling biking surfing skiing snowboarding
kayaking climbing fishing knitting sewing writing reading gaming chess basketball football soccer
tennis golf volleyball baseball hockey boxing kickboxing karate judo meditation pilates music singing
guitar piano violin drums volunteering traveling travelling poetry sculpting woodworking""".split())
_CHILD = r"daughter|son|kids|children|child|baby|twins|boys|girls"
_PET = r"dog|dogs|cat|cats|pup|puppy|puppies|kitten|turtle|turtles|pet|pets|horse|bird|parrot|fish|hamster|rabbit|bunny"
_RELATIVE = (r"mom|mother|mum|dad|father|grandma|grandmother|grandpa|grandfather|sister|sisters|brother|brothers|"
             r"aunt|uncle|cousin|cousins|wife|husband|partner|fiance|fiancee|fiancé|fiancée|niece|nephew|parents|"
             r"family|fam|in-laws")
_FRIEND = r"friend|friends|buddy|pal|best friend|bff"
_COLLEAGUE = r"colleague|coworker|co-worker|boss|manager|teammate|teammates|mentor|classmate"
_JOBS = frozenset("""banker teacher writer author nurse engineer developer programmer designer artist
counselor counsellor therapist doctor lawyer chef cook musician singer dancer photographer student
accountant manager scientist researcher firefighter officer soldier pilot driver baker barista
coach athlete player painter architect journalist editor volunteer entrepreneur consultant
analyst mechanic carpenter pharmacist veterinarian vet""".split())


def _phrase(text: str, start: int, *, max_words: int = 5) -> tuple[str, int] | None:
    """The noun phrase starting at ``start`` (determiners skipped) and where it ends, or None."""
    words: list[str] = []
    end = start
    for m in _WORD.finditer(text, start):
        gap = text[end:m.start()]
        if words and re.search(r"[,.;:!?()\[\]—–…]|\s-\s", gap):
            break
        if not words and re.search(r"[.;:!?()—–…]", gap):
            return None
        w = m.group(0)
        if w[0] in "\"“":
            if words:
                break
            return w.strip("\"“”"), m.end()
        lw = w.lower().replace("’", "'")
        if not words and lw in _DETERMINERS:
            end = m.end()
            continue
        if lw in _STOP or (words and (lw in _DETERMINERS or lw in _VERBS or (lw.endswith("ed") and len(lw) > 4))):
            break
        if not words and lw in _VAGUE:
            end = m.end()
            continue
        if lw.endswith("'s") and words:
            break
        words.append(w)
        end = m.end()
        if lw.endswith("'s") or len(words) >= max_words:
            break
    while words and words[-1].lower().endswith(("'s", "’s")) and len(words) > 1:
        words = words[:-1]
    if not words:
        return None
    phrase = " ".join(words)
    head = words[-1].lower().strip("'’")
    if head in _EMPTY_HEADS or head in _STOP or len(phrase) < 2 or (len(words) == 1 and head in _GENERIC_ALONE):
        return None
    return phrase, end


def _list(text: str, start: int) -> list[str]:
    """A phrase and the ones listed after it ("yoga, kickboxing, and circuit training")."""
    out = []
    pos = start
    while True:
        got = _phrase(text, pos)
        if got is None:
            break
        out.append(got[0])
        m = re.match(r"\s*(?:,\s*(?:and\s+|or\s+)?|\s+and\s+|\s+or\s+)", text[got[1]:])
        if not m or len(out) >= 6:
            break
        pos = got[1] + m.end()
    return out


def _drop_nested(text: str, out: Extraction) -> None:
    """A name only ever written inside a longer entity ("LGBTQ" of "LGBTQ center") is not an
    entity of its own in this text."""
    folded = text.casefold()
    longer = sorted((name.casefold() for name, _, _ in out.entities.values()), key=len, reverse=True)
    for key, (name, _, _) in list(out.entities.items()):
        n = name.casefold()
        rest = folded
        for other in longer:
            if len(other) > len(n) and n in other:
                rest = rest.replace(other, " ")
        if not re.search(rf"(?<!\w){re.escape(n)}(?!\w)", rest) and n in folded and any(
                len(o) > len(n) and n in o for o in longer):
            del out.entities[key]


def _head(phrase: str) -> str:
    return phrase.split()[-1].lower().strip("'’") if phrase else ""


# --- subjects ------------------------------------------------------------------------------------

_SUBJECT = re.compile(r"\b(I|I'm|I’m|I've|I’ve|I'd|I’d|I'll|I’ll|we|we're|we’re|we've|we’ve|you|you're|you’re|"
                      r"you've|you’ve|he|she|they|it|he's|she's|they're|it's|there|this|that|[a-z]+s)\b", re.IGNORECASE)
_CLAUSE_BREAK = re.compile(r"[.!?;]|\s[-–—]\s|,\s+(?:and|but|so)\s|\bbut\b|\bbecause\b|\bwhen\b|\bwhile\b")


_ADVERBS = (r"(?:(?:just|also|really|then|so|and|oh|well|recently|finally|even|still|yesterday|today|lately|been|had|"
            r"have|last \w+|\w+ly|\w+!)[\s,]+)*")
# A clause opened by a past-tense verb has dropped its "I" ("Took a short trip", "Lost my job as").
_LEAD_ONLY = re.compile(rf"^[\s,]*{_ADVERBS}(?:(?:[A-Z][a-z]+ed|Took|Lost|Got|Went|Made|Saw|Found|Bought|Began|Ran|"
                        r"Left|Met|Won|Had|Spent|Built|Tried|Came)\s+(?:[\w'-]+\s+){0,3})?$")
_PRONOUNS = frozenset({"i", "i'm", "i've", "i'd", "i'll", "we", "we're", "we've", "you", "you're", "you've", "he",
                       "she", "they", "it", "he's", "she's", "they're", "it's", "there", "this", "that"})
_BEFORE_PLURAL = re.compile(r"\b(?:my|our|your|the|his|her|their)\s+(?:[\w-]+\s+)?$", re.IGNORECASE)


def _subject(text: str, pos: int, speaker: str, addressee: str | None) -> str | None:
    """Who the verb at ``pos`` is about: the last subject word of its clause; no subject → speaker."""
    cut = max((m.end() for m in _CLAUSE_BREAK.finditer(text, 0, pos)), default=0)
    clause = text[cut:pos]
    last = None
    for m in _SUBJECT.finditer(clause):
        w = m.group(1).lower().replace("’", "'")
        if w not in _PRONOUNS:
            if w.endswith("s") and not _BEFORE_PLURAL.search(clause[: m.start()]):
                continue  # a plural noun is a subject only right after its determiner ("my kids love")
            w = "other"
        last = w
    if last is None:
        # Chat drops the subject of a clause it opens with the verb ("Took a trip to Rome").
        return speaker if _LEAD_ONLY.match(clause) else None
    if last.startswith("i") and last in {"i", "i'm", "i've", "i'd", "i'll"}:
        return speaker
    if last.startswith("we"):
        return speaker
    if last.startswith("you"):
        return addressee
    return None


# --- patterns ------------------------------------------------------------------------------------

_Q = r"(?:the |a |an |my |our |some |this |that )?"


@dataclass(frozen=True)
class _Rule:
    pattern: re.Pattern[str]  # case-insensitive, for a text whose lower-casing changes its length
    lowered: re.Pattern[str]  # the same, case-sensitive, for the lower-cased text: Python's matcher folds
    # the case of every character it tries under IGNORECASE, where lower-casing the text is one pass
    relation: str  # or a kind-dependent choice, see _relation_for
    confidence: float
    listed: bool = False  # the object may be a list


def _r(p: str, relation: str, confidence: float, listed: bool = False) -> _Rule:
    if re.search(r"[A-Z]", re.sub(r"\\.", "", p)):
        raise ValueError(f"verb rules are matched against lower-cased text; write {p!r} in lower case")
    return _Rule(re.compile(p, re.IGNORECASE), re.compile(p), relation, confidence, listed)


_VERB_RULES = [
    _r(r"\b(?:went|go|going|been|came|headed|travel(?:l)?ed|moved|flew|drove) to ", "visited|attended", 0.6),
    _r(r"\b(?:visit|visited|visiting|toured|explored) ", "visited", 0.7),
    _r(r"\btrip (?:[\w']+ ){0,3}?to ", "visited", 0.7),
    _r(r"\b(?:on|during|from) (?=(?:my|our|a|the|this|that) (?:[\w'-]+ ){0,2}(?:trip|vacation|holiday|cruise|tour)\b)",
       "attended", 0.55),
    _r(r"\b(?:support|supporting|supports|advocate for|fighting for|fight for) (?=(?:the |our )?(?:[\w'-]+ ){0,2}"
       r"(?:veterans|rights|community|cause|charity|people|kids|children|families)\b)", "supports", 0.5),
    _r(r"\b(?:off to|heading to|moving to|flying to|travel(?:l)?ing to) ", "travels_to", 0.6),
    _r(r"\bwent (?=(?:camping|hiking|swimming|fishing|skiing|surfing|kayaking|running|biking|cycling|"
       r"snowboarding|climbing|sailing)\b)", "does", 0.7),
    _r(r"\b(?:attended|attend|attending|joined|join|joining|took|taking|signed up for|enrolled in|"
       r"participated in|competed in|at) (?=(?:the |a |an |my |our |this |that )?(?:[\w'-]+ ){0,3}"
       r"(?:" + "|".join(sorted(EVENT_HEADS)) + r")\b)", "attended", 0.6),
    _r(r"\b(?:joined|join|joining|member of|part of|belong to) ", "member_of", 0.6),
    _r(r"\b(?:love|loved|loves|like|liked|enjoy|enjoyed|enjoying|adore|adored|a (?:big |huge )?fan of|"
       r"obsessed with|(?:i'm|i am|we're|really|so|totally|big) into) ", "likes", 0.55, True),
    _r(r"\b(?:admire|admired|inspired by|look up to) ", "admires", 0.6),
    _r(r"\b(?:read|reading|finished reading|re-?read) ", "read", 0.65),
    _r(r"\b(?:watched|watching|saw|seen|watch) ", "watched", 0.55),
    _r(r"\b(?:made|make|making|painted|built|created|baked|designed|knitted|sewed|crafted|drew) ", "made", 0.55),
    _r(r"\b(?:bought|buy|purchased|picked up|adopted|got (?:a |an |my |some |this )?new) ", "bought", 0.6),
    _r(r"\b(?:received|was given|got given|awarded) ", "received", 0.6),
    _r(r"\b(?:volunteer|volunteered|volunteering|volunteers) (?:at|with|for) ", "volunteers_at", 0.75),
    _r(r"\b(?:won|win|winning|took home|came first in|placed first in) ", "won", 0.65),
    _r(r"\b(?:i'm|i am|we're|we are|originally|i come|we come) from ", "from", 0.7),
    _r(r"\b(?:started|start|starting|took up|taking up|trying out|tried|try|practicing|practising|practice|"
       r"doing|do|play|plays|played|playing|into) (?=(?:some |more )?(?:" + "|".join(sorted(ACTIVITY_WORDS))
       + r")\b)", "does", 0.6, True),
    _r(r"\b(?:work|works|working|worked) (?:at|for) ", "works_at", 0.7),
    _r(r"\b(?:working on|work on|worked on|busy with|tackling) ", "works_on", 0.55),
    _r(r"\b(?:writing|wrote|write|am writing|i'm writing|in the middle of) (?=(?:a |an |my |the )?"
       r"(?:[\w'-]+ ){0,2}(?:book|novel|story|stories|poem|poems|screenplay|script|blog|article|series)\b)",
       "writes", 0.6),
    _r(r"\b(?:plan to|planning to|want to|wanna|hope to|hoping to|going to|gonna|thinking of|thinking about|"
       r"dream of|dreaming of|looking to|maybe even|aim to) (?:start|open|adopt|launch|build|create|found|"
       r"starting|opening|adopting|launching|building) ", "plans", 0.5),
    _r(r"\b(?:start|starting|started|open|opening|opened|launch|launched|launching) (?:my|our|a|an) own ", "plans",
       0.55),
    _r(r"\ballergic to ", "allergic_to", 0.8, True),
    _r(r"\b(?:researching|research|researched|looking into) ", "researches", 0.6),
    _r(r"\b(?:applied for|apply for|applying for|interview for|interviewed for|an interview for) ", "applied_for", 0.7),
    _r(r"\b(?:running for|ran for|run for) ", "runs_for", 0.7),
    _r(r"\b(?:recommend|recommended|recommending|recommend you|recommending me) ", "recommends", 0.55),
    _r(r"\b(?:learn|learning|learned|learnt|studying|study|studied|majoring in) ", "studies", 0.55, True),
    _r(r"\b(?:signed with|signed up|signed a deal with|sponsored by) ", "signed_with", 0.6),
    _r(r"\b(?:teamed up with|partnered with|collaborating with|collaborated with) ",
       "works_with", 0.55),
    _r(r"\b(?:hurt|injured|broke|sprained|twisted|pulled) (?=(?:my|his|her|your) )", "injured", 0.75),
    _r(r"\b(?:had|have|got|with) (?:a |an |this |the |my )?(?=(?:[\w-]+ )?(?:injury|accident|surgery|"
       r"operation|concussion|setback)\b)", "had", 0.6),
]

# A kin word ends its phrase ("my kids are", "my dog, Max"): "my horse painting" is no horse.
_KIN_END = r"(?=[^\w'’-]*(?:$|[,.;:!?)]|\s(?:" + "|".join(sorted(
    "and or but is was are were has have had who that with in at on to from for just always loves love "
    "likes like gets got came went made took".split())) + r")\b))"
_NAME_AFTER = r",? ((?-i:[A-Z][a-z]+))(?!\w)"


def _kin(words: str, modifiers: str = "") -> re.Pattern[str]:
    return re.compile(rf"\b(my|our|your) ((?:{modifiers})?(?:{words}))(?:{_NAME_AFTER}|{_KIN_END})", re.IGNORECASE)


_POSSESSIVE_RULES = [
    (_kin(_CHILD, "little |baby |oldest |youngest |eldest |two |three "), "has_child", 0.75),
    (_kin(_PET, "new |little |pet "), "has_pet", 0.7),
    (_kin(_RELATIVE), "has_relative", 0.65),
    (_kin(_FRIEND), "friend_of", 0.7),
    (_kin(_COLLEAGUE), "colleague_of", 0.7),
]
_HOME = re.compile(r"\b(my|our|your) (?:home ?(?:country|town|city)|hometown),? ", re.IGNORECASE)
_GAVE_ME = re.compile(r"\b(?:gave|handed|awarded|sent|got) me ", re.IGNORECASE)
_VOLUNTEER_AT = re.compile(r"\b(?:the|a|an) ((?:[\w'-]+ ){0,2}[\w'-]+) (?:I|we) (?:volunteer|volunteered|work|worked) "
                           r"(?:at|with|for)\b")
_NAMED_PET = re.compile(r"\b(?i:her|his|its) name is ([A-Z][a-z]+)|\bnamed ([A-Z][a-z]+)|\bcalled ([A-Z][a-z]+)")
_OWN = re.compile(r"\b(my|our|your) ", re.IGNORECASE)
_JOB = re.compile(r"\b(?:i'm|i am|i was|i work as|work as|working as|worked as|job as|career as|as) (?:a|an) "
                  r"((?:[\w-]+ )?(" + "|".join(sorted(_JOBS)) + r"))\b", re.IGNORECASE)
_PAST_JOB = re.compile(r"\b(?:lost|quit|left) my job\b|\bused to\b|\bi was\b|\bformer\b", re.IGNORECASE)
_MEMBER_POSS = re.compile(r"\b(?:my|our) ((?:[\w'-]+ ){0,2}(?:" + "|".join(sorted(GROUP_HEADS)) + r"))\b",
                          re.IGNORECASE)
_PROPER_TRIP = re.compile(r"\b(?:my|our|the|a) ((?:[A-Z][\w'-]+ ){1,3})(?:trip|vacation|holiday)\b")


_GERUND_RELATION = {"reading": "read", "watching": "watched", "playing": "does", "rereading": "read",
                    "re-reading": "read", "writing": "writes", "making": "made", "cooking": "made", "baking": "made"}
_GERUND_OBJECT = re.compile(r"(" + "|".join(_GERUND_RELATION) + r") (?=[\"“]|(?:the|a|an|my|this|that|some) |[A-Z])",
                            re.IGNORECASE)


def _kind_relation(relation: str, phrase: str, names: dict[str, Name]) -> str:
    """'visited|attended': an event is attended, a place (or a proper name) visited."""
    if relation != "visited|attended":
        return relation
    head = _head(phrase)
    if head in EVENT_HEADS:
        return "attended"
    return "visited"


def _target_ok(relation: str, phrase: str) -> bool:
    head = _head(phrase)
    if relation in {"does"}:
        return head in ACTIVITY_WORDS or head.endswith("ing")
    if relation == "member_of":
        return head in GROUP_HEADS or phrase[:1].isupper()
    if relation in {"likes", "watched", "made", "bought", "read", "studies"}:
        return not head.endswith("ing") or head in ACTIVITY_WORDS or relation == "likes"
    return True


def extract_graph(
    text: str, speaker: str | None, addressee: str | None = None, *,
    speakers: Iterable[str] = (), known: frozenset[str] = frozenset(),
) -> Extraction:
    """Entities written in ``text`` and the triples it states, its first person being ``speaker``.

    ``addressee`` is who "you" is (the other speaker of a two-person conversation, else None);
    ``known`` the conversation's names (``known_names``), so a name opening a sentence is kept.
    """
    speakers = tuple(s for s in speakers if s)
    out = Extraction()
    names = {normalize_name(n.name): n for n in find_names(text, speakers, known)}
    for n in names.values():
        etype = "person" if n.name in speakers else n.entity_type
        out.add_entity(n.name, etype, n.confidence)

    def emit(subject: str | None, relation: str, target: str, conf: float, etype: str) -> None:
        if not subject or not target or normalize_name(target) == normalize_name(subject):
            return
        if normalize_name(target) in {"i", "me", "you", "we", "us", "it", "them"}:
            return
        proper = normalize_name(target) in names
        named = names[normalize_name(target)].entity_type if proper else "concept"
        out.add_entity(target, named if named != "concept" else etype,
                       min(1.0, conf + (0.15 if proper else 0.0)))
        out.add_triple(Triple(subject, relation, target, round(min(1.0, conf + (0.1 if proper else 0.0)), 3)))

    def who(tag: str) -> str | None:
        return addressee if tag.lower().startswith("your") else speaker

    low = text.lower()
    same_offsets = len(low) == len(text)  # one character for each: a match's offsets are the text's
    for rule in _VERB_RULES:
        for m in rule.lowered.finditer(low) if same_offsets else rule.pattern.finditer(text):
            subj = _subject(text, m.start(), speaker or "", addressee) if speaker else None
            at = m.end()
            relation = rule.relation
            g = _GERUND_OBJECT.match(text, at)
            if g and relation in {"likes", "does"}:
                # "loved reading X": X was read, and is liked (the reading itself is an activity).
                obj = _phrase(text, g.end())
                if obj:
                    emit(subj, _GERUND_RELATION[g.group(1).lower()], obj[0], rule.confidence, "work")
                    if relation == "likes":
                        emit(subj, "likes", obj[0], rule.confidence, "work")
                    continue
            targets = _list(text, at) if rule.listed else [p[0] for p in [_phrase(text, at)] if p]
            for target in targets:
                rel = _kind_relation(relation, target, names)
                if not _target_ok(rel, target):
                    continue
                etype = ("place" if rel in {"visited", "travels_to", "from"} else
                         "event" if rel == "attended" else "activity" if rel == "does" else
                         "organization" if rel in {"member_of", "volunteers_at", "works_at", "signed_with"} else
                         "concept")
                emit(subj, rel, target, rule.confidence, etype)
    for rx, rel, conf in _POSSESSIVE_RULES:
        for m in rx.finditer(text):
            subj = who(m.group(1))
            target = m.group(3) if m.group(3) and normalize_name(m.group(3)) not in {"and", "i"} else m.group(2)
            if rel == "has_relative" and target.lower() in {"family", "fam", "parents"} and not m.group(3):
                continue  # "my family" names nobody
            emit(subj, rel, target, conf + (0.1 if m.group(3) else 0.0),
                 "pet" if rel == "has_pet" else "person")
    for m in _HOME.finditer(text):
        got = _phrase(text, m.end())
        if got:
            emit(who(m.group(1)), "from", got[0], 0.7, "place")
    for m in _GAVE_ME.finditer(text):
        got = _phrase(text, m.end())
        if got:
            emit(speaker, "received", got[0], 0.6, "object")
    for m in _VOLUNTEER_AT.finditer(text):
        emit(speaker, "volunteers_at", m.group(1), 0.7, "organization")
    for m in _NAMED_PET.finditer(text):
        name = next(g for g in m.groups() if g)
        if re.search(rf"\b(?:my|our) (?:{_PET})\b", text, re.IGNORECASE) or m.group(0).lower().startswith("her name"):
            emit(speaker, "has_pet", name, 0.6, "pet")
    for m in _OWN.finditer(text):
        got = _phrase(text, m.end(), max_words=4)
        if got and _head(got[0]) in OWNABLE_HEADS:
            emit(who(m.group(1)), "owns", got[0], 0.55, "object")
    for m in _MEMBER_POSS.finditer(text):
        phrase = m.group(1).strip()
        if _head(phrase) in GROUP_HEADS and not re.match(r"(?:family|fam)\b", phrase, re.IGNORECASE):
            emit(speaker, "member_of", phrase, 0.55, "organization")
    for m in _JOB.finditer(text):
        subj = _subject(text, m.start(), speaker or "", addressee) if speaker else None
        rel = "worked_as" if _PAST_JOB.search(text[max(0, m.start() - 30):m.end()]) else "works_as"
        emit(subj, rel, m.group(2), 0.65, "role")
    for m in _PROPER_TRIP.finditer(text):
        emit(speaker, "visited", m.group(1).strip(), 0.65, "place")
    _drop_nested(text, out)
    return out
