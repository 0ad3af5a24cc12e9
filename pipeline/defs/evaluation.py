"""Evaluation stage: an agent plays a seed partition's benchmark; its results, report and plots.

Partitioned by seed (the benchmark it reads) and by agent. The rule-based agents need no setting;
the LLM agent is set through the :class:`Evaluation` resource, and its API key only through an
environment variable the agent reads itself (``api_key_env``), so the key never reaches Dagster's
config, logs or metadata.
"""

import json
from pathlib import Path

import dagster as dg
from pydantic import Field

from pipeline.defs.noise import benchmark
from pipeline.defs.partitions import SEEDS
from pipeline.defs.resources import BenchmarkRun
from pipeline.eval.report import write_report
from pipeline.eval.runner import EvalConfig, EvalError, run_eval
from pipeline.gym.models import SIDES

LLM_AGENT = "openai"
AGENTS = dg.StaticPartitionsDefinition(["checking", "naive", "oracle", LLM_AGENT])
EVALUATION_PARTITIONS = dg.MultiPartitionsDefinition({"agent": AGENTS, "seed": SEEDS})


class Evaluation(dg.ConfigurableResource):
    """How an agent partition is run; the ``llm_*`` fields reach only the LLM agent."""

    trials: int = Field(default=1, description="episodes per (pair, side); pass^k needs k")
    workers: int = Field(default=2, description="worker processes, each opening the benchmark once")
    split: str | None = Field(default=None, description="only the pairs of this split (train/dev/test)")
    limit: int | None = Field(default=None, description="only this many pairs (a seeded choice)")
    seed: int = Field(default=0, description="seed of the pair choice and of each episode's rng")
    llm_model: str | None = Field(default=None, description="model the LLM agent calls")
    llm_base_url: str | None = Field(default=None, description="OpenAI-compatible endpoint of the LLM agent")
    llm_temperature: float | None = Field(default=None, description="sampling temperature of the LLM agent")
    llm_api_key_env: str | None = Field(default=None, description="name of the environment variable holding "
                                        "the endpoint's key (the key itself never goes through Dagster)")

    def config(self, benchmark_dir: Path, agent: str) -> EvalConfig:
        options = {}
        if agent == LLM_AGENT:
            given = {"model": self.llm_model, "base_url": self.llm_base_url, "temperature": self.llm_temperature,
                     "api_key_env": self.llm_api_key_env}
            options = {k: v for k, v in given.items() if v is not None}
        return EvalConfig(benchmark=benchmark_dir, agent=agent, options=options, trials=self.trials,
                          workers=self.workers, split=self.split, limit=self.limit, seed=self.seed)


def results_folder(benchmark_run: BenchmarkRun, seed: int, agent: str) -> Path:
    return Path(benchmark_run.data_dir) / "evaluation" / benchmark_run.source / f"seed={seed}" / agent


def _keys(context: dg.AssetExecutionContext) -> tuple[int, str]:
    key = context.partition_key
    if not isinstance(key, dg.MultiPartitionKey):
        raise dg.Failure(f"partition {key!r} does not name an agent and a seed")
    seed = key.keys_by_dimension["seed"]
    try:
        return int(seed), key.keys_by_dimension["agent"]
    except ValueError:
        raise dg.Failure(f"seed partition {seed!r} is not an integer") from None


@dg.asset(group_name="evaluation", deps=[benchmark], kinds={"parquet"}, partitions_def=EVALUATION_PARTITIONS)
def evaluation(context: dg.AssetExecutionContext, benchmark_run: BenchmarkRun,
               evaluation_settings: Evaluation) -> dg.MaterializeResult:
    """The agent's episodes on both sides of every pair (``results.parquet``, ``trajectories.jsonl``),
    with ``report.md``, ``metrics.json`` and plots beside them; a rerun resumes the episodes left."""
    seed, agent = _keys(context)
    out = results_folder(benchmark_run, seed, agent)
    config = evaluation_settings.config(benchmark_run.layout(seed).root, agent)
    try:
        run = run_eval(config, out, log=context.log.info)
    except EvalError as exc:
        raise dg.Failure(f"evaluation of agent {agent!r} on seed {seed}: {exc}") from exc
    files = write_report(out)
    summary = json.loads(files["metrics"].read_text())
    success, gap, rs = summary["success"], summary["gap"], summary["rs"]["all"]["10"]
    return dg.MaterializeResult(metadata={
        "dagster/row_count": summary["episodes"],
        **{f"{side}_success": success[side]["value"] for side in SIDES if success[side]},
        **({"gap": gap["value"]} if gap else {}),
        "rs_10": rs["value"],
        "episodes_played": run.played,
        "seconds": round(run.seconds, 1),
        "folder": dg.MetadataValue.path(str(out)),
        **{f"plot_{name}": dg.MetadataValue.path(str(path)) for name, path in files.items() if path.suffix == ".png"},
        "report": dg.MetadataValue.md(files["report"].read_text()),
    })


defs = dg.Definitions(assets=[evaluation], resources={"evaluation_settings": Evaluation()})
