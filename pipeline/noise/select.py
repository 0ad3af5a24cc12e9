"""From verified pairs to a balanced benchmark: per-template cap, minimum shares, template splits."""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import TYPE_CHECKING

from pipeline.files import stable_int
from pipeline.noise.registry import NOISE_LEVELS
from pipeline.questions.templates import INTENTS

if TYPE_CHECKING:
    from pipeline.noise.vetoes import Vetoes

MIN_SHARES = {"intent": 0.10, "noise_level": 0.25, "level": {"population": 0.25}}
SPLITS = (("train", 0.7), ("dev", 0.1), ("test", 0.2))


def _minimums(dimension: str) -> dict[str, float]:
    rule = MIN_SHARES[dimension]
    if isinstance(rule, dict):
        return rule
    values = INTENTS if dimension == "intent" else NOISE_LEVELS
    return {v: rule for v in values}


def violations(pairs: list[dict]) -> list[tuple[str, str]]:
    """(dimension, value) of every unmet minimum share."""
    out = []
    for dim in MIN_SHARES:
        counts = Counter(p[dim] for p in pairs)
        out += [(dim, value) for value, share in _minimums(dim).items() if counts[value] < share * len(pairs)]
    return out


def select_pairs(pairs: list[dict], seed: int, per_template: int, per_question: int = 2,
                 vetoes: Vetoes | None = None) -> list[dict]:
    """A deterministic, balanced subset of verified pairs.

    Pairs are ranked by a seeded hash; at most ``per_question`` per clean question (distinct noise
    levels first) and ``per_template`` per template are kept. While a minimum share is unmet,
    the lowest-ranked pairs of the most over-represented value of that dimension are dropped.
    Pairs ``vetoes`` names (one by one or by template × operator family) are dropped first, so the
    next pairs in the seeded order take their slots.
    """
    if vetoes:
        pairs = [p for p in pairs if vetoes.veto_of(p) is None]
    ranked = sorted(pairs, key=lambda p: stable_int(seed, p["pair_id"]))
    per_q: dict[str, list[dict]] = defaultdict(list)
    for p in ranked:
        per_q[p["question_id"]].append(p)
    kept_q = []
    for ps in per_q.values():
        first_of_level = [p for i, p in enumerate(ps)
                          if p["noise_level"] not in {x["noise_level"] for x in ps[:i]}]
        kept_q += (first_of_level + [p for p in ps if p not in first_of_level])[:per_question]
    kept_q.sort(key=lambda p: stable_int(seed, p["pair_id"]))
    taken: Counter = Counter()
    selected = []
    for p in kept_q:
        if taken[p["template_id"]] < per_template:
            taken[p["template_id"]] += 1
            selected.append(p)
    for _ in range(100):
        unmet = violations(selected)
        if not unmet:
            break
        dim, value = unmet[0]
        counts = Counter(p[dim] for p in selected if p[dim] != value)
        if not counts:
            break
        donor = counts.most_common(1)[0][0]
        # Dropping k donors raises the value's share; k solves count/(n-k) >= share.
        share = _minimums(dim)[value]
        have = sum(1 for p in selected if p[dim] == value)
        drop = max(1, int(len(selected) - have / share) + 1)
        donors = [i for i, p in enumerate(selected) if p[dim] == donor]
        for i in sorted(donors[-drop:], reverse=True):
            del selected[i]
    return sorted(selected, key=lambda p: p["pair_id"])


def template_splits(template_ids: list[str], cells: dict[str, tuple[str, str]], seed: int) -> dict[str, str]:
    """Each template goes wholly to train, dev or test; within every intent × level cell the
    templates are ordered by a seeded hash and cut 70/10/20, so every cell reaches test."""
    by_cell: dict[tuple, list[str]] = defaultdict(list)
    for t in sorted(set(template_ids)):
        by_cell[cells[t]].append(t)
    out = {}
    for ts in by_cell.values():
        ts.sort(key=lambda t: stable_int(seed, "split", t))
        n = len(ts)
        n_test = max(1, round(n * SPLITS[2][1])) if n >= 3 else 0
        n_dev = max(1, round(n * SPLITS[1][1])) if n >= 5 else 0
        for i, t in enumerate(ts):
            out[t] = "test" if i < n_test else "dev" if i < n_test + n_dev else "train"
    return out
