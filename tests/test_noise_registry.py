"""The operator registry is the one source of truth: what it stamps, what it refuses, and every
place that describes operators or pair columns (templates, GX suite, manifest, card) agrees with it."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import fields
from typing import get_args

import pytest

from pipeline.expectations import load_suite_json
from pipeline.noise.export import (
    CANDIDATES_SCHEMA,
    PAIRS_SCHEMA,
    SHIPPED_SCHEMA,
    PairRecord,
    candidates_table,
    dataset_card,
    operator_catalog,
    pairs_table,
    shipped_table,
)
from pipeline.noise.model import (
    Behavior,
    CleanQuestion,
    Detector,
    OperatorParams,
    Proposal,
)
from pipeline.noise.operators import OPERATORS
from pipeline.noise.overlay import Overlay
from pipeline.noise.pairs import pair_record
from pipeline.noise.registry import NOISE_LEVELS, Operator, operator
from pipeline.noise.verify import CHECKS
from pipeline.questions.templates import QUESTION_LEVELS, load_templates


def test_registry_module_imports_no_operator():
    code = ("import sys, pipeline.noise.registry as r; "
            "assert not [m for m in sys.modules if m.startswith('pipeline.noise.operators')], sys.modules; "
            "assert not r.OPERATORS")
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("name", sorted(OPERATORS))
def test_every_operator_says_what_it_is(name):
    op = OPERATORS[name]
    assert op.name == op.function.__name__ == name
    assert op.level in NOISE_LEVELS and op.discrepancy and op.kahn
    assert len(op.doc) > 20 and "\n" not in op.doc


def test_registration_is_refused_twice_or_with_an_unknown_level():
    before = dict(OPERATORS)

    def drop_evidence(db, q, params, rng):
        return None

    with pytest.raises(ValueError, match="registered twice"):
        operator(level="record", discrepancy="x", kahn="completeness")(drop_evidence)
    with pytest.raises(ValueError, match="noise level 'row'"):
        operator(level="row", discrepancy="x", kahn="completeness")
    assert dict(OPERATORS) == before


def _question() -> CleanQuestion:
    template = load_templates()[0]
    return CleanQuestion("q1", template, {"subject_id": 1}, 0, "clean?", "SELECT 1", "1",
                         {template.noise.evidence_table: [3, 4]})


PROPOSAL = Proposal(Overlay(), "noisy?", "SELECT 2", "abstain", None, Detector(sql="SELECT 1", clean_sql="SELECT 0"),
                    ["rewrote the question"], {"subject_id": 2})


def test_run_stamps_the_operator_on_its_proposal():
    q = _question()
    op = Operator("hand_made", "query", "false_premise", "plausibility: temporal", lambda *_: PROPOSAL)
    cand = op.run(None, q, OperatorParams(), None)
    assert cand.operator is op and cand.question is q
    assert all(getattr(cand, f.name) == getattr(PROPOSAL, f.name) for f in fields(Proposal))
    assert Operator("declines", "query", "x", "y", lambda *_: None).run(None, q, OperatorParams(), None) is None


def test_pair_record_is_the_column_contract():
    cand = OPERATORS["false_premise"].stamp(_question(), PROPOSAL)
    record = pair_record(cand, {c: True for c in CHECKS}, seed=7)
    assert list(record) == [f.name for f in fields(PairRecord)]
    assert (record["operator"], record["noise_level"], record["discrepancy"]) == (
        "false_premise", OPERATORS["false_premise"].level, OPERATORS["false_premise"].discrepancy)
    assert record["verified"] and record["split"] is None
    shipped = {**record, "split": "test"}
    assert pairs_table([shipped]).to_pylist() == [{k: shipped[k] for k in PAIRS_SCHEMA.names}]
    assert shipped_table([shipped]).schema == SHIPPED_SCHEMA
    assert candidates_table([record]).to_pylist() == [{k: record[k] for k in CANDIDATES_SCHEMA.names}]
    assert set(SHIPPED_SCHEMA.names) - set(PAIRS_SCHEMA.names) == {"changes"}
    assert set(CANDIDATES_SCHEMA.names) ^ set(PAIRS_SCHEMA.names) == {"split", "verified", "failed_check",
                                                                      "changes"}


def _suite_value_sets() -> dict[str, set]:
    suite = load_suite_json("benchmark/pairs")
    return {e["kwargs"]["column"]: set(e["kwargs"]["value_set"]) for e in suite["expectations"]
            if e["type"] == "expect_column_values_to_be_in_set" and isinstance(e["kwargs"]["value_set"], list)}


def test_pairs_suite_agrees_with_the_registry_and_the_record():
    """The GX suite is hand-written JSON: whatever it enumerates must be what the code defines."""
    suite = load_suite_json("benchmark/pairs")
    (columns,) = [e["kwargs"]["column_list"] for e in suite["expectations"]
                  if e["type"] == "expect_table_columns_to_match_ordered_list"]
    assert columns[:len(PAIRS_SCHEMA.names)] == PAIRS_SCHEMA.names
    assert suite["meta"]["one_hot"]["noise_level"] == list(NOISE_LEVELS)
    value_sets = _suite_value_sets()
    expected = {"operator": set(OPERATORS), "discrepancy": {op.discrepancy for op in OPERATORS.values()},
                "noise_level": set(NOISE_LEVELS), "level": set(QUESTION_LEVELS),
                "expected_behavior": set(get_args(Behavior))}
    for column, values in expected.items():
        if column in value_sets:
            assert value_sets[column] == values, f"expectations/benchmark/pairs.json: {column} value_set"
    assert not {"operator", "discrepancy"} & set(value_sets), "operator names belong to the registry, not the suite"


def test_manifest_and_card_describe_every_operator():
    manifest = {"seed": 0, "source": {"kind": "synthetic"},
                "counts": {"pairs": 3, "by_split": {"test": 3}, "by_noise_level": {"query": 3},
                           "by_intent": {"laboratory": 3}, "by_operator": {"false_premise": 3}}}
    catalog = operator_catalog()
    assert set(catalog) == set(OPERATORS)
    card = dataset_card(manifest)
    for name, op in OPERATORS.items():
        assert catalog[name] == {"level": op.level, "discrepancy": op.discrepancy, "kahn": op.kahn, "doc": op.doc}
        (row,) = [line for line in card.splitlines() if line.startswith(f"| `{name}` |")]
        assert op.kahn in row and op.doc in row
        assert row.endswith(f"| {3 if name == 'false_premise' else 0} |")
