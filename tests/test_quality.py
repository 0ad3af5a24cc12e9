"""Expectation suites and full-table invariants over staged tables."""

from __future__ import annotations

import shutil

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.expectations import EXPECTATIONS_DIR, _batch_definition, load_suite_json, warm_up
from pipeline.quality import expectation_check, integrity_check
from pipeline.schema import ROW_ID, TABLES
from pipeline.staging import staged_path


def test_every_table_has_a_suite_matching_the_registry():
    for name, t in TABLES.items():
        suite = load_suite_json(f"source/{name}")
        first = suite["expectations"][0]
        assert first["type"] == "expect_table_columns_to_match_ordered_list"
        assert first["kwargs"]["column_list"] == [*t.column_names, ROW_ID]
        for e in suite["expectations"]:
            column = e["kwargs"].get("column")
            assert column is None or column in first["kwargs"]["column_list"], (name, e)
            assert e.get("severity", "critical") in ("critical", "warning")
    assert len(list((EXPECTATIONS_DIR / "source").glob("*.json"))) == 31


def test_demo_has_no_errors_and_its_own_imperfections_as_warnings(demo_staged):
    for name in TABLES:
        if not staged_path(demo_staged, name).exists():
            continue
        assert not expectation_check(demo_staged, name).errors, name
        assert not integrity_check(demo_staged, name).errors, name
    emar = integrity_check(demo_staged, "emar")
    assert not emar.passed and emar.severity == "WARN"
    fk = next(d for d in emar.details if d["rule"] == "emar.poe_id->poe")
    assert fk["violations"] == 1063 and fk["examples"]  # real dangling poe_ids, with examples
    assert "emar.poe_id->poe" in emar.markdown()


def _copy(demo_staged, tmp_path, *tables):
    for t in tables:
        shutil.copyfile(staged_path(demo_staged, t), staged_path(tmp_path, t))


def test_duplicate_key_and_out_of_range_values_are_caught(demo_staged, tmp_path):
    _copy(demo_staged, tmp_path, "patients", "admissions")
    patients = pq.read_table(staged_path(tmp_path, "patients"))
    rows = patients.to_pylist()
    rows.append({**rows[0], ROW_ID: len(rows)})  # same subject_id twice
    rows[1]["gender"] = "X"
    pq.write_table(pa.Table.from_pylist(rows, schema=patients.schema), staged_path(tmp_path, "patients"))
    integrity = integrity_check(tmp_path, "patients")
    assert integrity.errors and "unique (subject_id)" in integrity.errors[0]
    gx = expectation_check(tmp_path, "patients")
    assert not gx.errors and any("gender" in w for w in gx.warnings)
    # A null in a required column is a critical expectation failure.
    rows[2]["anchor_year"] = None
    pq.write_table(pa.Table.from_pylist(rows, schema=patients.schema), staged_path(tmp_path, "patients"))
    assert any("anchor_year" in e for e in expectation_check(tmp_path, "patients").errors)


def test_foreign_key_to_an_unstaged_table_is_reported_as_skipped(demo_staged, tmp_path):
    _copy(demo_staged, tmp_path, "admissions")
    outcome = integrity_check(tmp_path, "admissions")
    assert outcome.passed and outcome.counts["skipped"] >= 1



def test_warm_up_prepares_validation_in_the_background():
    _batch_definition.cache_clear()
    thread = warm_up()
    assert thread.daemon
    thread.join()
    assert _batch_definition.cache_info().currsize == 1
