"""Labels of the record-level operators (docs/labels.md): each recoverable case expects the answer
its recovery SQL computes on the noisy database, each unrecoverable one no answer, and every
candidate passes all verification checks, the `expected` check included.

A tiny hand-made database is staged to real Parquet and loaded into a real DuckDB
:class:`Database`; answers are worked out by hand from its rows.
"""
# ruff: noqa: C408  (hand-made rows read best as dict(column=value, ...))

from __future__ import annotations

import datetime as dt

import duckdb
import pyarrow as pa
import pytest

from pipeline.gym import guard
from pipeline.noise.candidates import operator_rng
from pipeline.noise.model import AMBIGUOUS, CleanQuestion, OperatorParams, answer_of
from pipeline.noise.operators import OPERATORS
from pipeline.noise.operators.common import relinked, restricted
from pipeline.noise.overlay import Database
from pipeline.noise.verify import failed_checks, verify_candidates
from pipeline.plausibility import register_bounds
from pipeline.questions.templates import NoiseSpec, Slot, Template, render
from pipeline.schema import ROW_ID, TABLES
from pipeline.staging import TableSink

SEED = 7
T = dt.datetime
P1, P2 = 10000001, 10000002
H1, H2, H3 = 20000001, 20000002, 20000003  # H1, H2: P1's stays; H3: P2's only stay
S1, S2 = 30000001, 30000002
K = 50971


def _k(lid, subject, hadm, when, value):
    return dict(labevent_id=lid, subject_id=subject, hadm_id=hadm, itemid=K, charttime=when,
                storetime=when + dt.timedelta(hours=1), value=value, valuenum=float(value), valueuom="mEq/L",
                ref_range_lower=3.3, ref_range_upper=5.1, priority="ROUTINE")


def _rx(subject, hadm, pharmacy_id, start, hours, drug):
    return dict(subject_id=subject, hadm_id=hadm, pharmacy_id=pharmacy_id, starttime=start,
                stoptime=start + dt.timedelta(hours=hours), drug_type="MAIN", drug=drug, route="IV")


DATA: dict[str, list[dict]] = {
    "patients": [dict(subject_id=P1, gender="F", anchor_age=60, anchor_year=2150),
                 dict(subject_id=P2, gender="M", anchor_age=70, anchor_year=2160)],
    "admissions": [
        dict(subject_id=P1, hadm_id=H1, admittime=T(2150, 1, 1, 8), dischtime=T(2150, 1, 6, 12)),
        dict(subject_id=P1, hadm_id=H2, admittime=T(2151, 3, 1, 10), dischtime=T(2151, 3, 4, 10)),
        dict(subject_id=P2, hadm_id=H3, admittime=T(2160, 5, 1, 9), dischtime=T(2160, 5, 10, 9)),
    ],
    "icustays": [
        dict(subject_id=P1, hadm_id=H1, stay_id=S1, intime=T(2150, 1, 2), outtime=T(2150, 1, 4, 12), los=2.5),
        dict(subject_id=P2, hadm_id=H3, stay_id=S2, intime=T(2160, 5, 2), outtime=T(2160, 5, 5), los=3.0),
    ],
    "d_labitems": [dict(itemid=K, label="Potassium", fluid="Blood", category="Chemistry")],
    "labevents": [
        _k(1, P1, H1, T(2150, 1, 2, 6), "3.9"),
        _k(2, P1, H1, T(2150, 1, 3, 6), "4.0"),
        _k(3, P1, H1, T(2150, 1, 5, 6), "4.2"),  # rid 2: P1's last potassium of H1
        _k(4, P2, H3, T(2160, 5, 2, 7), "3.6"),
    ],
    "prescriptions": [
        _rx(P1, H1, 40000001, T(2150, 1, 1, 12), 24, "Furosemide"),  # rid 0: first Furosemide of H1
        _rx(P1, H1, 40000002, T(2150, 1, 3, 8), 48, "Furosemide"),
        _rx(P1, H1, 40000003, T(2150, 1, 2, 9), 96, "Heparin"),  # rid 2: the only Heparin
        _rx(P1, H2, 40000004, T(2151, 3, 1, 12), 48, "Metoprolol Tartrate"),
    ],
    "d_icd_diagnoses": [dict(icd_code="N179", icd_version=10, long_title="Acute kidney failure, unspecified"),
                        dict(icd_code="I10", icd_version=10, long_title="Essential (primary) hypertension"),
                        dict(icd_code="E119", icd_version=10, long_title="Type 2 diabetes mellitus")],
    "diagnoses_icd": [
        dict(subject_id=P1, hadm_id=H1, seq_num=1, icd_code="N179", icd_version=10),
        dict(subject_id=P1, hadm_id=H1, seq_num=2, icd_code="I10", icd_version=10),
        dict(subject_id=P1, hadm_id=H2, seq_num=1, icd_code="I10", icd_version=10),
        dict(subject_id=P1, hadm_id=H2, seq_num=2, icd_code="E119", icd_version=10),
        dict(subject_id=P2, hadm_id=H3, seq_num=1, icd_code="N179", icd_version=10),
    ],
}

FIRST = "(SELECT hadm_id FROM admissions WHERE subject_id = {{ subject_id|sql }} ORDER BY admittime, hadm_id LIMIT 1)"
K_ROWS = f"FROM labevents WHERE subject_id = {{{{ subject_id|sql }}}} AND itemid = {K} AND hadm_id = {FIRST}"
RX_ROWS = f"FROM prescriptions WHERE subject_id = {{{{ subject_id|sql }}}} AND drug = {{{{ drug|sql }}}} AND hadm_id = {FIRST}"
DX_ROWS = f"FROM diagnoses_icd WHERE hadm_id = {FIRST}"
RECORD_OPS = ("drop_evidence", "duplicate_exact", "duplicate_conflict", "orphan_link", "time_displaced",
              "missing_timestamp")
PATIENT = Slot("subject_id", "patient", {})


def _template(tid: str, gold: str, evidence: str, answer_type: str, table: str, **noise) -> Template:
    return Template(tid, "laboratory", "patient", [f"{tid} of {{{{ subject_id }}}}?"], gold, evidence,
                    [PATIENT], answer_type, [table],
                    NoiseSpec(evidence_table=table, operators=RECORD_OPS, **noise))


LAST = "QUALIFY rank() OVER (ORDER BY charttime DESC) = 1"
FIRST_RX = "QUALIFY rank() OVER (ORDER BY starttime) = 1"
TEMPLATES = {t.id: t for t in [
    _template("lab_last", f"SELECT valuenum {K_ROWS} {LAST}", f"SELECT 'labevents' AS table_name, _rid {K_ROWS} {LAST}",
              "number", "labevents", value_column="valuenum", time_column="charttime"),
    _template("lab_count", f"SELECT count(*) {K_ROWS}", f"SELECT 'labevents' AS table_name, _rid {K_ROWS}",
              "integer", "labevents", value_column="valuenum", time_column="charttime"),
    _template("rx_first", f"SELECT min(starttime) {RX_ROWS}",
              f"SELECT 'prescriptions' AS table_name, _rid {RX_ROWS} {FIRST_RX}", "datetime", "prescriptions"),
    _template("dx_count", f"SELECT count(*) {DX_ROWS}", f"SELECT 'diagnoses_icd' AS table_name, _rid {DX_ROWS}",
              "integer", "diagnoses_icd"),
    _template("adm_count", "SELECT count(*) FROM admissions WHERE subject_id = {{ subject_id|sql }}",
              "SELECT 'admissions' AS table_name, _rid FROM admissions WHERE subject_id = {{ subject_id|sql }}",
              "integer", "admissions"),
    _template("icu_hours", "SELECT date_diff('second', intime, outtime) / 3600.0 FROM icustays "
              "WHERE subject_id = {{ subject_id|sql }} ORDER BY intime, stay_id LIMIT 1",
              "SELECT 'icustays' AS table_name, _rid FROM icustays WHERE subject_id = {{ subject_id|sql }} "
              "ORDER BY intime, stay_id LIMIT 1", "number", "icustays", time_column="intime"),
]}
QUESTIONS = {  # key -> (template, slots, clean answer worked out by hand)
    "lab_last": ("lab_last", {"subject_id": P1}, "4.2"),
    "lab_count": ("lab_count", {"subject_id": P1}, "3"),
    "furosemide_first": ("rx_first", {"subject_id": P1, "drug": "Furosemide"}, '"2150-01-01T12:00:00"'),
    "heparin_first": ("rx_first", {"subject_id": P1, "drug": "Heparin"}, '"2150-01-02T09:00:00"'),
    "dx_count_p1": ("dx_count", {"subject_id": P1}, "2"),
    "dx_count_p2": ("dx_count", {"subject_id": P2}, "1"),
    "adm_count": ("adm_count", {"subject_id": P1}, "2"),
    "icu_hours": ("icu_hours", {"subject_id": P1}, "60.0"),
}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    out = tmp_path_factory.mktemp("record_labels")
    sink = TableSink(out, tuple(DATA))
    for name, rows in DATA.items():
        schema = TABLES[name].arrow_schema
        sink.write(name, pa.Table.from_pylist(rows, schema=schema.remove(schema.get_field_index(ROW_ID))))
    sink.commit()
    db = Database(out)
    register_bounds(db.con, db.tables)
    questions = {}
    for key, (tid, slots, _) in QUESTIONS.items():
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


def checked(world, key: str, name: str):
    """The operator's candidate for question ``key``, verified: every check passes."""
    db, questions = world
    cand = run(db, questions[key], name)
    assert cand is not None, f"{name} declined {key}"
    rec = verify_candidates(db, [cand], lambda c: run(db, c.question, c.operator.name))[0]
    assert failed_checks(rec) == [], rec
    if cand.expected_answer is not None:  # the label is what the analyst's SQL computes, on both sides
        assert rec["recovered_answer"] == cand.expected_answer
        assert rec["recovered_clean"] == cand.question.answer
    else:
        assert cand.recovery_sql is None
    return cand, rec


def noisy_rows(db, cand, sql):
    with db.noisy(cand.overlay):
        return db.records(sql)


@pytest.mark.parametrize("key", sorted(QUESTIONS))
def test_clean_answers_by_hand(world, key):
    assert world[1][key].answer == QUESTIONS[key][2]


# ---- drop_evidence: nothing left to support an answer -> abstain; other rows stepping in -> no pair
def test_drop_evidence(world):
    cand, rec = checked(world, "heparin_first", "drop_evidence")
    assert (cand.expected_behavior, cand.expected_answer, rec["naive_answer"]) == ("abstain", None, None)
    assert run(world[0], world[1]["lab_last"], "drop_evidence") is None  # 4.0 becomes the last


# ---- duplicate_exact: always recoverable by de-duplicating on the event key and value
@pytest.mark.parametrize(("key", "table", "fresh", "naive"), [
    ("lab_last", "labevents", {"labevent_id": 5}, AMBIGUOUS),  # next labevent_id
    ("dx_count_p1", "diagnoses_icd", {"seq_num": 3, "hadm_id": H1}, "3"),  # next seq_num of its admission
    ("adm_count", "admissions", {"hadm_id": H3 + 1}, "3"),  # next hadm_id
])
def test_duplicate_exact_twin_has_its_own_row_id(world, key, table, fresh, naive):
    db, questions = world
    cand, rec = checked(world, key, "duplicate_exact")
    assert (cand.expected_behavior, cand.expected_answer) == ("flag", QUESTIONS[key][2])
    assert rec["naive_answer"] == naive
    [twin] = [c.new_value for c in cand.overlay.changes if c.op == "insert"]
    assert {k: twin[k] for k in fresh} == fresh
    rest = {k: v for k, v in twin.items() if k not in fresh}
    originals = [r for r in db.base_rows(table, questions[key].evidence_rids(table))
                 if {k: r[k] for k in rest} == rest]
    assert len(originals) == 1  # every other cell as in one evidence row


# ---- duplicate_conflict: recoverable when either record gives the answer, else flag without one
def test_duplicate_conflict_recoverable_when_either_record_gives_the_answer(world):
    cand, rec = checked(world, "lab_count", "duplicate_conflict")
    assert (cand.expected_behavior, cand.expected_answer, rec["naive_answer"]) == ("flag", "3", "4")


def test_duplicate_conflict_unrecoverable_and_its_flag_recomputed(world):
    db = world[0]
    cand, rec = checked(world, "lab_last", "duplicate_conflict")
    assert (cand.expected_behavior, cand.expected_answer, rec["naive_answer"]) == ("flag", None, AMBIGUOUS)
    [twin] = noisy_rows(db, cand, "SELECT * FROM labevents WHERE labevent_id = 5")
    assert twin["valuenum"] != 4.2 and float(twin["value"]) == twin["valuenum"]
    outside = not 3.3 <= twin["valuenum"] <= 5.1
    assert twin["flag"] == ("abnormal" if outside else None)


# ---- orphan_link: a dangling id, re-linked when one stay fits, abstain when none or several do
def test_orphan_link_relinked_by_time(world):
    db = world[0]
    cand, rec = checked(world, "lab_last", "orphan_link")
    assert (cand.expected_behavior, cand.expected_answer, rec["naive_answer"]) == ("flag", "4.2", "4.0")
    [row] = noisy_rows(db, cand, "SELECT hadm_id FROM labevents WHERE labevent_id = 3")
    assert row["hadm_id"] not in {a["hadm_id"] for a in DATA["admissions"]}  # not NULL: it points nowhere


def test_orphan_link_relinked_to_the_only_admission(world):
    cand, rec = checked(world, "dx_count_p2", "orphan_link")
    assert (cand.expected_behavior, cand.expected_answer, rec["naive_answer"]) == ("flag", "1", "0")


def test_orphan_link_abstains_when_several_stays_fit(world):
    """A diagnosis has no time; P1 had two admissions: the row cannot be placed."""
    cand, rec = checked(world, "dx_count_p1", "orphan_link")
    assert (cand.expected_behavior, cand.expected_answer, rec["naive_answer"]) == ("abstain", None, "1")



def test_relinked_matches_its_per_row_definition():
    """relinked() joins each row to its patient's stays in a list; it must give each row exactly
    what the rule says, written here as the per-row look-up it replaces: a link naming a stay of
    the row's patient (or NULL) is kept, any other becomes the one stay containing the row's time
    (an admission from its ED registration), NULL when none or several do."""
    con = duckdb.connect()
    con.execute("CREATE TABLE admissions AS SELECT * FROM (VALUES "
                "(1, 11, TIMESTAMP '2150-01-01 08:00', TIMESTAMP '2150-01-06 12:00', NULL::TIMESTAMP), "
                "(1, 12, TIMESTAMP '2151-03-01 10:00', TIMESTAMP '2151-03-04 10:00', TIMESTAMP '2151-02-28 22:00'), "
                "(2, 21, TIMESTAMP '2160-05-01 09:00', TIMESTAMP '2160-05-10 09:00', NULL), "
                "(2, 22, TIMESTAMP '2160-05-08 09:00', TIMESTAMP '2160-05-20 09:00', NULL), "
                "(4, 41, TIMESTAMP '2170-01-01 00:00', TIMESTAMP '2170-01-02 00:00', NULL), "
                "(4, 41, TIMESTAMP '2170-01-01 00:00', TIMESTAMP '2170-01-02 00:00', NULL)"
                ") v(subject_id, hadm_id, admittime, dischtime, edregtime)")
    con.execute("CREATE TABLE labevents AS SELECT * FROM (VALUES "
                "(0, 1, 11, TIMESTAMP '2150-01-02 06:00'),"  # its own stay: kept
                "(1, 1, NULL, TIMESTAMP '2150-01-02 06:00'),"  # no link: kept NULL
                "(2, 1, 99, TIMESTAMP '2150-01-03 06:00'),"  # dangling, one stay fits: 11
                "(3, 1, 21, TIMESTAMP '2151-02-28 23:00'),"  # another patient's stay; fits 12 by its ED time
                "(4, 1, 99, TIMESTAMP '2152-01-01 00:00'),"  # no stay fits: NULL
                "(5, 1, 99, NULL),"  # no time to place it: NULL
                "(6, 2, 99, TIMESTAMP '2160-05-09 00:00'),"  # two overlapping stays fit: NULL
                "(7, 2, 99, TIMESTAMP '2160-05-15 00:00'),"  # only the second fits: 22
                "(8, 3, 99, TIMESTAMP '2160-05-15 00:00'),"  # a patient without stays: NULL
                "(9, 4, 99, TIMESTAMP '2170-01-01 12:00')"  # the one stay, recorded twice: NULL
                ") v(_rid, subject_id, hadm_id, charttime)")
    per_row = ("SELECT t._rid, CASE WHEN t.hadm_id IS NULL OR EXISTS (SELECT 1 FROM admissions p WHERE "
               "p.hadm_id = t.hadm_id AND p.subject_id = t.subject_id) THEN t.hadm_id ELSE (SELECT CASE WHEN "
               "count(*) = 1 THEN min(p.hadm_id) END FROM admissions p WHERE p.subject_id = t.subject_id AND "
               "t.charttime BETWEEN least(p.admittime, coalesce(p.edregtime, p.admittime)) AND p.dischtime) END "
               "FROM labevents t ORDER BY 1")
    listed = f"SELECT _rid, hadm_id FROM ({relinked('labevents', 'charttime')}) ORDER BY 1"
    expected = [(0, 11), (1, None), (2, 11), (3, 12), (4, None), (5, None), (6, None), (7, 22), (8, None), (9, None)]
    assert con.execute(per_row).fetchall() == expected
    assert con.execute(listed).fetchall() == expected
    untimed = f"SELECT _rid, hadm_id FROM ({relinked('diagnoses_icd', None, source='labevents')}) ORDER BY 1"
    assert [h for _, h in con.execute(untimed).fetchall()] == [11, None, None, None, None, None, None, None, None,
                                                                None]  # rows without a time: only sole stays fit
    # an agent in the gym may run the recovery SQL a pair publishes: the guard lets it through
    guard.check(restricted("SELECT count(*) FROM labevents", "labevents", relinked("labevents", "charttime")))


# ---- time_displaced: the row set aside; abstain when nothing remains; no pair when immaterial
def test_time_displaced_sets_the_row_aside(world):
    db = world[0]
    cand, rec = checked(world, "furosemide_first", "time_displaced")
    assert (cand.expected_behavior, cand.expected_answer) == ("flag", '"2150-01-03T08:00:00"')
    [row] = noisy_rows(db, cand, "SELECT starttime, stoptime FROM prescriptions WHERE pharmacy_id = 40000001")
    assert T(2149, 12, 31, 8) <= row["starttime"] <= T(2150, 1, 1, 7)  # 1-24 h before the admission
    assert row["stoptime"] - row["starttime"] == dt.timedelta(hours=24)  # its other time moved with it


def test_time_displaced_abstains_when_nothing_remains(world):
    cand, rec = checked(world, "heparin_first", "time_displaced")
    assert (cand.expected_behavior, cand.expected_answer) == ("abstain", None)


def test_time_displaced_keeps_storetime_after_charttime_and_declines_when_immaterial(world):
    """The last potassium charted after discharge is still the last one: the naive answer is the
    true one, so there is no pair; moved before the admission, setting it aside changes nothing."""
    assert run(world[0], world[1]["lab_last"], "time_displaced") is None


# ---- missing_timestamp: recovered from the row's stand-in, else abstain
def test_missing_timestamp_recovered_from_storetime(world):
    cand, rec = checked(world, "lab_last", "missing_timestamp")
    assert (cand.expected_behavior, cand.expected_answer, rec["naive_answer"]) == ("flag", "4.2", "4.0")
    assert "storetime" in cand.recovery_sql


def test_missing_timestamp_recovered_from_the_stay_length(world):
    cand, rec = checked(world, "icu_hours", "missing_timestamp")
    assert (cand.expected_behavior, cand.expected_answer, rec["naive_answer"]) == ("flag", "60.0", None)


def test_missing_timestamp_abstains_without_a_stand_in(world):
    cand, rec = checked(world, "furosemide_first", "missing_timestamp")
    assert (cand.expected_behavior, cand.expected_answer) == ("abstain", None)
    assert rec["naive_answer"] == '"2150-01-03T08:00:00"'
