"""Independent re-derivation of procedures/medications template answers on the real demo.

Each check recomputes a generated question's answer from its slots with pandas (not the template's
gold SQL) and compares it with the stored gold answer.
"""

from __future__ import annotations

import json

import pandas as pd
import pytest

from pipeline.questions import generate_questions, load_templates, open_staged

CHECKED = {
    # procedures, patient
    "proc_days_from_admission", "proc_icu_total_hours_first_stay", "proc_list_first_admission",
    # procedures, population
    "proc_avg_los_with_procedure", "proc_top_procedures_year", "proc_patients_within_days_of_admission",
    # medications, patient
    "med_admin_count_first_admission", "med_icu_input_within_hours", "med_orders_in_year",
    # medications, population
    "med_most_common_route", "med_top_drugs_year", "med_avg_input_per_stay",
}


@pytest.fixture(scope="module")
def data(demo_staged):
    templates = [t for t in load_templates() if t.id in CHECKED]
    table, report = generate_questions(demo_staged, seed=0, templates=templates, per_template=4)
    con, _ = open_staged(demo_staged)
    names = ["admissions", "patients", "icustays", "procedures_icd", "d_icd_procedures", "procedureevents",
             "d_items", "prescriptions", "emar", "inputevents"]
    frames = {n: con.execute(f"SELECT * FROM {n}").df() for n in names}
    con.close()
    return table.to_pandas(), report, frames


def _first_stay(df: pd.DataFrame, subject_id: int, time: str, key: str, last: bool = False) -> pd.Series:
    rows = df[df.subject_id == subject_id].sort_values([time, key], ascending=not last)
    return rows.iloc[0]


def _px(f) -> pd.DataFrame:
    return f["procedures_icd"].merge(f["d_icd_procedures"], on=["icd_code", "icd_version"])


def _items(f, table: str) -> pd.DataFrame:
    return f[table].merge(f["d_items"][["itemid", "label"]], on="itemid")


def _derive(tid: str, s: dict, f: dict):
    adm, px = f["admissions"], _px(f)
    if tid == "proc_days_from_admission":
        rows = px[(px.subject_id == s["subject_id"]) & (px.long_title == s["procedure"])]
        first = rows[rows.chartdate == rows.chartdate.min()].merge(adm[["hadm_id", "admittime"]], on="hadm_id")
        days = {(pd.Timestamp(r.chartdate) - r.admittime.normalize()).days for r in first.itertuples()}
        assert len(days) == 1
        return days.pop()
    if tid == "proc_icu_total_hours_first_stay":
        stay = _first_stay(f["icustays"], s["subject_id"], "intime", "stay_id").stay_id
        ev = _items(f, "procedureevents")
        ev = ev[(ev.stay_id == stay) & (ev.label == s["icu_procedure"])]
        return round((ev.endtime - ev.starttime).dt.total_seconds().sum() / 3600, 2)
    if tid == "proc_list_first_admission":
        hadm = _first_stay(adm, s["subject_id"], "admittime", "hadm_id").hadm_id
        return sorted(set(px[px.hadm_id == hadm].long_title))
    if tid == "proc_avg_los_with_procedure":
        hadms = set(px[px.long_title == s["procedure"]].hadm_id)
        a = adm[adm.hadm_id.isin(hadms)]
        return round(((a.dischtime - a.admittime).dt.total_seconds() / 86400).mean(), 2)
    if tid == "proc_top_procedures_year":
        rows = px[pd.to_datetime(px.chartdate).dt.year == s["year"]]
        n = rows.groupby("long_title").hadm_id.nunique().reset_index()
        n = n.sort_values(["hadm_id", "long_title"], ascending=[False, True])
        return list(n.long_title[: s["top_n"]])
    if tid == "proc_patients_within_days_of_admission":
        rows = px[px.long_title == s["procedure"]].merge(adm[["hadm_id", "admittime"]], on="hadm_id")
        delta = (pd.to_datetime(rows.chartdate) - rows.admittime.dt.normalize()).dt.days
        return int(rows[(delta >= 0) & (delta <= s["n_days"])].subject_id.nunique())
    if tid == "med_admin_count_first_admission":
        hadm = _first_stay(adm, s["subject_id"], "admittime", "hadm_id").hadm_id
        e = f["emar"]
        return int(((e.hadm_id == hadm) & (e.medication == s["medication"])
                    & (e.event_txt == "Administered")).sum())
    if tid == "med_icu_input_within_hours":
        stay = _first_stay(f["icustays"], s["subject_id"], "intime", "stay_id")
        ev = _items(f, "inputevents")
        ev = ev[(ev.stay_id == stay.stay_id) & (ev.label == s["input_item"])
                & (ev.starttime >= stay.intime)
                & (ev.starttime <= stay.intime + pd.Timedelta(hours=s["n_hours"]))]
        return round(float(ev.amount.sum()), 2)
    if tid == "med_orders_in_year":
        r = f["prescriptions"]
        return int(((r.subject_id == s["subject_id"]) & (r.drug == s["drug"])
                    & (r.starttime.dt.year == s["year"])).sum())
    if tid == "med_most_common_route":
        r = f["prescriptions"]
        counts = r[(r.drug == s["drug"]) & r.route.notna()].route.value_counts()
        top = counts[counts == counts.max()]
        assert len(top) == 1
        return top.index[0]
    if tid == "med_top_drugs_year":
        r = f["prescriptions"]
        n = r[r.starttime.dt.year == s["year"]].groupby("drug").subject_id.nunique().reset_index()
        n = n.sort_values(["subject_id", "drug"], ascending=[False, True])
        return list(n.drug[: s["top_n"]])
    if tid == "med_avg_input_per_stay":
        ev = _items(f, "inputevents")
        totals = ev[ev.label == s["input_item"]].groupby("stay_id").amount.sum()
        return round(float(totals.mean()), 2)
    raise KeyError(tid)


def test_every_checked_template_yields(data):
    _, report, _ = data
    for tid in CHECKED:
        assert report.questions.get(tid, 0) >= 1, (tid, report.rejected_by_template.get(tid))


@pytest.mark.parametrize("tid", sorted(CHECKED))
def test_answers_rederive(data, tid):
    qs, _, frames = data
    rows = qs[qs.template_id == tid]
    assert len(rows)
    for row in rows.itertuples():
        expected = _derive(tid, json.loads(row.slots), frames)
        got = json.loads(row.answer)
        if isinstance(expected, float):
            assert got == pytest.approx(expected, abs=0.011), (row.question, got, expected)
        else:
            assert got == expected, (row.question, got, expected)
