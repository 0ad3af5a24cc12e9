"""Noise stage: candidates per noise level, verified pairs (blocking check), benchmark export."""

import json
from collections import Counter

import dagster as dg
import pyarrow.parquet as pq

from pipeline.build import export_benchmark, ship, source_description
from pipeline.defs.questions import clean_questions
from pipeline.defs.resources import BenchmarkRun
from pipeline.files import write_parquet
from pipeline.noise.audit import operator_table, samples_markdown
from pipeline.noise.export import candidates_table, shipped_table, validate_pairs
from pipeline.noise.pairs import NoiseReport, candidate_records
from pipeline.noise.registry import NOISE_LEVELS
from pipeline.noise.verify import CHECKS
from pipeline.questions.templates import load_templates


def _read_candidates(run: BenchmarkRun) -> list[dict]:
    return [r for level in NOISE_LEVELS for r in pq.read_table(run.layout.candidates(level)).to_pylist()]


@dg.multi_asset(
    specs=[dg.AssetSpec(f"noise_candidates_{level}", group_name="noise", deps=[clean_questions],
                        kinds={"duckdb", "parquet"},
                        description=f"Every {level}-level candidate pair with its five verification checks.")
           for level in NOISE_LEVELS],
    name="noise_candidates",
)
def noise_candidates(context: dg.AssetExecutionContext, benchmark_run: BenchmarkRun):
    """Propose and verify candidates at all three levels in one pass (one proposal per question
    and level keeps the CLI and the UI on the same pairs), then file them by level."""
    questions = pq.read_table(benchmark_run.layout.clean_questions)
    records, report = candidate_records(benchmark_run.layout.staged, questions, benchmark_run.seed,
                                       workers=benchmark_run.workers)
    benchmark_run.layout.not_applicable.parent.mkdir(parents=True, exist_ok=True)
    benchmark_run.layout.not_applicable.write_text(json.dumps(dict(sorted(report.not_applicable.items()))))
    for level in NOISE_LEVELS:
        mine = [r for r in records if r["noise_level"] == level]
        write_parquet(candidates_table(mine), benchmark_run.layout.candidates(level))
        level_report = NoiseReport.from_records(mine, report.not_applicable)
        yield dg.MaterializeResult(asset_key=f"noise_candidates_{level}", metadata={
            "dagster/row_count": len(mine),
            "verified": sum(r["verified"] for r in mine),
            "rejected_by_check": dg.MetadataValue.md(json.dumps(dict(Counter(
                r["failed_check"] for r in mine if not r["verified"])), indent=1)),
            "by_operator": dg.MetadataValue.md(operator_table(level_report)),
            "samples": dg.MetadataValue.md(samples_markdown(mine, benchmark_run.layout.staged)),
            "seconds": round(report.seconds, 1),
        })


@dg.asset(group_name="noise", deps=[f"noise_candidates_{level}" for level in NOISE_LEVELS], kinds={"parquet"})
def verified_pairs(benchmark_run: BenchmarkRun) -> dg.MaterializeResult:
    """The shipped pairs: verified candidates, balanced (intent ≥ 10%, noise level ≥ 25%,
    population ≥ 25%), capped per template, split by template into train/dev/test."""
    pairs = ship(_read_candidates(benchmark_run), load_templates(), benchmark_run.seed, benchmark_run.per_template)
    write_parquet(shipped_table(pairs), benchmark_run.layout.verified_pairs)
    return dg.MaterializeResult(metadata={
        "dagster/row_count": len(pairs),
        **{f"by_{key}": dg.MetadataValue.json(dict(sorted(Counter(p[key] for p in pairs).items())))
           for key in ("noise_level", "intent", "level", "operator", "split")},
    })


@dg.asset_check(asset=verified_pairs, blocking=True,
                description="Every shipped pair passed all five verification checks.")
def every_shipped_pair_is_verified(benchmark_run: BenchmarkRun) -> dg.AssetCheckResult:
    rows = pq.read_table(benchmark_run.layout.verified_pairs, columns=["pair_id", "verification"]).to_pylist()
    failing = [r["pair_id"] for r in rows if not all(json.loads(r["verification"]).get(c) for c in CHECKS)]
    return dg.AssetCheckResult(passed=bool(rows) and not failing,
                               metadata={"pairs": len(rows), "unverified": len(failing),
                                         "examples": ", ".join(failing[:5]) or "none"})


@dg.asset(group_name="benchmark", deps=[verified_pairs], kinds={"parquet"})
def benchmark(benchmark_run: BenchmarkRun) -> dg.MaterializeResult:
    """The published benchmark folder: pairs, overlays, clean questions, manifest, dataset card."""
    pairs = pq.read_table(benchmark_run.layout.verified_pairs).to_pylist()
    records = _read_candidates(benchmark_run)
    noise = NoiseReport.from_records(records, Counter(json.loads(benchmark_run.layout.not_applicable.read_text())))
    questions = pq.read_table(benchmark_run.layout.clean_questions)
    rejections = json.loads(benchmark_run.layout.question_rejections.read_text())
    manifest = export_benchmark(benchmark_run.layout.root, pairs, questions, rejections, noise,
                                source_description(benchmark_run.source, benchmark_run.path, benchmark_run.patients),
                                benchmark_run.seed)
    return dg.MaterializeResult(metadata={
        "dagster/row_count": manifest["counts"]["pairs"],
        "folder": dg.MetadataValue.path(str(benchmark_run.layout.root)),
        "counts": dg.MetadataValue.json(manifest["counts"]),
        "outputs_sha256": dg.MetadataValue.json(manifest["outputs"]),
    })


@dg.asset_check(asset=benchmark, description="Great Expectations suite expectations/benchmark/pairs.json "
                "(column contract, enums, unique ids, balance thresholds).")
def pairs_expectations(benchmark_run: BenchmarkRun) -> dg.AssetCheckResult:
    result = validate_pairs(benchmark_run.layout.pairs)
    return dg.AssetCheckResult(passed=result.success and not result.warnings, metadata={
        "rows": result.rows, "failed": ", ".join(o.describe() for o in result.errors + result.warnings) or "none"})


defs = dg.Definitions(assets=[noise_candidates, verified_pairs, benchmark],
                      asset_checks=[every_shipped_pair_is_verified, pairs_expectations])
