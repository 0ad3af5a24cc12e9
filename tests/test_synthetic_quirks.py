"""The synthetic source reproduces the real demo's data-quality profile (issue 10): each quirk within
2x of the demo's rate by the one profile script, none with ``quirks="none"``, the clean values the
same either way, keys still unique across chunks, and the clean-evidence filter rejecting on them."""

from __future__ import annotations

import hashlib
import importlib.util

import duckdb
import pytest
from click.testing import CliRunner

from pipeline.cli import main
from pipeline.questions.generate import generate_questions
from pipeline.questions.templates import load_templates
from pipeline.schema import TABLES
from pipeline.sources import make_source
from pipeline.sources.synthetic import SyntheticSource
from pipeline.staging import StagingError, attach_staged, stage, staged_path
from tests.conftest import REPO

PATIENTS = 400
PROFILED = ("labevents", "admissions", "prescriptions", "emar", "poe")


def _profile_script():
    spec = importlib.util.spec_from_file_location("quirk_profile", REPO / "bench" / "quirk_profile.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def quirky(tmp_path_factory):
    out = tmp_path_factory.mktemp("quirky")
    stage(make_source("synthetic", patients=PATIENTS, seed=11), out)  # quirks="demo" is the default
    return out


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    out = tmp_path_factory.mktemp("clean")
    stage(make_source("synthetic", patients=PATIENTS, seed=11, quirks="none"), out)
    return out


def _rates(folder) -> dict[str, float]:
    profile = _profile_script()
    con = duckdb.connect()
    attach_staged(con, folder, tables=list(PROFILED))
    return profile.profile(con)


def test_every_quirk_is_within_twice_the_demo_rate(quirky, demo_path, tmp_path):
    profile = _profile_script()
    demo = profile.profile(profile.connect(str(demo_path), "demo", tmp_path))
    synthetic = _rates(quirky)
    for quirk, rate in demo.items():
        assert rate > 0, quirk
        assert rate / 2 <= synthetic[quirk] <= 2 * rate, (quirk, rate, synthetic[quirk])


def test_quirks_none_has_none_of_them(clean):
    rates = _rates(clean)
    sharing = "lab rows sharing (subject, item, charttime)"  # clean ward and ICU draws may coincide
    assert all(r == 0 or r != r for q, r in rates.items() if q != sharing), rates  # r != r: NaN, nothing to count
    assert rates[sharing] < 0.005


def _digest(folder, name: str) -> str:
    return hashlib.sha256(staged_path(folder, name).read_bytes()).hexdigest()


def test_quirks_leave_every_other_table_and_value_as_it_was(quirky, clean):
    touched = {"labevents", "prescriptions", "emar"}
    assert all(_digest(quirky, n) == _digest(clean, n) for n in TABLES if n not in touched)
    con = duckdb.connect()
    attach_staged(con, clean, schema="main")
    con.execute("CREATE SCHEMA q")
    attach_staged(con, quirky, schema="q")
    # a lab row keeps its id, item and (unless reported as text) its value; only twins are new
    changed = con.execute("""SELECT count(*) FROM labevents c JOIN q.labevents x USING (labevent_id)
                             WHERE x.itemid <> c.itemid OR x.valuenum <> c.valuenum""").fetchall()[0][0]
    assert changed == 0
    assert con.execute("SELECT count(*) FROM q.labevents ANTI JOIN labevents USING (labevent_id)").fetchall()[0][0] > 0


def test_same_seed_same_bytes_and_unique_keys_across_small_chunks(quirky, tmp_path):
    stage(make_source("synthetic", patients=PATIENTS, seed=11), tmp_path / "again", PROFILED)
    assert all(_digest(tmp_path / "again", n) == _digest(quirky, n) for n in PROFILED)
    stage(SyntheticSource(patients=150, seed=3, chunk_size=40), tmp_path / "chunks", ["labevents", "emar"])
    con = duckdb.connect()
    attach_staged(con, tmp_path / "chunks")
    assert con.execute("SELECT count(*) - count(DISTINCT labevent_id) FROM labevents").fetchall()[0][0] == 0
    assert con.execute("SELECT count(*) - count(DISTINCT emar_id) FROM emar").fetchall()[0][0] == 0
    twins = con.execute("""SELECT count(*) FROM (SELECT specimen_id FROM labevents
                           GROUP BY 1 HAVING count(DISTINCT charttime) > 1 OR count(DISTINCT subject_id) > 1)""")
    assert twins.fetchall()[0][0] == 0  # a new specimen id per twin draw, never a clash with another chunk's


def test_unknown_quirks_are_a_clear_error():
    with pytest.raises(StagingError, match="unknown quirks 'real'"):
        make_source("synthetic", quirks="real")
    result = CliRunner().invoke(main, ["stage", "--quirks", "real", "--out", "x"])
    assert result.exit_code == 2 and "--quirks" in result.output


def test_the_clean_evidence_filter_rejects_on_synthetic_quirks(quirky, clean):
    templates = [t for t in load_templates() if t.id in {
        "lab_last_value_first_admission", "lab_max_value_last_admission", "med_routes_first_admission",
        "med_first_start_last_admission", "med_last_administration"}]
    scope = {"inverted_in_scope", "outside_stay_in_scope", "unlinked_in_stay"}
    _, with_quirks = generate_questions(quirky, 0, templates, per_template=20, workers=1)
    _, without = generate_questions(clean, 0, templates, per_template=20, workers=1)
    assert scope & set(with_quirks.rejected)
    assert not scope & set(without.rejected)
