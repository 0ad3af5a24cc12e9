"""Labels of the query-level operators (docs/labels.md): what each expects, computed by SQL and
re-checked by verification's ``expected`` check, on the tiny hand-made database of
tests/test_noise_operators.py plus a few rows that make the cases below exist.

Query noise leaves the data clean, so "recoverable" means the question can still be answered
from the data alone: a misspelling resolves to one name, an ambiguous short name is answered per
reading. The others (no such entity, a year without stays, a false premise, an event the patient
never had) expect abstention and carry no recovery SQL.
"""
# ruff: noqa: C408  (hand-made rows read best as dict(column=value, ...))

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from test_noise_operators import CK, DATA, P1, P2, P3, STAGED, TEMPLATES, T, _arrow, _lab

from pipeline.noise.candidates import operator_rng
from pipeline.noise.model import CleanQuestion, OperatorParams, answer_of
from pipeline.noise.operators import OPERATORS
from pipeline.noise.operators.query import EPONYMS, REAL_ABSENT, SYLLABLES
from pipeline.noise.overlay import Database
from pipeline.noise.verify import failed_checks, verify_candidates
from pipeline.questions.samplers import SAMPLERS
from pipeline.questions.templates import render
from pipeline.staging import TableSink

SEEDS = range(16)
EXTRA = {  # P2 had a creatine kinase but never its MB isoenzyme: "creatine kinase" reads one way only
    "labevents": [_lab(16, P2, 20000003, CK, T(2160, 5, 3, 7), "300", "IU/L")],
    "prescriptions": [  # a drug two other patients had, and P1 never
        dict(subject_id=p, hadm_id=h, pharmacy_id=40000100 + p % 10, starttime=T(y, 5, 2), stoptime=T(y, 5, 3),
             drug_type="MAIN", drug="Vancomycin", route="IV") for p, h, y in ((P2, 20000003, 2160), (P3, 20000004, 2170))],
}
QUESTIONS = {  # key -> (template, slots)
    "lab_ck": ("t_lab_last", {"subject_id": P1, "lab_label": "Creatine Kinase (CK)"}),
    "lab_ck_p2": ("t_lab_last", {"subject_id": P2, "lab_label": "Creatine Kinase (CK)"}),
    "lab_k": ("t_lab_last", {"subject_id": P1, "lab_label": "Potassium"}),
    "lab_creat": ("t_lab_last", {"subject_id": P1, "lab_label": "Creatinine"}),
    "rx_count": ("t_rx_count", {"subject_id": P1, "drug": "Furosemide"}),
    "dx_ever": ("t_dx_ever", {"subject_id": P1, "diagnosis": "Acute kidney failure, unspecified"}),
    "dx_patients": ("t_dx_patients", {"diagnosis": "Acute kidney failure, unspecified"}),
    "icu_hours": ("t_icu_hours", {"subject_id": P1}),
    "adm_year": ("t_adm_year", {"subject_id": P1, "year": 2150}),
    "adm_longest": ("t_adm_year_longest", {"subject_id": P1, "year": 2150}),
    "adm_longest_2151": ("t_adm_year_longest", {"subject_id": P1, "year": 2151}),
}
POOLS = {"t_lab_last": ("Creatine Kinase (CK)", "Creatinine", "Potassium", "Sodium")}


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    out = tmp_path_factory.mktemp("labels_query")
    sink = TableSink(out, STAGED)
    for name, rows in DATA.items():
        sink.write(name, _arrow(name, rows + EXTRA.get(name, [])))
    sink.commit()
    database = Database(out)
    yield database
    database.close()


@pytest.fixture(scope="module")
def qs(db):
    out = {}
    for key, (tid, slots) in QUESTIONS.items():
        t = TEMPLATES[tid]
        question, gold, evidence_sql = render(t, slots, 0)
        evidence: dict[str, list[int]] = {}
        for table, rid in db.rows(evidence_sql):
            evidence.setdefault(table, []).append(rid)
        out[key] = CleanQuestion(f"q_{key}", t, slots, 0, question, gold, answer_of(db.rows(gold), t.answer_type),
                                 {k: sorted(v) for k, v in evidence.items()})
    return out


def run(db, q, name, seed=0):
    return OPERATORS[name].run(db, q, OperatorParams(POOLS.get(q.template.id, ())), operator_rng(seed, q.question_id, name))


def proposals(db, q, name):
    """The operator's proposals for ``q`` over many seeds (it may decline some)."""
    return [c for s in SEEDS if (c := run(db, q, name, s)) is not None]


def verified(db, cands):
    """Verification records; each must pass every check, the ``expected`` one included."""
    recs = verify_candidates(db, cands, lambda c: next(x for s in SEEDS if (x := run(db, c.question, c.operator.name, s))
                                                         and x.fingerprint() == c.fingerprint()))
    assert [failed_checks(r) for r in recs] == [[]] * len(cands), recs
    return recs


# ---- nonexistent_entity: never recoverable; the invented value fits the slot's kind
def test_nonexistent_entity_invents_a_value_of_the_slots_kind(db, qs):
    lab = proposals(db, qs["lab_k"], "nonexistent_entity")
    drug = proposals(db, qs["rx_count"], "nonexistent_entity")
    dx = proposals(db, qs["dx_patients"], "nonexistent_entity")
    assert lab and drug and dx
    assert {c.noisy_slots["lab_label"] for c in lab} <= set(REAL_ABSENT["lab_item"])
    assert all(c.noisy_slots["drug"].startswith(tuple(SYLLABLES[0])) for c in drug)
    assert all(c.noisy_slots["diagnosis"].startswith(tuple(EPONYMS))
               and c.noisy_slots["diagnosis"].endswith((" syndrome", " disease")) for c in dx)
    for c in lab + drug + dx:
        assert (c.expected_behavior, c.expected_answer, c.recovery_sql) == ("abstain", None, None)
    verified(db, lab[:3] + drug[:3] + dx[:3])


def test_nonexistent_entity_leaves_half_the_questions_to_other_operators(db, qs):
    share = len(proposals(db, qs["lab_k"], "nonexistent_entity")) / len(SEEDS)
    assert 0.25 <= share <= 0.75


def test_nonexistent_patient_without_an_entity_slot(db, qs):
    cands = proposals(db, qs["icu_hours"], "nonexistent_entity")
    assert cands and all(not db.scalar(f"SELECT count(*) FROM patients WHERE subject_id = {c.noisy_slots['subject_id']}")
                         for c in cands)
    verified(db, cands[:2])


# ---- misspelled_entity: recoverable; the answer is the gold SQL's for the name SQL resolves
def test_misspelled_entity_expects_the_answer_for_the_resolved_name(db, qs):
    for key, slot in (("dx_patients", "diagnosis"), ("lab_creat", "lab_label")):
        q = qs[key]
        cands = proposals(db, q, "misspelled_entity")
        assert cands
        for c in cands:
            assert c.noisy_slots[slot] != q.slots[slot]
            assert c.expected_behavior == "answer"
            assert c.recovery_sql == q.gold_sql  # resolved to the clean name
            assert c.expected_answer == answer_of(db.rows(c.recovery_sql), q.answer_type) == q.answer
            assert c.expected_answer != answer_of(db.rows(c.naive_sql), q.answer_type)
        verified(db, cands[:2])


# ---- window_outside_record: abstain where nothing answers; no pair where "0" / "no" is true
def test_window_outside_record_abstains_when_the_empty_window_has_no_answer(db, qs):
    cands = proposals(db, qs["adm_longest"], "window_outside_record")
    assert cands
    for c in cands:
        assert (c.expected_behavior, c.expected_answer, c.recovery_sql) == ("abstain", None, None)
        assert answer_of(db.rows(c.naive_sql), "integer") is None
    verified(db, cands[:2])


def test_window_outside_record_moves_a_year_drawn_from_events_too(db, qs):
    """Most year templates draw the year from the patient's events (``event_year``), not admissions."""
    q = qs["adm_longest"]
    by_events = replace(q.template, slots=[replace(s, sampler="event_year") if s.name == "year" else s
                                           for s in q.template.slots])
    assert proposals(db, replace(q, template=by_events), "window_outside_record")


def test_window_outside_record_declines_a_count_that_is_literally_zero(db, qs):
    assert proposals(db, qs["adm_year"], "window_outside_record") == []


def test_window_outside_record_keeps_distinct_years_distinct(db, qs):
    """Mirrored about the record's edge: two clean years never move to the same noisy year."""
    years = {key: {c.noisy_slots["year"] for c in proposals(db, qs[key], "window_outside_record")}
             for key in ("adm_longest", "adm_longest_2151")}
    assert years["adm_longest"] and years["adm_longest_2151"]
    assert not years["adm_longest"] & years["adm_longest_2151"]
    first, last = db.rows(f"SELECT min(year(admittime)), max(year(dischtime)) FROM admissions WHERE subject_id = {P1}")[0]
    assert all(y <= first - 3 or y >= last + 3 for ys in years.values() for y in ys)


# ---- false_premise and absent_event: never recoverable
@pytest.mark.parametrize("name", ["false_premise", "absent_event"])
def test_unanswerable_question_expects_abstention_without_recovery(db, qs, name):
    cands = proposals(db, qs["lab_k"], name)
    assert cands
    assert {(c.expected_behavior, c.expected_answer, c.recovery_sql) for c in cands} == {("abstain", None, None)}
    verified(db, cands[:2])


# ---- ambiguous_reference: recoverable per reading, only for a real short name with data for each
def test_ambiguous_reference_answers_every_reading(db, qs):
    q = qs["lab_ck"]
    cands = proposals(db, q, "ambiguous_reference")
    assert cands
    c = cands[0]
    assert c.noisy_slots["lab_label"] == "Creatine Kinase" and c.expected_behavior == "flag"
    assert json.loads(c.expected_answer) == [["Creatine Kinase (CK)", 120.0], ["Creatine Kinase, MB Isoenzyme", 4.0]]
    assert answer_of(db.rows(c.recovery_sql), q.answer_type) == c.expected_answer
    assert answer_of(db.rows(c.naive_sql), q.answer_type) is None
    verified(db, [c])


def test_ambiguous_reference_declines_when_one_reading_has_no_data(db, qs):
    """P2 had creatine kinase but no MB isoenzyme: "creatine kinase" can only mean the one."""
    assert qs["lab_ck_p2"].answer == "300.0"
    assert proposals(db, qs["lab_ck_p2"], "ambiguous_reference") == []


def test_ambiguous_reference_declines_fragments_and_names(db, qs):
    """"Potassium" is itself a name; "Acute kidney failure" heads a single title; no fragments."""
    for key in ("lab_k", "dx_ever", "dx_patients"):
        assert proposals(db, qs[key], "ambiguous_reference") == []


def test_readings_rows_answer_once_per_reading():
    rows = [("b", 2.0), ("a", 1.234), ("c", None)]
    assert answer_of(rows, "number") == '[["a",1.23],["b",2.0]]'
    assert answer_of([("a", None)], "number") is None


# ---- samplers: "ever" questions draw entities the patient never had, too
def test_entity_sampler_draws_among_other_patients_values(db):
    drug = SAMPLERS["drug"].fn
    given = [{"subject_id": P1}] * 200
    own = {r[0] for r in db.rows(f"SELECT drug FROM prescriptions WHERE subject_id = {P1}")}
    only_own = drug(db.con, np.random.default_rng(0), given, patient="subject_id")
    mixed = drug(db.con, np.random.default_rng(0), given, patient="subject_id", others=0.5)
    assert set(only_own) <= own
    foreign = sum(v not in own for v in mixed)
    assert 0 < foreign < len(given) and set(mixed) - own
    assert mixed == drug(db.con, np.random.default_rng(0), given, patient="subject_id", others=0.5)
