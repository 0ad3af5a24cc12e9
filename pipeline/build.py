"""The main job: stage a source, ask clean questions, perturb, verify, select and export.

``ehr-robustgym build`` and the Dagster assets call the same functions; this module only
chains them and writes the benchmark folder (see :mod:`pipeline.noise.export`).
"""

from __future__ import annotations

import os
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

from pipeline.expectations import warm_up
from pipeline.files import AtomicFolder, sha256_file
from pipeline.layout import RunLayout
from pipeline.noise.export import (
    code_version,
    dataset_card,
    manifest_json,
    operator_catalog,
    overlays_table,
    pairs_table,
    split_tables,
    templates_fingerprint,
    validate_pairs,
)
from pipeline.noise.pairs import NoiseReport, candidate_records
from pipeline.noise.select import select_pairs, template_splits
from pipeline.noise.vetoes import NO_VETOES, Vetoes
from pipeline.progress import Log, verification_progress
from pipeline.questions.generate import DEFAULT_PER_TEMPLATE, QuestionReport, generate_questions
from pipeline.questions.templates import TEMPLATES_DIR, load_templates
from pipeline.schema import TABLES
from pipeline.sources import make_source
from pipeline.staging import StageReport, stage, staged_database, staged_path

PAIRS_PER_TEMPLATE = 80


class BuildError(RuntimeError):
    pass


@dataclass
class BuildReport:
    out: Path
    stage: StageReport | None = None
    questions: QuestionReport | None = None
    noise: NoiseReport | None = None
    pairs: list[dict] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    manifest: dict = field(default_factory=dict)

    def summary(self) -> str:
        c = self.manifest["counts"]
        lines = [f"{c['pairs']:,} verified pairs ({c['candidates']:,} candidates, "
                 f"{c['verified']:,} verified) from {c['clean_questions']:,} clean questions"]
        lines += [f"  {k:<10} {v:>6,}" for k, v in sorted(c["by_noise_level"].items())]
        lines += [f"  {k:<16} {v:>6,}" for k, v in sorted(c["by_intent"].items())]
        lines += [f"  {k:<10} {v:>6,}" for k, v in sorted(c["by_level"].items())]
        lines.append("operator               candidates  verified  shipped")
        for row in self.noise.by_operator():
            lines.append(f"  {row['operator']:<22}{row['candidates']:>9,}{row['verified']:>10,}"
                         f"{c['by_operator'].get(row['operator'], 0):>9,}")
        lines.append("timings: " + ", ".join(f"{k} {v:.1f} s" for k, v in self.timings.items()))
        lines.append(f"wrote {self.out}")
        return "\n".join(lines)

    def profile(self) -> str:
        """Where the time went: by stage, then the noise stage's worker time by operator and by check."""
        total = sum(self.timings.values()) or 1.0
        lines = ["time by stage (wall):"]
        lines += [f"  {k:<10}{v:>9.1f} s {v / total:>7.1%}" for k, v in self.timings.items()]
        lines.append("noise stage, seconds inside workers (summed over workers):")
        lines += ["  " + line for line in self.noise.profile.lines()]
        return "\n".join(lines)


def _counts(pairs: list[dict], key) -> dict:
    return dict(sorted(Counter(key(p) for p in pairs).items()))


def build(source: str, out: str | os.PathLike, seed: int, path: str | os.PathLike | None = None,
          patients: int = 1000, per_template: int = PAIRS_PER_TEMPLATE, workers: int | None = None,
          questions_per_template: int = DEFAULT_PER_TEMPLATE, vetoes: Vetoes = NO_VETOES,
          log: Log | None = None, quirks: str = "demo") -> BuildReport:
    """Run the whole chain into ``out``; the same inputs and seed give byte-identical files.
    ``log`` receives a line per stage milestone and verification progress."""
    out = Path(out)
    layout = RunLayout(out)
    report = BuildReport(out)
    clock = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        report.timings[name] = now - clock
        clock = now
        if log:
            log(f"{name}: done in {report.timings[name]:.1f} s")

    report.stage = stage(make_source(source, path, patients=patients, seed=seed, quirks=quirks), layout.staged)
    lap("stage")
    templates = load_templates()
    validation = warm_up()  # the main process only waits on the workers until the export
    # both stages' workers read one on-disk copy of the staged tables, written once
    with staged_database(layout.staged) as staged_file:
        questions, report.questions = generate_questions(layout.staged, seed, templates, questions_per_template,
                                                         workers=workers, staged_file=staged_file)
        lap("questions")
        records, report.noise = candidate_records(layout.staged, questions, seed, workers=workers,
                                                  progress=verification_progress(log) if log else None,
                                                  vetoed_families=vetoes.families(), staged_file=staged_file)
    lap("noise")
    validation.join()
    report.pairs = ship(records, templates, seed, per_template, vetoes)
    report.manifest = export_benchmark(out, report.pairs, questions, report.questions.rejected, report.noise,
                                       source_description(source, path, patients, quirks), seed, vetoes.report(records))
    lap("export")
    return report


def source_description(source: str, path, patients: int, quirks: str = "demo") -> dict:
    synthetic = source == "synthetic"
    return {"kind": source, "path": str(path) if path else None, "patients": patients if synthetic else None,
            "quirks": quirks if synthetic else None}


def ship(records: list[dict], templates, seed: int, per_template: int = PAIRS_PER_TEMPLATE,
         vetoes: Vetoes = NO_VETOES) -> list[dict]:
    """The verified records less the vetoed ones, balanced and capped, each with its template's split."""
    selected = select_pairs([r for r in records if r["verified"]], seed, per_template, vetoes=vetoes)
    operators_of: dict[str, set[str]] = defaultdict(set)
    for p in selected:
        operators_of[p["template_id"]].add(p["operator"])
    splits = template_splits([p["template_id"] for p in selected], {t.id: (t.intent, t.level) for t in templates}, seed,
                             operators_of)
    return [{**p, "split": splits[p["template_id"]]} for p in selected]


def export_benchmark(out: Path, pairs: list[dict], questions: pa.Table, question_rejections: dict,
                     noise: NoiseReport, source: dict, seed: int, vetoes: list[dict] = ()) -> dict:
    """Write pairs, overlays, their train/dev/test splits, clean questions, manifest and dataset card
    into ``out``, atomically; ``out/staged`` must hold the staged tables. Returns the manifest, which
    lists the reviewer ``vetoes`` applied (:meth:`Vetoes.report`) when there are any."""
    layout = RunLayout(out)
    folder = AtomicFolder(out)
    try:
        files = {
            layout.PAIRS: folder.write_parquet(layout.PAIRS, pairs_table(pairs)),
            layout.OVERLAYS: folder.write_parquet(layout.OVERLAYS, overlays_table(pairs)),
            layout.CLEAN_QUESTIONS: folder.write_parquet(layout.CLEAN_QUESTIONS, questions),
        }
        files.update({name: folder.write_parquet(name, table) for name, table in split_tables(pairs).items()})
        suite = validate_pairs(files[layout.PAIRS])
        if suite.errors:
            raise BuildError("pairs.parquet fails its expectation suite: "
                             + "; ".join(f"{o.describe()} ({o.unexpected_count} unexpected)" for o in suite.errors))
        staged = {t: staged_path(layout.staged, t) for t in TABLES}
        manifest = {
            "seed": seed,
            "source": source,
            "code_version": code_version(),
            "operators": operator_catalog(),
            "inputs": {
                "staged_tables": {t: sha256_file(p) for t, p in staged.items() if p.exists()},
                "absent_tables": sorted(t for t, p in staged.items() if not p.exists()),
                "templates_sha256": templates_fingerprint(TEMPLATES_DIR),
            },
            "counts": {
                "clean_questions": questions.num_rows,
                "candidates": sum(noise.proposed.values()),
                "verified": sum(noise.verified.values()),
                "pairs": len(pairs),
                "by_intent": _counts(pairs, lambda p: p["intent"]),
                "by_level": _counts(pairs, lambda p: p["level"]),
                "by_noise_level": _counts(pairs, lambda p: p["noise_level"]),
                "by_operator": _counts(pairs, lambda p: p["operator"]),
                "by_split": _counts(pairs, lambda p: p["split"]),
                "by_intent_level_noise_operator": {
                    "|".join(k): v for k, v in _counts(
                        pairs, lambda p: (p["intent"], p["level"], p["noise_level"], p["operator"])).items()},
            },
            "rejected": {
                "clean_questions": dict(sorted(question_rejections.items())),
                "candidates_by_check": {f"{op}|{check}": n for (op, check), n in sorted(noise.rejected.items())},
                "not_applicable": dict(sorted(noise.not_applicable.items())),
            },
            "expectations": {"suite": suite.suite, "success": suite.success, "rows": suite.rows,
                             "failed": [o.describe() for o in suite.errors + suite.warnings]},
            "outputs": {name: sha256_file(tmp) for name, tmp in files.items()},
        }
        if vetoes:
            manifest["vetoes"] = list(vetoes)
        folder.write_text(layout.MANIFEST, manifest_json(manifest))
        folder.write_text(layout.CARD, dataset_card(manifest))
        folder.commit()
        for stale in set((out / "splits").glob("*.parquet")) - {out / name for name in files}:
            stale.unlink()
        return manifest
    except BaseException:
        folder.abort()
        raise
