"""What a benchmark folder holds: the pairs and overlays tables, manifest and dataset card.

:func:`pipeline.build.export_benchmark` writes them through one :class:`pipeline.files.AtomicFolder`,
so they appear together or not at all.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from dataclasses import dataclass, fields
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import get_args, get_type_hints

import pyarrow as pa

from pipeline.expectations import SuiteOutcome, validate_parquet
from pipeline.layout import SPLITS, RunLayout
from pipeline.noise.operators import OPERATORS
from pipeline.noise.registry import NOISE_LEVELS


@dataclass(frozen=True, kw_only=True)
class PairRecord:
    """A candidate pair with its verification, flat. Its fields, in order, are the columns of
    every table of pairs (see the schemas below); the JSON-valued ones hold canonical JSON text."""

    pair_id: str
    seed: int
    question_id: str
    template_id: str
    intent: str
    level: str  # question level
    noise_level: str
    operator: str
    clean_question: str
    noisy_question: str
    gold_sql: str
    answer_type: str
    clean_answer: str
    naive_sql: str
    expected_behavior: str
    expected_answer: str | None
    recovery_sql: str | None  # what a careful analyst runs on the noisy database to get expected_answer
    discrepancy: str
    evidence: str  # JSON: table -> _rids of the clean answer
    verification: str  # JSON: each check's outcome and what it measured
    split: str | None = None  # train | dev | test, once shipped
    change_log: str  # JSON: what the operator did, in words
    noisy_slots: str  # JSON
    verified: bool
    failed_check: str | None
    changes: str  # JSON: the overlay, [table, op, rid, column, new value] per change


def _arrow_type(hint) -> pa.DataType:
    """The Arrow type of a field typed ``str``, ``int`` or ``bool``, optionally ``| None``."""
    (python_type,) = [t for t in get_args(hint) or (hint,) if t is not type(None)]
    return {str: pa.string(), int: pa.int64(), bool: pa.bool_()}[python_type]


def _schema(leave_out: set[str]) -> pa.Schema:
    hints = get_type_hints(PairRecord)
    return pa.schema([(f.name, _arrow_type(hints[f.name])) for f in fields(PairRecord) if f.name not in leave_out])


PAIRS_SCHEMA = _schema({"verified", "failed_check", "changes"})  # pairs.parquet; overlays apart
SHIPPED_SCHEMA = _schema({"verified", "failed_check"})  # shipped pairs, overlay kept alongside
CANDIDATES_SCHEMA = _schema({"split"})  # every candidate of a run, verified or not
OVERLAYS_SCHEMA = pa.schema([
    ("pair_id", pa.string()), ("table_name", pa.string()), ("op", pa.string()), ("rid", pa.int64()),
    ("column_name", pa.string()), ("new_value", pa.string()),
])


def _table(records: list[dict], schema: pa.Schema) -> pa.Table:
    return pa.Table.from_pylist([{k: r.get(k) for k in schema.names} for r in records], schema=schema)


def pairs_table(pairs: list[dict]) -> pa.Table:
    return _table(pairs, PAIRS_SCHEMA)


def shipped_table(pairs: list[dict]) -> pa.Table:
    """Shipped pairs with their overlay (``changes``) kept alongside, before export splits them."""
    return _table(pairs, SHIPPED_SCHEMA)


def candidates_table(records: list[dict]) -> pa.Table:
    """All candidates of a run, verified or not, with their overlay (``changes``) as JSON."""
    return _table(records, CANDIDATES_SCHEMA)


def overlays_table(pairs: list[dict]) -> pa.Table:
    rows = [{"pair_id": p["pair_id"], "table_name": t, "op": op, "rid": rid, "column_name": col, "new_value": new}
            for p in pairs for t, op, rid, col, new in json.loads(p["changes"])]
    return pa.Table.from_pylist(rows, schema=OVERLAYS_SCHEMA)


def split_tables(pairs: list[dict]) -> dict[str, pa.Table]:
    """The files the dataset card's configs name: each split's pairs and overlays. A split without
    pairs gets no file (``datasets`` cannot read an empty Parquet file) and no config entry."""
    tables = {}
    for split in SPLITS:
        mine = [p for p in pairs if p["split"] == split]
        if not mine:
            continue
        tables[RunLayout.split_file("pairs", split)] = pairs_table(mine)
        tables[RunLayout.split_file("overlays", split)] = overlays_table(mine)
    return tables


def validate_pairs(path: str | os.PathLike) -> SuiteOutcome:
    """The benchmark suite on a pairs file, its operator and discrepancy sets taken from the registry."""
    return validate_parquet(path, "benchmark/pairs", values={
        "operators": sorted(OPERATORS), "discrepancies": sorted({op.discrepancy for op in OPERATORS.values()})})


def code_version() -> dict:
    try:
        pkg = version("ehr-robustgym")
    except PackageNotFoundError:
        pkg = "unknown"
    repo = Path(__file__).resolve().parents[2]
    try:
        if not (repo / ".git").exists():  # an installed wheel: not a checkout (git would find an enclosing repo)
            raise FileNotFoundError(repo / ".git")
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True,
                                timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = "unknown"
    return {"package": pkg, "git_commit": commit}


def templates_fingerprint(templates_dir: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(templates_dir.glob("*.yaml")):
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


# The card's licence header by source: the data's licence, not the code's (SPEC §2).
CARD_LICENSE = {
    "demo": ["license: odbl"],
    "mimic": ["license: other", "license_name: physionet-credentialed-health-data-license-1.5.0",
              "license_link: https://physionet.org/content/mimiciv/view-license/2.2/"],
    "synthetic": ["license: apache-2.0"],
}


def _card_configs(splits: list[str]) -> list[str]:
    """Hugging Face ``configs``: the pairs (default) and their overlays, one file per split."""
    lines = ["configs:"]
    for kind, default in (("pairs", True), ("overlays", False)):
        lines += [f"- config_name: {'default' if default else kind}"] + (["  default: true"] if default else [])
        lines.append("  data_files:")
        for split in splits:
            lines += [f"  - split: {split}", f"    path: {RunLayout.split_file(kind, split)}"]
    return lines


def dataset_card(manifest: dict) -> str:
    counts = manifest["counts"]
    lines = [
        "---",
        *CARD_LICENSE[manifest["source"]["kind"]],
        "pretty_name: EHR-RobustGym Clean-Noise pairs",
        "task_categories:",
        "- question-answering",
        "tags:",
        "- ehr",
        "- mimic-iv",
        "- robustness",
        "- text-to-sql",
        *_card_configs([s for s in SPLITS if counts["by_split"].get(s)]),
        "---",
        "",
        f"# EHR-RobustGym benchmark — {manifest['source']['kind']}, seed {manifest['seed']}",
        "",
        f"{counts['pairs']:,} verified Clean–Noise pairs over MIMIC-IV-shaped data. Each pair holds a",
        "clean clinical question with its gold SQL and answer, and a noisy twin: the same question on a",
        "database perturbed by a small overlay (record or value level), or a rewritten question (query",
        "level), with the behaviour a careful agent should show (`answer`, `abstain` or `flag`).",
        "Every pair passed six mechanical checks (clean, local, effect, expected, detectable,",
        "deterministic); see the `verification` column. Expected behaviours follow the project's",
        "labelling policy (docs/labels.md in the EHR-RobustGym repository): what a careful analyst can",
        "infer with SQL on the noisy database alone; `recovery_sql` is that inference for pairs that",
        "expect an answer.",
        "",
        "```python",
        "from datasets import load_dataset",
        'pairs = load_dataset("path/to/this/folder")            # train / dev / test',
        'overlays = load_dataset("path/to/this/folder", "overlays")',
        'everything = load_dataset("parquet", data_files="pairs.parquet")["train"]',
        "```",
        "",
        "Splits assign whole templates to `train`, `dev` or `test` (the `split` column of",
        "`pairs.parquet`, which holds every pair; `splits/` holds one file per split). A pair's noisy",
        "database is `staged/<table>.parquet` with the rows of `overlays.parquet` for its `pair_id`",
        "applied (delete a `_rid`, insert a row, update a cell).",
        "",
        "| noise level | pairs |", "|---|---|",
        *[f"| {k} | {v:,} |" for k, v in sorted(counts["by_noise_level"].items())],
        "",
        "| intent | pairs |", "|---|---|",
        *[f"| {k} | {v:,} |" for k, v in sorted(counts["by_intent"].items())],
        "",
        *operator_table(counts["by_operator"]),
        "",
        "Source data: " + ("MIMIC-IV Clinical Database Demo v2.2 (ODbL 1.0; Johnson et al., PhysioNet 2023)."
                           if manifest["source"]["kind"] == "demo" else
                           "credentialed MIMIC-IV v2.2 (PhysioNet credentialed licence: do not share)."
                           if manifest["source"]["kind"] == "mimic" else
                           "the built-in synthetic MIMIC-IV generator (no real patients)."),
        "",
    ]
    return "\n".join(lines)


def operator_catalog() -> dict[str, dict[str, str]]:
    """Every registered operator: noise level, discrepancy category, Kahn dimension, what it does."""
    return {name: {"level": op.level, "discrepancy": op.discrepancy, "kahn": op.kahn, "doc": op.doc}
            for name, op in sorted(OPERATORS.items())}


def operator_table(pairs_by_operator: dict[str, int]) -> list[str]:
    """Markdown lines: every registered operator, by noise level, with its pairs in this build."""
    ordered = sorted(OPERATORS.values(), key=lambda op: (NOISE_LEVELS.index(op.level), op.name))
    return ["| operator | noise level | discrepancy | Kahn dimension | what it does | pairs |",
            "|---|---|---|---|---|---|",
            *[f"| `{op.name}` | {op.level} | {op.discrepancy} | {op.kahn} | {op.doc.replace('|', '/')} | "
              f"{pairs_by_operator.get(op.name, 0):,} |" for op in ordered]]


def manifest_json(manifest: dict) -> str:
    return json.dumps(manifest, indent=2, sort_keys=True, default=str) + "\n"
