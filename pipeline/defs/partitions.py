"""Seeds as dynamic partitions: the benchmark graph from ``slot_pools`` down runs once per seed.

A seed partition writes its own folder (``RunLayout.for_partition``); the staged source tables
above it are unpartitioned and shared. Seeds 0–4 are added by the ``default_seeds`` sensor on a
fresh instance; add another seed in the UI (Materialize → partition → "Add partition") or with
``dagster instance`` tooling, then materialize or backfill it.
"""

import dagster as dg

from pipeline.defs.resources import BenchmarkRun
from pipeline.layout import RunLayout

SEEDS = dg.DynamicPartitionsDefinition(name="seeds")
DEFAULT_SEEDS = tuple(str(seed) for seed in range(5))


def seed_of(context: dg.AssetExecutionContext | dg.AssetCheckExecutionContext) -> int:
    try:
        return int(context.partition_key)
    except ValueError:
        raise dg.Failure(f"seed partition {context.partition_key!r} is not an integer") from None


def seed_layout(context: dg.AssetExecutionContext | dg.AssetCheckExecutionContext,
                benchmark_run: BenchmarkRun) -> RunLayout:
    """The folder of the partition being materialized or checked."""
    return benchmark_run.layout(seed_of(context))


@dg.sensor(default_status=dg.DefaultSensorStatus.RUNNING, minimum_interval_seconds=30,
           description="Adds seeds 0–4 as partitions once, so a fresh `dagster dev` shows them.")
def default_seeds(context: dg.SensorEvaluationContext):
    """Runs nothing; its cursor remembers the seeds were added, so a seed deleted later stays deleted."""
    if context.cursor == "added":
        return dg.SkipReason("seeds 0–4 were added")
    missing = [s for s in DEFAULT_SEEDS if not context.instance.has_dynamic_partition(SEEDS.name, s)]
    return dg.SensorResult(dynamic_partitions_requests=[SEEDS.build_add_request(missing)] if missing else [],
                           cursor="added")


defs = dg.Definitions(sensors=[default_seeds])
