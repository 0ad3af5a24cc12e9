"""From verified pairs to a balanced benchmark: per-template cap, minimum shares, template splits."""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from typing import TYPE_CHECKING

from pipeline.files import stable_int
from pipeline.noise.registry import NOISE_LEVELS
from pipeline.questions.templates import INTENTS

if TYPE_CHECKING:
    from pipeline.noise.vetoes import Vetoes

MIN_SHARES = {"intent": 0.10, "noise_level": 0.25, "level": {"population": 0.25}}
OPERATOR_SHARES = (0.01, 0.15)  # every operator's share of shipped pairs, where its candidates allow
TRUE_SHARE = (0.35, 0.65)  # of boolean questions' clean answers: "yes" must not be a safe guess
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


def operator_shares(pairs: list[dict]) -> dict[str, float]:
    """Each operator's share of ``pairs``."""
    counts = Counter(p["operator"] for p in pairs)
    return {op: n / len(pairs) for op, n in sorted(counts.items())}


def select_pairs(pairs: list[dict], seed: int, per_template: int, per_question: int = 2,
                 vetoes: Vetoes | None = None) -> list[dict]:
    """A deterministic, balanced subset of verified pairs.

    Pairs are ranked by a seeded hash; a query-level pair asking exactly what another asks (the
    same noisy question and SQL on the same clean database) is dropped; at most ``per_question``
    per clean question (distinct noise levels first) and ``per_template`` per template are kept.
    Then every operator is brought within :data:`OPERATOR_SHARES` — its next-ranked pairs beyond
    the template cap admitted while it is below the floor, its lowest-ranked pairs dropped while it
    is above the ceiling — and while a minimum share of :data:`MIN_SHARES` is unmet, the
    lowest-ranked pairs of the most over-represented value of that dimension are dropped; boolean
    questions keep their true answers within :data:`TRUE_SHARE`.
    Pairs ``vetoes`` names (one by one or by template × operator family) are dropped first, so the
    next pairs in the seeded order take their slots.
    """
    if vetoes:
        pairs = [p for p in pairs if vetoes.veto_of(p) is None]
    ranked = _distinct(sorted(pairs, key=lambda p: _rank(seed, p)))
    per_q: dict[str, list[dict]] = defaultdict(list)
    for p in ranked:
        per_q[p["question_id"]].append(p)
    kept_q = []
    for ps in per_q.values():
        first_of_level = [p for i, p in enumerate(ps)
                          if p["noise_level"] not in {x["noise_level"] for x in ps[:i]}]
        kept_q += (first_of_level + [p for p in ps if p not in first_of_level])[:per_question]
    kept_q.sort(key=lambda p: _rank(seed, p))
    taken: Counter = Counter()
    selected = []
    for p in kept_q:
        if taken[p["template_id"]] < per_template:
            taken[p["template_id"]] += 1
            selected.append(p)
    for _ in range(5):
        selected = _within_operator_shares(selected, ranked, per_question, seed)
        selected = _balance_booleans(selected)
        selected = _meet_minimums(selected)
        share = true_share(selected)
        if (not _operators_outside_shares(selected, ranked) and not violations(selected)
                and (share is None or TRUE_SHARE[0] <= share <= TRUE_SHARE[1])):
            break
    return sorted(selected, key=lambda p: p["pair_id"])


def _rank(seed: int, pair: dict) -> int:
    return stable_int(seed, pair["pair_id"])


def _distinct(ranked: list[dict]) -> list[dict]:
    """The first of each set of query-level pairs that pose the same question with the same SQL."""
    seen, out = set(), []
    for p in ranked:
        key = (p["noisy_question"], p["naive_sql"]) if p["noise_level"] == "query" else p["pair_id"]
        if key not in seen:
            seen.add(key)
            out.append(p)
    return out


def _unselected(op: str, ranked: list[dict], selected: list[dict]) -> list[dict]:
    chosen = {p["pair_id"] for p in selected}
    return [p for p in ranked if p["operator"] == op and p["pair_id"] not in chosen]


def _operators_outside_shares(selected: list[dict], ranked: list[dict]) -> list[str]:
    """Operators above the ceiling, or below the floor while they have pairs left to admit."""
    floor, ceiling = OPERATOR_SHARES[0], _ceiling(selected)
    counts = Counter(p["operator"] for p in selected)
    return sorted(op for op in {p["operator"] for p in ranked}
                  if counts[op] > ceiling * len(selected)
                  or (counts[op] < floor * len(selected) and _unselected(op, ranked, selected)))


def _lift(op: str, missing: int, selected: list[dict], ranked: list[dict], per_question: int,
          floor_count: int) -> list[dict]:
    """Admit up to ``missing`` more pairs of ``op`` in rank order: into a question with room (past
    the template cap), or in place of the question's pair of the same noise level when that pair's
    operator stays above the floor."""
    by_q: dict[str, list[dict]] = defaultdict(list)
    for p in selected:
        by_q[p["question_id"]].append(p)
    counts = Counter(p["operator"] for p in selected)
    out, added = list(selected), 0
    for p in _unselected(op, ranked, selected):
        if added >= missing:
            break
        mates = by_q[p["question_id"]]
        same_level = [m for m in mates if m["noise_level"] == p["noise_level"]]
        if same_level:
            victim = same_level[0]
            if counts[victim["operator"]] <= floor_count:
                continue
            out.remove(victim)
            mates.remove(victim)
            counts[victim["operator"]] -= 1
        elif len(mates) >= per_question:
            continue
        out.append(p)
        mates.append(p)
        counts[op] += 1
        added += 1
    return out


def _ceiling(selected: list[dict]) -> float:
    """The operator ceiling, relaxed when so few operators are present that it would bind even on
    an even spread (twice the even share)."""
    return max(OPERATOR_SHARES[1], 2 / max(1, len({p["operator"] for p in selected})))


def _within_operator_shares(selected: list[dict], ranked: list[dict], per_question: int, seed: int) -> list[dict]:
    floor, ceiling = OPERATOR_SHARES[0], _ceiling(selected)
    floor_count = math.ceil(floor * len(selected))
    counts = Counter(p["operator"] for p in selected)
    for op in sorted({p["operator"] for p in ranked}):
        if counts[op] < floor_count:
            selected = _lift(op, floor_count - counts[op], selected, ranked, per_question, floor_count)
    for op, n in Counter(p["operator"] for p in selected).most_common():
        if n > ceiling * len(selected):
            # dropping k of them: (n - k) / (len - k) <= ceiling, while their noise level keeps its
            # minimum share: (level - k) / (len - k) >= minimum
            level = next(p["noise_level"] for p in selected if p["operator"] == op)
            at_level = sum(p["noise_level"] == level for p in selected)
            minimum = _minimums("noise_level")[level]
            k = min(math.ceil((n - ceiling * len(selected)) / (1 - ceiling)),
                    math.floor((at_level - minimum * len(selected)) / (1 - minimum)))
            if k <= 0:
                continue
            drop = {p["pair_id"] for p in sorted((p for p in selected if p["operator"] == op),
                                                 key=lambda p: _rank(seed, p))[-k:]}
            selected = [p for p in selected if p["pair_id"] not in drop]
    return sorted(selected, key=lambda p: _rank(seed, p))


def true_share(pairs: list[dict]) -> float | None:
    """The share of boolean pairs whose clean answer is true (None without boolean pairs)."""
    answers = [p["clean_answer"] == "true" for p in pairs if p["answer_type"] == "boolean"]
    return sum(answers) / len(answers) if answers else None


def _balance_booleans(selected: list[dict]) -> list[dict]:
    """Drop the lowest-ranked boolean pairs of the over-represented answer into :data:`TRUE_SHARE`."""
    share = true_share(selected)
    if share is None or TRUE_SHARE[0] <= share <= TRUE_SHARE[1]:
        return selected
    booleans = [p for p in selected if p["answer_type"] == "boolean"]
    heavy = "true" if share > TRUE_SHARE[1] else "false"
    light = sum(p["clean_answer"] != heavy for p in booleans)
    # keep h of the heavy answer: h / (h + light) <= upper bound
    keep = math.floor(light * TRUE_SHARE[1] / (1 - TRUE_SHARE[1]))
    heavy_pairs = [p for p in booleans if p["clean_answer"] == heavy]
    drop = {p["pair_id"] for p in heavy_pairs[keep:]}
    return [p for p in selected if p["pair_id"] not in drop]


def _meet_minimums(selected: list[dict]) -> list[dict]:
    """Drop the lowest-ranked pairs of over-represented values until every minimum share is met."""
    for _ in range(100):
        unmet = [(dim, value) for dim, value in violations(selected) if any(p[dim] == value for p in selected)]
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
    return selected


def template_splits(template_ids: list[str], cells: dict[str, tuple[str, str]], seed: int,
                    operators_of: dict[str, set[str]] | None = None) -> dict[str, str]:
    """Each template goes wholly to train, dev or test; within every intent × level cell the
    templates are ordered by a seeded hash and cut 70/10/20, so every cell reaches test. Then,
    with ``operators_of`` (template -> operators of its pairs), templates move between splits so
    every operator reaches train, dev and test where it has templates enough."""
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
    if operators_of:
        _cover_operators(out, {t: operators_of.get(t, set()) for t in out}, seed)
    return out


def split_gaps(splits: dict[str, str], operators_of: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(operator, split) combinations no template provides."""
    have = {(op, splits[t]) for t, ops in operators_of.items() if t in splits for op in ops}
    operators = {op for ops in operators_of.values() for op in ops}
    return sorted((op, s) for op in operators for s, _ in SPLITS if (op, s) not in have)


def _cover_operators(out: dict[str, str], operators_of: dict[str, set[str]], seed: int) -> None:
    """Move one template at a time (in a seeded order) into a split its operator lacks, taken from a
    split where another template keeps that operator, while that closes more gaps than it opens."""
    order = sorted(out, key=lambda t: stable_int(seed, "cover", t))
    gaps = split_gaps(out, operators_of)
    while gaps:
        for op, split in gaps:
            carriers = [t for t in order if op in operators_of[t]]
            for t in carriers:
                if sum(out[u] == out[t] for u in carriers) < 2:
                    continue
                old, out[t] = out[t], split
                after = split_gaps(out, operators_of)
                if len(after) < len(gaps):
                    gaps = after
                    break
                out[t] = old
            else:
                continue
            break
        else:
            return
