"""Instantiate templates into clean questions over a staged folder.

Per template: draw ``per_template * OVERSAMPLE`` candidates with the slot samplers (rng seeded by
the run seed and the template id, so adding a template never changes another's sample), render,
run the gold SQL in DuckDB, then the evidence SQL (each batched into one query per chunk of
candidates), drop those whose answer is empty or whose evidence fails :mod:`evidence`, and keep
the first ``per_template`` survivors in draw order. Templates run in parallel worker processes;
output rows are sorted by ``question_id``, so the result does not depend on the worker count.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextlib import nullcontext
from dataclasses import dataclass, field
from itertools import repeat
from typing import TypeVar

import duckdb
import numpy as np
import pyarrow as pa

from pipeline.files import stable_int, write_parquet
from pipeline.plausibility import load_bounds
from pipeline.questions.answers import AnswerError, normalise
from pipeline.questions.evidence import check_evidence
from pipeline.questions.samplers import SAMPLERS
from pipeline.questions.templates import (
    SLOT_PREFIX,
    SLOT_TABLE,
    Template,
    literal_slots,
    load_templates,
    render,
    render_columnar,
)
from pipeline.sql import register_macros
from pipeline.staging import (
    MemoryBudgetError,
    attach_database,
    attach_staged,
    configure,
    staged_database,
    staged_tables,
)
from pipeline.workers import worker_pool

T = TypeVar("T")
DEFAULT_PER_TEMPLATE = 40
OVERSAMPLE = 3
POPULATION_MATERIAL = 0.05  # share of a population question's scope rows a data-quality problem must reach

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


def open_staged(staged_dir: str | os.PathLike, staged_file: str | os.PathLike | None = None,
                processes: int = 1) -> tuple[duckdb.DuckDBPyConnection, set[str]]:
    """A DuckDB with every staged table under its MIMIC-IV name, and the bounds: generation runs
    thousands of small gold queries, and re-scanning Parquet dominated their time. The tables are
    loaded into memory, or with ``staged_file`` (a :func:`~pipeline.staging.staged_database`)
    read from it, shared by every worker and cached within this process's memory limit."""
    con = duckdb.connect()
    configure(con, processes)
    register_macros(con)
    if staged_file is None:
        present = set(attach_staged(con, staged_dir, kind="TABLE", tables=staged_tables(staged_dir)))
    else:
        present = set(attach_database(con, staged_file, "staged"))
    load_bounds(con)
    return con, present


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


UNION_QUERIES = 16
"""Queries per UNION ALL statement. One statement pays the planning and per-query overhead once, and
DuckDB's ``common_subplan`` optimizer computes what its queries share once (a population template's
pass over labevents at 10,000 patients: 4x faster than one query each). Past about 30 queries that
share subplans, DuckDB 2.0 on one thread slowed down sharply: 60 gold queries of
``med_top_drugs_with_diagnosis`` took 52 s in one statement, 0.8 s in chunks of 16. The twelve
slowest templates at 10,000 patients: 112 s in chunks of 16, 150 s in whole unions with the
optimizer off; on the demo's noise stage chunks of 16 and 64 are within noise of each other."""


def _union(queries: dict[int, str], columns: str = "*") -> str:
    """The queries as one UNION ALL, each row tagged with its query's key (``cand``). Each query's
    rows keep their order: DuckDB preserves row order through a SELECT from one subquery and through
    UNION ALL (its SQL dialect's "order preservation" guarantees)."""
    return "\nUNION ALL\n".join(f"SELECT {i} AS cand, {columns} FROM ({sql}) AS q{i}" for i, sql in queries.items())


def union_chunks(queries: dict[int, T], size: int = UNION_QUERIES) -> Iterator[dict[int, T]]:
    """``queries`` in chunks of ``size`` (default :data:`UNION_QUERIES`), in order."""
    keys = list(queries)
    for start in range(0, len(keys), size):
        yield {k: queries[k] for k in keys[start:start + size]}


def batched_rows(con, queries: dict[int, str]) -> tuple[list[str], dict[int, list[tuple]]]:
    """Column names (those of every query: they share a shape) and rows of each query in its own
    order, by key, from one :func:`_union` statement."""
    cursor = con.execute(_union(queries))
    out: dict[int, list[tuple]] = {i: [] for i in queries}
    for cand, *row in cursor.fetchall():
        out[cand].append(tuple(row))
    return [d[0] for d in cursor.description][1:], out


def union_rows(con, queries: dict[int, str]) -> dict[int, tuple[list[str], list[tuple]]]:
    """Column names and rows of each query (all of one shape), one :func:`batched_rows` statement
    per :func:`union_chunks` chunk; a statement DuckDB refuses leaves its queries out."""
    out: dict[int, tuple[list[str], list[tuple]]] = {}
    for chunk in union_chunks(queries):
        try:
            columns, rows_of = batched_rows(con, chunk)
        except duckdb.Error:
            continue
        out.update({k: (columns, rows) for k, rows in rows_of.items()})
    return out


def gold_rows(con, template: Template, gold: dict[int, str]) -> dict[int, list[tuple]]:
    """Gold rows per candidate, by :func:`union_rows`; slot values are never the answer column
    itself, so a union's common column type is each query's own. A query whose statement failed
    is re-run on its own, so an error surfaces exactly as before."""
    found = {k: rows for k, (_, rows) in union_rows(con, gold).items()} if len(gold) > 1 else {}
    return {k: found[k] if k in found else con.execute(sql).fetchall() for k, sql in gold.items()}


def columnar(con, template: Template, slots: dict[int, dict], part: int, columns: str = "q.*",
             keys: Mapping[str, Mapping[int, object]] | None = None,
             wrap: Callable[[str], str] | None = None) -> pa.Table | None:
    """Every candidate's gold (``part`` 0) or evidence (1) rows, tagged with its key (first column
    ``cand``), from one ``FROM _slots, LATERAL (sql)`` statement per set of :func:`literal_slots`
    values (:func:`~pipeline.questions.templates.render_columnar`). DuckDB plans it as joins, so the
    data is scanned once rather than once per candidate: 10x faster on the demo. ``keys`` adds
    columns of the slot table by name (values by candidate), which ``wrap(sql)`` may read (the
    noise stage's overlay ids). None when the slot values make no typed column or DuckDB refuses
    the query (then each is run as rendered)."""
    tables = run_columnar(con, template, slots, part, columns, keys, wrap, lambda con, sql: con.sql(sql).to_arrow_table())
    return None if not tables else pa.concat_tables(tables) if len(tables) > 1 else tables[0]


def columnar_rows(con, template: Template, slots: dict[int, dict], keys: Mapping[str, Mapping[int, object]] | None = None,
                  wrap: Callable[[str], str] | None = None) -> list[tuple] | None:
    """:func:`columnar` gold rows as the Python values a rendered query's ``fetchall`` gives
    (through Arrow, a HUGEINT sum would read as a Decimal)."""
    found = run_columnar(con, template, slots, 0, "q.*", keys, wrap, lambda con, sql: con.execute(sql).fetchall())
    return None if found is None else [row for rows in found for row in rows]


COLUMNAR_POPULATION_ROWS = 250_000
"""Rows of the largest table a population template reads up to which its candidates run columnar.
Its query reads the whole table for each candidate, and DuckDB cannot push the slot values through
its windows and aggregates, so the joined plan grows with table times candidates. On the demo
(labevents: 108K rows) it is several times faster than one query per candidate; at 10,000
patients (labevents: 5.5M rows) 14 of 74 templates' evidence SQL ran slower, one 10x."""


def largest_read(con, template: Template) -> int:
    """Rows of the largest staged table ``template`` reads (DuckDB's count, kept with the table:
    no scan)."""
    names = ", ".join(f"'{t}'" for t in sorted(template.tables_needed()))
    return con.execute(f"SELECT coalesce(max(estimated_size), 0) FROM duckdb_tables() "
                       f"WHERE table_name IN ({names})").fetchall()[0][0]


def run_columnar(con, template: Template, slots: dict[int, dict], part: int, columns: str,
                 keys: Mapping[str, Mapping[int, object]] | None, wrap: Callable[[str], str] | None,
                 fetch: Callable[[duckdb.DuckDBPyConnection, str], T]) -> list[T] | None:
    """What ``fetch(con, sql)`` makes of each of :func:`columnar`'s statements (one per set of
    literal slot values); None when one fails, and for a population template over a table larger
    than :data:`COLUMNAR_POPULATION_ROWS`."""
    if template.level != "patient" and largest_read(con, template) > COLUMNAR_POPULATION_ROWS:
        return None
    literal = sorted(literal_slots(template))
    groups: dict[str, dict[int, dict]] = {}
    for k, s in slots.items():
        groups.setdefault(_json({n: s[n] for n in literal}), {})[k] = s
    found = []
    try:
        for batch in groups.values():
            first = next(iter(batch.values()))
            sql = render_columnar(template, {n: first[n] for n in literal})[part]
            con.register(SLOT_TABLE, pa.table({
                "cand": pa.array(list(batch), pa.int64()),
                **{name: pa.array([values[k] for k in batch]) for name, values in (keys or {}).items()},
                **{SLOT_PREFIX + n: pa.array([s[n] for s in batch.values()])
                   for n in template.slot_names if n not in literal}}))
            try:
                found.append(fetch(con, f"SELECT {SLOT_TABLE}.cand, {columns} FROM {SLOT_TABLE}, "
                                        f"LATERAL ({wrap(sql) if wrap else sql}) AS q"))
            finally:
                con.unregister(SLOT_TABLE)
    except (pa.ArrowInvalid, pa.ArrowTypeError, duckdb.Error):
        return None
    return found or None


def near_rounding(rows: list[tuple]) -> bool:
    """Whether a float among ``rows`` lies within 1e-9 of a half-cent, where the order a sum was
    accumulated in (a columnar plan's, not the rendered query's) could move its 2-decimal rounding."""
    return any(isinstance(v, float) and abs(abs(v) * 100 % 1 - 0.5) < 1e-9 for row in rows for v in row)


def template_rows(con, template: Template, slots: dict[int, dict], gold: dict[int, str],
                  keys: Mapping[str, Mapping[int, object]] | None = None,
                  wrap: Callable[[str], str] | None = None) -> dict[int, list[tuple]]:
    """Gold rows per candidate: in one :func:`columnar` statement (``keys``, ``wrap``: see there)
    where the order of rows does not matter (not a ``list`` answer), else (or when it cannot) by
    :func:`gold_rows` of each candidate's own SQL ``gold[k]``; a float at a rounding edge is
    re-checked by ``gold[k]`` too, so answers are those of the SQL as written."""
    found = columnar_rows(con, template, slots, keys, wrap) if template.answer_type != "list" and len(slots) > 1 else None
    if found is None:
        return gold_rows(con, template, gold)
    out: dict[int, list[tuple]] = {k: [] for k in slots}
    for cand, *row in found:
        out[cand].append(tuple(row))
    edge = {k: gold[k] for k, rows in out.items() if near_rounding(rows)}
    out.update(gold_rows(con, template, edge) if edge else {})
    return out


def _evaluate(con, template: Template, cands: list[tuple[dict, int]], present: set[str],
              rejected: Counter) -> list[dict]:
    """Rows of the clean candidates among ``cands`` (slots, variant), in order."""
    rendered = {i: render(template, slots, variant) for i, (slots, variant) in enumerate(cands)}
    rows_of = template_rows(con, template, {i: slots for i, (slots, _) in enumerate(cands)},
                            {i: gold for i, (_, gold, _) in rendered.items()})
    rows: dict[int, dict] = {}
    for i, (slots, variant) in enumerate(cands):
        question, gold, _ = rendered[i]
        try:
            answer = normalise(rows_of[i], template.answer_type)
        except AnswerError as exc:
            rejected[exc.reason] += 1
            continue
        slots_json = _json(slots)
        rows[i] = dict(question_id=hashlib.sha256(f"{template.id}|{slots_json}|{variant}".encode())
                       .hexdigest()[:16], template_id=template.id, intent=template.intent,
                       level=template.level, question=question, gold_sql=gold,
                       answer_type=template.answer_type, answer=answer, slots=slots_json, variant=variant)
    if not rows:
        return []
    # kept in Arrow: a population's rows can be millions
    evidence = columnar(con, template, {i: cands[i][0] for i in rows}, 1, "q.table_name, q._rid")
    if evidence is None:
        evidence = pa.concat_tables([con.sql(_union(chunk, "table_name, _rid")).to_arrow_table()
                                     for chunk in union_chunks({i: rendered[i][2] for i in rows})])
    bad = check_evidence(con, evidence, present, POPULATION_MATERIAL if template.level == "population" else 0.0,
                         candidates=rows)
    rejected.update(bad.values())
    kept = [i for i in rows if i not in bad]
    by_candidate: dict[int, dict[str, list[int]]] = {i: {} for i in kept}
    if kept:
        con.register("_evidence", evidence)
        try:
            for cand, table_name, rids in con.execute(
                    f"SELECT cand, table_name, list_sort(list_distinct(list(_rid))) FROM _evidence "
                    f"WHERE cand IN ({', '.join(map(str, kept))}) GROUP BY ALL").fetchall():
                by_candidate[cand][table_name] = rids
        finally:
            con.unregister("_evidence")
    for i in kept:
        rows[i]["evidence"] = _json(by_candidate[i])
    return [rows[i] for i in kept]


@dataclass
class _Result:
    template_id: str
    rows: list[dict] = field(default_factory=list)
    rejected: Counter = field(default_factory=Counter)
    skipped: str | None = None


def slot_pool(con, t: Template, seed: int, per_template: int) -> tuple[list[tuple[dict, int]], int]:
    """The template's candidate (slots, paraphrase variant) pairs in draw order, and how many draws
    found no valid slot value: the seeded first half of generation, auditable on its own."""
    rng = np.random.default_rng([seed, stable_int(t.id)])
    cands, no_slot = draw_candidates(con, t, rng, per_template * OVERSAMPLE)
    variants = rng.integers(len(t.questions), size=len(cands))
    return [(c, int(v)) for c, v in zip(cands, variants)], no_slot


def _template_result(con, present: set[str], t: Template, seed: int, per_template: int,
                     pool: tuple[list[tuple[dict, int]], int] | None = None) -> _Result:
    """One template's clean rows, or why it was skipped. Candidates (from ``pool``, or drawn now)
    are evaluated in chunks sized to what is still missing (scaled by the survival rate so far), so
    little work is spent past the ``per_template``-th survivor; each candidate's verdict does not
    depend on its chunk, so the kept rows are the same whatever the chunking."""
    missing = sorted(t.tables_needed() - present)
    if missing:
        return _Result(t.id, skipped=f"needs absent table(s): {', '.join(missing)}")
    rejected: Counter = Counter()
    try:
        pairs, no_slot = pool if pool is not None else slot_pool(con, t, seed, per_template)
        rejected["no_slot_value"] += no_slot
        kept: list[dict] = []
        start = 0
        while start < len(pairs) and len(kept) < per_template:
            need = per_template - len(kept)
            size = need if not start else -(-need * start // max(len(kept), 1))
            kept += _evaluate(con, t, pairs[start:start + size], present, rejected)
            start += size
    except duckdb.OutOfMemoryException as exc:  # the machine's limit, not the template's: skipping the
        # template would make what a build ships depend on the memory of the machine and the worker count
        raise MemoryBudgetError(f"template {t.id!r}: DuckDB ran out of its memory budget "
                                f"({str(exc).splitlines()[0]}); set EHR_ROBUSTGYM_DUCKDB_MEMORY higher") from exc
    except duckdb.Error as exc:
        return _Result(t.id, skipped=f"SQL error: {str(exc).splitlines()[0]}")
    except Exception as exc:  # a worker's traceback would not say which template failed
        exc.add_note(f"while generating questions for template {t.id!r}")
        raise
    return _Result(t.id, kept[:per_template], +rejected)


POOL_SCHEMA = pa.schema([("template_id", pa.string()), ("position", pa.int32()), ("slots", pa.string()),
                         ("variant", pa.int16()), ("no_slot_value", pa.int32())])


def slot_pools(staged_dir: str | os.PathLike, seed: int, templates: list[Template] | None = None,
               per_template: int = DEFAULT_PER_TEMPLATE) -> tuple[pa.Table, dict[str, str]]:
    """Every template's candidate slots as a table (``no_slot_value`` repeats the template's count
    of failed draws), and the templates skipped for absent tables. ``generate_questions(pools=...)``
    evaluates exactly these candidates."""
    templates = load_templates() if templates is None else templates
    con, present = open_staged(staged_dir)
    rows, skipped = [], {}
    try:
        for t in templates:
            missing = sorted(t.tables_needed() - present)
            if missing:
                skipped[t.id] = f"needs absent table(s): {', '.join(missing)}"
                continue
            pairs, no_slot = slot_pool(con, t, seed, per_template)
            rows += [{"template_id": t.id, "position": i, "slots": _json(c), "variant": v, "no_slot_value": no_slot}
                     for i, (c, v) in enumerate(pairs)]
    finally:
        con.close()
    return pa.Table.from_pylist(rows, schema=POOL_SCHEMA), skipped


def _pools_by_template(table: pa.Table) -> dict[str, tuple[list[tuple[dict, int]], int]]:
    out: dict[str, tuple[list, int]] = {}
    for r in sorted(table.to_pylist(), key=lambda r: (r["template_id"], r["position"])):
        pairs, _ = out.setdefault(r["template_id"], ([], r["no_slot_value"]))
        pairs.append((json.loads(r["slots"]), r["variant"]))
    return out


_WORKER: dict = {}  # the worker process's own connection and present tables


def _worker_init(staged_dir: str, staged_file: str, processes: int) -> None:
    _WORKER["con"], _WORKER["present"] = open_staged(staged_dir, staged_file, processes)
    _WORKER["con"].execute("SET threads = 1")


def _worker_run(t: Template, seed: int, per_template: int, pool) -> _Result:
    return _template_result(_WORKER["con"], _WORKER["present"], t, seed, per_template, pool)


def _results(staged_dir, seed: int, templates: list[Template], per_template: int, workers: int, pools: dict,
             staged_file: str | os.PathLike | None = None):
    """Per-template results in template order. Templates are independent (own rng, own rows), so
    they run in ``workers`` spawned processes, each with its own single-threaded DuckDB: the
    workload is thousands of small queries whose cost is planning, which one thread does best."""
    if workers <= 1:
        con, present = open_staged(staged_dir, staged_file)
        try:
            con.execute("SET threads = 1")
            yield from (_template_result(con, present, t, seed, per_template, pools.get(t.id)) for t in templates)
        finally:
            con.close()
        return
    with nullcontext(staged_file) if staged_file else staged_database(staged_dir) as shared, \
            worker_pool(workers, _worker_init, (str(staged_dir), str(shared), workers)) as pool:
        # compiled Jinja templates do not pickle; workers compile their own
        plain = [dataclasses.replace(t, _compiled={}) for t in templates]
        yield from pool.map(_worker_run, plain, repeat(seed), repeat(per_template), [pools.get(t.id) for t in plain])


def generate_questions(staged_dir: str | os.PathLike, seed: int, templates: list[Template] | None = None,
                       per_template: int = DEFAULT_PER_TEMPLATE, out: str | os.PathLike | None = None,
                       workers: int | None = None, pools: pa.Table | None = None,
                       staged_file: str | os.PathLike | None = None) -> tuple[pa.Table, QuestionReport]:
    """Clean questions for ``templates`` (default: all in ``templates/``) over ``staged_dir``, using
    ``workers`` processes (default: one per CPU); written atomically to ``out`` when given. With
    ``pools`` (from :func:`slot_pools`, same seed) the drawn candidates are taken from there; with
    ``staged_file`` (a :func:`~pipeline.staging.staged_database` of ``staged_dir``) the tables are
    read from it instead of a database of this call's own. Same inputs and seed give
    byte-identical output, whatever the number of workers."""
    started = time.perf_counter()
    templates = load_templates() if templates is None else templates
    workers = min(workers or os.cpu_count() or 1, len(templates))
    report = QuestionReport()
    rows: list[dict] = []
    by_id = {t.id: t for t in templates}
    by_template = _pools_by_template(pools) if pools is not None else {}
    for res in _results(staged_dir, seed, templates, per_template, workers, by_template, staged_file):
        if res.skipped:
            report.skipped[res.template_id] = res.skipped
            continue
        t = by_id[res.template_id]
        rows += res.rows
        report.questions[t.id] = len(res.rows)
        report.cells[(t.intent, t.level)] += len(res.rows)
        report.rejected.update(res.rejected)
        report.rejected_by_template[t.id] = res.rejected
    rows.sort(key=lambda r: r["question_id"])
    table = pa.Table.from_pylist(rows, schema=SCHEMA)
    if out is not None:
        write_parquet(table, out)
    report.seconds = time.perf_counter() - started
    return table, report
