"""All Dagster definitions of EHR-RobustGym (``dagster dev`` loads this via ``[tool.dagster]``)."""

import os

os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")

import dagster as dg  # noqa: E402

from pipeline.defs import audit, evaluation, noise, partitions, questions, sources  # noqa: E402
from pipeline.defs.resources import BenchmarkRun  # noqa: E402

defs = dg.Definitions.merge(
    sources.defs,
    questions.defs,
    noise.defs,
    audit.defs,
    evaluation.defs,
    partitions.defs,
    dg.Definitions(
        resources={"benchmark_run": BenchmarkRun()},
        # One process per run: the stages share imports (GX, DuckDB) and a 2-core machine
        # gains nothing from a process per step. Choose another executor in run config to scale.
        executor=dg.in_process_executor,
    ),
)
