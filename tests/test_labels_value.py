"""Labels of the value-level operators (docs/labels.md): each expected answer is what the careful
analyst's data-only recovery SQL gives on the noisy database, and verification (the ``expected``
check included) accepts it. One recoverable and one unrecoverable case per operator where both
exist, on a tiny database staged to real Parquet and loaded into a real DuckDB; every expected
answer below is worked out by hand from these rows.
"""
# ruff: noqa: C408  (hand-made rows read best as dict(column=value, ...))

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pytest

from pipeline.noise.candidates import operator_rng
from pipeline.noise.model import CleanQuestion, OperatorParams, answer_of
from pipeline.noise.operators import OPERATORS
from pipeline.noise.overlay import Database
from pipeline.noise.verify import failed_checks, verify_candidates
from pipeline.plausibility import register_bounds
from pipeline.questions.templates import EntitySlot, NoiseSpec, Slot, Template, render
from pipeline.schema import ROW_ID, TABLES
from pipeline.staging import TableSink

SEED = 7
T = dt.datetime
P1, P2, P3 = 10000001, 10000002, 10000003
H1, H2, H3 = 20000001, 20000002, 20000003
K, CREAT, MYELO = 50971, 50912, 51144


def _lab(subject, hadm, itemid, when, value, valuenum, uom):
    return dict(subject_id=subject, hadm_id=hadm, itemid=itemid, charttime=when, value=value,
                valuenum=valuenum, valueuom=uom)


def _stay(subject, hadm, stay, intime, hours):
    return dict(subject_id=subject, hadm_id=hadm, stay_id=stay, intime=intime,
                outtime=intime + dt.timedelta(hours=hours), los=hours / 24)


DATA: dict[str, list[dict]] = {
    "patients": [dict(subject_id=s, gender="F", anchor_age=60, anchor_year=2150) for s in (P1, P2, P3)],
    "admissions": [
        dict(subject_id=P1, hadm_id=H1, admittime=T(2150, 1, 1, 8), dischtime=T(2150, 1, 8, 12)),
        dict(subject_id=P2, hadm_id=H2, admittime=T(2160, 5, 1, 9), dischtime=T(2160, 5, 10, 9)),
        dict(subject_id=P3, hadm_id=H3, admittime=T(2170, 7, 1, 9), dischtime=T(2170, 7, 5, 9)),
    ],
    "icustays": [  # 60 h, 72 h, 24 h, 12 h: mean 42 h
        _stay(P1, H1, 30000001, T(2150, 1, 2), 60),
        _stay(P2, H2, 30000002, T(2160, 5, 2), 72),
        _stay(P3, H3, 30000003, T(2170, 7, 2), 24),
        _stay(P2, H2, 30000004, T(2160, 5, 6), 12),
    ],
    "d_labitems": [
        dict(itemid=K, label="Potassium", fluid="Blood", category="Chemistry"),  # curated bounds 0.01-30
        dict(itemid=CREAT, label="Creatinine", fluid="Blood", category="Chemistry"),  # curated 0.01-150
        dict(itemid=MYELO, label="Myelocytes", fluid="Blood", category="Hematology"),  # derived 0-100
    ],
    "labevents": [
        _lab(P1, H1, K, T(2150, 1, 2, 6), "3.9", 3.9, "mEq/L"),        # rid 0
        _lab(P1, H1, K, T(2150, 1, 3, 6), "4.0", 4.0, "mEq/L"),        # rid 1
        _lab(P1, H1, K, T(2150, 1, 5, 6), "4.2", 4.2, "mEq/L"),        # rid 2: P1's last potassium
        _lab(P1, H1, CREAT, T(2150, 1, 5, 6), "1.1", 1.1, "mg/dL"),    # rid 3: P1's only creatinine
        _lab(P2, H2, K, T(2160, 5, 2, 7), "3.6", 3.6, "mEq/L"),        # rid 4
        _lab(P2, H2, CREAT, T(2160, 5, 2, 7), "1.3", 1.3, "mg/dL"),    # rid 5
        _lab(P3, H3, K, T(2170, 7, 2, 7), "___", 4.4, "mEq/L"),        # rid 6: text without a number
        _lab(P1, H1, MYELO, T(2150, 1, 2, 6), "0", 0.0, "%"),          # rid 7
        _lab(P2, H2, MYELO, T(2160, 5, 2, 7), "2", 2.0, "%"),          # rid 8
        _lab(P3, H3, MYELO, T(2170, 7, 2, 7), "10", 10.0, "%"),        # rid 9: myelocytes 0-10, mean 4
    ],
    "d_icd_diagnoses": [
        dict(icd_code="N179", icd_version=10, long_title="Acute kidney failure, unspecified"),
        dict(icd_code="5849", icd_version=9, long_title="Acute kidney failure, unspecified"),
        # A string that is a code under both versions (493 such in the demo's dictionary).
        dict(icd_code="V140", icd_version=9, long_title="Personal history of allergy to penicillin"),
        dict(icd_code="V140", icd_version=10, long_title="Pedal cycle driver injured in collision with heavy "
             "transport vehicle or bus in nontraffic accident"),
    ],
    "diagnoses_icd": [
        dict(subject_id=P1, hadm_id=H1, seq_num=1, icd_code="N179", icd_version=10),  # rid 0
        dict(subject_id=P2, hadm_id=H2, seq_num=1, icd_code="V140", icd_version=9),   # rid 1
    ],
}

LAB_JOIN = "FROM labevents l JOIN d_labitems d ON d.itemid = l.itemid WHERE d.label = {{ lab_label|sql }}"
LAB_LAST = (LAB_JOIN + " AND l.subject_id = {{ subject_id|sql }} AND l.valuenum IS NOT NULL AND l.hadm_id = "
            "(SELECT hadm_id FROM admissions WHERE subject_id = {{ subject_id|sql }} ORDER BY admittime LIMIT 1) "
            "QUALIFY rank() OVER (ORDER BY l.charttime DESC) = 1")
LAB_OPS = ("unit_scale", "implausible_value", "unit_label_mismatch", "value_text_conflict", "invalid_code")
LAB_NOISE = NoiseSpec(evidence_table="labevents", value_column="valuenum", time_column="charttime",
                      entity_slot=EntitySlot("lab_label", "d_labitems", "label"), operators=LAB_OPS)
DX = ("FROM diagnoses_icd x JOIN d_icd_diagnoses d ON d.icd_code = x.icd_code AND d.icd_version = x.icd_version "
      "WHERE x.subject_id = {{ subject_id|sql }} AND d.long_title = {{ diagnosis|sql }}")
HOURS = "date_diff('second', intime, outtime) / 3600.0"
ICU_NOISE = NoiseSpec(evidence_table="icustays", value_column="outtime", time_column="intime",
                      operators=("temporal_inversion",))
PATIENT, LAB = Slot("subject_id", "patient", {}), Slot("lab_label", "lab_item", {})

TEMPLATES = {t.id: t for t in [
    Template("lab_last", "laboratory", "patient", ["Last {{ lab_label }} of {{ subject_id }}?", "Q2"],
             f"SELECT l.valuenum {LAB_LAST}", f"SELECT 'labevents', l._rid {LAB_LAST}", [PATIENT, LAB],
             "number", ["labevents", "d_labitems", "admissions"], LAB_NOISE),
    Template("lab_mean", "laboratory", "population", ["Mean {{ lab_label }}?", "Q2"],
             f"SELECT avg(l.valuenum) {LAB_JOIN}", f"SELECT 'labevents', l._rid {LAB_JOIN}", [LAB],
             "number", ["labevents", "d_labitems"], LAB_NOISE),
    Template("dx_ever", "diagnoses", "patient", ["Has {{ subject_id }} had {{ diagnosis }}?", "Q2"],
             f"SELECT count(*) > 0 {DX}", f"SELECT 'diagnoses_icd', x._rid {DX}",
             [PATIENT, Slot("diagnosis", "diagnosis", {})], "boolean", ["diagnoses_icd", "d_icd_diagnoses"],
             NoiseSpec(evidence_table="diagnoses_icd", value_column="icd_code", operators=("invalid_code",))),
    Template("icu_hours", "encounters", "patient", ["Hours of {{ subject_id }}'s first ICU stay?", "Q2"],
             f"SELECT {HOURS} FROM icustays WHERE subject_id = {{{{ subject_id|sql }}}} ORDER BY intime LIMIT 1",
             "SELECT 'icustays', _rid FROM icustays WHERE subject_id = {{ subject_id|sql }} ORDER BY intime LIMIT 1",
             [PATIENT], "number", ["icustays"], ICU_NOISE),
    Template("icu_total_hours", "encounters", "patient", ["Total ICU hours of {{ subject_id }}?", "Q2"],
             f"SELECT sum({HOURS}) FROM icustays WHERE subject_id = {{{{ subject_id|sql }}}}",
             "SELECT 'icustays', _rid FROM icustays WHERE subject_id = {{ subject_id|sql }}",
             [PATIENT], "number", ["icustays"], ICU_NOISE),
    Template("icu_mean_hours", "encounters", "population", ["Mean ICU stay in hours?", "Q2"],
             f"SELECT avg({HOURS}) FROM icustays", "SELECT 'icustays', _rid FROM icustays", [], "number",
             ["icustays"], ICU_NOISE),
]}

QUESTIONS = {
    "k_p1": ("lab_last", {"subject_id": P1, "lab_label": "Potassium"}),
    "k_p3": ("lab_last", {"subject_id": P3, "lab_label": "Potassium"}),
    "creat_p1": ("lab_last", {"subject_id": P1, "lab_label": "Creatinine"}),
    "myelo_mean": ("lab_mean", {"lab_label": "Myelocytes"}),
    "aki_p1": ("dx_ever", {"subject_id": P1, "diagnosis": "Acute kidney failure, unspecified"}),
    "penicillin_p2": ("dx_ever", {"subject_id": P2, "diagnosis": "Personal history of allergy to penicillin"}),
    "icu_p1": ("icu_hours", {"subject_id": P1}),
    "icu_total_p2": ("icu_total_hours", {"subject_id": P2}),
    "icu_mean": ("icu_mean_hours", {}),
}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    out = tmp_path_factory.mktemp("value_labels")
    sink = TableSink(out, tuple(DATA))
    for name, rows in DATA.items():
        schema = TABLES[name].arrow_schema
        rows = [{f.name: r.get(f.name) for f in schema if f.name != ROW_ID} for r in rows]
        sink.write(name, pa.Table.from_pylist(rows, schema=schema.remove(schema.get_field_index(ROW_ID))))
    sink.commit()
    db = Database(out)
    register_bounds(db.con, db.tables)
    questions = {}
    for key, (tid, slots) in QUESTIONS.items():
        template = TEMPLATES[tid]
        question, gold, evidence_sql = render(template, slots, 0)
        evidence: dict[str, list[int]] = {}
        for table, rid in db.rows(evidence_sql):
            evidence.setdefault(table, []).append(rid)
        questions[key] = CleanQuestion(f"q_{key}", template, slots, 0, question, gold,
                                       answer_of(db.rows(gold), template.answer_type),
                                       {t: sorted(r) for t, r in evidence.items()})
    yield db, questions
    db.close()


def run(db, q, name):
    return OPERATORS[name].run(db, q, OperatorParams(), operator_rng(SEED, q.question_id, name))


def verified(world, key: str, name: str, behavior: str, answer: str | None):
    """The operator's candidate for question ``key``: expected behaviour and answer as given, its
    recovery SQL data-only (no _rid) and present exactly when there is an answer, and every
    verification check (``expected`` included) passed."""
    db, questions = world
    cand = run(db, questions[key], name)
    assert cand is not None, f"{name} declined {key}"
    assert (cand.expected_behavior, cand.expected_answer) == (behavior, answer), cand.change_log
    assert (cand.recovery_sql is None) == (answer is None)
    assert cand.recovery_sql is None or "_rid" not in cand.recovery_sql
    rec = verify_candidates(db, [cand], lambda c: run(db, c.question, name))[0]
    assert failed_checks(rec) == [], rec
    assert rec["naive_answer"] != (answer or questions[key].answer)
    return cand, rec


def noisy_rows(db, cand, sql):
    with db.noisy(cand.overlay):
        return db.rows(sql)


def test_clean_answers_by_hand(world):
    _, qs = world
    assert {k: q.answer for k, q in qs.items()} == {
        "k_p1": "4.2", "k_p3": "4.4", "creat_p1": "1.1", "myelo_mean": "4.0", "aki_p1": "true",
        "penicillin_p2": "true", "icu_p1": "60.0", "icu_total_p2": "84.0",
        "icu_mean": "42.0"}


def test_unit_scale_divides_back_by_the_only_factor_that_fits(world):
    db, _ = world
    # 4.2 x10 = 42 > 30; of 4.2 and 0.42 only 4.2 lies in potassium's values (3.6-4.4)
    cand, rec = verified(world, "k_p1", "unit_scale", "flag", "4.2")
    assert rec["naive_answer"] == "42.0"
    # myelocytes 0-10, bound 100: x100 (1000 -> 10 or 1?) is ambiguous, x1000 (10000 -> only 10) is not
    cand, rec = verified(world, "myelo_mean", "unit_scale", "flag", "4.0")
    assert noisy_rows(db, cand, f"SELECT valuenum FROM labevents WHERE itemid = {MYELO} ORDER BY 1") == [
        (0.0,), (2.0,), (10000.0,)]
    assert rec["naive_answer"] == "3334.0"


def test_implausible_value_sets_the_impossible_value_aside(world):
    # recoverable: the last potassium without the impossible one is the previous, 4.0
    cand, _ = verified(world, "k_p1", "implausible_value", "flag", "4.0")
    assert "NOT BETWEEN" not in cand.recovery_sql and "30.0" in cand.recovery_sql  # bounds inlined
    # unrecoverable: P1's only creatinine set aside leaves nothing
    verified(world, "creat_p1", "implausible_value", "flag", None)


def test_unit_label_mismatch_converts_the_unit_back(world):
    db, _ = world
    cand, rec = verified(world, "creat_p1", "unit_label_mismatch", "flag", "1.1")
    assert noisy_rows(db, cand, f"SELECT valuenum, valueuom FROM labevents WHERE itemid = {CREAT} "
                                f"AND subject_id = {P1}") == [(97.262, "umol/L")]
    assert rec["naive_answer"] == "97.26"


def test_value_text_conflict_reads_the_charted_text(world):
    db, qs = world
    cand, _ = verified(world, "k_p1", "value_text_conflict", "flag", "4.2")
    assert noisy_rows(db, cand, "SELECT value FROM labevents WHERE valuenum <> 4.2 AND value = '4.2'") == [("4.2",)]
    assert run(db, qs["k_p3"], "value_text_conflict") is None  # text "___": nothing to read back


def test_invalid_code_version_flip_is_read_back_mangled_code_is_not(world):
    db, _ = world
    # recoverable: N179 under ICD-9 does not exist, under ICD-10 (its only version) it does
    cand, rec = verified(world, "aki_p1", "invalid_code", "flag", "true")
    assert noisy_rows(db, cand, f"SELECT icd_code, icd_version FROM diagnoses_icd WHERE subject_id = {P1}") == [
        ("N179", 9)]
    assert rec["naive_answer"] == "false"
    # unrecoverable: V140 is a code in both versions, so it is mangled into a code of neither
    cand, _ = verified(world, "penicillin_p2", "invalid_code", "flag", None)
    assert noisy_rows(db, cand, f"SELECT icd_code, icd_version FROM diagnoses_icd WHERE subject_id = {P2}") == [
        ("V1409", 9)]
    # unrecoverable: an itemid with no dictionary entry
    verified(world, "k_p1", "invalid_code", "flag", None)


def test_temporal_inversion_is_a_whole_hour_slip(world):
    db, qs = world
    # unrecoverable for the patient: the first stay's end is lost (and its los with it)
    cand, _ = verified(world, "icu_p1", "temporal_inversion", "abstain", None)
    (intime, outtime, los), = noisy_rows(db, cand, f"SELECT intime, outtime, los FROM icustays WHERE subject_id = {P1}")
    slip = intime - outtime
    assert dt.timedelta(hours=1) <= slip <= dt.timedelta(hours=17) and slip.seconds % 3600 == 0
    assert los == -slip.total_seconds() / 86400
    # a patient's total rests on every one of their stays: abstain, not the sum of the others
    verified(world, "icu_total_p2", "temporal_inversion", "abstain", None)
    # population mean: the one lost end is set aside, the rest answer (60, 72, 24, 12 h by stay)
    cand = run(db, qs["icu_mean"], "temporal_inversion")
    rid = cand.overlay.changes[0].rid
    rest = [h for i, h in enumerate((60, 72, 24, 12)) if i != rid]
    verified(world, "icu_mean", "temporal_inversion", "flag", answer_of([(sum(rest) / 3,)], "number"))
