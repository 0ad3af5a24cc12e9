"""End to end on the real demo: build a (small) benchmark, check its contract, determinism."""

from __future__ import annotations

import json
from collections import defaultdict

import duckdb
import pyarrow.parquet as pq
import pytest
import yaml

from pipeline.build import build
from pipeline.files import sha256_file as sha256
from pipeline.noise.model import answer_of
from pipeline.noise.operators import OPERATORS
from pipeline.noise.overlay import Database, changes_from_records
from pipeline.noise.pairs import MIN_SHARD_TEMPLATES, shard_templates
from pipeline.noise.select import violations
from pipeline.noise.verify import CHECKS

QUESTIONS_PER_TEMPLATE = 3
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def demo_build(demo_path, tmp_path_factory):
    out = tmp_path_factory.mktemp("build") / "seed0"
    report = build("demo", out, 0, path=demo_path, questions_per_template=QUESTIONS_PER_TEMPLATE)
    return out, report


def test_every_shipped_pair_is_verified_and_balanced(demo_build):
    out, report = demo_build
    pairs = pq.read_table(out / "pairs.parquet").to_pylist()
    assert len(pairs) > 400
    for p in pairs:
        checks = json.loads(p["verification"])
        assert all(checks[c] for c in CHECKS), p["pair_id"]
        assert p["expected_behavior"] in ("answer", "abstain", "flag")
        assert p["noise_level"] == OPERATORS[p["operator"]].level
    assert not violations(pairs)
    assert len({p["operator"] for p in pairs}) >= 15
    assert len({p["pair_id"] for p in pairs}) == len(pairs)
    # A template never crosses splits.
    splits = {}
    for p in pairs:
        assert splits.setdefault(p["template_id"], p["split"]) == p["split"]
    assert set(splits.values()) == {"train", "dev", "test"}


def test_the_profile_accounts_for_every_operator_call_and_check(demo_build):
    _, report = demo_build
    noise, profile = report.noise, report.noise.profile
    for op in OPERATORS:  # every proposal attempt is timed: proposed or declined
        assert profile.calls[("operator", op)] == noise.proposed[op] + noise.not_applicable[op], op
    assert profile.calls[("check", "clean")] == sum(noise.proposed.values())
    assert profile.calls[("check", "deterministic")] == sum(noise.verified.values()) + sum(
        n for (_, check), n in noise.rejected.items() if check == "deterministic")
    text = report.profile()
    assert all(stage in text for stage in ("stage", "questions", "noise", "export"))
    assert "deterministic" in text and "misspelled_entity" in text


def test_overlays_belong_to_pairs_and_reopen(demo_build):
    out, _ = demo_build
    con = duckdb.connect()
    orphans = con.sql(f"SELECT count(*) FROM '{out}/overlays.parquet' o ANTI JOIN '{out}/pairs.parquet' p "
                      "USING (pair_id)").fetchall()[0][0]
    assert orphans == 0
    ops = {r[0] for r in con.sql(f"SELECT DISTINCT op FROM '{out}/overlays.parquet'").fetchall()}
    assert ops <= {"delete", "insert", "update"} and "update" in ops
    # Record and value pairs have overlays; query pairs rewrite the question instead.
    levels = dict(con.sql(f"SELECT p.noise_level, count(o.pair_id) FROM '{out}/pairs.parquet' p "
                          f"LEFT JOIN '{out}/overlays.parquet' o USING (pair_id) GROUP BY 1").fetchall())
    assert levels["query"] == 0 and levels["record"] > 0 and levels["value"] > 0
    # Re-applied from the published files alone, every pair gives back its recorded answers.
    db = Database(out / "staged")
    changes = defaultdict(list)
    for row in pq.read_table(out / "overlays.parquet").to_pylist():
        changes[row["pair_id"]].append(row)
    for pair in pq.read_table(out / "pairs.parquet").to_pylist():
        assert answer_of(db.rows(pair["gold_sql"]), pair["answer_type"]) == pair["clean_answer"], pair["pair_id"]
        with db.noisy(changes_from_records(changes[pair["pair_id"]])):
            naive = answer_of(db.rows(pair["naive_sql"]), pair["answer_type"])
        assert naive == json.loads(pair["verification"])["naive_answer"], pair["pair_id"]


def test_manifest_and_card(demo_build):
    out, report = demo_build
    manifest = json.loads((out / "manifest.json").read_text())
    for name, digest in manifest["outputs"].items():
        assert sha256(out / name) == digest, name
    assert manifest["counts"]["pairs"] == pq.ParquetFile(out / "pairs.parquet").metadata.num_rows
    assert manifest["inputs"]["absent_tables"] == ["chartevents"]
    assert manifest["expectations"]["success"] is True
    card = (out / "README.md").read_text()
    header = yaml.safe_load(card.split("---")[1])
    assert header["license"] == "odbl"
    assert header["configs"][0]["data_files"][0]["path"] == "splits/pairs-train.parquet"


def test_hugging_face_loads_the_benchmark_folder(demo_build, tmp_path, monkeypatch):
    datasets = pytest.importorskip("datasets")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    out, _ = demo_build
    by_split = json.loads((out / "manifest.json").read_text())["counts"]["by_split"]
    pairs = datasets.load_dataset(str(out), cache_dir=str(tmp_path))
    assert {s: pairs[s].num_rows for s in pairs} == by_split
    assert set(pairs["test"]["split"]) == {"test"}
    overlays = datasets.load_dataset(str(out), "overlays", cache_dir=str(tmp_path))
    assert sum(overlays[s].num_rows for s in overlays) == pq.ParquetFile(out / "overlays.parquet").metadata.num_rows
    flat = datasets.load_dataset("parquet", data_files=str(out / "pairs.parquet"), cache_dir=str(tmp_path))
    assert flat["train"].num_rows == sum(by_split.values())


def test_same_seed_same_bytes_other_seed_other_pairs(demo_build, demo_path, tmp_path):
    out, _ = demo_build
    build("demo", tmp_path / "again", 0, path=demo_path, questions_per_template=QUESTIONS_PER_TEMPLATE, workers=1)
    for name in ("pairs.parquet", "overlays.parquet", "clean_questions.parquet"):
        assert sha256(out / name) == sha256(tmp_path / "again" / name), name
    build("demo", tmp_path / "seed1", 1, path=demo_path, questions_per_template=QUESTIONS_PER_TEMPLATE)
    assert sha256(out / "pairs.parquet") != sha256(tmp_path / "seed1" / "pairs.parquet")


@pytest.mark.parametrize("workers", [2, 3, 8])
def test_noise_shards_hold_whole_templates_and_shrink_towards_the_end(workers):
    templates = [f"template_{i}" for i in range(149)]
    shards = shard_templates(templates * 3, workers)  # one id per question
    assert sorted(t for s in shards for t in s) == sorted(templates)
    sizes = [len(s) for s in shards]
    assert sizes == sorted(sizes, reverse=True)
    assert sizes[0] == -(-149 // (2 * workers)) and sizes[-1] <= MIN_SHARD_TEMPLATES
    assert len(shards) <= 8 * workers  # a shard's database is opened once, not once per template
    assert shard_templates(templates[:1], workers) == [templates[:1]]
