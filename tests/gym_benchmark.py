"""A small benchmark folder for the gym tests, written in seconds from real staged data.

The synthetic source is staged for 30 patients; the pairs are written by hand through the
export module's own table builders, one per answer type and behaviour, each gold answer computed
by running its gold SQL on the staged base and normalised as the build normalises it. Overlays
cover delete, update and insert.
"""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pyarrow.parquet as pq

from pipeline.noise.export import overlays_table, pairs_table
from pipeline.noise.overlay import Change
from pipeline.questions.answers import normalise
from pipeline.sources import make_source
from pipeline.staging import stage


def _first_patient(con) -> tuple[int, int]:
    """(subject_id, _rid) of the lowest subject id that has admissions and lab values."""
    return con.execute("SELECT p.subject_id, p._rid FROM patients p WHERE p.subject_id IN "
                       "(SELECT subject_id FROM labevents WHERE valuenum IS NOT NULL) AND p.subject_id IN "
                       "(SELECT subject_id FROM admissions) ORDER BY 1 LIMIT 1").fetchone()


def make_benchmark(folder: Path) -> Path:
    stage(make_source("synthetic", None, patients=30, seed=0), folder / "staged")
    con = duckdb.connect()
    for t in ("patients", "admissions", "labevents"):
        con.execute(f"CREATE VIEW {t} AS SELECT * FROM read_parquet('{folder / 'staged' / t}.parquet')")
    subject, patient_rid = _first_patient(con)
    item = con.execute(f"SELECT itemid FROM labevents WHERE subject_id = {subject} AND valuenum IS NOT NULL "
                       "GROUP BY 1 ORDER BY count(*) DESC, 1 LIMIT 1").fetchone()[0]
    lab_rid, lab_value = con.execute(
        f"SELECT _rid, valuenum FROM labevents WHERE subject_id = {subject} AND itemid = {item} "
        "AND valuenum IS NOT NULL ORDER BY valuenum DESC, _rid LIMIT 1").fetchone()
    adm = con.execute(f"SELECT * EXCLUDE (_rid) FROM admissions WHERE subject_id = {subject} "
                      "ORDER BY admittime LIMIT 1").fetchone()
    adm_cols = [d[0] for d in con.description]
    next_adm_rid = con.execute("SELECT max(_rid) + 1 FROM admissions").fetchone()[0]
    twin = dict(zip(adm_cols, adm))
    twin["hadm_id"] = 99_999_999

    specs = [
        # (pair_id, answer_type, gold_sql, behaviour, discrepancy, expected answer source, changes)
        ("p_count", "integer", "SELECT count(*) FROM patients", "abstain", "missing_evidence", None,
         [Change("patients", "delete", patient_rid)]),
        ("p_maxlab", "number", (f"SELECT max(valuenum) FROM labevents WHERE subject_id = {subject} "
                                f"AND itemid = {item}"), "flag", "unit_error", "clean",
         [Change("labevents", "update", lab_rid, "valuenum", lab_value * 1000)]),
        ("p_admits", "integer", f"SELECT count(*) FROM admissions WHERE subject_id = {subject}",
         "flag", "duplicate_record", "clean", [Change("admissions", "insert", next_adm_rid, None, twin)]),
        ("p_gender", "text", f"SELECT gender FROM patients WHERE subject_id = {subject}", "answer",
         "misspelled_entity", "clean", []),
        ("p_dead", "boolean", f"SELECT dod IS NOT NULL FROM patients WHERE subject_id = {subject}", "abstain",
         "nonexistent_entity", None, []),
        ("p_first", "datetime", f"SELECT min(admittime) FROM admissions WHERE subject_id = {subject}", "flag",
         "invalid_code", None, []),
        ("p_lastdod", "date", "SELECT max(dod) FROM patients", "answer", "misspelled_entity", "clean", []),
        ("p_oldest", "list", "SELECT subject_id FROM patients ORDER BY anchor_age DESC, subject_id LIMIT 3",
         "answer", "misspelled_entity", "clean", []),
        ("p_genders", "set", "SELECT DISTINCT gender FROM patients", "answer", "misspelled_entity", "clean", []),
    ]
    pairs = []
    for pid, answer_type, gold_sql, behaviour, discrepancy, expected, overlay in specs:
        clean = normalise(con.execute(gold_sql).fetchall(), answer_type)
        pairs.append({
            "pair_id": pid, "seed": 0, "question_id": pid, "template_id": pid, "intent": "test",
            "level": "patient", "noise_level": "record" if overlay else "query", "operator": discrepancy,
            "clean_question": f"clean question of {pid}?", "noisy_question": f"noisy question of {pid}?",
            "gold_sql": gold_sql, "answer_type": answer_type, "clean_answer": clean, "naive_sql": gold_sql,
            "expected_behavior": behaviour, "expected_answer": clean if expected == "clean" else None,
            "discrepancy": discrepancy, "evidence": "{}", "verification": "{}", "split": "test",
            "change_log": "[]", "noisy_slots": "{}",
            "changes": json.dumps([[c.table, c.op, c.rid, c.column, c.new_value_json()] for c in overlay]),
        })
    pq.write_table(pairs_table(pairs), folder / "pairs.parquet")
    pq.write_table(overlays_table(pairs), folder / "overlays.parquet")
    return folder
