"""What a benchmark folder holds: the pairs and overlays tables, manifest and dataset card.

:func:`pipeline.build.export_benchmark` writes them through one :class:`pipeline.files.AtomicFolder`,
so they appear together or not at all.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pyarrow as pa

from pipeline.layout import SPLITS, RunLayout


PAIR_COLUMNS = [
    ("pair_id", pa.string()), ("seed", pa.int64()), ("question_id", pa.string()),
    ("template_id", pa.string()), ("intent", pa.string()), ("level", pa.string()),
    ("noise_level", pa.string()), ("operator", pa.string()), ("clean_question", pa.string()),
    ("noisy_question", pa.string()), ("gold_sql", pa.string()), ("answer_type", pa.string()),
    ("clean_answer", pa.string()), ("naive_sql", pa.string()), ("expected_behavior", pa.string()),
    ("expected_answer", pa.string()), ("discrepancy", pa.string()), ("evidence", pa.string()),
    ("verification", pa.string()), ("split", pa.string()), ("change_log", pa.string()),
    ("noisy_slots", pa.string()),
]
PAIRS_SCHEMA = pa.schema(PAIR_COLUMNS)
CANDIDATES_SCHEMA = pa.schema([f for f in PAIR_COLUMNS if f[0] != "split"] + [
    ("verified", pa.bool_()), ("failed_check", pa.string()), ("changes", pa.string())])
OVERLAYS_SCHEMA = pa.schema([
    ("pair_id", pa.string()), ("table_name", pa.string()), ("op", pa.string()), ("rid", pa.int64()),
    ("column_name", pa.string()), ("new_value", pa.string()),
])


def pairs_table(pairs: list[dict]) -> pa.Table:
    return pa.Table.from_pylist([{k: p.get(k) for k, _ in PAIR_COLUMNS} for p in pairs], schema=PAIRS_SCHEMA)


def shipped_table(pairs: list[dict]) -> pa.Table:
    """Shipped pairs with their overlay (``changes``) kept alongside, before export splits them."""
    return pairs_table(pairs).append_column("changes", pa.array([p["changes"] for p in pairs], pa.string()))


def candidates_table(records: list[dict]) -> pa.Table:
    """All candidates of a run, verified or not, with their overlay (``changes``) as JSON."""
    return pa.Table.from_pylist([{f.name: r.get(f.name) for f in CANDIDATES_SCHEMA} for r in records],
                                schema=CANDIDATES_SCHEMA)


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
        "Every pair passed five mechanical checks (clean, effect, detectable, local, deterministic);",
        "see the `verification` column.",
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
        "| operator | pairs |", "|---|---|",
        *[f"| {k} | {v:,} |" for k, v in sorted(counts["by_operator"].items())],
        "",
        "Source data: " + ("MIMIC-IV Clinical Database Demo v2.2 (ODbL 1.0; Johnson et al., PhysioNet 2023)."
                           if manifest["source"]["kind"] == "demo" else
                           "credentialed MIMIC-IV v2.2 (PhysioNet credentialed licence: do not share)."
                           if manifest["source"]["kind"] == "mimic" else
                           "the built-in synthetic MIMIC-IV generator (no real patients)."),
        "",
    ]
    return "\n".join(lines)


def manifest_json(manifest: dict) -> str:
    return json.dumps(manifest, indent=2, sort_keys=True, default=str) + "\n"
