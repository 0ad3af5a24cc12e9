"""Human-readable audit of perturbations: what each operator did, on which rows, and why it passed.

Used for Dagster materialization metadata, so a person can check sample pairs in the UI.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict

import duckdb

from pipeline.noise.pairs import NoiseReport
from pipeline.noise.verify import CHECKS
from pipeline.staging import attach_staged


def _cell(value) -> str:
    text = "∅" if value is None else str(value)
    return text.replace("|", "\\|").replace("\n", " ")[:80]


def operator_table(report: NoiseReport) -> str:
    """Markdown: per operator, candidates, verified and rejections by check."""
    head = "| operator | level | candidates | verified | not applicable | " + " | ".join(
        f"rejected: {c}" for c in CHECKS) + " |"
    lines = [head, "|" + "---|" * (5 + len(CHECKS))]
    for row in report.by_operator():
        lines.append(f"| {row['operator']} | {row['level']} | {row['candidates']:,} | {row['verified']:,} | "
                     f"{row['not_applicable']:,} | " + " | ".join(f"{row[f'rejected_{c}']:,}" for c in CHECKS) + " |")
    return "\n".join(lines)


def before_after(staged_dir: str | os.PathLike, changes: list[list]) -> str:
    """Markdown rows ``table | _rid | column | before | after`` for one pair's overlay."""
    if not changes:
        return "_No rows changed: the question itself was rewritten._"
    con = duckdb.connect()
    try:
        attach_staged(con, staged_dir, tables=sorted({c[0] for c in changes if c[1] == "update"}))
        lines = ["| table | _rid | change | column | before | after |", "|---|---|---|---|---|---|"]
        for table, op, rid, column, new in changes:
            if op == "update":
                before = con.execute(f"SELECT \"{column}\" FROM {table} WHERE _rid = {int(rid)}").fetchall()
                lines.append(f"| {table} | {rid} | update | {column} | {_cell(before[0][0] if before else None)} | "
                             f"{_cell(json.loads(new))} |")
            elif op == "delete":
                lines.append(f"| {table} | {rid} | delete | (row) | present | deleted |")
            else:
                lines.append(f"| {table} | {rid} | insert | (row) | absent | {_cell(new)} |")
        return "\n".join(lines)
    finally:
        con.close()


def samples_markdown(records: list[dict], staged_dir: str | os.PathLike, per_operator: int = 2) -> str:
    """For the first verified pairs of every operator: clean vs noisy question, expectation, rows."""
    by_op: dict[str, list[dict]] = defaultdict(list)
    for r in records:
        if r["verified"] and len(by_op[r["operator"]]) < per_operator:
            by_op[r["operator"]].append(r)
    parts = []
    for op in sorted(by_op):
        for r in by_op[op]:
            parts += [
                f"### {op} — {r['intent']} / {r['level']} (`{r['pair_id']}`)",
                f"- **clean:** {r['clean_question']} → `{r['clean_answer']}`",
                f"- **noisy:** {r['noisy_question']}",
                f"- **expected:** {r['expected_behavior']}"
                + (f" `{r['expected_answer']}`" if r["expected_answer"] is not None else "")
                + f" (discrepancy: {r['discrepancy']})",
                f"- **what changed:** {'; '.join(json.loads(r['change_log']))}",
                "",
                before_after(staged_dir, json.loads(r["changes"])),
                "",
            ]
    return "\n".join(parts) or "_No verified pairs._"
