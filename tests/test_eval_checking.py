"""The label-free ``checking`` agent on a small benchmark built by the real pipeline (synthetic
source, two lab templates): it answers clean questions right, abstains where the evidence is gone,
flags duplicates, value/text conflicts and implausible values with the right category, and never touches the labels."""

from __future__ import annotations

import random
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from pipeline.eval.agent import make_agent
from pipeline.eval.agents.checking import INT_SAMPLERS, _parse, _swap_tables, read_question
from pipeline.gym.env import Env
from pipeline.noise.export import overlays_table, pairs_table
from pipeline.noise.pairs import candidate_records
from pipeline.questions.generate import generate_questions
from pipeline.questions.templates import load_templates, render
from pipeline.sources import make_source
from pipeline.staging import stage

TEMPLATES = ("lab_last_value_first_admission", "lab_max_value_last_admission", "dx_first_listed_first_admission")


@pytest.fixture(scope="module")
def bench(tmp_path_factory) -> Path:
    """Every verified pair of two lab templates and a diagnosis one over 40 synthetic patients (~15 s)."""
    folder = tmp_path_factory.mktemp("checking")
    stage(make_source("synthetic", None, patients=40, seed=0), folder / "staged")
    templates = [t for t in load_templates() if t.id in TEMPLATES]
    questions, _ = generate_questions(folder / "staged", 0, templates, 6, workers=1)
    records, _ = candidate_records(folder / "staged", questions, 0, workers=1)
    pairs = [{**r, "split": "test"} for r in records if r["verified"]]
    pq.write_table(pairs_table(pairs), folder / "pairs.parquet")
    pq.write_table(overlays_table(pairs), folder / "overlays.parquet")
    return folder


@pytest.fixture(scope="module")
def env(bench):
    with Env(bench) as env:
        yield env


@pytest.fixture(scope="module")
def pairs(bench) -> list[dict]:
    return pq.read_table(bench / "pairs.parquet").to_pylist()


def play(env: Env, pair_id: str, side: str) -> tuple[dict, dict]:
    """(the terminal call, the verdict) of one checking episode."""
    start = env.reset(pair_id, side)
    make_agent("checking").play(env, start, None, random.Random(0))
    assert env.state.done, "the agent must end every episode itself"
    call = next(m["tool_calls"][0]["function"] for m in reversed(env.messages) if m.get("tool_calls"))
    return call, env.verdict


def of(pairs: list[dict], operator: str) -> list[dict]:
    chosen = [p for p in pairs if p["operator"] == operator]
    assert chosen, f"the small benchmark has no {operator} pair (its seed or templates changed)"
    return chosen


def test_reads_every_question_back_to_its_template(pairs):
    for p in pairs:
        readings = read_question(p["clean_question"])
        assert readings and readings[0].template.id == p["template_id"], p["clean_question"]


def _example_slots(template) -> dict:
    values = {}
    for slot in template.slots:
        if slot.sampler == "choice":
            values[slot.name] = slot.params["values"][0]
        elif slot.sampler in INT_SAMPLERS:
            values[slot.name] = 3
        elif slot.sampler == "threshold":
            values[slot.name] = 1.5
        else:
            values[slot.name] = "Urea Nitrogen"
    return values


def test_swapping_a_table_keeps_a_parenthesised_join():
    """Diagnosis templates join the dictionary inside parentheses: a probe reading the table from its
    repaired copy must keep that join (it was dropped, widening the evidence to every diagnosis)."""
    gold = ("SELECT count(x.hadm_id) > 0 FROM admissions a LEFT JOIN (diagnoses_icd x JOIN d_icd_diagnoses d "
            "ON d.icd_code = x.icd_code AND d.long_title = 'Sepsis') ON x.hadm_id = a.hadm_id")
    swapped = _swap_tables(_parse(gold), {"diagnoses_icd": "diagnoses_icd__fixed"}).sql(dialect="duckdb")
    assert "(diagnoses_icd__fixed AS x JOIN d_icd_diagnoses AS d ON" in swapped, swapped
    assert "long_title = 'Sepsis'" in swapped


@pytest.mark.parametrize("grammar", ["|article", "|plural", "|with_word"])
def test_reads_back_questions_rendered_through_the_grammar_filters(grammar):
    read = 0
    for template in load_templates():
        for variant, text in enumerate(template.questions):
            if grammar not in text:
                continue
            question = render(template, _example_slots(template), variant)[0]
            assert template.id in {r.template.id for r in read_question(question)}, question
            read += 1
    assert read >= 2


def test_answers_clean_questions_correctly(env, pairs):
    for p in pairs:
        call, verdict = play(env, p["pair_id"], "clean")
        assert call["name"] == "answer" and verdict["correct"], (p["clean_question"], verdict)


@pytest.mark.parametrize("operator, tool", [("drop_evidence", "abstain"), ("value_text_conflict", "flag"),
                                            ("duplicate_conflict", "flag"), ("implausible_value", "flag"),
                                            ("nonexistent_entity", "abstain"), ("invalid_code", "flag"),
                                            ("orphan_link", None)])
def test_catches_the_noise(env, pairs, operator, tool):
    """``tool=None``: the pair's own behaviour (a dangling link is re-linked and flagged where one stay
    fits the row, abstained from where none or several do)."""
    for p in of(pairs, operator):
        call, verdict = play(env, p["pair_id"], "noise")
        assert call["name"] == (tool or p["expected_behavior"]), (p["noisy_question"], p["change_log"], verdict)
        assert verdict["correct"], (p["noisy_question"], p["change_log"], verdict)


class Sealed:
    """An Env the agent can only step: any other attribute (the pair, its gold, the overlay) raises."""

    def __init__(self, env: Env):
        object.__setattr__(self, "_env", env)

    def __getattr__(self, name):
        if name == "step":
            return object.__getattribute__(self, "_env").step
        raise AssertionError(f"the checking agent read env.{name}")


def test_never_reads_labels(env, pairs, bench, monkeypatch):
    """Only the first observation and tool calls: no task, no Env internals, no benchmark files."""
    def refuse(*args, **kwargs):
        raise AssertionError(f"the checking agent read a file: {args[:1]}")

    p = of(pairs, "duplicate_conflict")[0]
    start = env.reset(p["pair_id"], "noise")
    monkeypatch.setattr(pq, "read_table", refuse)
    monkeypatch.setattr("builtins.open", refuse)
    agent = make_agent("checking")
    assert agent.uses_labels is False
    agent.play(Sealed(env), start, None, random.Random(0))
    monkeypatch.undo()
    assert env.state.done and env.verdict["correct"], env.verdict
