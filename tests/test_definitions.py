"""Dagster: all definitions load, and the source assets materialize with their checks."""

from __future__ import annotations

import dagster as dg

from pipeline.definitions import defs
from pipeline.defs import sources
from pipeline.defs.resources import BenchmarkRun
from pipeline.schema import TABLES


def test_all_definitions_load():
    repo = defs.get_repository_def()
    graph = repo.asset_graph
    keys = {k.to_user_string() for k in graph.get_all_asset_keys()}
    assert set(TABLES) <= keys
    groups = {graph.get(dg.AssetKey(name)).group_name for name in TABLES}
    assert groups == {"mimic_hosp", "mimic_icu"}
    checks = {(k.asset_key.to_user_string(), k.name) for k in graph.asset_check_keys}
    assert {(t, c) for t in TABLES for c in ("expectations", "integrity")} <= checks
    assert repo.get_all_jobs()  # the implicit asset job resolves


def test_source_assets_materialize_on_the_demo_with_checks(demo_path, tmp_path):
    run = BenchmarkRun(source="demo", path=str(demo_path), data_dir=str(tmp_path))
    result = dg.materialize([sources.stage_mimic_tables, *sources.TABLE_CHECKS],
                            resources={"benchmark_run": run})
    assert result.success
    materialized = {e.asset_key.to_user_string() for e in result.get_asset_materialization_events()}
    assert materialized == set(TABLES) - {"chartevents"}
    evaluations = result.get_asset_check_evaluations()
    assert len(evaluations) == 2 * 30
    assert all(e.passed or e.severity == dg.AssetCheckSeverity.WARN for e in evaluations)
    labevents = next(e for e in result.get_asset_materialization_events()
                     if e.asset_key.to_user_string() == "labevents")
    assert labevents.materialization.metadata["dagster/row_count"].value == 107_727
    assert (run.staged_dir / "labevents.parquet").exists()
    assert run.staged_dir == tmp_path / "benchmark" / "demo" / "seed=0" / "staged"
