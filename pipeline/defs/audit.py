"""Audit stage: the perturbation audit of a seed partition, readable in the UI and as ``audit.html``,
with one check per operator that warns when its share or rejection rate needs a reviewer's look."""

import json

import dagster as dg
import pyarrow.parquet as pq

from pipeline.defs.noise import benchmark, read_candidates
from pipeline.defs.partitions import SEEDS, seed_layout, seed_of
from pipeline.defs.resources import BenchmarkRun
from pipeline.noise.audit import samples_markdown
from pipeline.noise.audit_page import (
    MAX_REJECTED,
    MAX_SHARE,
    MIN_SHARE,
    OPERATOR_COLUMNS,
    SAMPLE_COLUMNS,
    changed_rows,
    operator_audit,
    operator_warnings,
    page_records,
    sample_pairs,
    sample_rows,
    write_audit_page,
)
from pipeline.noise.operators import OPERATORS
from pipeline.noise.vetoes import Veto, Vetoes

OPERATOR_TABLE_SCHEMA = dg.TableSchema(columns=[dg.TableColumn(name, kind) for name, kind in OPERATOR_COLUMNS])
SAMPLE_TABLE_SCHEMA = dg.TableSchema(columns=[dg.TableColumn(name, "string") for name in SAMPLE_COLUMNS])


def _vetoes_markdown(vetoes: list[dict]) -> str:
    if not vetoes:
        return "No vetoes (`audit/vetoes.yaml` is empty)."
    lines = ["| pair | template | operator | reason | removed |", "|---|---|---|---|---|"]
    lines += [f"| {v.get('pair_id', '')} | {v.get('template_id', '')} | {v.get('operator', '')} | "
              f"{v['reason'].replace('|', '/')} | {v['removed']} |" for v in vetoes]
    return "\n".join(lines)


@dg.asset(
    group_name="audit", deps=[benchmark], kinds={"html"}, partitions_def=SEEDS,
    check_specs=[dg.AssetCheckSpec(f"operator_{op}", asset="perturbation_audit",
                                   description=f"{op} ships {MIN_SHARE:.0%}–{MAX_SHARE:.0%} of the pairs and "
                                               f"rejects at most {MAX_REJECTED:.0%} of its candidates.")
                 for op in sorted(OPERATORS)],
)
def perturbation_audit(context: dg.AssetExecutionContext, benchmark_run: BenchmarkRun):
    """What each operator proposed, verified and shipped, seeded samples of its shipped pairs with
    their changed rows, and ``audit.html`` (every shipped pair, filterable) in the benchmark folder."""
    layout = seed_layout(context, benchmark_run)
    seed = seed_of(context)
    records = read_candidates(layout)
    pairs = pq.read_table(layout.verified_pairs).to_pylist()
    vetoes = json.loads(layout.vetoes_applied.read_text())
    applied = Vetoes(tuple(Veto(**{k: v for k, v in entry.items() if k not in ("removed", "acts_at")}) for entry in vetoes))
    operators = operator_audit(records, pairs, applied)
    context.log.info(f"auditing {len(pairs):,} shipped pairs of seed {seed}")
    rows = changed_rows(layout.published_staged, pairs)
    page = write_audit_page(layout.audit_page, f"Perturbation audit — {benchmark_run.source}, seed {seed}",
                            page_records(pairs, rows, layout.root), operators, vetoes)
    context.log.info(f"wrote {page}")
    sampled = sample_pairs(pairs, seed)
    samples = {f"samples: {op}": dg.MetadataValue.md(samples_markdown(
        [{**p, "verified": True} for p in chosen], layout.published_staged, per_operator=len(chosen)))
        for op, chosen in sampled.items()}
    yield dg.MaterializeResult(metadata={
        "dagster/row_count": len(pairs),
        "operators": dg.MetadataValue.table([dg.TableRecord(r) for r in operators], schema=OPERATOR_TABLE_SCHEMA),
        "vetoes": dg.MetadataValue.md(_vetoes_markdown(vetoes)),
        "audit_page": dg.MetadataValue.path(str(page.resolve())),
        "audit_page_url": dg.MetadataValue.url(page.resolve().as_uri()),
        "samples": dg.MetadataValue.table([dg.TableRecord(r) for r in sample_rows(sampled, rows)],
                                          schema=SAMPLE_TABLE_SCHEMA),
        **samples,
    })
    for row in operators:
        warnings = operator_warnings(row)
        yield dg.AssetCheckResult(
            check_name=f"operator_{row['operator']}", passed=not warnings, severity=dg.AssetCheckSeverity.WARN,
            metadata={"shipped": row["shipped"], "share": row["share"], "candidates": row["candidates"],
                      "verified": row["verified"], "why": "; ".join(warnings) or "within bounds"})


defs = dg.Definitions(assets=[perturbation_audit])
