"""Helpers the operators share: evidence rows, re-rendered answers, record-level proposals."""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterator

import numpy as np
import pyarrow as pa

from pipeline.noise.model import Behavior, CleanQuestion, Detector, Proposal, answer_of
from pipeline.noise.overlay import Change, Database, Overlay
from pipeline.plausibility import RULES
from pipeline.questions.evidence import INLINE_ROWS
from pipeline.schema import ROW_ID, TABLES

UNANSWERABLE_WHEN_EMPTY = ("number", "text", "date", "datetime", "list", "set")


def value_column(q: CleanQuestion) -> str | None:
    rule = RULES.get(q.evidence_table)
    return q.noise.value_column or (rule.value if rule else None)


def time_column(q: CleanQuestion) -> str | None:
    rule = RULES.get(q.evidence_table)
    return q.noise.time_column or (rule.time if rule else None)


def question_patient(q: CleanQuestion) -> int | None:
    """The patient a patient-level question names (its ``subject_id`` slot), else None."""
    subject = q.slots.get("subject_id")
    return subject if isinstance(subject, int) else None  # the patient sampler's values are ints


def pick(rng: np.random.Generator, items: list):
    return items[int(rng.integers(len(items)))] if items else None


def evidence_rids(db: Database, q: CleanQuestion, condition: str | None = None) -> list[int]:
    """The _rids of the question's evidence rows in its evidence table, in order; with ``condition``
    (SQL over the row's columns), of those rows meeting it on the base only."""
    if condition is None:
        return sorted(set(q.evidence_rids()))
    return [rid for rid, in evidence_select(db, q, ROW_ID, condition)]


def evidence_select(db: Database, q: CleanQuestion, select: str, condition: str = "true",
                    order: str = ROW_ID, limit: int | None = None) -> Iterator[tuple]:
    """Rows of ``SELECT select`` over the question's evidence rows (on the base) meeting
    ``condition``, in ``order``. Filtered in DuckDB: a population question's evidence can be
    400,000 rows (10,000 patients), over a gigabyte as Python rows, of which an operator wants one.

    A few evidence rows are named in the query and fetched as tuples (:meth:`Database.rows`: a
    rerun replays them); more are joined as a registered table and come through Arrow, turned into
    tuples a chunk at a time."""
    rids = sorted(set(q.evidence_rids()))
    if not rids:
        return iter(())
    table = f"base.{q.evidence_table}"
    span = f"{ROW_ID} BETWEEN {rids[0]} AND {rids[-1]}"  # lets zone maps skip where _rid follows the stored order
    tail = f"AND ({condition}) ORDER BY {order}{'' if limit is None else f' LIMIT {int(limit)}'}"
    if len(rids) <= INLINE_ROWS:  # cheaper than registering a table to join, and than Arrow; memoized
        return iter(db.rows(f"SELECT {select} FROM {table} WHERE {span} "
                            f"AND {ROW_ID} IN ({', '.join(map(str, rids))}) {tail}"))
    db.con.register("_evidence_rids", pa.table({ROW_ID: pa.array(rids, pa.int64())}))
    try:
        found = db.con.sql(f"SELECT {select} FROM {table} SEMI JOIN _evidence_rids USING ({ROW_ID}) "
                           f"WHERE {span} {tail}").to_arrow_table()
    finally:
        db.con.unregister("_evidence_rids")
    return (row for batch in found.to_batches(4096) for row in zip(*(c.to_pylist() for c in batch.columns)))


def evidence_row(db: Database, q: CleanQuestion, rid: int | None) -> dict | None:
    """The base row ``rid`` of the question's evidence table (None for None)."""
    return None if rid is None else db.base_rows(q.evidence_table, [rid], subject=question_patient(q))[0]


def first_evidence_row(db: Database, q: CleanQuestion, condition: str, order: str) -> dict | None:
    """The first evidence row meeting ``condition`` in ``order`` (which should end in _rid, for a tie)."""
    return evidence_row(db, q, next(evidence_select(db, q, ROW_ID, condition, order, limit=1), (None,))[0])


def pick_evidence_row(db: Database, q: CleanQuestion, rng: np.random.Generator,
                      condition: str | None = None) -> dict | None:
    """``pick(rng, ...)`` among the evidence rows meeting ``condition``, fetching only the row drawn."""
    return evidence_row(db, q, pick(rng, evidence_rids(db, q, condition)))


def timestamp(table: str, column: str | None) -> str:
    """SQL true where ``column`` of ``table`` holds a time Python reads as a datetime (not a date)."""
    if not has_column(table, column) or TABLES[table].column(column).type != "TIMESTAMP":
        return "false"
    return f"{column} IS NOT NULL"


def numeric(table: str, column: str | None) -> str:
    """SQL true where ``column`` of ``table`` holds a number Python reads as int or float: never for
    a column of another type (DECIMAL, BOOLEAN, text) or one the table lacks."""
    if not has_column(table, column):
        return "false"
    kind = TABLES[table].arrow_schema.field(column).type
    return f"{column} IS NOT NULL" if pa.types.is_integer(kind) or pa.types.is_floating(kind) else "false"


PENDING = "<pending>"  # a noisy answer put off by Database.deferring: never an answer itself


def gold_answer(db: Database, q: CleanQuestion, overlay: Overlay | None = None, sql: str | None = None) -> str | None:
    """The question's gold SQL (or ``sql``) answered on the base, or with ``overlay`` applied
    (:data:`PENDING` while the database defers noisy queries)."""
    sql = sql or q.gold_sql
    if not overlay:
        return answer_of(db.rows(sql), q.answer_type)
    if db.defers(overlay, sql):
        return PENDING
    with db.noisy(overlay):
        return answer_of(db.rows(sql), q.answer_type)


def restricted(sql: str, table: str, rows_sql: str) -> str:
    """``sql`` reading ``table`` as ``rows_sql``: a CTE of the table's own name shadows it, so the
    gold SQL runs unchanged on the rows a careful analyst keeps (or repairs) — a recovery SQL."""
    cte = f"{table} AS ({rows_sql})"
    head = re.match(r"\s*WITH\s+(?!RECURSIVE\b)", sql, re.IGNORECASE)
    return f"WITH {cte}, {sql[head.end():]}" if head else f"WITH {cte}\n{sql}"


def restriction(sql: str, gold: str, table: str) -> str | None:
    """The rows SQL that :func:`restricted` put in front of ``gold`` to make ``sql`` (None when
    ``sql`` is not ``gold`` restricted on ``table``)."""
    head = re.match(r"\s*WITH\s+(?!RECURSIVE\b)", gold, re.IGNORECASE)
    start, end = f"WITH {table} AS (", f"), {gold[head.end():]}" if head else f")\n{gold}"
    if not (sql.startswith(start) and sql.endswith(end)) or len(sql) <= len(start) + len(end):
        return None
    rows_sql = sql[len(start):len(sql) - len(end)]
    return rows_sql if restricted(gold, table, rows_sql) == sql else None


def recovered(db: Database, q: CleanQuestion, overlay: Overlay, recovery_sql: str) -> str | None:
    """The expected answer, by executing the analyst's recovery SQL on the noisy database."""
    return gold_answer(db, q, overlay, sql=recovery_sql)


def icd_reversioned(table: str, codes: str) -> str:
    """``table`` with every ICD code its dictionary ``codes`` knows under exactly one version read
    under that version: an intact code filed under the wrong version is given back. The
    ``invalid_code`` operator's recovery and the checking agent's repair, one rule for both."""
    return (f"SELECT x.* REPLACE (coalesce(d.icd_version, x.icd_version) AS icd_version) FROM {table} x "
            f"LEFT JOIN (SELECT icd_code, any_value(icd_version) AS icd_version FROM {codes} "
            f"GROUP BY icd_code HAVING count(*) = 1) d ON d.icd_code = x.icd_code")


# The stay a link names: (link column, start, end) of a stay ``p``; an admission includes its ED time.
STAYS = {
    "admissions": ("hadm_id", "least(p.admittime, coalesce(p.edregtime, p.admittime))", "p.dischtime"),
    "icustays": ("stay_id", "p.intime", "p.outtime"),
}


def inside(table: str, time: str, start: str, end: str) -> str:
    """``t.time`` within [start, end], by calendar day when the time is a date."""
    if TABLES[table].column(time).type == "DATE":
        return f"t.{time} BETWEEN CAST({start} AS DATE) AND CAST({end} AS DATE)"
    return f"t.{time} BETWEEN {start} AND {end}"


def stay_link(table: str) -> tuple[str, str] | None:
    """(link column, stay table) of ``table``'s rows: the ICU stay where the row has one, else the
    admission; None for tables that link to no stay."""
    parent = "admissions" if table == "icustays" or not has_column(table, "stay_id") else "icustays"
    link = STAYS[parent][0]
    if table in ("admissions", "patients") or table not in RULES or not has_column(table, link):
        return None
    return link, parent


def linked_stay(table: str) -> tuple[str, str]:
    """:func:`stay_link` of a table that must have one: a table without is a caller's bug, named."""
    found = stay_link(table)
    if found is None:
        raise ValueError(f"table {table!r} links to no stay (admission or ICU stay)")
    return found


def stay_fits(table: str, time: str | None) -> str:
    """Stay ``p`` could hold row ``t``: the patient's, and containing the row's time when it has one."""
    _, parent = linked_stay(table)
    _, start, end = STAYS[parent]
    return f"p.subject_id = t.subject_id{f' AND {inside(table, time, start, end)}' if time else ''}"


def stay_known(link: str, parent: str) -> str:
    """Row ``t``'s link names a stay ``parent`` holds for its patient."""
    return f"EXISTS (SELECT 1 FROM {parent} p WHERE p.{link} = t.{link} AND p.subject_id = t.subject_id)"


def relinked(table: str, time: str | None, source: str | None = None) -> str:
    """``table`` (its rows read from ``source``) with each link naming no stay of the row's patient
    replaced by the one stay that fits the row (NULL when none or several do): the ``orphan_link``
    operator's recovery and the checking agent's repair, one rule for both.

    Each row is joined to its patient's stays, gathered in a list, rather than looking them up with
    correlated subqueries: DuckDB evaluates those for every row of the table before a question's
    own filter applies (10,000 patients: 1.5 s for one patient's labs), while a filter on the
    patient passes through the join (5 ms)."""
    link, parent = linked_stay(table)
    _, start, end = STAYS[parent]
    fits = inside(table, time, "s.since", "s.until") if time else "true"
    fitting = f"list_filter(p.stays, lambda s: {fits})"
    return (f"SELECT t.* REPLACE (CASE WHEN t.{link} IS NULL OR list_contains(p.{link}s, t.{link}) THEN t.{link} "
            f"WHEN len({fitting}) = 1 THEN {fitting}[1].{link} END AS {link}) "
            f"FROM {source or table} t LEFT JOIN (SELECT p.subject_id, list(p.{link}) AS {link}s, "
            f"list({{{link}: p.{link}, since: {start}, until: {end}}}) AS stays FROM {parent} p "
            f"GROUP BY p.subject_id) p ON p.subject_id = t.subject_id")


def copy_row(db: Database, table: str, row: dict, offset: int = 0, **changes) -> Change:
    """An insert of ``row`` (minus its _rid) under a fresh _rid, with ``changes`` applied."""
    data = {k: v for k, v in row.items() if k != ROW_ID}
    data.update(changes)
    return Change(table, "insert", db.next_rid(table) + offset, None, data)


def update(table: str, row: dict, column: str, value) -> Change:
    return Change(table, "update", row[ROW_ID], column, value)


def record_proposal(q: CleanQuestion, overlay: Overlay, behavior: Behavior, expected: str | None,
                    reason: str | None, log: list[str], recovery_sql: str | None = None) -> Proposal:
    """A record/value-level proposal: same question and SQL, perturbed rows, detected by ``reason``
    on the evidence plus any inserted rows; ``expected`` comes from ``recovery_sql`` (:func:`recovered`)."""
    scope = {q.evidence_table: sorted(set(q.evidence_rids()) | {c.rid for c in overlay.changes
                                                                  if c.op == "insert"})}
    return Proposal(overlay, q.question, q.gold_sql, behavior, expected, Detector(reason=reason, scope=scope),
                    log, dict(q.slots), recovery_sql=recovery_sql)


def text_of(number: float, like: str | None) -> str:
    """Format ``number`` with as many decimals as the example text ``like`` had, or more when the
    number needs them: the text must never contradict the number (that is another discrepancy)."""
    decimals = len(like.split(".")[1]) if like and "." in like else 0
    for d in range(decimals, 10):
        text = f"{number:.{d}f}"
        if float(text) == number:
            return text
    return repr(float(number))


def shifted(value, days: float):
    return value + dt.timedelta(days=days) if isinstance(value, dt.datetime) else value


def has_column(table: str, column: str | None) -> bool:
    return column is not None and TABLES[table].has(column)
