"""Precision and recall of an entity/triple extractor against hand labels (pure, no I/O).

Names are compared the way the graph keys them (``normalize_name``), without a leading article or
possessive, so "the homeless shelter" and "homeless shelter" are one name. Two views are kept
apart because they answer different questions: *exact* (the same name: what lands on the same
entity id) and *lenient* (one name's words contain the other's: "council meeting" found for
"council meeting for adoption" is a hit a reader would accept, but not the same node). Each
prediction matches at most one label and the other way round, so repeating a name cannot raise
either figure.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from shared.memory.kg import normalize_name, normalize_predicate

__all__ = ["Score", "Scores", "evaluate_labels", "name_key", "names_match", "score_turns"]

_LEAD = re.compile(r"^(?:the|a|an|my|your|our|his|her|their|this|that|some)\s+")
_WORDS = re.compile(r"[^\W_]+")


def name_key(name: str) -> str:
    """The comparable form of a name: normalised, leading article or possessive dropped."""
    key = normalize_name(name).replace("’", "'")
    while (stripped := _LEAD.sub("", key)) != key:
        key = stripped
    return key


def _words(key: str) -> tuple[str, ...]:
    return tuple(_WORDS.findall(key))


def names_match(a: str, b: str, *, lenient: bool) -> bool:
    """Equal keys; with ``lenient``, also one name's words a contiguous run of the other's."""
    ka, kb = name_key(a), name_key(b)
    if ka == kb:
        return True
    if not lenient:
        return False
    wa, wb = _words(ka), _words(kb)
    if not wa or not wb:
        return False
    short, long_ = (wa, wb) if len(wa) <= len(wb) else (wb, wa)
    return any(long_[i:i + len(short)] == short for i in range(len(long_) - len(short) + 1))


@dataclass(frozen=True)
class Score:
    """Counts and the figures derived from them (a figure with nothing to divide by is 0)."""

    true_pos: int
    predicted: int
    labelled: int

    @property
    def precision(self) -> float:
        return self.true_pos / self.predicted if self.predicted else 0.0

    @property
    def recall(self) -> float:
        return self.true_pos / self.labelled if self.labelled else 0.0

    @property
    def f1(self) -> float:
        p, r = self.precision, self.recall
        return 2 * p * r / (p + r) if p + r else 0.0

    def __add__(self, other: Score) -> Score:
        return Score(self.true_pos + other.true_pos, self.predicted + other.predicted,
                     self.labelled + other.labelled)

    def as_dict(self) -> dict[str, float | int]:
        return {"precision": round(self.precision, 3), "recall": round(self.recall, 3), "f1": round(self.f1, 3),
                "true_pos": self.true_pos, "predicted": self.predicted, "labelled": self.labelled}


@dataclass(frozen=True)
class Scores:
    entities_exact: Score
    entities_lenient: Score
    triples_strict: Score
    triples_pair: Score

    def as_dict(self) -> dict[str, dict[str, float | int]]:
        return {k: getattr(self, k).as_dict() for k in ("entities_exact", "entities_lenient", "triples_strict",
                                                       "triples_pair")}


def _greedy(predicted: Sequence[object], labelled: Sequence[object], same: Callable[[object, object], bool]) -> Score:
    """One-to-one matching, each prediction taking the first label it matches that is still free."""
    free = list(range(len(labelled)))
    hits = 0
    for p in predicted:
        for n, i in enumerate(free):
            if same(p, labelled[i]):
                hits += 1
                del free[n]
                break
    return Score(hits, len(predicted), len(labelled))


def _dedup(items: Iterable[tuple[str, ...]]) -> list[tuple[str, ...]]:
    return list(dict.fromkeys(tuple(name_key(x) for x in it) for it in items))


def _rel(r: str) -> str:
    try:
        return normalize_predicate(r)
    except ValueError:
        return ""


def score_turns(
    turns: Iterable[tuple[Sequence[str], Sequence[tuple[str, str, str]], Sequence[str],
                          Sequence[tuple[str, str, str]]]],
) -> Scores:
    """Scores over turns of (labelled entity names, labelled triples, predicted names, predicted triples).

    Duplicates within a turn count once, on both sides. Triples are (source, relation, target).
    """
    ee = el = ts = tp = Score(0, 0, 0)
    for gold_e, gold_t, pred_e, pred_t in turns:
        ge = [k[0] for k in _dedup((n,) for n in gold_e)]
        pe = [k[0] for k in _dedup((n,) for n in pred_e)]
        ee += _greedy(pe, ge, lambda a, b: names_match(a, b, lenient=False))  # type: ignore[arg-type]
        el += _greedy(pe, ge, lambda a, b: names_match(a, b, lenient=True))  # type: ignore[arg-type]
        gt = [(s, _rel(r), o) for s, r, o in _dedup(gold_t)]
        pt = [(s, _rel(r), o) for s, r, o in _dedup(pred_t)]

        def pair(a: tuple[str, str, str], b: tuple[str, str, str]) -> bool:
            return names_match(a[0], b[0], lenient=True) and names_match(a[2], b[2], lenient=True)

        ts += _greedy(pt, gt, lambda a, b: pair(a, b) and a[1] == b[1])  # type: ignore[arg-type]
        tp += _greedy(pt, gt, pair)  # type: ignore[arg-type]
    return Scores(ee, el, ts, tp)


def evaluate_labels(turns: Sequence[dict[str, object]]) -> tuple[Scores, list[dict[str, object]]]:
    """Run the offline extractor over labelled turns (``tests/data/kg_labels_locomo_dev.json``'s
    ``turns``) and score it; also returns each turn's predictions, for reading the misses.

    The names a conversation capitalises mid-sentence are taken from its labelled turns, the way the
    enrich service takes them from the whole session.
    """
    from shared.memory.relations import extract_graph, known_names

    by_conv: dict[str, list[dict[str, object]]] = {}
    for t in turns:
        by_conv.setdefault(str(t["conversation"]), []).append(t)
    known = {c: known_names([str(t["text"]) for t in ts], {str(t["speaker"]) for t in ts})
             for c, ts in by_conv.items()}
    rows = []
    detail = []
    for t in turns:
        speakers = (str(t["speaker"]), str(t["addressee"]))
        ex = extract_graph(str(t["text"]), speakers[0], speakers[1], speakers=speakers,
                           known=known[str(t["conversation"])])
        pred_e = [name for name, _, _ in ex.entities.values()]
        pred_t = [(x.source, x.relation, x.target) for x in ex.triples]
        gold_e = [str(e["name"]) for e in t["entities"]]  # type: ignore[attr-defined]
        gold_t = [(str(x["source"]), str(x["relation"]), str(x["target"])) for x in t["triples"]]  # type: ignore[attr-defined]
        rows.append((gold_e, gold_t, pred_e, pred_t))
        detail.append({"dia_id": t["dia_id"], "conversation": t["conversation"], "text": t["text"],
                       "gold_entities": gold_e, "entities": pred_e, "gold_triples": gold_t, "triples": pred_t})
    return score_turns(rows), detail
