"""Paths reach SQL only through :func:`pipeline.sql.path_literal`: a folder named like
``~/O'Brien/mimic`` works for every command that reads staged or source files; and the rest of
:mod:`pipeline.sql`."""

from __future__ import annotations

import duckdb
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from pipeline.cli import main
from pipeline.integrity import table_invariants
from pipeline.noise.audit import before_after
from pipeline.noise.overlay import Change, Database, Overlay
from pipeline.sql import path_literal, quote_string, register_macros


def test_quote_string_doubles_quotes():
    assert quote_string("O'Brien") == "'O''Brien'"
    assert duckdb.sql(f"SELECT {quote_string(chr(39) * 3 + 'x')}").fetchall() == [("'''x",)]


@pytest.fixture()
def obrien(tmp_path, demo_path):
    """A home folder with an apostrophe, holding a link to the demo."""
    home = tmp_path / "O'Brien"
    home.mkdir()
    (home / "mimic").symlink_to(demo_path, target_is_directory=True)
    return home


def test_staged_folder_with_an_apostrophe_opens_everywhere(obrien):
    staged = CliRunner().invoke(main, ["stage", "--source", "demo", "--path", str(obrien / "mimic"),
                                       "--out", str(obrien / "staged"), "--table", "patients", "--table", "admissions"])
    assert staged.exit_code == 0, staged.output
    db = Database(obrien / "staged")
    assert db.tables == ["admissions", "patients"] and db.scalar("SELECT count(*) FROM patients") == 100
    rid = db.scalar("SELECT min(_rid) FROM admissions")
    with db.noisy(Overlay([Change("admissions", "update", rid, "admission_type", "ELECTIVE")])):
        assert db.scalar(f"SELECT admission_type FROM admissions WHERE _rid = {rid}") == "ELECTIVE"
    assert any(inv.kind == "unique_key" and inv.ok for inv in table_invariants(obrien / "staged", "admissions"))
    audit = before_after(obrien / "staged", [["admissions", "update", rid, "admission_type", '"ELECTIVE"']])
    assert f"| admissions | {rid} | update | admission_type |" in audit


@pytest.mark.slow
def test_stage_build_check_in_a_folder_with_an_apostrophe(obrien):
    out = obrien / "bench"
    built = CliRunner().invoke(main, ["build", "--source", "synthetic", "--patients", "60",
                                      "--questions-per-template", "2", "--per-template", "3", "--workers", "1",
                                      "--out", str(out)])
    assert built.exit_code == 0, built.output
    pairs = pq.read_table(out / "pairs.parquet")
    assert pairs.num_rows > 0
    assert duckdb.sql(f"SELECT count(*) FROM read_parquet({path_literal(out / 'pairs.parquet')})").fetchall() == [
        (pairs.num_rows,)]
    checked = CliRunner().invoke(main, ["check", "--staged", str(out / "staged")])
    assert checked.exit_code == 0, checked.output
    assert "admissions integrity: ok" in checked.output


def test_the_registered_year_reads_exactly_like_the_built_in():
    """register_macros swaps year() for a spelling DuckDB plans faster: same values, type, NULLs."""
    con = duckdb.connect()
    con.execute("CREATE TABLE t AS SELECT * FROM (VALUES (TIMESTAMP '2133-01-01 00:00:00', DATE '2180-12-31'), "
                "(TIMESTAMP '2199-12-31 23:59:59.999', NULL), (NULL, DATE '2001-02-03')) v(ts, d)")
    query = ("SELECT year(ts), year(d), typeof(year(ts)), typeof(year(d)), count(*) FILTER (WHERE year(ts) = 2133) "
             "OVER () FROM t ORDER BY ts NULLS LAST")
    built_in = con.execute(query).fetchall()
    register_macros(con)
    assert con.execute("SELECT count(*) FROM duckdb_functions() WHERE function_name = 'year' "
                       "AND function_type = 'macro'").fetchall() == [(1,)]
    assert con.execute(query).fetchall() == built_in
