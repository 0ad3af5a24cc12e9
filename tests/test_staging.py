"""Staging real and malformed PhysioNet folders: counts, types, determinism, clear errors."""

from __future__ import annotations

import gzip
import os
import shutil
from pathlib import Path

import duckdb
import pyarrow.parquet as pq
import pytest

from pipeline.schema import FOREIGN_KEYS, HOSP_TABLES, ICU_TABLES, ROW_ID, TABLES
from pipeline.sources import make_source
from pipeline.staging import StagingError, stage, staged_path

DEMO_ROWS = {
    "admissions": 275, "caregiver": 15468, "d_hcpcs": 89200, "d_icd_diagnoses": 109775,
    "d_icd_procedures": 85257, "d_items": 4014, "d_labitems": 1622, "datetimeevents": 15280,
    "diagnoses_icd": 4506, "drgcodes": 454, "emar": 35835, "emar_detail": 72018,
    "hcpcsevents": 61, "icustays": 140, "ingredientevents": 25728, "inputevents": 20404,
    "labevents": 107727, "microbiologyevents": 2899, "omr": 2964, "outputevents": 9362,
    "patients": 100, "pharmacy": 15306, "poe": 45154, "poe_detail": 3795, "prescriptions": 18087,
    "procedureevents": 1468, "procedures_icd": 722, "provider": 40508, "services": 319,
    "transfers": 1190,
}


def test_registry_covers_31_tables_in_two_modules():
    assert len(TABLES) == 31 and len(HOSP_TABLES) == 22 and len(ICU_TABLES) == 9
    assert TABLES["chartevents"].column_names == (
        "subject_id", "hadm_id", "stay_id", "caregiver_id", "charttime", "storetime", "itemid",
        "value", "valuenum", "valueuom", "warning")
    for fk in FOREIGN_KEYS:
        assert all(TABLES[fk.table].has(c) for c in fk.columns), fk
        assert all(TABLES[fk.ref_table].has(c) for c in fk.ref_columns), fk


def test_demo_stages_to_exact_counts_with_registry_types(demo_path, demo_staged):
    assert sum(DEMO_ROWS.values()) == 729_638
    assert not staged_path(demo_staged, "chartevents").exists()
    for name, rows in DEMO_ROWS.items():
        f = pq.ParquetFile(staged_path(demo_staged, name))
        assert f.metadata.num_rows == rows, name
        assert f.schema_arrow.equals(TABLES[name].arrow_schema), name
    # _rid is the 0-based row number of the source file: unique and dense.
    con = duckdb.connect()
    n, distinct, top = con.sql(
        f"SELECT count(*), count(DISTINCT {ROW_ID}), max({ROW_ID}) FROM "
        f"'{staged_path(demo_staged, 'labevents')}'").fetchall()[0]
    assert n == distinct == top + 1 == 107_727


def test_demo_values_survive_staging_unchanged(demo_path, demo_staged):
    """Typed staging keeps text as-is (no trimming) and parses numbers and times exactly."""
    con = duckdb.connect()
    codes = {r[0] for r in con.sql(f"SELECT code FROM '{staged_path(demo_staged, 'd_hcpcs')}'").fetchall()}
    assert "TD   " in codes  # trailing blanks are part of the real code
    row = con.sql(
        f"SELECT * FROM '{staged_path(demo_staged, 'labevents')}' WHERE labevent_id = 172062").to_arrow_table()
    assert row.num_rows == 1
    rec = row.to_pylist()[0]
    assert rec["valuenum"] == 3.35 and rec["value"] == "3.35" and rec["flag"] == "abnormal"
    assert str(rec["charttime"]) == "2148-08-16 00:00:00" and rec["ref_range_lower"] == 4.6


def test_staging_twice_is_byte_identical(demo_path, demo_staged, tmp_path):
    again = stage(make_source("demo", demo_path), tmp_path / "again")
    assert set(again.rows) == set(DEMO_ROWS)
    for name in DEMO_ROWS:
        assert staged_path(demo_staged, name).read_bytes() == staged_path(tmp_path / "again", name).read_bytes(), name


def test_missing_table_is_reported_and_skipped(demo_path, tmp_path):
    report = stage(make_source("demo", demo_path), tmp_path, ["patients", "chartevents"])
    assert report.rows == {"patients": 100}
    assert "chartevents" in report.skipped and "icu/chartevents.csv.gz" in report.skipped["chartevents"]
    assert "skipped" in report.summary()


# ---------------------------------------------------------------- malformed input


def _release(tmp_path: Path, demo_path: Path, tables=("patients", "admissions")) -> Path:
    root = tmp_path / "release"
    for m in ("hosp", "icu"):
        (root / m).mkdir(parents=True)
    for name in tables:
        rel = TABLES[name].relative_path + ".csv.gz"
        shutil.copyfile(demo_path / rel, root / rel)
    return root


def _rewrite(path: Path, edit) -> None:
    lines = gzip.open(path, "rt").read().splitlines()
    with gzip.open(path, "wt") as f:
        f.write("\n".join(edit(lines)) + "\n")


def _stage_fails(root: Path, out: Path, *fragments: str) -> None:
    with pytest.raises(StagingError) as err:
        stage(make_source("mimic", root), out, ["patients", "admissions"])
    for fragment in fragments:
        assert fragment in str(err.value), str(err.value)
    leftovers = list(out.glob("*")) if out.exists() else []
    assert leftovers == [], f"partial output left behind: {leftovers}"


def test_missing_column_is_named(tmp_path, demo_path):
    root = _release(tmp_path, demo_path)
    _rewrite(root / "hosp/patients.csv.gz", lambda ls: [",".join(line.split(",")[:-1]) for line in ls])
    _stage_fails(root, tmp_path / "out", "patients.csv.gz", "missing column(s) dod")


def test_extra_column_is_named(tmp_path, demo_path):
    root = _release(tmp_path, demo_path)
    _rewrite(root / "hosp/patients.csv.gz", lambda ls: [ls[0] + ",shoe_size"] + [line + ",42" for line in ls[1:]])
    _stage_fails(root, tmp_path / "out", "patients.csv.gz", "unexpected column(s) shoe_size")


def test_value_of_wrong_type_names_file_line_and_column(tmp_path, demo_path):
    root = _release(tmp_path, demo_path)

    def corrupt(lines):
        fields = lines[5].split(",")
        fields[2] = "forty"  # anchor_age
        lines[5] = ",".join(fields)
        return lines

    _rewrite(root / "hosp/patients.csv.gz", corrupt)
    _stage_fails(root, tmp_path / "out", "patients.csv.gz", "line 6", "anchor_age")


def test_row_with_too_many_fields_is_named(tmp_path, demo_path):
    root = _release(tmp_path, demo_path)
    _rewrite(root / "hosp/admissions.csv.gz", lambda ls: ls[:10] + [ls[10] + ",surplus"] + ls[11:])
    _stage_fails(root, tmp_path / "out", "admissions.csv.gz", "line 11")


def test_truncated_gzip_fails_cleanly(tmp_path, demo_path):
    root = _release(tmp_path, demo_path)
    target = root / "hosp/admissions.csv.gz"
    data = target.read_bytes()
    target.write_bytes(data[: len(data) // 2])
    _stage_fails(root, tmp_path / "out", "admissions.csv.gz")


def test_empty_file_fails_cleanly(tmp_path, demo_path):
    root = _release(tmp_path, demo_path)
    with gzip.open(root / "hosp/patients.csv.gz", "wb"):
        pass
    _stage_fails(root, tmp_path / "out", "patients.csv.gz", "empty")


def test_wrong_folder_fails_cleanly(tmp_path, demo_path):
    _stage_fails(demo_path / "hosp", tmp_path / "out", "not a MIMIC-IV folder", "hosp/")
    _stage_fails(tmp_path / "nowhere", tmp_path / "out", "does not exist")


def test_plain_csv_is_read_like_gzip(tmp_path, demo_path):
    root = _release(tmp_path, demo_path)
    gz = root / "hosp/patients.csv.gz"
    (root / "hosp/patients.csv").write_bytes(gzip.open(gz).read())
    gz.unlink()
    report = stage(make_source("mimic", root), tmp_path / "out", ["patients"])
    assert report.rows == {"patients": 100}


def test_failed_run_keeps_the_previous_output_intact(tmp_path, demo_path):
    root = _release(tmp_path, demo_path)
    out = tmp_path / "out"
    stage(make_source("mimic", root), out, ["patients", "admissions"])
    before = staged_path(out, "patients").read_bytes()
    _rewrite(root / "hosp/admissions.csv.gz", lambda ls: ls[:3] + ["not,a,valid,row"] + ls[3:])
    with pytest.raises(StagingError):
        stage(make_source("mimic", root), out, ["patients", "admissions"])
    assert staged_path(out, "patients").read_bytes() == before
    assert sorted(p.name for p in out.iterdir()) == ["admissions.parquet", "patients.parquet"]


def test_unknown_table_and_source_are_named(tmp_path, demo_path):
    with pytest.raises(KeyError, match="labevent"):
        stage(make_source("demo", demo_path), tmp_path, ["labevent"])
    with pytest.raises(StagingError, match="unknown source 'mimic3'"):
        make_source("mimic3", demo_path)
    with pytest.raises(StagingError, match="needs --path"):
        make_source("demo")


def test_staged_database_is_shared_read_only_and_removed_after(demo_staged, tmp_path, monkeypatch):
    """Workers attach one on-disk copy of the staged tables read-only (no copy per worker), each
    within its share of the memory budget; the file lives only as long as the stage needs it."""
    from pipeline.noise.overlay import Database
    from pipeline.staging import memory_limit, staged_database

    monkeypatch.setenv("EHR_ROBUSTGYM_TEMP_DIR", str(tmp_path))
    monkeypatch.setenv("EHR_ROBUSTGYM_DUCKDB_MEMORY", "3GB")
    with staged_database(demo_staged) as path:
        assert path.parent.parent == tmp_path and path.stat().st_size > 0
        shared = [Database(demo_staged, staged_file=path, processes=2) for _ in range(2)]
        loaded = Database(demo_staged)
        try:
            query = ("SELECT itemid, count(*), sum(valuenum), max(charttime) FROM labevents "
                     "WHERE subject_id IN (SELECT subject_id FROM patients WHERE gender = 'F') GROUP BY 1 ORDER BY 1")
            assert shared[0].rows(query) == shared[1].rows(query) == loaded.rows(query)
            assert shared[0].tables == loaded.tables
            assert shared[0].base_rows("labevents", [5, 70000]) == loaded.base_rows("labevents", [5, 70000])
            with shared[0].noisy(_one_deleted_lab(shared[0])):
                assert shared[0].scalar("SELECT count(*) FROM labevents") == DEMO_ROWS["labevents"] - 1
            limit = shared[0].scalar("SELECT current_setting('memory_limit')")
            assert limit == "1.3 GiB", limit  # 3 GB (2,861 MiB) over 2 workers
            with pytest.raises(duckdb.Error, match="read-only"):
                shared[0].rows("DELETE FROM base.labevents")
        finally:
            for db in (*shared, loaded):
                db.close()
    assert not path.parent.exists()
    assert memory_limit(4) == "715MiB"
    assert (memory_limit(1, at_most_mib=1024), memory_limit(4, at_most_mib=1024)) == ("1024MiB", "715MiB")


def _one_deleted_lab(db):
    from pipeline.noise.overlay import Change, Overlay

    return Overlay([Change("labevents", "delete", 5)])


def test_staged_database_of_a_killed_build_is_removed_by_the_next(demo_staged, tmp_path, monkeypatch):
    import subprocess
    import sys

    from pipeline.staging import staged_database

    monkeypatch.setenv("EHR_ROBUSTGYM_TEMP_DIR", str(tmp_path))
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    orphan = tmp_path / f"ehr-robustgym-staged-{dead.stdout.strip()}-x1y2"  # its process is gone
    orphan.mkdir()
    (orphan / "staged.duckdb").write_bytes(b"left by a killed build")
    alive = tmp_path / f"ehr-robustgym-staged-{os.getpid()}-a1b2"  # another stage of a live build
    alive.mkdir()
    with staged_database(demo_staged) as path:
        assert path.is_file()
    assert not orphan.exists() and alive.exists()


def test_a_key_value_folder_in_the_path_adds_no_column(demo_staged, tmp_path):
    """DuckDB reads ``seed=3/`` as a hive partition unless told not to: the benchmark's default
    folder (``data/benchmark/<source>/seed=<S>/``) put a ``seed`` column into inserted overlay rows
    and into the tables the gym shows the agent."""
    from pipeline.staging import attach_staged

    folder = tmp_path / "seed=3"
    folder.mkdir()
    shutil.copy(staged_path(demo_staged, "patients"), folder / "patients.parquet")
    con = duckdb.connect()
    attach_staged(con, folder, tables=["patients"])
    assert con.sql("SELECT * FROM patients").columns == pq.read_schema(folder / "patients.parquet").names


def test_loaded_tables_store_a_patient_s_rows_together(demo_staged):
    """The staged file keeps the source's order (the demo's labs are not by patient); the shared
    database and in-memory loads store rows by patient, then _rid, so zone maps can skip to one
    patient's row groups. A table without patients keeps _rid order."""
    from pipeline.noise.overlay import Database
    from pipeline.staging import staged_database

    source = duckdb.sql(f"SELECT subject_id FROM read_parquet('{staged_path(demo_staged, 'labevents')}') "
                        "ORDER BY _rid").fetchall()
    assert source != sorted(source)
    with staged_database(demo_staged) as path:
        con = duckdb.connect(str(path), read_only=True)
        labs = con.sql("SELECT subject_id, _rid FROM labevents ORDER BY rowid").fetchall()
        items = con.sql("SELECT _rid FROM d_labitems ORDER BY rowid").fetchall()
        con.close()
    assert labs == sorted(labs) and len(labs) == DEMO_ROWS["labevents"]
    assert items == sorted(items)
    loaded = Database(demo_staged, tables=["labevents"])
    try:
        assert loaded.rows("SELECT subject_id, _rid FROM base.labevents ORDER BY rowid") == labs
    finally:
        loaded.close()


def test_base_rows_narrow_by_patient_fall_back_and_cache(demo_staged):
    """base_rows gives the same rows with or without the patient hint (a row of another patient is
    still found), reads each row from DuckDB once, and hands out copies the caller may change."""
    from pipeline.noise.overlay import Database

    db = Database(demo_staged, tables=["labevents"])
    try:
        first, other = db.rows("SELECT min(_rid), max(_rid) FROM base.labevents")[0]
        subject = db.scalar(f"SELECT subject_id FROM base.labevents WHERE _rid = {first}")
        assert db.scalar(f"SELECT subject_id FROM base.labevents WHERE _rid = {other}") != subject
        mine = [r for (r,) in db.rows(f"SELECT _rid FROM base.labevents WHERE subject_id = {subject} LIMIT 5")]
        wanted = [other, *mine, mine[0]]
        fresh = Database(demo_staged, tables=["labevents"])
        plain = fresh.base_rows("labevents", wanted)
        fresh.close()
        hinted = db.base_rows("labevents", wanted, subject=subject)
        assert hinted == plain and [r["_rid"] for r in hinted] == sorted({other, *mine})
        hinted[0]["valuenum"] = -1.0
        db.records = None  # any further read from DuckDB would fail: the rows must come from the cache
        assert db.base_rows("labevents", wanted, subject=subject) == plain
    finally:
        db.close()
