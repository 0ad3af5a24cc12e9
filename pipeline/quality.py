"""Per-table quality checks shared by the CLI and the Dagster asset checks.

Two checks per staged table: its Great Expectations suite (batch-wise) and its full-table
invariants in DuckDB. Critical expectations and duplicate keys are errors; range, value-set,
foreign-key and time-window violations are warnings, because real MIMIC-IV carries them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.expectations import validate_parquet
from pipeline.integrity import Invariant, table_invariants
from pipeline.schema import TABLES
from pipeline.staging import staged_path, staged_tables

ERROR_INVARIANTS = {"unique_key"}


@dataclass
class CheckOutcome:
    table: str
    check: str  # "expectations" | "integrity"
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    details: list[dict] = field(default_factory=list)  # one row per failed rule, for metadata tables
    counts: dict[str, int] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return not self.errors and not self.warnings

    @property
    def severity(self) -> str:
        return "ERROR" if self.errors else "WARN"

    def markdown(self) -> str:
        if not self.details:
            return "All rules hold."
        lines = ["| rule | severity | violations | examples |", "|---|---|---|---|"]
        for d in self.details:
            examples = str(d["examples"]).replace("|", "\\|")[:300]
            lines.append(f"| {d['rule']} | {d['severity']} | {d['violations']:,} | {examples} |")
        return "\n".join(lines)


def expectation_check(staged_dir: str | os.PathLike, table: str) -> CheckOutcome:
    result = validate_parquet(staged_path(staged_dir, table), f"source/{table}")
    out = CheckOutcome(table, "expectations", counts={
        "rows": result.rows, "expectations": len(result.outcomes),
        "failed_critical": len(result.errors), "failed_warning": len(result.warnings)})
    for o in result.errors + result.warnings:
        text = f"{o.describe()}: {o.unexpected_count:,} unexpected of {o.element_count:,}"
        (out.errors if o.severity == "critical" else out.warnings).append(text)
        out.details.append({"rule": o.describe(), "severity": o.severity, "violations": o.unexpected_count,
                            "examples": o.examples or o.observed})
    return out


def integrity_check(staged_dir: str | os.PathLike, table: str) -> CheckOutcome:
    invariants = table_invariants(staged_dir, table)
    out = CheckOutcome(table, "integrity", counts={
        "invariants": len(invariants),
        "skipped": sum(1 for i in invariants if i.skipped),
        "violated": sum(1 for i in invariants if not i.ok)})
    for inv in invariants:
        if inv.ok:
            continue
        severity = "critical" if inv.kind in ERROR_INVARIANTS else "warning"
        (out.errors if severity == "critical" else out.warnings).append(_describe(inv))
        out.details.append({"rule": inv.name, "severity": severity, "violations": inv.violations,
                            "examples": inv.examples})
    return out


def _describe(inv: Invariant) -> str:
    return f"{inv.name}: {inv.violations:,} violation(s) in {inv.checked_rows:,} rows"


def check_staged(staged_dir: str | os.PathLike) -> Iterator[tuple[str, bool]]:
    """Lines of a human-readable report, each with whether it is an error."""
    staged_dir = Path(staged_dir)
    staged_tables(staged_dir)
    for table in TABLES:
        if not staged_path(staged_dir, table).exists():
            yield f"{table}: not staged, skipped", False
            continue
        for outcome in (expectation_check(staged_dir, table), integrity_check(staged_dir, table)):
            status = "ok" if outcome.passed else ("ERROR" if outcome.errors else "warning")
            yield f"{table} {outcome.check}: {status}", bool(outcome.errors)
            for text in outcome.errors:
                yield f"  error: {text}", False
            for text in outcome.warnings:
                yield f"  warning: {text}", False
