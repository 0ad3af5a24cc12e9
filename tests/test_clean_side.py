"""The clean-evidence filter looks at the gold SQL's scope, not only at the answer rows (issue 10):
a problem in another row of the same subject, entity and stay rejects the question; the same
problem outside that scope does not; noise detectors, asking for their own reason, never see it."""

from __future__ import annotations

import pytest

from pipeline.questions.evidence import REASONS, check_evidence, evidence_violations
from pipeline.questions.generate import open_staged
from pipeline.sources import make_source
from pipeline.staging import stage

SCOPE_REASONS = {"inverted_in_scope", "outside_stay_in_scope", "several_units", "unlinked_in_stay"}


@pytest.fixture(scope="module")
def staged(tmp_path_factory):
    out = tmp_path_factory.mktemp("clean_side")
    stage(make_source("synthetic", patients=60, seed=5, quirks="none"), out)
    return out


@pytest.fixture
def db(staged):
    """A fresh in-memory copy of the quirk-free staged tables: each test may change rows."""
    con, present = open_staged(staged)
    yield con, present
    con.close()


# per table: the scope group (subject, entity, stay) and the time column rows are ordered by
GROUPS = {
    "labevents": ("subject_id, itemid, hadm_id", "charttime"),
    "prescriptions": ("subject_id, drug, hadm_id", "starttime"),
    "outputevents": ("subject_id, itemid, stay_id", "charttime"),
}


def group_rows(con, table: str) -> tuple[int, int]:
    """(_rid of a group's last row: the evidence, _rid of its first row: a row only in the scope)."""
    keys, time = GROUPS[table]
    return con.execute(f"""
        SELECT max_by(_rid, ({time}, _rid)), min_by(_rid, ({time}, _rid)) FROM {table}
        GROUP BY {keys} HAVING count(*) >= 3 ORDER BY {keys} LIMIT 1""").fetchall()[0]


def reasons(con, present, table: str, rid: int, only: set[str] | None = None) -> set[str]:
    """The reasons found for one row, the same whether the query names the row itself (one
    candidate's evidence) or joins a registered table of it (a batch's)."""
    alone = evidence_violations(con, {0: [(table, rid)]}, present, only).get(0, set())
    batch = evidence_violations(con, {0: [(table, rid)], 1: [(table, rid)]}, present, only)
    assert batch.get(0, set()) == batch.get(1, set()) == alone
    return alone


SCOPE_PROBLEMS = [
    ("labevents", "UPDATE labevents SET charttime = (SELECT dischtime FROM admissions a "
                  "WHERE a.hadm_id = labevents.hadm_id) + INTERVAL 2 HOUR WHERE _rid = {other}",
     "outside_stay_in_scope"),
    ("labevents", "UPDATE labevents SET hadm_id = NULL WHERE _rid = {other}", "unlinked_in_stay"),
    ("labevents", "UPDATE labevents SET valueuom = 'mmol/L?' WHERE _rid = (SELECT max(_rid) FROM labevents "
                  "WHERE itemid = (SELECT itemid FROM labevents WHERE _rid = {evidence}) "
                  "AND subject_id <> (SELECT subject_id FROM labevents WHERE _rid = {evidence}))",
     "several_units"),
    ("prescriptions", "UPDATE prescriptions SET stoptime = starttime - INTERVAL 1 HOUR WHERE _rid = {other}",
     "inverted_in_scope"),
    ("outputevents", "UPDATE outputevents SET charttime = (SELECT outtime FROM icustays i "
                     "WHERE i.stay_id = outputevents.stay_id) + INTERVAL 1 HOUR WHERE _rid = {other}",
     "outside_stay_in_scope"),
]


@pytest.mark.parametrize("table,change,reason", SCOPE_PROBLEMS, ids=[p[2] + "-" + p[0] for p in SCOPE_PROBLEMS])
def test_a_problem_in_the_scope_rejects_the_question(db, table, change, reason):
    con, present = db
    evidence, other = group_rows(con, table)
    assert reasons(con, present, table, evidence) == set()  # quirk-free data: clean
    con.execute(change.format(evidence=evidence, other=other)).fetchall()
    found = reasons(con, present, table, evidence)
    assert reason in found
    assert found <= SCOPE_REASONS  # the answer row itself is still fine
    assert check_evidence(con, {0: [(table, evidence)]}, present) == {0: min(found, key=REASONS.index)}


def test_the_same_problem_outside_the_scope_does_not_count(db):
    con, present = db
    evidence, _ = group_rows(con, "prescriptions")
    # another drug of the same admission, and the same drug in another patient's admission
    con.execute("""UPDATE prescriptions p SET stoptime = starttime - INTERVAL 1 HOUR
                   FROM (SELECT subject_id, hadm_id, drug FROM prescriptions WHERE _rid = ?) e
                   WHERE (p.hadm_id = e.hadm_id AND p.drug <> e.drug) OR (p.subject_id <> e.subject_id AND p.drug = e.drug)""",
                [evidence]).fetchall()
    assert con.execute("SELECT count(*) FROM prescriptions WHERE stoptime < starttime").fetchall()[0][0] > 0
    assert reasons(con, present, "prescriptions", evidence) == set()


def test_an_unlinked_row_outside_the_admission_is_not_skipped_by_the_gold_sql(db):
    con, present = db
    evidence, other = group_rows(con, "labevents")
    con.execute("""UPDATE labevents SET hadm_id = NULL, charttime = charttime - INTERVAL 400 DAY WHERE _rid = ?""",
                [other]).fetchall()
    assert reasons(con, present, "labevents", evidence) == set()


def test_noise_detectors_never_run_the_scope_checks(db):
    con, present = db
    evidence, other = group_rows(con, "prescriptions")
    con.execute("UPDATE prescriptions SET stoptime = starttime - INTERVAL 1 HOUR WHERE _rid = ?", [other]).fetchall()
    assert reasons(con, present, "prescriptions", evidence) == {"inverted_in_scope"}
    assert reasons(con, present, "prescriptions", evidence, {"temporal_inversion"}) == set()
    # while the perturbed row itself is what the temporal_inversion detector fires on
    assert "temporal_inversion" in reasons(con, present, "prescriptions", other, {"temporal_inversion"})


def test_a_population_scope_needs_a_material_share_of_bad_rows(db):
    con, present = db
    # a population-sized candidate: the last row of every lab group of every patient
    evidence = [("labevents", r) for (r,) in con.execute(
        "SELECT max_by(_rid, (charttime, _rid)) FROM labevents GROUP BY subject_id, itemid, hadm_id").fetchall()]
    last, other = group_rows(con, "labevents")
    con.execute("UPDATE labevents SET hadm_id = NULL WHERE _rid = ?", [other]).fetchall()
    assert "unlinked_in_stay" in evidence_violations(con, {0: evidence}, present).get(0, set())
    assert evidence_violations(con, {0: evidence}, present, material=0.05) == {}
    # while a patient's own scope is small: the one row is material
    assert "unlinked_in_stay" in evidence_violations(con, {0: [("labevents", last)]}, present, material=0.05)[0]


def test_unlinked_rows_the_gold_sql_reads_are_not_skipped_ones(db):
    con, present = db
    evidence, other = group_rows(con, "labevents")
    con.execute("UPDATE labevents SET hadm_id = NULL WHERE _rid = ?", [other]).fetchall()
    assert "unlinked_in_stay" in reasons(con, present, "labevents", evidence)
    both = evidence_violations(con, {0: [("labevents", evidence), ("labevents", other)]}, present).get(0, set())
    assert "unlinked_in_stay" not in both
