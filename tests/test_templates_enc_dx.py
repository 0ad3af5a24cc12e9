"""Independent re-derivation of encounters/diagnoses template answers on the demo.

Each test instantiates a handful of questions of one template, then recomputes every answer in
pandas from the staged tables (not from the template's gold SQL) and compares.
"""

from __future__ import annotations

import json

import pandas as pd
import pytest

from pipeline.questions.generate import generate_questions
from pipeline.questions.templates import load_templates
from pipeline.staging import staged_path

PER_TEMPLATE = 6


@pytest.fixture(scope="module")
def tables(demo_staged):
    out = {}
    for name in ("admissions", "icustays", "patients", "diagnoses_icd", "d_icd_diagnoses"):
        out[name] = pd.read_parquet(staged_path(demo_staged, name))
    dx = out["diagnoses_icd"].merge(out["d_icd_diagnoses"], on=["icd_code", "icd_version"], how="left")
    out["dx"] = dx.merge(out["admissions"][["hadm_id", "admittime"]], on="hadm_id", how="left")
    return out


@pytest.fixture(scope="module")
def questions(demo_staged):
    wanted = {"enc_admissions_in_year", "enc_total_icu_days", "enc_days_to_second_admission",
              "enc_avg_los_in_year", "enc_long_icu_stays_careunit", "dx_admissions_with_diagnosis_count",
              "dx_new_diagnoses_last_admission", "dx_patients_diagnosed_in_year", "dx_top_co_diagnoses"}
    ts = [t for t in load_templates() if t.id in wanted]
    assert {t.id for t in ts} == wanted
    table, _ = generate_questions(demo_staged, 0, ts, per_template=PER_TEMPLATE)
    by: dict[str, list[tuple[dict, object]]] = {}
    for r in table.to_pylist():
        by.setdefault(r["template_id"], []).append((json.loads(r["slots"]), json.loads(r["answer"])))
    return by


def _check(questions, tid, derive, approx=False):
    rows = questions.get(tid, [])
    assert rows, f"{tid} produced no questions"
    for slots, answer in rows:
        expected = derive(slots)
        if approx:
            assert answer == pytest.approx(expected, abs=0.01), (tid, slots)
        else:
            assert answer == expected, (tid, slots)


def _days(delta) -> float:
    return delta.total_seconds() / 86400.0


# ---------------------------------------------------------------- encounters, patient level
def test_enc_admissions_in_year(questions, tables):
    a = tables["admissions"]
    _check(questions, "enc_admissions_in_year", lambda s: int(
        ((a.subject_id == s["subject_id"]) & (a.admittime.dt.year == s["year"])).sum()))


def test_enc_total_icu_days(questions, tables):
    i = tables["icustays"]
    _check(questions, "enc_total_icu_days", lambda s: round(
        _days((i[i.subject_id == s["subject_id"]].outtime - i[i.subject_id == s["subject_id"]].intime).sum()), 2),
        approx=True)


def test_enc_days_to_second_admission(questions, tables):
    a = tables["admissions"]

    def derive(s):
        mine = a[a.subject_id == s["subject_id"]].sort_values(["admittime", "hadm_id"])
        return round(_days(mine.iloc[1].admittime - mine.iloc[0].dischtime), 2)
    _check(questions, "enc_days_to_second_admission", derive, approx=True)


# ---------------------------------------------------------------- encounters, population level
def test_enc_avg_los_in_year(questions, tables):
    a = tables["admissions"]

    def derive(s):
        y = a[a.admittime.dt.year == s["year"]]
        return round(float(((y.dischtime - y.admittime).dt.total_seconds() / 86400.0).mean()), 2)
    _check(questions, "enc_avg_los_in_year", derive, approx=True)


def test_enc_long_icu_stays_careunit(questions, tables):
    i = tables["icustays"]

    def derive(s):
        hours = (i.outtime - i.intime).dt.total_seconds() / 3600.0
        return int(i[(i.first_careunit == s["careunit"]) & (hours > s["n_hours"])].subject_id.nunique())
    _check(questions, "enc_long_icu_stays_careunit", derive)


# ---------------------------------------------------------------- diagnoses, patient level
def test_dx_admissions_with_diagnosis_count(questions, tables):
    dx = tables["dx"]
    _check(questions, "dx_admissions_with_diagnosis_count", lambda s: int(
        dx[(dx.subject_id == s["subject_id"]) & (dx.long_title == s["diagnosis"])].hadm_id.nunique()))


def test_dx_new_diagnoses_last_admission(questions, tables):
    a, dx = tables["admissions"], tables["dx"]

    def derive(s):
        mine = a[a.subject_id == s["subject_id"]].sort_values(["admittime", "hadm_id"])
        last = mine.iloc[-1].hadm_id
        earlier = set(dx[dx.hadm_id.isin(mine.hadm_id.iloc[:-1])].long_title)
        return len(set(dx[dx.hadm_id == last].long_title) - earlier)
    _check(questions, "dx_new_diagnoses_last_admission", derive)


# ---------------------------------------------------------------- diagnoses, population level
def test_dx_patients_diagnosed_in_year(questions, tables):
    dx = tables["dx"]
    _check(questions, "dx_patients_diagnosed_in_year", lambda s: int(
        dx[(dx.long_title == s["diagnosis"]) & (dx.admittime.dt.year == s["year"])].subject_id.nunique()))


def test_dx_top_co_diagnoses(questions, tables):
    dx = tables["dx"]

    def derive(s):
        adm = set(dx[dx.long_title == s["diagnosis"]].hadm_id)
        other = dx[dx.hadm_id.isin(adm) & (dx.long_title != s["diagnosis"])]
        counts = other.groupby("long_title").hadm_id.nunique().reset_index()
        counts = counts.sort_values(["hadm_id", "long_title"], ascending=[False, True])
        return list(counts.long_title.iloc[:s["top_n"]])
    _check(questions, "dx_top_co_diagnoses", derive)
