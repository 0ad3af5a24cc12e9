"""Noise stage: candidates per noise level, verified pairs (blocking check), benchmark export."""

import json
from collections import Counter

import dagster as dg
import pyarrow.parquet as pq

from pipeline.build import export_benchmark, ship, source_description
from pipeline.defs.partitions import SEEDS, seed_layout, seed_of
from pipeline.defs.questions import clean_questions
from pipeline.defs.resources import BenchmarkRun
from pipeline.files import link_or_copy, write_parquet
from pipeline.layout import RunLayout
from pipeline.noise.audit import operator_table, samples_markdown
from pipeline.noise.export import candidates_table, shipped_table, validate_pairs
from pipeline.noise.pairs import NoiseReport, candidate_records
from pipeline.noise.registry import NOISE_LEVELS
from pipeline.noise.verify import CHECKS
from pipeline.noise.vetoes import load_vetoes
from pipeline.progress import verification_progress
from pipeline.questions.templates import load_templates
from pipeline.schema import TABLES
from pipeline.staging import staged_path


def read_candidates(layout: RunLayout) -> list[dict]:
    return [r for level in NOISE_LEVELS for r in pq.read_table(layout.candidates(level)).to_pylist()]


@dg.multi_asset(
    specs=[dg.AssetSpec(f"noise_candidates_{level}", group_name="noise", deps=[clean_questions],
                        kinds={"duckdb", "parquet"},
                        description=f"Every {level}-level candidate pair with its six verification checks.")
           for level in NOISE_LEVELS],
    name="noise_candidates",
    partitions_def=SEEDS,
)
def noise_candidates(context: dg.AssetExecutionContext, benchmark_run: BenchmarkRun):
    """Propose and verify candidates at all three levels in one pass (one proposal per question
    and level keeps the CLI and the UI on the same pairs), then file them by level."""
    layout = seed_layout(context, benchmark_run)
    questions = pq.read_table(layout.clean_questions)
    context.log.info(f"seed {seed_of(context)}: proposing and verifying candidates for "
                     f"{questions.num_rows:,} clean questions")
    records, report = candidate_records(layout.staged, questions, seed_of(context),
                                        workers=benchmark_run.workers, progress=verification_progress(context.log.info),
                                        vetoed_families=load_vetoes(benchmark_run.vetoes).families())
    layout.not_applicable.parent.mkdir(parents=True, exist_ok=True)
    layout.not_applicable.write_text(json.dumps(dict(sorted(report.not_applicable.items()))))
    for level in NOISE_LEVELS:
        mine = [r for r in records if r["noise_level"] == level]
        write_parquet(candidates_table(mine), layout.candidates(level))
        level_report = NoiseReport.from_records(mine, report.not_applicable)
        yield dg.MaterializeResult(asset_key=f"noise_candidates_{level}", metadata={
            "dagster/row_count": len(mine),
            "verified": sum(r["verified"] for r in mine),
            "rejected_by_check": dg.MetadataValue.md(json.dumps(dict(Counter(
                r["failed_check"] for r in mine if not r["verified"])), indent=1)),
            "by_operator": dg.MetadataValue.md(operator_table(level_report)),
            "samples": dg.MetadataValue.md(samples_markdown(mine, layout.staged)),
            "seconds": round(report.seconds, 1),
            "profile": dg.MetadataValue.md("```\n" + "\n".join(report.profile.lines()) + "\n```"),
        })


@dg.asset(group_name="noise", deps=[f"noise_candidates_{level}" for level in NOISE_LEVELS], kinds={"parquet"},
          partitions_def=SEEDS)
def verified_pairs(context: dg.AssetExecutionContext, benchmark_run: BenchmarkRun) -> dg.MaterializeResult:
    """The shipped pairs: verified candidates less the reviewer's vetoes (``audit/vetoes.yaml``),
    balanced (intent ≥ 10%, noise level ≥ 25%, population ≥ 25%), capped per template, split by
    template into train/dev/test."""
    layout = seed_layout(context, benchmark_run)
    records, vetoes = read_candidates(layout), load_vetoes(benchmark_run.vetoes)
    pairs = ship(records, load_templates(), seed_of(context), benchmark_run.per_template, vetoes)
    write_parquet(shipped_table(pairs), layout.verified_pairs)
    layout.vetoes_applied.write_text(json.dumps(vetoes.report(records), indent=1))
    context.log.info(f"{len(pairs):,} pairs selected from {sum(r['verified'] for r in records):,} verified "
                     f"candidates ({len(vetoes.entries)} veto(es) from {benchmark_run.vetoes})")
    return dg.MaterializeResult(metadata={
        "dagster/row_count": len(pairs),
        "vetoes": dg.MetadataValue.json(vetoes.report(records)),
        **{f"by_{key}": dg.MetadataValue.json(dict(sorted(Counter(p[key] for p in pairs).items())))
           for key in ("noise_level", "intent", "level", "operator", "split")},
    })


@dg.asset_check(asset=verified_pairs, blocking=True, partitions_def=SEEDS,
                description="Every shipped pair passed all six verification checks.")
def every_shipped_pair_is_verified(context: dg.AssetCheckExecutionContext,
                                   benchmark_run: BenchmarkRun) -> dg.AssetCheckResult:
    rows = pq.read_table(seed_layout(context, benchmark_run).verified_pairs,
                         columns=["pair_id", "verification"]).to_pylist()
    failing = [r["pair_id"] for r in rows if not all(json.loads(r["verification"]).get(c) for c in CHECKS)]
    return dg.AssetCheckResult(passed=bool(rows) and not failing,
                               metadata={"pairs": len(rows), "unverified": len(failing),
                                         "examples": ", ".join(failing[:5]) or "none"})


def _publish_staged(layout: RunLayout) -> None:
    """Link the shared staged tables into the benchmark folder, so it stands alone like a CLI build's
    (hard links: no extra space, and a later re-staging leaves this benchmark's inputs intact)."""
    for table in TABLES:
        shared, published = staged_path(layout.staged, table), staged_path(layout.published_staged, table)
        if shared.is_file():
            link_or_copy(shared, published)
        else:
            published.unlink(missing_ok=True)


@dg.asset(group_name="benchmark", deps=[verified_pairs], kinds={"parquet"}, partitions_def=SEEDS)
def benchmark(context: dg.AssetExecutionContext, benchmark_run: BenchmarkRun) -> dg.MaterializeResult:
    """The published benchmark folder: pairs, overlays, clean questions, staged tables, manifest,
    dataset card."""
    layout = seed_layout(context, benchmark_run)
    pairs = pq.read_table(layout.verified_pairs).to_pylist()
    records = read_candidates(layout)
    noise = NoiseReport.from_records(records, Counter(json.loads(layout.not_applicable.read_text())))
    questions = pq.read_table(layout.clean_questions)
    rejections = json.loads(layout.question_rejections.read_text())
    _publish_staged(layout)
    manifest = export_benchmark(layout.root, pairs, questions, rejections, noise,
                                source_description(benchmark_run.source, benchmark_run.path, benchmark_run.patients,
                                                   benchmark_run.quirks),
                                seed_of(context), json.loads(layout.vetoes_applied.read_text()))
    context.log.info(f"wrote {manifest['counts']['pairs']:,} pairs to {layout.root}")
    return dg.MaterializeResult(metadata={
        "dagster/row_count": manifest["counts"]["pairs"],
        "folder": dg.MetadataValue.path(str(layout.root)),
        "counts": dg.MetadataValue.json(manifest["counts"]),
        "outputs_sha256": dg.MetadataValue.json(manifest["outputs"]),
    })


@dg.asset_check(asset=benchmark, partitions_def=SEEDS,
                description="Great Expectations suite expectations/benchmark/pairs.json "
                "(column contract, enums, unique ids, balance thresholds).")
def pairs_expectations(context: dg.AssetCheckExecutionContext, benchmark_run: BenchmarkRun) -> dg.AssetCheckResult:
    result = validate_pairs(seed_layout(context, benchmark_run).pairs)
    return dg.AssetCheckResult(passed=result.success and not result.warnings, metadata={
        "rows": result.rows, "failed": ", ".join(o.describe() for o in result.errors + result.warnings) or "none"})


defs = dg.Definitions(assets=[noise_candidates, verified_pairs, benchmark],
                      asset_checks=[every_shipped_pair_is_verified, pairs_expectations])
