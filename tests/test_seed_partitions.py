"""Seeds as Dagster partitions: seeds 0 and 1 materialize into their own folders from shared staged
tables, each with a perturbation audit (metadata, per-operator checks, audit.html) and pairs whose
databases export to standalone DuckDB files; a reviewer's veto removes one pair on re-selection."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import dagster as dg
import duckdb
import pyarrow.parquet as pq
import pytest

from pipeline.defs import audit, noise, partitions, questions, sources
from pipeline.defs.resources import BenchmarkRun
from pipeline.files import sha256_file
from pipeline.noise.model import answer_of
from pipeline.noise.operators import OPERATORS

pytestmark = pytest.mark.slow

PARTITIONED = [questions.slot_pools, questions.clean_questions, questions.clean_questions_cover_all_cells,
               noise.noise_candidates, noise.verified_pairs, noise.every_shipped_pair_is_verified,
               noise.benchmark, noise.pairs_expectations, audit.perturbation_audit]
RESELECT = [noise.verified_pairs, noise.benchmark, audit.perturbation_audit]


def _run(tmp: Path, vetoes: Path) -> BenchmarkRun:
    return BenchmarkRun(source="synthetic", patients=100, questions_per_template=2, data_dir=str(tmp),
                        vetoes=str(vetoes))


@pytest.fixture(scope="module")
def seeds(tmp_path_factory):
    """Seeds 0 and 1 materialized on one instance: {seed: (result, layout)}, plus the run and instance."""
    tmp = tmp_path_factory.mktemp("partitions")
    run = _run(tmp, tmp / "vetoes.yaml")
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(partitions.SEEDS.name, ["0", "1"])
    assert dg.materialize([sources.stage_mimic_tables], instance=instance,
                          resources={"benchmark_run": run}).success
    results = {}
    for seed in (0, 1):
        result = dg.materialize(PARTITIONED, partition_key=str(seed), instance=instance,
                                resources={"benchmark_run": run})
        assert result.success
        results[seed] = (result, run.layout(seed))
    return results, run, instance


def test_each_seed_writes_its_own_folder_from_shared_staged_tables(seeds):
    results, run, instance = seeds
    folders = {seed: layout.root for seed, (_, layout) in results.items()}
    assert folders[1] == Path(run.data_dir) / "benchmark" / "synthetic" / "seed=1"
    for folder in folders.values():
        for name in ("pairs.parquet", "overlays.parquet", "manifest.json", "README.md", "audit.html"):
            assert (folder / name).is_file(), folder / name
        # The published staged tables are the shared ones, linked in: the folder stands alone.
        assert sha256_file(folder / "staged" / "labevents.parquet") == sha256_file(run.staged / "labevents.parquet")
    assert run.staged == Path(run.data_dir) / "benchmark" / "synthetic" / "staged"
    assert sha256_file(folders[0] / "pairs.parquet") != sha256_file(folders[1] / "pairs.parquet")
    assert [json.loads((f / "manifest.json").read_text())["seed"] for f in folders.values()] == [0, 1]
    materialized = instance.get_materialized_partitions(dg.AssetKey("benchmark"))
    assert materialized == {"0", "1"}
    logs = [e.user_message for e in instance.all_logs(results[1][0].run_id)]
    assert any("candidates verified" in m and "candidates/s" in m for m in logs)  # progress with the rate
    assert any(m.startswith("wrote ") and "seed=1" in m for m in logs)


def test_seeds_0_to_4_are_added_once_by_the_sensor():
    instance = dg.DagsterInstance.ephemeral()
    context = dg.build_sensor_context(instance=instance)
    result = partitions.default_seeds(context)
    (request,) = result.dynamic_partitions_requests
    assert request.partition_keys == ["0", "1", "2", "3", "4"] and result.cursor == "added"
    skipped = partitions.default_seeds(dg.build_sensor_context(instance=instance, cursor="added"))
    assert isinstance(skipped, dg.SkipReason)


def test_audit_metadata_renders_as_table_samples_and_page_link(seeds):
    results, run, _ = seeds
    result, layout = results[0]
    (event,) = [e for e in result.get_asset_materialization_events()
                if e.asset_key == dg.AssetKey("perturbation_audit")]
    metadata = event.materialization.metadata
    table = metadata["operators"]
    assert isinstance(table, dg.TableMetadataValue)
    columns = [c.name for c in table.schema.columns]
    assert columns[:7] == ["operator", "level", "discrepancy", "candidates", "verified", "shipped", "share"]
    assert {"rejected_effect", "rejected_local", "vetoed"} <= set(columns)
    rows = {r.data["operator"]: r.data for r in table.records}
    assert set(rows) == set(OPERATORS)
    pairs = pq.read_table(layout.pairs).to_pylist()
    assert sum(r["shipped"] for r in rows.values()) == len(pairs)
    assert isinstance(metadata["audit_page"], dg.PathMetadataValue)
    assert Path(metadata["audit_page"].path) == layout.audit_page.resolve()
    assert isinstance(metadata["audit_page_url"], dg.UrlMetadataValue)
    assert isinstance(metadata["vetoes"], dg.MarkdownMetadataValue)
    inline = metadata["samples"]  # every sample in one table the UI shows without expanding anything
    assert isinstance(inline, dg.TableMetadataValue)
    assert [c.name for c in inline.schema.columns][:2] == ["operator", "pair_id"]
    per_operator = Counter(r.data["operator"] for r in inline.records)
    assert all(per_operator[op] == min(5, rows[op]["shipped"]) for op in rows)
    assert any("→" in r.data["changed_rows"] for r in inline.records)
    samples = {k.removeprefix("samples: "): v for k, v in metadata.items() if k.startswith("samples: ")}
    assert samples and all(isinstance(v, dg.MarkdownMetadataValue) for v in samples.values())
    for op, md in samples.items():
        assert md.value.count("### ") == min(5, rows[op]["shipped"]), op
        assert "**clean:**" in md.value and "**noisy:**" in md.value and "**expected:**" in md.value
    assert any("| table | _rid |" in md.value for md in samples.values())  # before/after rows
    checks = {e.check_name: e for e in result.get_asset_check_evaluations()
              if e.asset_key == dg.AssetKey("perturbation_audit")}
    assert set(checks) == {f"operator_{op}" for op in OPERATORS}
    assert all(e.severity == dg.AssetCheckSeverity.WARN for e in checks.values())
    for op, row in rows.items():  # warns exactly when the share or the rejection rate is out of bounds
        rejected = (row["candidates"] - row["verified"]) / row["candidates"] if row["candidates"] else 0
        assert checks[f"operator_{op}"].passed == (0.01 <= row["share"] <= 0.15 and rejected <= 0.70), op


def _dom(page: Path, fragment: str) -> str:
    out = subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=10000",
                          "--dump-dom", page.resolve().as_uri() + fragment],
                         capture_output=True, text=True, timeout=120, check=True)
    return out.stdout


def test_audit_page_loads_filters_and_shows_a_pairs_rows_in_headless_chromium(seeds):
    results, _, _ = seeds
    _, layout = results[0]
    pairs = pq.read_table(layout.pairs).to_pylist()
    everything = _dom(layout.audit_page, "")
    assert f'id="count">{len(pairs)} of {len(pairs)} pairs<' in everything
    op = sorted(p["operator"] for p in pairs)[0]
    wanted = sum(p["operator"] == op and p["intent"] == "laboratory" for p in pairs)
    filtered = _dom(layout.audit_page, f"#operator={op}&intent=laboratory")
    assert f'id="count">{wanted} of {len(pairs)} pairs<' in filtered
    assert filtered.count('class="pair"') == min(wanted, 100)
    overlays = pq.read_table(layout.overlays).to_pylist()
    pair = next(p for p in pairs if any(o["pair_id"] == p["pair_id"] and o["op"] == "update" for o in overlays))
    one = _dom(layout.audit_page, f"#pair={pair['pair_id']}")
    assert f'id="count">1 of {len(pairs)} pairs<' in one
    change = next(o for o in overlays if o["pair_id"] == pair["pair_id"] and o["op"] == "update")
    rows = one[one.index('class="changed-rows"'):]
    assert f"<td>{change['table_name']}</td><td>{change['rid']}</td><td>update</td>" \
           f"<td>{change['column_name']}</td>" in rows
    assert f"export-pair --benchmark {layout.root} --pair {pair['pair_id']} --side noise" in one


def test_export_pair_gives_the_recorded_answers_in_plain_duckdb(seeds, tmp_path):
    results, _, _ = seeds
    _, layout = results[0]
    pairs = pq.read_table(layout.pairs).to_pylist()
    chosen = [next(p for p in pairs if p["noise_level"] == level) for level in ("record", "value", "query")]
    cli = Path(sys.executable).with_name("ehr-robustgym")
    for pair in chosen:
        for side in ("clean", "noise"):
            out = tmp_path / f"{pair['pair_id']}-{side}.duckdb"
            subprocess.run([str(cli), "export-pair", "--benchmark", str(layout.root), "--pair", pair["pair_id"],
                            "--side", side, "--out", str(out)], check=True, capture_output=True, timeout=300)
            con = duckdb.connect(str(out), read_only=True)
            try:
                assert not con.execute("SELECT * FROM information_schema.columns "
                                       "WHERE column_name = '_rid'").fetchall()
                if side == "noise":
                    naive = answer_of(con.execute(pair["naive_sql"]).fetchall(), pair["answer_type"])
                    assert naive == json.loads(pair["verification"])["naive_answer"], pair["pair_id"]
                else:
                    clean = answer_of(con.execute(pair["gold_sql"]).fetchall(), pair["answer_type"])
                    assert clean == pair["clean_answer"], pair["pair_id"]
            finally:
                con.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        f"{p['pair_id']}-{s}.duckdb" for p in chosen for s in ("clean", "noise"))  # no temporary left


def test_a_veto_removes_its_pair_and_only_selection_replaces_it(seeds):
    results, run, instance = seeds
    _, layout = results[1]
    before = {p["pair_id"]: p for p in pq.read_table(layout.pairs).to_pylist()}
    vetoed = sorted(before)[len(before) // 2]
    Path(run.vetoes).write_text(f"- pair_id: '{vetoed}'\n  reason: the test vetoes it\n")
    try:
        result = dg.materialize(RESELECT, partition_key="1", instance=instance, resources={"benchmark_run": run})
    finally:
        Path(run.vetoes).unlink()
    assert result.success
    after = {p["pair_id"]: p for p in pq.read_table(layout.pairs).to_pylist()}
    assert vetoed not in after
    assert set(before) - {vetoed} <= set(after)  # every other pair still ships, unchanged
    assert all(after[i] == before[i] for i in set(before) - {vetoed})
    replacements = set(after) - set(before)
    assert len(replacements) <= 1
    assert all(after[i]["question_id"] == before[vetoed]["question_id"]
               or after[i]["template_id"] == before[vetoed]["template_id"] for i in replacements)
    manifest = json.loads((layout.root / "manifest.json").read_text())
    assert manifest["vetoes"] == [{"pair_id": vetoed, "reason": "the test vetoes it", "acts_at": "selection",
                                   "removed": 1}]
    (event,) = [e for e in result.get_asset_materialization_events()
                if e.asset_key == dg.AssetKey("perturbation_audit")]
    assert vetoed in event.materialization.metadata["vetoes"].value
    rows = {r.data["operator"]: r.data for r in event.materialization.metadata["operators"].records}
    assert rows[before[vetoed]["operator"]]["vetoed"] == 1
