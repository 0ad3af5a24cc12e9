"""Selection balance: operator shares, distinct query-level pairs, every operator in every split."""

from __future__ import annotations

from collections import Counter

from pipeline.noise.select import (
    OPERATOR_SHARES,
    TRUE_SHARE,
    select_pairs,
    split_gaps,
    template_splits,
    true_share,
    violations,
)
from pipeline.questions.templates import INTENTS

LEVELS = ("record", "value", "query")


def _pairs(operators: dict[str, int]) -> list[dict]:
    """Verified pairs over every intent × level; each operator of a noise level gets ``weight``
    times as many questions as weight 1."""
    out = []
    for intent in INTENTS:
        for t in range(4):
            for q in range(20):
                for op, weight in operators.items():
                    level = op.split("_")[0]
                    if q % weight == 0 or weight == 1:
                        qid = f"{intent}-{t}-{q}"
                        out.append({"pair_id": f"{qid}-{op}", "question_id": qid, "template_id": f"{intent}-{t}",
                                    "intent": intent, "level": "population" if t % 2 else "patient",
                                    "noise_level": level, "operator": op, "verified": True,
                                    "noisy_question": f"{qid} {op}", "naive_sql": "SELECT 1",
                                    "answer_type": "boolean" if t == 3 else "number",
                                    "clean_answer": "false" if t == 3 and q % 5 == 0 else "true"})
    return out


def test_a_dominant_operator_is_capped_and_a_rare_one_lifted():
    ops = {f"{level}_{x}": 1 for level in LEVELS for x in "abcde"} | {"query_big": 1, "query_rare": 1}
    pairs = _pairs(ops)
    # query_rare exists on one template only: the template cap hides it without the floor
    pairs = [p for p in pairs if p["operator"] != "query_rare" or p["template_id"] == f"{INTENTS[0]}-0"]
    # query_big appears on every question, twice the others' pairs per question at its level
    pairs += [{**p, "pair_id": p["pair_id"] + "x", "question_id": p["question_id"] + "x",
               "noisy_question": p["noisy_question"] + "x"} for p in pairs if p["operator"] == "query_big"]
    selected = select_pairs(pairs, 0, per_template=12)
    shares = Counter(p["operator"] for p in selected)
    floor, ceiling = OPERATOR_SHARES
    assert len(shares) == 17 and max(shares.values()) <= ceiling * len(selected)
    assert shares["query_rare"] >= floor * len(selected)
    assert not violations(selected)
    assert true_share(pairs) == 0.8 and TRUE_SHARE[0] <= true_share(selected) <= TRUE_SHARE[1]
    assert selected == select_pairs(pairs, 0, per_template=12)  # deterministic


def test_query_level_pairs_asking_the_same_are_kept_once():
    pairs = _pairs({"record_a": 1, "query_a": 1})
    twins = [{**p, "pair_id": p["pair_id"] + "-twin", "question_id": p["question_id"] + "-twin"}
             for p in pairs if p["noise_level"] == "query"]
    selected = select_pairs(pairs + twins, 0, per_template=1000)
    asked = Counter((p["noisy_question"], p["naive_sql"]) for p in selected if p["noise_level"] == "query")
    assert asked and max(asked.values()) == 1


def test_every_operator_reaches_every_split_when_it_has_templates_enough():
    templates = [f"t{i}" for i in range(20)]
    cells = {t: ("lookup", "patient") for t in templates}
    # "rare" lives on three templates, which the plain split may put in one split
    operators_of = {t: {"common"} | ({"rare"} if t in ("t0", "t1", "t2") else set()) for t in templates}
    for seed in range(10):
        splits = template_splits(templates, cells, seed, operators_of)
        assert split_gaps(splits, operators_of) == []
        assert Counter(splits.values())["train"] >= 10  # the cut stays close to 70/10/20
    lone = {t: {"common"} | ({"lone"} if t == "t0" else set()) for t in templates}
    gaps = split_gaps(template_splits(templates, cells, 0, lone), lone)
    assert len(gaps) == 2 and {op for op, _ in gaps} == {"lone"}  # one template cannot cover three splits
