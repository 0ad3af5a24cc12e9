"""Instantiate templates into clean questions over a staged folder.

Per template: draw ``per_template * OVERSAMPLE`` candidates with the slot samplers (rng seeded by
the run seed and the template id, so adding a template never changes another's sample), render,
run the gold SQL in DuckDB, then the evidence SQL for all candidates in one query, drop those
whose answer is empty or whose evidence fails :mod:`evidence`, and keep the first
``per_template`` survivors in draw order. Output rows are sorted by ``question_id``.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.questions.answers import AnswerError, normalise
from pipeline.questions.evidence import check_evidence, load_bounds
from pipeline.questions.samplers import SAMPLERS
from pipeline.questions.templates import Template, load_templates, render
from pipeline.schema import TABLES
from pipeline.staging import staged_path

DEFAULT_PER_TEMPLATE = 40
OVERSAMPLE = 3

SCHEMA = pa.schema([
    ("question_id", pa.string()), ("template_id", pa.string()), ("intent", pa.string()),
    ("level", pa.string()), ("question", pa.string()), ("gold_sql", pa.string()),
    ("answer_type", pa.string()), ("answer", pa.string()), ("evidence", pa.string()),
    ("slots", pa.string()), ("variant", pa.int16()),
])


@dataclass
class QuestionReport:
    seconds: float = 0.0
    questions: dict[str, int] = field(default_factory=dict)  # template id -> clean questions
    cells: Counter = field(default_factory=Counter)  # (intent, level) -> clean questions
    skipped: dict[str, str] = field(default_factory=dict)  # template id -> reason
    rejected: Counter = field(default_factory=Counter)  # reason -> candidates
    rejected_by_template: dict[str, Counter] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.questions.values())

    def summary(self) -> str:
        intents = sorted({i for i, _ in self.cells})
        lines = [f"{'intent':<16}{'patient':>9}{'population':>12}"]
        lines += [f"{i:<16}{self.cells[(i, 'patient')]:>9}{self.cells[(i, 'population')]:>12}" for i in intents]
        lines += [f"skipped {tid}: {why}" for tid, why in sorted(self.skipped.items())]
        lines += [f"rejected {n:>6} {reason}" for reason, n in sorted(self.rejected.items())]
        lines.append(f"{self.total} clean questions from {len(self.questions)} templates "
                     f"({len(self.skipped)} skipped) in {self.seconds:.1f} s")
        return "\n".join(lines)


def open_staged(staged_dir: str | os.PathLike) -> tuple[duckdb.DuckDBPyConnection, set[str]]:
    """An in-memory DuckDB with one view per staged table, named as in MIMIC-IV, and the bounds.
    Dictionaries (``d_*``, the same size on the demo and on full MIMIC-IV) are loaded as tables:
    nearly every gold query joins one, and re-scanning their Parquet dominated query time."""
    con = duckdb.connect()
    present = set()
    for name in TABLES:
        path = staged_path(staged_dir, name)
        if path.is_file():
            kind = "TABLE"
            con.execute(f"CREATE {kind} {name} AS SELECT * FROM read_parquet('{_quote(path)}')")
            present.add(name)
    if not present:
        raise FileNotFoundError(f"no staged tables (<table>.parquet) in {staged_dir}")
    load_bounds(con)
    return con, present


def _quote(path: Path) -> str:
    return str(path).replace("'", "''")


def _stable_int(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


def _json(value) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def draw_candidates(con, template: Template, rng: np.random.Generator, n: int) -> tuple[list[dict], int]:
    """``n`` slot dicts drawn slot by slot (duplicates removed) and how many had no valid value."""
    given: list[dict] = [{} for _ in range(n)]
    for slot in template.slots:
        values = SAMPLERS[slot.sampler].fn(con, rng, given, **slot.params)
        given = [dict(g, **{slot.name: v}) for g, v in zip(given, values) if v is not None]
    unique = list({_json(g): g for g in reversed(given)}.values())[::-1]
    return unique, n - len(given)


def _evaluate(con, template: Template, cands: list[tuple[dict, int]], present: set[str],
              rejected: Counter) -> list[dict]:
    """Rows of the clean candidates among ``cands`` (slots, variant), in order."""
    rows: dict[int, dict] = {}
    evidence_sql: dict[int, str] = {}
    for i, (slots, variant) in enumerate(cands):
        question, gold, ev = render(template, slots, variant)
        try:
            answer = normalise(con.execute(gold).fetchall(), template.answer_type)
        except AnswerError as exc:
            rejected[exc.reason] += 1
            continue
        slots_json = _json(slots)
        rows[i] = dict(question_id=hashlib.sha256(f"{template.id}|{slots_json}|{variant}".encode())
                       .hexdigest()[:16], template_id=template.id, intent=template.intent,
                       level=template.level, question=question, gold_sql=gold,
                       answer_type=template.answer_type, answer=answer, slots=slots_json, variant=variant)
        evidence_sql[i] = ev
    if not rows:
        return []
    union = "\nUNION ALL\n".join(f"SELECT {i} AS cand, table_name, _rid FROM ({sql}) AS q{i}"
                                 for i, sql in evidence_sql.items())
    evidence: dict[int, list[tuple[str, int]]] = {i: [] for i in rows}
    for cand, table_name, rid in con.execute(union).fetchall():
        evidence[cand].append((table_name, rid))
    bad = check_evidence(con, evidence, present)
    rejected.update(bad.values())
    out = []
    for i, row in rows.items():
        if i not in bad:
            by_table: dict[str, list[int]] = {}
            for table_name, rid in evidence[i]:
                by_table.setdefault(table_name, []).append(rid)
            row["evidence"] = _json({t: sorted(set(r)) for t, r in by_table.items()})
            out.append(row)
    return out


def generate_questions(staged_dir: str | os.PathLike, seed: int, templates: list[Template] | None = None,
                       per_template: int = DEFAULT_PER_TEMPLATE,
                       out: str | os.PathLike | None = None) -> tuple[pa.Table, QuestionReport]:
    """Clean questions for ``templates`` (default: all in ``templates/``) over ``staged_dir``;
    written atomically to ``out`` when given. Same inputs and seed give byte-identical output."""
    started = time.perf_counter()
    templates = load_templates() if templates is None else templates
    report = QuestionReport()
    con, present = open_staged(staged_dir)
    rows: list[dict] = []
    try:
        for t in templates:
            missing = sorted(t.tables_needed() - present)
            if missing:
                report.skipped[t.id] = f"needs absent table(s): {', '.join(missing)}"
                continue
            rejected: Counter = Counter()
            rng = np.random.default_rng([seed, _stable_int(t.id)])
            try:
                cands, no_slot = draw_candidates(con, t, rng, per_template * OVERSAMPLE)
                rejected["no_slot_value"] += no_slot
                variants = rng.integers(len(t.questions), size=len(cands))
                pairs = [(c, int(v)) for c, v in zip(cands, variants)]
                kept: list[dict] = []
                for start in range(0, len(pairs), per_template):
                    kept += _evaluate(con, t, pairs[start:start + per_template], present, rejected)
                    if len(kept) >= per_template:
                        break
            except duckdb.Error as exc:
                report.skipped[t.id] = f"SQL error: {str(exc).splitlines()[0]}"
                continue
            kept = kept[:per_template]
            rows += kept
            report.questions[t.id] = len(kept)
            report.cells[(t.intent, t.level)] += len(kept)
            rejected = +rejected
            report.rejected.update(rejected)
            report.rejected_by_template[t.id] = rejected
    finally:
        con.close()
    rows.sort(key=lambda r: r["question_id"])
    table = pa.Table.from_pylist(rows, schema=SCHEMA)
    if out is not None:
        write_parquet(table, out)
    report.seconds = time.perf_counter() - started
    return table, report


def write_parquet(table: pa.Table, out: str | os.PathLike) -> None:
    """Write via a temporary file and ``os.replace`` so readers never see a partial file."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    try:
        pq.write_table(table, tmp, compression="zstd")
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
