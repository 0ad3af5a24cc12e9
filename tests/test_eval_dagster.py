"""Dagster: the evaluation asset runs the runner for its (agent, seed) partition and reports."""

from __future__ import annotations

import shutil

import dagster as dg
from gym_benchmark import make_benchmark

from pipeline.defs import evaluation
from pipeline.defs.partitions import SEEDS
from pipeline.defs.resources import BenchmarkRun


def materialize(tmp_path, agent: str, settings: evaluation.Evaluation) -> tuple[BenchmarkRun, dg.ExecuteInProcessResult]:
    run = BenchmarkRun(source="synthetic", data_dir=str(tmp_path))
    make_benchmark(tmp_path / "bench")
    shutil.copytree(tmp_path / "bench", run.layout(0).root)
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(SEEDS.name, ["0"])
    return run, dg.materialize([evaluation.evaluation], instance=instance, raise_on_error=False,
                               resources={"benchmark_run": run, "evaluation_settings": settings},
                               partition_key=dg.MultiPartitionKey({"agent": agent, "seed": "0"}))


def test_evaluation_asset_materializes_an_agent_partition(tmp_path):
    settings = evaluation.Evaluation(workers=1, trials=2, llm_model="ignored-by-rule-based-agents")
    run, result = materialize(tmp_path, "oracle", settings)
    assert result.success
    metadata = result.get_asset_materialization_events()[0].materialization.metadata
    assert metadata["clean_success"].value == 1.0 and metadata["noise_success"].value == 1.0
    assert metadata["dagster/row_count"].value == 9 * 2 * 2
    folder = evaluation.results_folder(run, 0, "oracle")
    assert metadata["folder"].value == str(folder)
    assert (folder / "results.parquet").exists() and (folder / "pass_hat_k.png").exists()
    assert metadata["plot_pass_hat_k"].value == str(folder / "pass_hat_k.png")
    assert "# Evaluation: oracle" in metadata["report"].value


def test_an_agent_partition_without_a_registered_agent_fails_clearly(tmp_path, monkeypatch):
    from pipeline.eval import agent

    agent.agent_names()  # fill the registry, then take the oracle out
    monkeypatch.delitem(agent._factories, "oracle")
    _, result = materialize(tmp_path, "oracle", evaluation.Evaluation(workers=1))
    assert not result.success
    failure = next(e for e in result.all_events if e.is_step_failure).step_failure_data.error
    assert "evaluation of agent 'oracle' on seed 0: unknown agent 'oracle'" in failure.message


def test_only_the_llm_agent_gets_the_llm_settings(tmp_path):
    settings = evaluation.Evaluation(llm_model="m", llm_base_url="http://127.0.0.1:1/v1", llm_api_key_env="KEY")
    assert settings.config(tmp_path, "naive").options == {}
    assert settings.config(tmp_path, evaluation.LLM_AGENT).options == {
        "model": "m", "base_url": "http://127.0.0.1:1/v1", "api_key_env": "KEY"}


def test_evaluation_is_downstream_of_the_benchmark_in_the_definitions():
    from pipeline.definitions import defs

    graph = defs.get_repository_def().asset_graph
    node = graph.get(dg.AssetKey("evaluation"))
    assert dg.AssetKey("benchmark") in node.parent_keys
    assert node.partitions_def == evaluation.EVALUATION_PARTITIONS
    assert {"oracle", "naive", "checking", evaluation.LLM_AGENT} == set(evaluation.AGENTS.get_partition_keys())
