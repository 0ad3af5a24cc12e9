"""Question stage: clean questions from the templates, with an audit of what was kept and why."""

import json
from collections import Counter

import dagster as dg
import pyarrow.parquet as pq

from pipeline.defs.partitions import SEEDS, seed_layout, seed_of
from pipeline.defs.resources import BenchmarkRun
from pipeline.files import write_parquet
from pipeline.questions import generate
from pipeline.questions.generate import generate_questions
from pipeline.questions.templates import INTENTS, QUESTION_LEVELS
from pipeline.schema import TABLES

SAMPLES_PER_CELL = 2


def _markdown_table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c).replace("|", "\\|").replace("\n", " ") for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _samples(rows: list[dict]) -> str:
    seen: Counter = Counter()
    parts = []
    for r in rows:
        cell = (r["intent"], r["level"])
        if seen[cell] >= SAMPLES_PER_CELL:
            continue
        seen[cell] += 1
        parts += [f"**{r['intent']} / {r['level']}** — `{r['template_id']}`", "",
                  f"> {r['question']}", "", f"Answer: `{r['answer']}`", "", "```sql", r["gold_sql"], "```", ""]
    return "\n".join(parts)


@dg.asset(group_name="questions", deps=list(TABLES), kinds={"duckdb", "parquet"}, partitions_def=SEEDS)
def slot_pools(context: dg.AssetExecutionContext, benchmark_run: BenchmarkRun) -> dg.MaterializeResult:
    """Every template's candidate slot values (patients, items, drugs, codes, windows, thresholds),
    drawn by its seeded samplers from the staged data, in the order clean_questions evaluates them."""
    layout = seed_layout(context, benchmark_run)
    table, skipped = generate.slot_pools(layout.staged, seed_of(context),
                                         per_template=benchmark_run.questions_per_template)
    write_parquet(table, layout.slot_pools)
    context.log.info(f"seed {seed_of(context)}: {table.num_rows:,} slot candidates → {layout.slot_pools}")
    for template_id, reason in skipped.items():
        context.log.warning(f"template {template_id} skipped: {reason}")
    per_template = Counter(table.column("template_id").to_pylist())
    examples = {}
    for r in table.to_pylist():
        examples.setdefault(r["template_id"], r["slots"])
    return dg.MaterializeResult(metadata={
        "dagster/row_count": table.num_rows,
        "templates": len(per_template),
        "by_template": dg.MetadataValue.md(_markdown_table(
            ["template", "candidates", "first draw"], [[t, n, examples[t]] for t, n in sorted(per_template.items())])),
        "skipped_templates": dg.MetadataValue.md(_markdown_table(
            ["template", "why"], sorted(skipped.items())) if skipped else "None."),
    })


@dg.asset(group_name="questions", deps=[slot_pools], kinds={"duckdb", "parquet"}, partitions_def=SEEDS)
def clean_questions(context: dg.AssetExecutionContext, benchmark_run: BenchmarkRun) -> dg.MaterializeResult:
    """Clean questions: every template's slot-pool candidates rendered, answered by the gold SQL,
    kept only when the answer is non-empty and its evidence rows pass the clean-evidence filter."""
    layout = seed_layout(context, benchmark_run)
    context.log.info(f"seed {seed_of(context)}: answering the slot pools' candidates")
    table, report = generate_questions(layout.staged, seed_of(context),
                                       per_template=benchmark_run.questions_per_template,
                                       workers=benchmark_run.workers, pools=pq.read_table(layout.slot_pools))
    write_parquet(table, layout.clean_questions)
    layout.question_rejections.write_text(json.dumps(dict(sorted(report.rejected.items()))))
    context.log.info(f"{table.num_rows:,} clean questions, {sum(report.rejected.values()):,} candidates "
                     f"rejected, in {report.seconds:.1f} s")
    for template_id, reason in report.skipped.items():
        context.log.warning(f"template {template_id} skipped: {reason}")
    rows = table.to_pylist()
    cells = [[i] + [report.cells[(i, lvl)] for lvl in QUESTION_LEVELS] for i in INTENTS]
    return dg.MaterializeResult(metadata={
        "dagster/row_count": table.num_rows,
        "path": dg.MetadataValue.path(str(layout.clean_questions)),
        "seconds": round(report.seconds, 1),
        "by_intent_and_level": dg.MetadataValue.md(_markdown_table(["intent", *QUESTION_LEVELS], cells)),
        "by_template": dg.MetadataValue.md(_markdown_table(
            ["template", "clean questions", "rejected"],
            [[t, n, json.dumps(dict(report.rejected_by_template.get(t, {})))] for t, n in sorted(report.questions.items())])),
        "rejected_by_reason": dg.MetadataValue.md(_markdown_table(
            ["reason", "candidates"], sorted(report.rejected.items()))),
        "skipped_templates": dg.MetadataValue.md(_markdown_table(
            ["template", "why"], sorted(report.skipped.items())) if report.skipped else "None."),
        "samples": dg.MetadataValue.md(_samples(rows)),
    })


@dg.asset_check(asset=clean_questions, partitions_def=SEEDS,
                description="Every intent × level cell has clean questions; ids unique.")
def clean_questions_cover_all_cells(context: dg.AssetCheckExecutionContext,
                                    benchmark_run: BenchmarkRun) -> dg.AssetCheckResult:
    rows = pq.read_table(seed_layout(context, benchmark_run).clean_questions,
                         columns=["question_id", "intent", "level"]).to_pylist()
    cells = Counter((r["intent"], r["level"]) for r in rows)
    empty = [f"{i}/{lvl}" for i in INTENTS for lvl in QUESTION_LEVELS if not cells[(i, lvl)]]
    duplicates = len(rows) - len({r["question_id"] for r in rows})
    return dg.AssetCheckResult(passed=not empty and not duplicates,
                               metadata={"empty_cells": ", ".join(empty) or "none", "duplicate_ids": duplicates})


defs = dg.Definitions(assets=[slot_pools, clean_questions], asset_checks=[clean_questions_cover_all_cells])
