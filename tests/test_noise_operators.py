"""The perturbation operators and their mechanical verification, on a tiny hand-made database.

A handful of rows per table is staged to real Parquet with :class:`TableSink` and loaded into a
real DuckDB :class:`Database`. Each clean question has an answer worked out by hand from those
rows; every operator is run on a question it suits, its overlay is applied and inspected through
the MIMIC table names, and :func:`verify_candidates` must pass all five checks. Broken operators
(irrelevant change, undetectable change, undeclared no-op, nondeterminism, no effect) must be
rejected by the check that names their fault.
"""
# ruff: noqa: C408  (hand-made rows read best as dict(column=value, ...))

from __future__ import annotations

import datetime as dt
import difflib
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import pyarrow as pa
import pytest

from pipeline.noise.candidates import operator_rng, run_operator
from pipeline.noise.model import (
    AMBIGUOUS,
    Candidate,
    CleanQuestion,
    Detector,
    OperatorParams,
    Proposal,
    answer_of,
)
from pipeline.noise.operators import OPERATORS
from pipeline.noise.operators.common import record_proposal, recovered, relinked, restricted, stay_fits, update
from pipeline.noise.overlay import Change, Database, Overlay
from pipeline.noise.registry import NOISE_LEVELS, Operator
from pipeline.noise.verify import (
    CHECKS,
    expected_outcome,
    failed_checks,
    verify_candidates,
)
from pipeline.plausibility import register_bounds
from pipeline.questions.evidence import check_evidence, evidence_violations
from pipeline.questions.templates import EntitySlot, NoiseSpec, Slot, Template, render
from pipeline.schema import ROW_ID, TABLES
from pipeline.staging import TableSink

SEED = 20240611
T = dt.datetime

# ----------------------------------------------------------------------------------------------
# The tiny staged database. _rid is the row's position in its list (TableSink numbers rows).
# ----------------------------------------------------------------------------------------------
P1, P2, P3 = 10000001, 10000002, 10000003
H1, H2, H3, H4 = 20000001, 20000002, 20000003, 20000004  # H1, H2: P1's first and second stays
S1, S2 = 30000001, 30000002
K, NA, CREAT, K_WB, BE, K_ART = 50971, 50983, 50912, 50822, 50802, 50833
CK, CK_MB = 50910, 50911
FOLEY = 226559


def _lab(lid, subject, hadm, itemid, when, value, uom, lo=None, hi=None, flag=None):
    return dict(labevent_id=lid, subject_id=subject, hadm_id=hadm, specimen_id=900 + lid, itemid=itemid,
                charttime=when, storetime=when + dt.timedelta(hours=1), value=value, valuenum=float(value),
                valueuom=uom, ref_range_lower=lo, ref_range_upper=hi, flag=flag, priority="ROUTINE")


DATA: dict[str, list[dict]] = {
    "patients": [
        dict(subject_id=P1, gender="F", anchor_age=60, anchor_year=2150, anchor_year_group="2014 - 2016"),
        dict(subject_id=P2, gender="M", anchor_age=70, anchor_year=2160, anchor_year_group="2014 - 2016"),
        dict(subject_id=P3, gender="F", anchor_age=50, anchor_year=2170, anchor_year_group="2017 - 2019"),
    ],
    "admissions": [
        dict(subject_id=P1, hadm_id=H1, admittime=T(2150, 1, 1, 8), dischtime=T(2150, 1, 6, 12),
             admission_type="EW EMER.", hospital_expire_flag=0),
        dict(subject_id=P1, hadm_id=H2, admittime=T(2151, 3, 1, 10), dischtime=T(2151, 3, 4, 10),
             admission_type="ELECTIVE", hospital_expire_flag=0),
        dict(subject_id=P2, hadm_id=H3, admittime=T(2160, 5, 1, 9), dischtime=T(2160, 5, 10, 9),
             admission_type="EW EMER.", hospital_expire_flag=0),
        dict(subject_id=P3, hadm_id=H4, admittime=T(2170, 7, 1, 9), dischtime=T(2170, 7, 3, 9),
             admission_type="ELECTIVE", hospital_expire_flag=0),
    ],
    "icustays": [
        dict(subject_id=P1, hadm_id=H1, stay_id=S1, first_careunit="Medical Intensive Care Unit (MICU)",
             last_careunit="Medical Intensive Care Unit (MICU)", intime=T(2150, 1, 2), outtime=T(2150, 1, 4, 12),
             los=2.5),
        dict(subject_id=P2, hadm_id=H3, stay_id=S2, first_careunit="Surgical Intensive Care Unit (SICU)",
             last_careunit="Surgical Intensive Care Unit (SICU)", intime=T(2160, 5, 2), outtime=T(2160, 5, 5),
             los=3.0),
    ],
    "d_labitems": [
        dict(itemid=K, label="Potassium", fluid="Blood", category="Chemistry"),
        dict(itemid=NA, label="Sodium", fluid="Blood", category="Chemistry"),
        dict(itemid=CREAT, label="Creatinine", fluid="Blood", category="Chemistry"),
        dict(itemid=K_WB, label="Potassium, Whole Blood", fluid="Blood", category="Blood Gas"),
        dict(itemid=BE, label="Base Excess", fluid="Blood", category="Blood Gas"),
        dict(itemid=K_ART, label="Potassium, Arterial", fluid="Blood", category="Blood Gas"),
        dict(itemid=CK, label="Creatine Kinase (CK)", fluid="Blood", category="Chemistry"),
        dict(itemid=CK_MB, label="Creatine Kinase, MB Isoenzyme", fluid="Blood", category="Chemistry"),
    ],
    "labevents": [
        _lab(1, P1, H1, K, T(2150, 1, 2, 6), "3.9", "mEq/L", 3.3, 5.1),      # rid 0
        _lab(2, P1, H1, K, T(2150, 1, 3, 6), "4.0", "mEq/L", 3.3, 5.1),      # rid 1
        _lab(3, P1, H1, K, T(2150, 1, 5, 6), "4.2", "mEq/L", 3.3, 5.1),      # rid 2: last K of H1
        _lab(4, P1, H1, CREAT, T(2150, 1, 2, 6), "0.9", "mg/dL", 0.5, 1.2),  # rid 3
        _lab(5, P1, H1, CREAT, T(2150, 1, 5, 6), "1.1", "mg/dL", 0.5, 1.2),  # rid 4: last creatinine
        _lab(6, P1, H2, K, T(2151, 3, 2, 8), "5.0", "mEq/L", 3.3, 5.1),      # rid 5
        _lab(7, P1, H2, NA, T(2151, 3, 2, 8), "140", "mEq/L", 133, 145),     # rid 6
        _lab(8, P2, H3, K, T(2160, 5, 2, 7), "3.6", "mEq/L", 3.3, 5.1),      # rid 7
        _lab(9, P2, H3, CREAT, T(2160, 5, 2, 7), "1.3", "mg/dL", 0.5, 1.2, "abnormal"),  # rid 8
        _lab(10, P1, H1, K_WB, T(2150, 1, 2, 6, 30), "3.8", "mEq/L"),        # rid 9
        _lab(11, P1, H1, BE, T(2150, 1, 2, 6, 30), "-3", "mEq/L"),           # rid 10: negative values
        _lab(12, P2, H3, BE, T(2160, 5, 2, 7), "2", "mEq/L"),                # rid 11
        _lab(13, P1, H1, K_ART, T(2150, 1, 2, 6, 30), "3.7", "mEq/L"),       # rid 12
        _lab(14, P1, H1, CK, T(2150, 1, 3, 6), "120", "IU/L"),               # rid 13: "creatine kinase"
        _lab(15, P1, H1, CK_MB, T(2150, 1, 3, 6), "4", "ng/mL"),             # rid 14: reads two ways
    ],
    "d_icd_diagnoses": [
        dict(icd_code="N179", icd_version=10, long_title="Acute kidney failure, unspecified"),
        dict(icd_code="5849", icd_version=9, long_title="Acute kidney failure, unspecified"),
        dict(icd_code="I10", icd_version=10, long_title="Essential (primary) hypertension"),
        dict(icd_code="J9600", icd_version=10,
             long_title="Acute respiratory failure, unspecified whether with hypoxia or hypercapnia"),
        dict(icd_code="I214", icd_version=10, long_title="Non-ST elevation (NSTEMI) myocardial infarction"),
        dict(icd_code="E119", icd_version=10, long_title="Type 2 diabetes mellitus without complications"),
    ],
    "diagnoses_icd": [
        dict(subject_id=P1, hadm_id=H1, seq_num=1, icd_code="N179", icd_version=10),   # rid 0
        dict(subject_id=P1, hadm_id=H1, seq_num=2, icd_code="I10", icd_version=10),    # rid 1
        dict(subject_id=P1, hadm_id=H2, seq_num=1, icd_code="I10", icd_version=10),    # rid 2
        dict(subject_id=P1, hadm_id=H2, seq_num=2, icd_code="E119", icd_version=10),   # rid 3
        dict(subject_id=P1, hadm_id=H2, seq_num=3, icd_code="I214", icd_version=10),   # rid 4
        dict(subject_id=P2, hadm_id=H3, seq_num=1, icd_code="5849", icd_version=9),    # rid 5
        dict(subject_id=P2, hadm_id=H3, seq_num=2, icd_code="J9600", icd_version=10),  # rid 6
    ],
    "prescriptions": [
        dict(subject_id=P1, hadm_id=H1, pharmacy_id=40000001, starttime=T(2150, 1, 1, 12),
             stoptime=T(2150, 1, 2, 12), drug_type="MAIN", drug="Furosemide", route="IV"),          # rid 0
        dict(subject_id=P1, hadm_id=H1, pharmacy_id=40000002, starttime=T(2150, 1, 3, 8),
             stoptime=T(2150, 1, 5, 8), drug_type="MAIN", drug="Furosemide", route="PO"),           # rid 1
        dict(subject_id=P1, hadm_id=H1, pharmacy_id=40000003, starttime=T(2150, 1, 2, 9),
             stoptime=T(2150, 1, 6, 9), drug_type="MAIN", drug="Heparin", route="SC"),              # rid 2
        dict(subject_id=P2, hadm_id=H3, pharmacy_id=40000004, starttime=T(2160, 5, 1, 12),
             stoptime=T(2160, 5, 3, 12), drug_type="MAIN", drug="Furosemide", route="IV"),          # rid 3
        dict(subject_id=P1, hadm_id=H2, pharmacy_id=40000005, starttime=T(2151, 3, 1, 12),
             stoptime=T(2151, 3, 3, 12), drug_type="MAIN", drug="Metoprolol Tartrate", route="PO"),  # rid 4
    ],
    "d_items": [
        dict(itemid=FOLEY, label="Foley", abbreviation="Foley", linksto="outputevents", category="Output",
             unitname="mL", param_type="Numeric"),
    ],
    "outputevents": [
        dict(subject_id=P1, hadm_id=H1, stay_id=S1, charttime=T(2150, 1, 2, 6), itemid=FOLEY, value=300.0,
             valueuom="mL"),  # rid 0
        dict(subject_id=P1, hadm_id=H1, stay_id=S1, charttime=T(2150, 1, 3, 6), itemid=FOLEY, value=450.0,
             valueuom="mL"),  # rid 1
        dict(subject_id=P2, hadm_id=H3, stay_id=S2, charttime=T(2160, 5, 3, 6), itemid=FOLEY, value=500.0,
             valueuom="mL"),  # rid 2
    ],
}
STAGED = tuple(DATA) + ("inputevents",)  # inputevents: staged empty by commit()


def _arrow(name: str, rows: list[dict]) -> pa.Table:
    schema = TABLES[name].arrow_schema
    schema = schema.remove(schema.get_field_index(ROW_ID))
    return pa.Table.from_pylist(rows, schema=schema)


# ----------------------------------------------------------------------------------------------
# Hand-written templates, and the clean questions with their hand-computed answers.
# ----------------------------------------------------------------------------------------------
FIRST_HADM = "(SELECT hadm_id FROM admissions WHERE subject_id = {{ subject_id|sql }} ORDER BY admittime, hadm_id LIMIT 1)"
LAB_FILTER = f"""FROM labevents l JOIN d_labitems d ON d.itemid = l.itemid
    WHERE l.subject_id = {{{{ subject_id|sql }}}} AND d.label = {{{{ lab_label|sql }}}} AND d.fluid = 'Blood'
      AND l.valuenum IS NOT NULL AND l.hadm_id = {FIRST_HADM}
    QUALIFY rank() OVER (ORDER BY l.charttime DESC) = 1"""
LAB_NOISE = NoiseSpec(evidence_table="labevents", value_column="valuenum", time_column="charttime",
                      entity_slot=EntitySlot("lab_label", "d_labitems", "label"),
                      operators=("drop_evidence", "duplicate_exact", "duplicate_conflict", "orphan_link",
                                 "time_displaced", "missing_timestamp", "unit_scale", "implausible_value",
                                 "unit_label_mismatch", "value_text_conflict", "invalid_code", "absent_event",
                                 "nonexistent_entity", "misspelled_entity", "false_premise",
                                 "ambiguous_reference"))
DX_ENTITY = EntitySlot("diagnosis", "d_icd_diagnoses", "long_title")
DX_JOIN = "diagnoses_icd x JOIN d_icd_diagnoses d ON d.icd_code = x.icd_code AND d.icd_version = x.icd_version"

TEMPLATES = {t.id: t for t in [
    Template(
        "t_lab_last", "laboratory", "patient",
        ["What was the last {{ lab_label }} value of patient {{ subject_id }} during their first hospital stay?",
         "During patient {{ subject_id }}'s first admission, what was the most recent {{ lab_label }} result?"],
        f"SELECT l.valuenum {LAB_FILTER}", f"SELECT 'labevents' AS table_name, l._rid {LAB_FILTER}",
        [Slot("subject_id", "patient", {"source": "lab"}), Slot("lab_label", "lab_item", {"patient": "subject_id"})],
        "number", ["labevents", "d_labitems", "admissions"], LAB_NOISE),
    Template(
        "t_icu_hours", "encounters", "patient",
        ["How many hours did patient {{ subject_id }}'s first ICU stay last?",
         "What was the length in hours of patient {{ subject_id }}'s earliest ICU stay?"],
        "SELECT date_diff('second', intime, outtime) / 3600.0 FROM icustays "
        "WHERE subject_id = {{ subject_id|sql }} ORDER BY intime, stay_id LIMIT 1",
        "SELECT 'icustays' AS table_name, _rid FROM icustays "
        "WHERE subject_id = {{ subject_id|sql }} ORDER BY intime, stay_id LIMIT 1",
        [Slot("subject_id", "patient", {"source": "icu_stay"})], "number", ["icustays"],
        NoiseSpec(evidence_table="icustays", value_column="outtime", time_column="intime",
                  operators=("drop_evidence", "temporal_inversion", "missing_timestamp", "nonexistent_entity"))),
    Template(
        "t_rx_count", "medications", "patient",
        ["How many {{ drug }} orders did patient {{ subject_id }} receive during their first hospital stay?",
         "During their first admission, how many times was {{ drug }} prescribed to patient {{ subject_id }}?"],
        f"SELECT count(*) FROM prescriptions WHERE subject_id = {{{{ subject_id|sql }}}} "
        f"AND drug = {{{{ drug|sql }}}} AND hadm_id = {FIRST_HADM}",
        f"SELECT 'prescriptions' AS table_name, _rid FROM prescriptions WHERE subject_id = {{{{ subject_id|sql }}}} "
        f"AND drug = {{{{ drug|sql }}}} AND hadm_id = {FIRST_HADM}",
        [Slot("subject_id", "patient", {"source": "drug"}), Slot("drug", "drug", {"patient": "subject_id"})],
        "integer", ["prescriptions", "admissions"],
        NoiseSpec(evidence_table="prescriptions", time_column="starttime",
                  entity_slot=EntitySlot("drug", "prescriptions", "drug"),
                  operators=("duplicate_exact", "nonexistent_entity", "misspelled_entity", "temporal_inversion"))),
    Template(
        "t_rx_first", "medications", "patient",
        ["When did patient {{ subject_id }} first start {{ drug }} during their first hospital stay?"],
        f"SELECT min(starttime) FROM prescriptions WHERE subject_id = {{{{ subject_id|sql }}}} "
        f"AND drug = {{{{ drug|sql }}}} AND hadm_id = {FIRST_HADM}",
        f"SELECT 'prescriptions' AS table_name, _rid FROM prescriptions WHERE subject_id = {{{{ subject_id|sql }}}} "
        f"AND drug = {{{{ drug|sql }}}} AND hadm_id = {FIRST_HADM} QUALIFY rank() OVER (ORDER BY starttime) = 1",
        [Slot("subject_id", "patient", {"source": "drug"}), Slot("drug", "drug", {"patient": "subject_id"})],
        "datetime", ["prescriptions", "admissions"],
        NoiseSpec(evidence_table="prescriptions", time_column="starttime", operators=("time_displaced",))),
    Template(
        "t_dx_ever", "diagnoses", "patient",
        ["Has patient {{ subject_id }} ever been diagnosed with {{ diagnosis }}?",
         "Is there a recorded diagnosis of {{ diagnosis }} for patient {{ subject_id }}?"],
        f"SELECT count(*) > 0 FROM {DX_JOIN} WHERE x.subject_id = {{{{ subject_id|sql }}}} "
        "AND d.long_title = {{ diagnosis|sql }}",
        f"SELECT 'diagnoses_icd' AS table_name, x._rid FROM {DX_JOIN} WHERE x.subject_id = {{{{ subject_id|sql }}}} "
        "AND d.long_title = {{ diagnosis|sql }}",
        [Slot("subject_id", "patient", {"source": "diagnosis"}),
         Slot("diagnosis", "diagnosis", {"patient": "subject_id"})],
        "boolean", ["diagnoses_icd", "d_icd_diagnoses"],
        NoiseSpec(evidence_table="diagnoses_icd", value_column="icd_code", entity_slot=DX_ENTITY,
                  operators=("invalid_code", "ambiguous_reference", "misspelled_entity"))),
    Template(
        "t_dx_patients", "diagnoses", "population",
        ["How many patients have been diagnosed with {{ diagnosis }}?",
         "What is the number of distinct patients with a recorded diagnosis of {{ diagnosis }}?"],
        f"SELECT count(DISTINCT x.subject_id) FROM {DX_JOIN} WHERE d.long_title = {{{{ diagnosis|sql }}}}",
        f"SELECT 'diagnoses_icd' AS table_name, x._rid FROM {DX_JOIN} WHERE d.long_title = {{{{ diagnosis|sql }}}}",
        [Slot("diagnosis", "diagnosis", {})], "integer", ["diagnoses_icd", "d_icd_diagnoses"],
        NoiseSpec(evidence_table="diagnoses_icd", value_column="icd_code", entity_slot=DX_ENTITY,
                  operators=("misspelled_entity", "nonexistent_entity", "ambiguous_reference"))),
    Template(
        "t_adm_year", "encounters", "patient",
        ["How many times was patient {{ subject_id }} admitted to the hospital in {{ year }}?",
         "In {{ year }}, how many hospital admissions did patient {{ subject_id }} have?"],
        "SELECT count(*) FROM admissions WHERE subject_id = {{ subject_id|sql }} AND year(admittime) = {{ year }}",
        "SELECT 'admissions' AS table_name, _rid FROM admissions "
        "WHERE subject_id = {{ subject_id|sql }} AND year(admittime) = {{ year }}",
        [Slot("subject_id", "patient", {"source": "admission"}), Slot("year", "year", {"patient": "subject_id"})],
        "integer", ["admissions"],
        NoiseSpec(evidence_table="admissions", time_column="admittime", window=("year",),
                  operators=("window_outside_record",))),
    Template(
        "t_adm_year_longest", "encounters", "patient",
        ["How many days did patient {{ subject_id }}'s longest hospital stay that began in {{ year }} last?",
         "In {{ year }}, what was patient {{ subject_id }}'s longest hospital stay, in days?"],
        "SELECT max(date_diff('day', admittime, dischtime)) FROM admissions "
        "WHERE subject_id = {{ subject_id|sql }} AND year(admittime) = {{ year }}",
        "SELECT 'admissions' AS table_name, _rid FROM admissions "
        "WHERE subject_id = {{ subject_id|sql }} AND year(admittime) = {{ year }}",
        [Slot("subject_id", "patient", {"source": "admission"}), Slot("year", "year", {"patient": "subject_id"})],
        "integer", ["admissions"],
        NoiseSpec(evidence_table="admissions", time_column="admittime", window=("year",),
                  operators=("window_outside_record",))),
    Template(
        "t_foley_first_icu", "icu_monitoring", "patient",
        ["How much {{ output_label }} output did patient {{ subject_id }} have during their first ICU stay?",
         "What was patient {{ subject_id }}'s total {{ output_label }} output in their earliest ICU stay?"],
        "SELECT sum(o.value) FROM outputevents o JOIN d_items d ON d.itemid = o.itemid "
        "WHERE d.label = {{ output_label|sql }} AND o.stay_id = (SELECT stay_id FROM icustays "
        "WHERE subject_id = {{ subject_id|sql }} ORDER BY intime, stay_id LIMIT 1)",
        "SELECT 'outputevents' AS table_name, o._rid FROM outputevents o JOIN d_items d ON d.itemid = o.itemid "
        "WHERE d.label = {{ output_label|sql }} AND o.stay_id = (SELECT stay_id FROM icustays "
        "WHERE subject_id = {{ subject_id|sql }} ORDER BY intime, stay_id LIMIT 1)",
        [Slot("subject_id", "patient", {"source": "icu_stay"}),
         Slot("output_label", "output_item", {"patient": "subject_id"})],
        "number", ["outputevents", "d_items", "icustays"],
        NoiseSpec(evidence_table="outputevents", value_column="value", time_column="charttime",
                  entity_slot=EntitySlot("output_label", "d_items", "label"),
                  operators=("orphan_link", "unit_scale"))),
]}

# key -> (template, slots, hand-computed clean answer as normalised JSON, evidence rids)
QUESTIONS = {
    "lab_k": ("t_lab_last", {"subject_id": P1, "lab_label": "Potassium"}, "4.2", {"labevents": [2]}),
    "lab_creat": ("t_lab_last", {"subject_id": P1, "lab_label": "Creatinine"}, "1.1", {"labevents": [4]}),
    "lab_be": ("t_lab_last", {"subject_id": P1, "lab_label": "Base Excess"}, "-3.0", {"labevents": [10]}),
    "icu_hours": ("t_icu_hours", {"subject_id": P1}, "60.0", {"icustays": [0]}),  # 01-02 00:00 -> 01-04 12:00
    "rx_count": ("t_rx_count", {"subject_id": P1, "drug": "Furosemide"}, "2", {"prescriptions": [0, 1]}),
    "dx_ever": ("t_dx_ever", {"subject_id": P1, "diagnosis": "Acute kidney failure, unspecified"}, "true",
                {"diagnoses_icd": [0]}),
    "dx_patients": ("t_dx_patients", {"diagnosis": "Acute kidney failure, unspecified"}, "2",
                    {"diagnoses_icd": [0, 5]}),  # N179 (ICD-10) for P1, 5849 (ICD-9) for P2
    "adm_year": ("t_adm_year", {"subject_id": P1, "year": 2150}, "1", {"admissions": [0]}),
    "adm_longest": ("t_adm_year_longest", {"subject_id": P1, "year": 2150}, "5", {"admissions": [0]}),
    "lab_ck": ("t_lab_last", {"subject_id": P1, "lab_label": "Creatine Kinase (CK)"}, "120.0", {"labevents": [13]}),
    "rx_first": ("t_rx_first", {"subject_id": P1, "drug": "Furosemide"}, '"2150-01-01T12:00:00"',
                 {"prescriptions": [0]}),
    "foley": ("t_foley_first_icu", {"subject_id": P1, "output_label": "Foley"}, "750.0",
              {"outputevents": [0, 1]}),
}
ENTITY_POOLS = {"t_lab_last": ["Base Excess", "Creatinine", "Potassium", "Sodium"]}
NOISE_WORDS = ("missing", "noise", "noisy", "error", "duplicate", "typo", "misspel", "corrupt", "invalid",
               "wrong", "fake", "nonexist", "ambiguous", "absent", "premise")


@dataclass
class World:
    db: Database
    questions: dict[str, CleanQuestion]


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> World:
    out = tmp_path_factory.mktemp("tiny_staged")
    sink = TableSink(out, STAGED)
    for name, rows in DATA.items():
        sink.write(name, _arrow(name, rows))
    assert sink.commit()["inputevents"] == 0
    db = Database(out)
    register_bounds(db.con, db.tables)
    questions = {}
    for key, (tid, slots, _answer, _evidence) in QUESTIONS.items():
        template = TEMPLATES[tid]
        question, gold, evidence_sql = render(template, slots, 0)
        evidence: dict[str, list[int]] = {}
        for table, rid in db.rows(evidence_sql):
            evidence.setdefault(table, []).append(rid)
        questions[key] = CleanQuestion(f"q_{key}", template, slots, 0, question, gold,
                                       answer_of(db.rows(gold), template.answer_type),
                                       {t: sorted(r) for t, r in evidence.items()})
    yield World(db, questions)
    db.close()


def params_for(q: CleanQuestion) -> OperatorParams:
    return OperatorParams(tuple(ENTITY_POOLS.get(q.template.id, ())))


def run(db: Database, q: CleanQuestion, name: str):
    return OPERATORS[name].run(db, q, params_for(q), operator_rng(SEED, q.question_id, name))


def rerun(db: Database) -> Callable:
    return lambda c: run(db, c.question, c.operator.name)


def verify_one(db: Database, cand, again: Callable | None = None) -> dict:
    return verify_candidates(db, [cand], again or rerun(db))[0]


@pytest.mark.parametrize("build", [lambda t: stay_fits(t, None), lambda t: relinked(t, None)])
def test_relinking_a_table_without_a_stay_link_is_an_error_naming_it(build):
    with pytest.raises(ValueError, match="'patients' links to no stay"):
        build("patients")
    assert "p.subject_id = t.subject_id" in build("labevents")


class Counting:
    """A DuckDB connection that keeps the statements it is given."""

    def __init__(self, con):
        self.con, self.statements = con, []

    def execute(self, sql, *args):
        self.statements.append(sql)
        return self.con.execute(sql, *args)

    def __getattr__(self, name):
        return getattr(self.con, name)


def test_an_overlay_shows_only_the_tables_it_touches_and_is_forgotten_in_batches(world, monkeypatch):
    """Selecting an overlay puts only its tables' views before the base; unloaded overlays stay
    invisible until their patch rows are deleted, one batch at a time."""
    db = world.db
    base = {t: db.scalar(f"SELECT count(*) FROM {t}") for t in ("labevents", "admissions")}
    kept = db.new_id()  # loaded throughout: admissions has patch tables, but the batch below does not touch it
    db.load({kept: Overlay([Change("admissions", "delete", 0)])})
    ids = []
    for _ in range(Database.PURGE_BATCH):
        ids.append(db.new_id())
        db.load({ids[-1]: Overlay([Change("labevents", "delete", 2)])})
    db.use(ids[0])
    assert db.search_path(ids[0]).split(",")[0] == "overlay_labevents"
    assert db.scalar("SELECT count(*) FROM labevents") == base["labevents"] - 1
    assert db.scalar("SELECT count(*) FROM admissions") == base["admissions"]
    assert "overlay_admissions" not in db.search_path(ids[0])
    for oid in ids[:-1]:
        db.unload(oid)
    assert db.scalar("SELECT count(*) FROM labevents") == base["labevents"]  # the active one went with it
    assert db.scalar("SELECT count(*) FROM patch.labevents_removed") == Database.PURGE_BATCH  # not yet deleted
    for _ in range(Database.PURGE_BATCH):  # never loaded: nothing to delete, and no place in a batch
        with db.memoized({}), db.noisy(Overlay([Change("admissions", "delete", 0)])):
            pass
    assert db.scalar("SELECT count(*) FROM patch.labevents_removed") == Database.PURGE_BATCH
    monkeypatch.setattr(db, "con", Counting(db.con))
    db.unload(ids[-1])
    assert db.scalar("SELECT count(*) FROM patch.labevents_removed") == 0
    purge, = [sql for sql in db.con.statements if sql.startswith("DELETE")]
    assert "patch.labevents_removed" in purge and "admissions" not in purge  # only the tables the batch touched
    monkeypatch.undo()
    db.unload(kept)
    db.use(ids[1])  # a forgotten id shows the clean base
    assert db.scalar("SELECT count(*) FROM labevents") == base["labevents"]
    db.use(Database.CLEAN)


def test_a_shadowed_query_reads_its_own_overlay_whatever_is_active(world):
    """Verification asks many overlays' queries in one union: each branch must see exactly what
    selecting its overlay shows (deleted, updated and inserted rows; two overlays inserting the
    same fresh _rid), and no other overlay's rows."""
    db = world.db
    fresh = db.next_rid("labevents")
    row = db.base_rows("labevents", [2])[0]
    overlays = {db.new_id(): o for o in (
        Overlay([Change("labevents", "delete", 2)]),
        Overlay([Change("labevents", "update", 2, "valuenum", 99.5)]),
        Overlay([Change("labevents", "insert", fresh, None, {**row, "valuenum": 7.0})]),
        Overlay([Change("labevents", "insert", fresh, None, {**row, "valuenum": 8.0}),
                 Change("admissions", "delete", db.base_rows("admissions", [0])[0]["_rid"])]),
    )}
    db.load(overlays)
    sql = ("SELECT count(*), sum(valuenum), (SELECT count(*) FROM admissions) FROM labevents "
           f"WHERE subject_id = {row['subject_id']}")
    try:
        selected = {}
        for oid in overlays:
            db.use(oid)
            selected[oid] = db.rows(sql)
        db.use(Database.CLEAN)
        union = " UNION ALL ".join(f"SELECT {oid} AS oid, * FROM ({db.shadowed(sql, oid)})" for oid in overlays)
        shadowed = {oid: [tuple(rest)] for oid, *rest in db.rows(union)}
        assert shadowed == selected
        assert len(set(map(str, selected.values()))) == len(overlays)  # each overlay shows something else
    finally:
        for oid in overlays:
            db.unload(oid)
        db.use(Database.CLEAN)


def test_the_clean_base_answers_a_query_any_memoized_block_asked_before_from_memory(world, monkeypatch):
    """Operators trying one question ask its evidence and answers again, each in a memoized block
    of its own; the clean base never changes, so DuckDB is asked once. The same text under an
    overlay reads the noisy rows, and outside a memoized block (verification reading the patch
    tables) every query is asked."""
    db = world.db

    monkeypatch.setattr(db, "con", Counting(db.con))
    db.use(Database.CLEAN)
    sql = "SELECT count(*), min(_rid) FROM labevents -- asked again"
    with db.memoized({}):
        (count, first), = db.rows(sql)
    with db.memoized({}):
        assert db.rows(sql) == [(count, first)] and db.con.statements.count(sql) == 1
        with db.noisy(Overlay([Change("labevents", "delete", first)])):
            assert db.rows(sql) == [(count - 1, first + 1)]
        assert db.con.statements.count(sql) == 2
    assert db.rows(sql) == [(count, first)] and db.con.statements.count(sql) == 3


# ----------------------------------------------------------------------------------------------
# The world itself: staged as declared, clean answers as computed by hand, evidence clean.
# ----------------------------------------------------------------------------------------------
def test_staged_tables_and_rids(world):
    db = world.db
    assert set(STAGED) <= set(db.tables)
    for name, rows in DATA.items():
        assert db.scalar(f"SELECT count(*) FROM {name}") == len(rows)
        assert [r[0] for r in db.rows(f"SELECT {ROW_ID} FROM {name} ORDER BY {ROW_ID}")] == list(range(len(rows)))
    assert db.scalar("SELECT count(*) FROM inputevents") == 0
    assert db.scalar("SELECT valuenum FROM labevents WHERE _rid = 2") == 4.2


@pytest.mark.parametrize("key", sorted(QUESTIONS))
def test_clean_answers_by_hand(world, key):
    q = world.questions[key]
    _, _, answer, evidence = QUESTIONS[key]
    assert q.answer == answer
    assert q.evidence == evidence


def test_clean_evidence_passes_every_detector(world):
    batch = {i: [(t, r) for t, rids in q.evidence.items() for r in rids]
             for i, q in enumerate(world.questions.values())}
    assert check_evidence(world.db.con, batch, set(world.db.tables)) == {}


def test_every_registered_operator_has_a_case():
    assert {c.operator for c in CASES} == set(OPERATORS)
    assert {OPERATORS[c.operator].level for c in CASES} == set(NOISE_LEVELS)


# ----------------------------------------------------------------------------------------------
# One case per operator (plus a few extra branches): expected behaviour, answer and change.
# ----------------------------------------------------------------------------------------------
@dataclass
class Case:
    operator: str
    question: str
    behavior: str
    answer: str | None  # expected noisy answer (normalised JSON), None when there is none
    probe: str | None = None  # SQL on MIMIC names (no _rid) showing the change
    clean: list | None = None  # probe on the clean base
    noisy: list | Callable | None = None  # probe under the overlay (a list, or a predicate)
    slots: Callable | None = None  # predicate on the noisy slots (query level)
    changes: list = field(default_factory=list)  # expected (table, op, rid, column)
    reason: str | None = None  # evidence-rule reason of the detector, if any

    @property
    def id(self) -> str:
        return f"{self.operator}-{self.question}"


K3 = "SELECT {} FROM labevents WHERE labevent_id = 3"
TWINS = "SELECT valuenum, value FROM labevents WHERE itemid = 50971 AND charttime = TIMESTAMP '2150-01-05 06:00:00' ORDER BY valuenum"
CK_READINGS = '[["Creatine Kinase (CK)",120.0],["Creatine Kinase, MB Isoenzyme",4.0]]'


def _misspelt(original: str, slot: str):
    def ok(slots):
        typo = slots[slot]
        return typo != original and typo.lower() != original.lower() and typo[0] == original[0] \
            and abs(len(typo) - len(original)) <= 1 and difflib.SequenceMatcher(None, typo, original).ratio() > 0.8
    return ok


CASES = [
    # ---- record level
    Case("drop_evidence", "icu_hours", "abstain", None,
         "SELECT count(*) FROM icustays WHERE stay_id = 30000001", [(1,)], [(0,)],
         changes=[("icustays", "delete", 0, None)]),
    Case("duplicate_exact", "rx_count", "flag", "2",  # the de-duplicated count is the clean one
         "SELECT count(*), count(DISTINCT starttime) FROM prescriptions WHERE subject_id = 10000001 "
         "AND drug = 'Furosemide' AND hadm_id = 20000001", [(2, 2)], [(3, 2)],
         changes=[("prescriptions", "insert", len(DATA["prescriptions"]), None)], reason="duplicate_exact"),
    Case("duplicate_exact", "lab_k", "flag", "4.2", TWINS, [(4.2, "4.2")], [(4.2, "4.2"), (4.2, "4.2")],
         changes=[("labevents", "insert", len(DATA["labevents"]), None)], reason="duplicate_exact"),
    Case("duplicate_conflict", "lab_k", "flag", None, TWINS, [(4.2, "4.2")],
         lambda rows: len(rows) == 2 and (4.2, "4.2") in rows
         and any(v != 4.2 and float(t) == v for v, t in rows),
         changes=[("labevents", "insert", len(DATA["labevents"]), None)], reason="duplicate_conflict"),
    Case("orphan_link", "lab_k", "flag", "4.2",  # re-linked to H1, the one stay around its time
         K3.format("hadm_id"), [(H1,)], lambda rows: rows[0][0] > H4,
         changes=[("labevents", "update", 2, "hadm_id")], reason="orphan_link"),
    Case("orphan_link", "foley", "flag", "750.0",
         "SELECT stay_id FROM outputevents WHERE stay_id IS DISTINCT FROM 30000001 AND subject_id = 10000001",
         [], lambda rows: len(rows) == 1 and rows[0][0] > S2,
         changes=[("outputevents", "update", None, "stay_id")], reason="orphan_link"),
    Case("time_displaced", "rx_first", "flag", '"2150-01-03T08:00:00"',  # the next Furosemide start
         "SELECT starttime, stoptime FROM prescriptions WHERE pharmacy_id = 40000001",
         [(T(2150, 1, 1, 12), T(2150, 1, 2, 12))],
         lambda rows: T(2149, 12, 31, 8) < rows[0][0] <= T(2150, 1, 1, 7) and rows[0][1] - rows[0][0] == dt.timedelta(days=1),
         changes=[("prescriptions", "update", 0, "starttime"), ("prescriptions", "update", 0, "stoptime")],
         reason="time_outside_stay"),
    Case("missing_timestamp", "lab_k", "flag", "4.2",  # its storetime still makes it the last
         K3.format("charttime"), [(T(2150, 1, 5, 6),)], [(None,)],
         changes=[("labevents", "update", 2, "charttime")], reason="missing_timestamp"),
    # ---- value level
    Case("unit_scale", "lab_k", "flag", "4.2",  # x10 is the smallest slip past potassium's bound of 30
         K3.format("valuenum, value, flag"), [(4.2, "4.2", None)], [(42.0, "42.0", "abnormal")],
         changes=[("labevents", "update", 2, "valuenum"), ("labevents", "update", 2, "value"),
                  ("labevents", "update", 2, "flag")], reason="implausible_value"),
    Case("implausible_value", "lab_k", "flag", "4.0",  # set aside: the previous K, 4.0
         K3.format("valuenum, value, flag"), [(4.2, "4.2", None)],
         lambda rows: (rows[0][0] < 0 or rows[0][0] > 30) and float(rows[0][1]) == rows[0][0]
         and rows[0][2] == "abnormal", reason="implausible_value"),
    Case("implausible_value", "lab_be", "flag", None,  # Base Excess has negative values: no lower bound
         "SELECT valuenum FROM labevents WHERE labevent_id = 11", [(-3.0,)], lambda rows: rows[0][0] > 20,
         reason="implausible_value"),
    Case("unit_label_mismatch", "lab_creat", "flag", "1.1",  # 1.1 mg/dL charted as 97.262 umol/L
         "SELECT valuenum, valueuom FROM labevents WHERE labevent_id = 5", [(1.1, "mg/dL")], [(97.262, "umol/L")],
         reason="unit_mismatch"),
    Case("value_text_conflict", "lab_k", "flag", "4.2", K3.format("value, valuenum"), [("4.2", 4.2)],
         lambda rows: rows[0][0] == "4.2" and rows[0][1] != 4.2,
         changes=[("labevents", "update", 2, "valuenum")], reason="value_text_conflict"),
    Case("invalid_code", "dx_ever", "flag", "true",  # N179 re-labelled ICD-9: no such code, ICD-10 has it
         "SELECT icd_code, icd_version FROM diagnoses_icd WHERE hadm_id = 20000001 AND seq_num = 1",
         [("N179", 10)], [("N179", 9)], changes=[("diagnoses_icd", "update", 0, "icd_version")],
         reason="invalid_code"),
    Case("invalid_code", "lab_k", "flag", None, K3.format("itemid"), [(K,)],
         lambda rows: rows[0][0] > K, changes=[("labevents", "update", 2, "itemid")]),
    Case("temporal_inversion", "icu_hours", "abstain", None,
         "SELECT intime, outtime FROM icustays WHERE stay_id = 30000001",
         [(T(2150, 1, 2), T(2150, 1, 4, 12))],
         lambda rows: rows[0][0] == T(2150, 1, 2) and T(2150, 1, 1, 6) <= rows[0][1] < T(2150, 1, 2),
         changes=[("icustays", "update", 0, "outtime"), ("icustays", "update", 0, "los")],
         reason="temporal_inversion"),
    # ---- query level (the data is clean; the question is not answerable as asked)
    Case("absent_event", "lab_k", "abstain", None, slots=lambda s: s == {"subject_id": P1, "lab_label": "Sodium"}),
    Case("nonexistent_entity", "rx_count", "abstain", None,
         slots=lambda s: s["subject_id"] == P1 and s["drug"] not in {r["drug"] for r in DATA["prescriptions"]}
         and s["drug"][0].isupper()),
    Case("nonexistent_entity", "icu_hours", "abstain", None,
         slots=lambda s: s["subject_id"] not in (P1, P2, P3) and 10_000_000 <= s["subject_id"] < 20_000_000),
    Case("misspelled_entity", "dx_patients", "answer", "2",
         slots=_misspelt("Acute kidney failure, unspecified", "diagnosis")),
    Case("misspelled_entity", "lab_k", "answer", "4.2", slots=_misspelt("Potassium", "lab_label")),
    Case("window_outside_record", "adm_longest", "abstain", None,
         slots=lambda s: s["subject_id"] == P1 and (2142 <= s["year"] <= 2147 or 2154 <= s["year"] <= 2159)),
    Case("false_premise", "lab_k", "abstain", None,  # P3 had no lab at all; P2 had potassium
         slots=lambda s: s == {"subject_id": P3, "lab_label": "Potassium"}),
    Case("ambiguous_reference", "lab_ck", "flag", CK_READINGS,
         slots=lambda s: s == {"subject_id": P1, "lab_label": "Creatine Kinase"}),
]


# the scope checks see a faulty evidence row again as part of its group: the same fault
SCOPE_VIEWS = {"temporal_inversion": "inverted_in_scope", "time_outside_stay": "outside_stay_in_scope",
               "unit_mismatch": "several_units", "orphan_link": "unlinked_in_stay"}
CONSEQUENCES = {"orphan_link": {"time_outside_stay", "outside_stay_in_scope"}}


@pytest.fixture(scope="module")
def candidates(world):
    return {c.id: run(world.db, world.questions[c.question], c.operator) for c in CASES}


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_operator_proposes_expected_candidate(world, candidates, case):
    q = world.questions[case.question]
    cand = candidates[case.id]
    assert cand is not None, f"{case.operator} declined {case.question}"
    spec = OPERATORS[case.operator]
    assert cand.operator is spec and spec.name == case.operator  # stamped by the registry
    assert cand.question is q
    assert cand.expected_behavior == case.behavior
    assert cand.expected_answer == case.answer
    assert cand.change_log and all(isinstance(line, str) for line in cand.change_log)
    text = cand.noisy_question.lower()
    assert not [w for w in NOISE_WORDS if w in text and w not in q.question.lower()], cand.noisy_question
    if spec.level == "query":
        assert not cand.overlay
        assert cand.noisy_question != q.question and case.slots(cand.noisy_slots), cand.noisy_slots
        question, gold, _ = render(q.template, cand.noisy_slots, q.variant)
        assert (cand.noisy_question, cand.naive_sql) == (question, gold)
        assert "{" not in cand.noisy_question
        assert set(cand.noisy_slots) == set(q.slots)
    else:
        assert cand.overlay and (cand.noisy_question, cand.naive_sql, cand.noisy_slots) == (q.question, q.gold_sql, q.slots)
        assert cand.detector.reason == case.reason
        if case.reason:
            inserted = {c.rid for c in cand.overlay.changes if c.op == "insert"}
            assert cand.detector.scope == {q.evidence_table: sorted(set(q.evidence_rids()) | inserted)}
        for table, op, rid, column in case.changes:
            assert any(c.table == table and c.op == op and (rid is None or c.rid == rid) and c.column == column
                       for c in cand.overlay.changes), (table, op, rid, column, cand.overlay.changes)


@pytest.mark.parametrize("case", [c for c in CASES if c.probe], ids=lambda c: c.id)
def test_overlay_is_visible_and_base_untouched(world, candidates, case):
    db, cand = world.db, candidates[case.id]
    assert db.rows(case.probe) == case.clean
    snapshot = {t: db.rows(f"SELECT * FROM {t} ORDER BY {ROW_ID}") for t in cand.overlay.tables}
    with db.noisy(cand.overlay):
        noisy = db.rows(case.probe)
        for table, changes in cand.overlay.by_table().items():
            for c in changes:
                here = db.records(f"SELECT * FROM {table} WHERE {ROW_ID} = {c.rid}")
                if c.op == "delete":
                    assert here == []
                elif c.op == "insert":
                    assert len(here) == 1 and all(here[0][k] == v for k, v in c.new_value.items())
                else:
                    assert len(here) == 1 and here[0][c.column] == c.new_value
            # every row not touched by the overlay is as in the base
            touched = {c.rid for c in changes}
            untouched = [r for r in snapshot[table] if r[-1] not in touched]
            assert db.rows(f"SELECT * FROM {table} WHERE {ROW_ID} NOT IN ({', '.join(map(str, touched))}) "
                           f"ORDER BY {ROW_ID}") == untouched
    assert noisy == case.noisy if isinstance(case.noisy, list) else case.noisy(noisy), noisy
    assert db.rows(case.probe) == case.clean
    for table, rows in snapshot.items():
        assert db.rows(f"SELECT * FROM {table} ORDER BY {ROW_ID}") == rows
        assert db.rows(f"SELECT * FROM base.{table} ORDER BY {ROW_ID}") == rows


@pytest.fixture(scope="module")
def records(world, candidates):
    return {cid: verify_one(world.db, c) for cid, c in candidates.items()}


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_candidate_verifies(world, candidates, records, case):
    db, cand, rec = world.db, candidates[case.id], records[case.id]
    assert failed_checks(rec) == [], rec
    assert rec["detector_noisy"] >= 1 and rec["detector_clean"] == 0
    assert rec["naive_answer"] != expected_outcome(cand)
    # the naive reading on the noisy side really is what verification measured
    with db.noisy(cand.overlay):
        assert answer_of(db.rows(cand.naive_sql), cand.question.answer_type) == rec["naive_answer"]


@pytest.mark.parametrize("case", [c for c in CASES if c.reason], ids=lambda c: c.id)
def test_noise_breaks_only_its_own_rule(world, candidates, case):
    """The corrupted evidence shows the operator's discrepancy and no other one, so the category an
    agent should name is unambiguous."""
    db, cand = world.db, candidates[case.id]
    scope = {0: [(t, r) for t, rids in cand.detector.scope.items() for r in rids]}
    clean = evidence_violations(db.con, scope, set(db.tables)).get(0, set())
    with db.noisy(cand.overlay):
        noisy = evidence_violations(db.con, scope, set(db.tables)).get(0, set())
    assert clean == set()
    assert case.reason in noisy
    # a row re-linked to another stay also lies outside that stay: the same fault, seen from its time
    assert noisy - CONSEQUENCES.get(case.reason, set()) - set(SCOPE_VIEWS.values()) == {case.reason}, noisy
    assert noisy & set(SCOPE_VIEWS.values()) <= {SCOPE_VIEWS.get(r) for r in noisy}, noisy


def test_naive_answers_by_hand(records):
    """What a naive agent reads on the noisy side, worked out from the tiny tables."""
    naive = {cid: rec["naive_answer"] for cid, rec in records.items()}
    assert naive["time_displaced-rx_first"] < '"2150-01-01T08:00:00"'  # before the admission
    assert naive["drop_evidence-icu_hours"] is None
    assert naive["duplicate_exact-rx_count"] == "3"
    assert naive["duplicate_exact-lab_k"] == AMBIGUOUS  # two "last" potassium values
    assert naive["duplicate_conflict-lab_k"] == AMBIGUOUS
    assert naive["orphan_link-lab_k"] == "4.0"  # the unlinked row falls out of the first stay
    assert naive["orphan_link-foley"] in ("300.0", "450.0")
    assert naive["missing_timestamp-lab_k"] == "4.0"  # NULL time sorts last
    assert naive["unit_scale-lab_k"] == "42.0"
    assert naive["unit_label_mismatch-lab_creat"] == "97.26"
    assert naive["invalid_code-dx_ever"] == "false"
    assert -18 <= float(naive["temporal_inversion-icu_hours"]) <= -1  # the end a few hours before the start
    assert naive["absent_event-lab_k"] is None
    assert naive["misspelled_entity-dx_patients"] == "0"
    assert naive["window_outside_record-adm_longest"] is None
    assert naive["ambiguous_reference-lab_ck"] is None


def test_evidence_rule_detectors_run_many_candidates_to_a_statement_each_on_its_own_overlay(
        world, candidates, monkeypatch):
    """Evidence-rule detectors over a few rows run many candidates to a statement: their rows
    checked together where the rule reads no table their overlays touch, else in unions of their
    own checks; either way each reads its own overlay, and the verdicts are those of running each
    on its noisy database alone."""
    from pipeline.noise import verify

    named, original = [], verify.named_rows
    monkeypatch.setattr(verify, "named_rows", lambda cand, *a: named.append(cand) or original(cand, *a))
    checked, in_unions, in_one = Counter(), verify.union_rows, verify._violating
    monkeypatch.setattr(verify, "union_rows", lambda con, queries: checked.update(apart=len(queries))
                        or in_unions(con, queries))
    monkeypatch.setattr(verify, "_violating", lambda db, table, rows, *rest: checked.update(together=len(rows))
                        or in_one(db, table, rows, *rest))
    together = verify_candidates(world.db, list(candidates.values()), rerun(world.db))
    assert len(named) == sum(bool(c.detector.reason) for c in candidates.values()) > 1
    assert checked["together"] > 1 and checked["apart"] > 0, checked
    monkeypatch.setattr(verify, "named_rows", lambda *a: None)
    alone = verify_candidates(world.db, list(candidates.values()), rerun(world.db))
    assert together == alone
    assert sum(r["detector_noisy"] for r in together if "detector_noisy" in r) > 1


def test_verification_in_one_batch_matches_one_by_one(world, candidates, records):
    """Many overlays loaded at once (several inserting the same fresh _rid) stay independent."""
    batch = verify_candidates(world.db, list(candidates.values()), rerun(world.db))
    assert dict(zip(candidates, batch)) == records
    # everything unloaded afterwards: the clean database answers as before
    for q in world.questions.values():
        assert answer_of(world.db.rows(q.gold_sql), q.answer_type) == q.answer


@pytest.mark.parametrize("name", sorted(OPERATORS))
def test_operators_are_deterministic(world, name):
    for q in world.questions.values():
        if name not in q.noise.operators:
            continue
        a, b = run(world.db, q, name), run(world.db, q, name)
        assert (a is None) == (b is None)
        if a is not None:
            assert a.fingerprint() == b.fingerprint()


def test_ambiguous_reference_declines_a_word_that_is_itself_a_name(world):
    """"potassium" names the item "Potassium" exactly: not ambiguous, and its detector could not fire."""
    assert run(world.db, world.questions["lab_k"], "ambiguous_reference") is None


def test_drop_evidence_declines_when_other_rows_step_in(world):
    """Deleting the last potassium (4.2) makes 4.0 the last one: an answer remains and the evidence
    query is not empty, so "abstain" would be wrong and undetectable."""
    db, qs = world.db, world.questions
    assert run(db, qs["lab_k"], "drop_evidence") is None
    assert run(db, qs["lab_be"], "drop_evidence") is not None  # its only reading: nothing steps in


def test_operators_decline_what_they_cannot_perturb(world):
    db, qs = world.db, world.questions
    assert run(db, qs["adm_year"], "misspelled_entity") is None  # no entity slot
    assert run(db, qs["dx_patients"], "false_premise") is None  # population level
    assert run(db, qs["dx_patients"], "absent_event") is None
    assert run(db, qs["lab_k"], "window_outside_record") is None  # no year window
    assert run(db, qs["lab_k"], "temporal_inversion") is None  # labevents has no end time
    assert run(db, qs["adm_year"], "orphan_link") is None  # an admission links to no stay
    assert run(db, qs["dx_ever"], "unit_scale") is None  # no numeric value
    assert run(db, qs["rx_count"], "missing_timestamp") is not None


# ----------------------------------------------------------------------------------------------
# Broken operators: verification must reject each one by the check that names the fault.
# ----------------------------------------------------------------------------------------------
def _first_failure(rec: dict) -> str:
    failed = failed_checks(rec)
    assert failed, rec
    ran = CHECKS[:CHECKS.index(failed[0])]
    assert all(rec[k] for k in ran), rec
    return failed[0]


def _k_row(db):
    return db.base_rows("labevents", [2])[0]


def hand_made(name: str, level: str, discrepancy: str, q: CleanQuestion, proposal: Proposal) -> Candidate:
    """The proposal of an unregistered, hand-written operator, stamped as the registry stamps."""
    return Operator(name, level, discrepancy, "test", lambda *_: proposal).stamp(q, proposal)


def test_rejects_change_to_an_irrelevant_row(world):
    """The overlay changes potassium's neighbour (a sodium of the second stay): nothing changes."""
    db, q = world.db, world.questions["lab_k"]
    sodium = db.base_rows("labevents", [6])[0]
    overlay = Overlay([update("labevents", sodium, "valuenum", 1400.0), update("labevents", sodium, "value", "1400")])
    cand = hand_made("irrelevant", "value", "implausible_value", q,
                     record_proposal(q, overlay, "flag", None, "implausible_value", ["sodium x10"]))
    rec = verify_one(db, cand, lambda c: cand)
    assert _first_failure(rec) == "effect"
    assert rec["naive_answer"] == q.answer


def test_rejects_noise_that_does_not_change_the_naive_answer(world):
    """A duplicate of an earlier potassium: the last one is still 4.2, the noise does not matter."""
    db, q = world.db, world.questions["lab_k"]
    earlier = db.base_rows("labevents", [0])[0]
    overlay = Overlay([Change("labevents", "insert", db.next_rid("labevents"), None,
                              {k: v for k, v in earlier.items() if k != ROW_ID})])
    cand = hand_made("useless_duplicate", "record", "duplicate_record", q,
                     record_proposal(q, overlay, "flag", q.answer, "duplicate_exact", ["copied an earlier row"]))
    rec = verify_one(db, cand, lambda c: cand)
    assert _first_failure(rec) == "effect"


def test_rejects_undetectable_change(world):
    """4.2 -> 4.6, text and all: the answer changes but nothing in the data betrays it."""
    db, q = world.db, world.questions["lab_k"]
    row = _k_row(db)
    overlay = Overlay([update("labevents", row, "valuenum", 4.6), update("labevents", row, "value", "4.6")])
    for reason in ("implausible_value", "value_text_conflict", "duplicate_conflict"):
        cand = hand_made("silent", "value", "implausible_value", q,
                         record_proposal(q, overlay, "flag", None, reason, ["4.2 -> 4.6"]))
        rec = verify_one(db, cand, lambda c, cand=cand: cand)
        assert _first_failure(rec) == "detectable" and rec["detector_noisy"] == 0, reason


def test_rejects_detector_that_fires_on_clean_data(world):
    db, q = world.db, world.questions["lab_k"]
    good = run(db, q, "unit_scale")
    cand = replace(good, detector=Detector(sql="SELECT 1", clean_sql="SELECT 1"))
    rec = verify_one(db, cand, lambda c: cand)
    assert _first_failure(rec) == "detectable" and rec["detector_clean"] == 1


@pytest.mark.parametrize("extra", ["no-op update", "null to null", "delete of a missing row", "insert over a row"])
def test_rejects_overlay_with_undeclared_or_false_changes(world, extra):
    """A unit-scale candidate plus one change that does not do what it declares: locality fails."""
    db, q = world.db, world.questions["lab_k"]
    good = run(db, q, "unit_scale")
    row = _k_row(db)
    bad = {
        "no-op update": update("labevents", row, "priority", row["priority"]),
        "null to null": update("labevents", row, "comments", None),
        "delete of a missing row": Change("labevents", "delete", 10_000),
        "insert over a row": Change("labevents", "insert", 0, None,
                                    {k: v for k, v in db.base_rows("labevents", [0])[0].items() if k != ROW_ID}),
    }[extra]
    cand = replace(good, overlay=Overlay(good.overlay.changes + [bad]))
    rec = verify_one(db, cand, lambda c: cand)
    assert _first_failure(rec) == "local"
    assert failed_checks(verify_one(db, good)) == []  # the honest candidate still passes


def test_rejects_nondeterministic_operator(world):
    """An operator drawing from Python's random and the clock instead of its seeded generator."""
    db, q = world.db, world.questions["lab_k"]

    def flaky(db, q, params, rng):
        row = _k_row(db)
        new = round(100 + random.random() * 100 + time.perf_counter_ns() % 1000 / 1e4, 4)
        overlay = Overlay([update("labevents", row, "valuenum", new), update("labevents", row, "value", str(new))])
        recovery = restricted(q.gold_sql, "labevents", "SELECT * FROM labevents WHERE valuenum < 50")
        return record_proposal(q, overlay, "flag", recovered(db, q, overlay, recovery), "implausible_value",
                               [f"4.2 -> {new}"], recovery)

    op = Operator("flaky", "value", "implausible_value", "test", flaky)
    cand = op.run(db, q, OperatorParams(), operator_rng(SEED, q.question_id, "flaky"))
    rec = verify_one(db, cand, lambda c: op.run(db, c.question, OperatorParams(), operator_rng(SEED, q.question_id, "flaky")))
    assert _first_failure(rec) == "deterministic"
    # the same operator with a stable value passes
    rec = verify_one(db, cand, lambda c: cand)
    assert failed_checks(rec) == []


def test_a_replayed_rerun_still_rejects_a_nondeterministic_operator(world):
    """The determinism re-run answers the operator's queries from its first run: what it re-tests
    is the operator's own decisions, which a draw from Python's random still changes."""
    db, q = world.db, world.questions["lab_k"]

    def flaky(db, q, params, rng):
        row = _k_row(db)
        new = round(100 + random.random() * 100, 4)
        overlay = Overlay([update("labevents", row, "valuenum", new), update("labevents", row, "value", str(new))])
        recovery = restricted(q.gold_sql, "labevents", "SELECT * FROM labevents WHERE valuenum < 50")
        return record_proposal(q, overlay, "flag", recovered(db, q, overlay, recovery), "implausible_value",
                               [f"4.2 -> {new}"], recovery)

    op = Operator("flaky", "value", "implausible_value", "test", flaky)
    memo: dict = {}
    with db.memoized(memo):
        cand = op.run(db, q, OperatorParams(), operator_rng(SEED, q.question_id, "flaky"))
    assert memo, "the operator's queries were recorded"

    def replayed(c):
        with db.memoized(dict(memo)):
            return op.run(db, c.question, OperatorParams(), operator_rng(SEED, q.question_id, "flaky"))
    assert _first_failure(verify_one(db, cand, replayed)) == "deterministic"


def test_a_rerun_replays_the_first_runs_query_results(world):
    """run_operator keeps the query results on the candidate; a re-run given them asks DuckDB
    nothing it asked before, and proposes the same pair."""
    db, q = world.db, world.questions["lab_k"]
    cand = run_operator(db, q, "implausible_value", SEED, {})
    assert cand is not None and cand.queries
    again = run_operator(db, q, "implausible_value", SEED, {}, replay=cand.queries)
    assert again is not None and again.fingerprint() == cand.fingerprint()
    assert again.queries.keys() == cand.queries.keys()  # no query missed the replay
    # the replay really answers from the record: with every query answering nothing, it declines
    emptied = {key: (names, []) for key, (names, _) in cand.queries.items()}
    assert run_operator(db, q, "implausible_value", SEED, {}, replay=emptied) is None
    memo: dict = {}
    with db.memoized(memo):  # a large result is asked again rather than held
        assert len(db.rows(f"SELECT * FROM range({Database.MEMO_ROWS + 1})")) == Database.MEMO_ROWS + 1
        db.rows("SELECT 1")
    assert [sql for _, sql in memo] == ["SELECT 1"]
    assert failed_checks(verify_candidates(
        db, [cand], lambda c: run_operator(db, c.question, c.operator.name, SEED, {}, replay=c.queries))[0]) == []


def test_rejects_expected_answer_the_recovery_does_not_give(world):
    """The expected answer must be what the analyst's recovery SQL gives: not assumed, not missing."""
    db, q = world.db, world.questions["lab_k"]
    good = run(db, q, "implausible_value")
    assert good.recovery_sql and failed_checks(verify_one(db, good)) == []
    assumed = replace(good, expected_answer="12345.0")
    assert _first_failure(verify_one(db, assumed, lambda c: assumed)) == "expected"
    unexplained = replace(good, recovery_sql=None)
    assert _first_failure(verify_one(db, unexplained, lambda c: unexplained)) == "expected"
    # a recovery that also changes clean data is not the analyst's inference of this noise
    greedy = restricted(q.gold_sql, "labevents", "SELECT * FROM labevents WHERE valuenum BETWEEN 0.01 AND 4.1")
    overreach = replace(good, recovery_sql=greedy, expected_answer=recovered(db, q, good.overlay, greedy))
    assert _first_failure(verify_one(db, overreach, lambda c: overreach)) == "expected"


def test_rejects_operator_that_declines_on_rerun(world):
    db, q = world.db, world.questions["lab_k"]
    cand = run(db, q, "unit_scale")
    assert _first_failure(verify_one(db, cand, lambda c: None)) == "deterministic"


def test_rejects_question_whose_stored_answer_is_wrong(world):
    db, q = world.db, world.questions["lab_k"]
    wrong = replace(q, question_id="q_lab_k_wrong", answer="4.3")
    cand = OPERATORS["unit_scale"].run(db, wrong, OperatorParams(), operator_rng(SEED, wrong.question_id, "unit_scale"))
    assert _first_failure(verify_one(db, cand, lambda c: cand)) == "clean"


def test_rejected_candidates_do_not_leak_into_the_clean_base(world):
    db, q = world.db, world.questions["lab_k"]
    row = _k_row(db)
    cand = hand_made("silent", "value", "implausible_value", q,
                     record_proposal(q, Overlay([update("labevents", row, "valuenum", 4.6)]), "flag", None,
                                     "implausible_value", []))
    verify_candidates(db, [cand, run(db, q, "unit_scale")], rerun(db))
    assert answer_of(db.rows(q.gold_sql), "number") == "4.2"
    assert db.scalar("SELECT count(*) FROM labevents") == len(DATA["labevents"])


def test_propose_takes_distinct_levels_and_is_deterministic(world):
    from pipeline.noise.candidates import propose
    questions = list(world.questions.values())
    first, report = propose(world.db, questions, SEED, per_question=2)
    again, _ = propose(world.db, questions, SEED, per_question=2)
    assert [c.fingerprint() for c in first] == [c.fingerprint() for c in again]
    assert sum(report.proposed.values()) == len(first) > 0
    by_question: dict[str, list[str]] = {}
    for c in first:
        assert c.operator.name in c.question.noise.operators
        by_question.setdefault(c.question.question_id, []).append(c.operator.level)
    assert all(len(levels) == len(set(levels)) <= 2 for levels in by_question.values())
    # A vetoed family is never tried: the question falls back to its next admitted operator.
    vetoed = first[0]
    family = (vetoed.question.template.id, vetoed.operator.name)
    without, _ = propose(world.db, questions, SEED, per_question=2, vetoed_families=frozenset({family}))
    assert family not in {(c.question.template.id, c.operator.name) for c in without}
    untouched = [c.fingerprint() for c in first if c.question.template.id != family[0]]
    assert [c.fingerprint() for c in without if c.question.template.id != family[0]] == untouched


def test_noisy_answers_in_bulk_change_nothing_an_operator_decides(world, monkeypatch):
    """The operators' noisy answers computed beforehand, columnar (overlay ids in the slot table)
    or as written in one union, are what each would have asked alone: the same candidates, and
    they were actually used."""
    from pipeline.noise import bulk, candidates
    from pipeline.questions import generate

    questions = list(world.questions.values())
    remembered, unions = [], []
    original, union = Database.remember, generate.batched_rows
    monkeypatch.setattr(Database, "remember", classmethod(
        lambda cls, memo, overlay, sql, names, rows: remembered.append(sql) or original(memo, overlay, sql, names, rows)))
    monkeypatch.setattr(generate, "batched_rows", lambda con, queries: unions.append(len(queries)) or union(con, queries))
    in_bulk, _ = candidates.propose(world.db, questions, SEED, per_question=2)
    assert remembered and any(sql.startswith("WITH ") for sql in remembered)  # recovery SQL among them
    assert 0 < sum(unions) < len(remembered)  # both ways ran: columnar, and unions of the queries as written
    monkeypatch.setattr(candidates, "noisy_answers", lambda db, asked, profile=None: None)
    alone, _ = candidates.propose(world.db, questions, SEED, per_question=2)
    assert [c.fingerprint() for c in in_bulk] == [c.fingerprint() for c in alone]
    assert bulk.restriction("WITH t AS (x)\nSELECT 1", "SELECT 1", "t") == "x"
    assert bulk.restriction("WITH t AS (x), a AS (y) SELECT 1", "WITH a AS (y) SELECT 1", "t") == "x"
    assert bulk.restriction("WITH u AS (x)\nSELECT 1", "SELECT 1", "t") is None


def test_the_noise_profile_breaks_bulk_statements_down_by_template_and_operator(world):
    """``--profile`` names the template and operator (or the template's columnar statements) that
    the bulk statements on overlays spent their time on, and the evidence rule and table of the
    detectors' unions, apart from the operator and check rows."""
    from pipeline.noise.candidates import propose
    from pipeline.profile import STATEMENTS, Profile

    profile = Profile()
    questions = list(world.questions.values())
    found, _ = propose(world.db, questions, SEED, per_question=2, profile=profile)
    verify_candidates(world.db, found, rerun(world.db), profile)
    named = [r["name"] for r in profile.slowest(1000)]
    rules = {name for name in named if name.startswith("rule ")}
    assert {name.removesuffix(" (together)") for name in rules} <= {
        f"rule {c.detector.reason} on {table}" for c in found if c.detector.reason for table in c.detector.scope}
    assert rules, "the evidence rules of detectors are timed by reason and table"
    named = [name for name in named if name not in rules]
    possible = {f"{q.template.id} / {op}" for q in questions for op in OPERATORS} | {
        f"{q.template.id} (columnar)" for q in questions}
    assert named and set(named) <= possible
    assert set(named) & {f"{c.question.template.id} / {c.operator.name}" for c in found}
    assert STATEMENTS not in {r["part"] for r in profile.rows()}
    bulk_calls = profile.calls[("operator", "noisy answers in bulk")]
    assert sum(profile.calls[(STATEMENTS, name)] for name in named) >= bulk_calls > 0


def test_a_template_reading_a_touched_table_twice_runs_as_written_over_overlays(world, candidates, monkeypatch):
    """Columnar over overlays, each read of such a table is every candidate's copy, joined to all
    the others (dx_pair_same_admission on the demo: 50-60 ms per candidate); as written, in unions,
    the answers are the same."""
    from pipeline.noise import bulk
    from pipeline.questions.templates import load_templates

    real = {t.id: t.gold_sql for t in load_templates()}
    assert bulk.reads_twice(real["dx_pair_same_admission"], ("diagnoses_icd",))
    assert bulk.reads_twice(real["icu_patients_input_after_input_hours"], ("admissions", "inputevents"))
    assert not bulk.reads_twice(real["dx_pair_same_admission"], ("admissions",))
    assert not bulk.reads_twice(real["dx_patients_with_diagnosis"], ("diagnoses_icd",))

    db = world.db
    noisy = {i: c for i, c in enumerate(candidates.values()) if c.overlay and c.question.answer_type != "list"}
    ids = {i: db.new_id() for i in noisy}
    db.load({ids[i]: c.overlay for i, c in noisy.items()})
    columnar, original = [], bulk.run_columnar
    monkeypatch.setattr(bulk, "run_columnar", lambda con, t, *a: columnar.append(t.id) or original(con, t, *a))
    try:
        asked = {i: bulk.OnOverlay(c.question, c.question.gold_sql, ids[i], tuple(c.overlay.tables),
                                   c.question.template.id, c.question.slots) for i, c in noisy.items()}
        def answers() -> dict:
            return {i: answer_of(rows, noisy[i].question.answer_type) for i, (_, rows) in bulk.overlaid_rows(db, asked).items()}

        by_default = answers()
        assert columnar and len(by_default) == len(asked)
        columnar.clear()
        monkeypatch.setattr(bulk, "reads_twice", lambda sql, tables: True)
        assert answers() == by_default and not columnar
    finally:
        for oid in ids.values():
            db.unload(oid)


# ----------------------------------------------------------------------------------------------
# Operators filter evidence in DuckDB: the rows they may draw are the ones a Python reading of the
# same rows finds (NaN, zero, blank and odd texts, missing and inverted times, a death time).
# ----------------------------------------------------------------------------------------------
EDGE_LABS = [  # (value text, valuenum): rids 0..8
    ("4.0", 4.0), ("4.0", float("nan")), ("0", 0.0), ("-0", -0.0), (" 2.5 ", 2.5), ("1e1", 10.0),
    ("1,5", 1.5), ("", 3.0), ("7.0", 6.0),
]
EDGE_ADMISSIONS = [  # (admittime, dischtime, deathtime): rids 0..5
    (T(2150, 1, 1), T(2150, 1, 5), None), (T(2150, 2, 1), T(2150, 1, 30), None),  # 1: already inverted
    (T(2150, 3, 1), T(2150, 3, 4), T(2150, 3, 4)), (T(2150, 4, 1), None, None),
    (T(2150, 5, 1), T(2150, 5, 9), None), (T(2150, 5, 1), T(2150, 5, 9), None),  # 4, 5: tie on admittime
]


@pytest.fixture(scope="module")
def edge_db(tmp_path_factory):
    out = tmp_path_factory.mktemp("edge_staged")
    sink = TableSink(out, ("labevents", "admissions", "d_labitems"))
    sink.write("labevents", _arrow("labevents", [
        {**_lab(i, P1, H1, K, T(2150, 1, 2, i), 1, "mEq/L"), "value": text, "valuenum": num}
        for i, (text, num) in enumerate(EDGE_LABS)]))
    sink.write("admissions", _arrow("admissions", [
        dict(subject_id=P1, hadm_id=H1 + i, admittime=a, dischtime=d, deathtime=death, hospital_expire_flag=0)
        for i, (a, d, death) in enumerate(EDGE_ADMISSIONS)]))
    sink.write("d_labitems", _arrow("d_labitems", DATA["d_labitems"]))
    sink.commit()
    db = Database(out)
    register_bounds(db.con, db.tables)
    yield db
    db.close()


def _over_all(template: str, table: str, n: int, gold: str) -> CleanQuestion:
    return CleanQuestion(f"q_all_{table}", TEMPLATES[template], {}, 0, "?", gold, "1", {table: list(range(n))})


def _drawn(db: Database, q: CleanQuestion, name: str, seeds: int = 60) -> set[int]:
    """The evidence rows ``name`` changes over many seeds: the rows it may draw from."""
    drawn = set()
    for seed in range(seeds):
        cand = OPERATORS[name].run(db, q, params_for(q), operator_rng(seed, q.question_id, name))
        drawn |= {ch.rid for ch in cand.overlay.changes} if cand else set()
    return drawn


def test_value_text_conflict_draws_the_rows_whose_text_reads_as_their_number(edge_db):
    q = _over_all("t_lab_last", "labevents", len(EDGE_LABS), "SELECT max(valuenum) FROM labevents")

    def reads_as(text, number):
        try:
            return bool(text) and float(text) == number
        except ValueError:
            return False
    expected = {i for i, (text, num) in enumerate(EDGE_LABS) if num and reads_as(text, num)}
    assert expected == {0, 4, 5}
    assert _drawn(edge_db, q, "value_text_conflict") == expected


def test_temporal_inversion_draws_the_rows_whose_end_follows_their_start_and_no_death(edge_db):
    q = _over_all("t_adm_year", "admissions", len(EDGE_ADMISSIONS), "SELECT count(*) FROM admissions")
    assert _drawn(edge_db, q, "temporal_inversion") == {0, 4, 5}


def test_missing_timestamp_blanks_the_latest_time_the_last_row_on_a_tie(edge_db):
    q = _over_all("t_adm_year", "admissions", len(EDGE_ADMISSIONS), "SELECT count(*) FROM admissions")
    cand = run(edge_db, q, "missing_timestamp")
    assert [(ch.rid, ch.column, ch.new_value) for ch in cand.overlay.changes] == [(5, "admittime", None)]
