"""Helpers the operators share: evidence rows, re-rendered answers, record-level proposals."""

from __future__ import annotations

import datetime as dt
import re

import numpy as np

from pipeline.noise.model import Behavior, CleanQuestion, Detector, Proposal, answer_of
from pipeline.noise.overlay import Change, Database, Overlay
from pipeline.plausibility import RULES
from pipeline.schema import ROW_ID, TABLES

UNANSWERABLE_WHEN_EMPTY = ("number", "text", "date", "datetime", "list", "set")


def value_column(q: CleanQuestion) -> str | None:
    rule = RULES.get(q.evidence_table)
    return q.noise.value_column or (rule.value if rule else None)


def time_column(q: CleanQuestion) -> str | None:
    rule = RULES.get(q.evidence_table)
    return q.noise.time_column or (rule.time if rule else None)


def evidence_rows(db: Database, q: CleanQuestion) -> list[dict]:
    """Base rows of the question's evidence in its evidence table, by _rid."""
    return db.base_rows(q.evidence_table, q.evidence_rids())


def pick(rng: np.random.Generator, items: list):
    return items[int(rng.integers(len(items)))] if items else None


def gold_answer(db: Database, q: CleanQuestion, overlay: Overlay | None = None, sql: str | None = None) -> str | None:
    """The question's gold SQL (or ``sql``) answered on the base, or with ``overlay`` applied."""
    sql = sql or q.gold_sql
    if not overlay:
        return answer_of(db.rows(sql), q.answer_type)
    with db.noisy(overlay):
        return answer_of(db.rows(sql), q.answer_type)


def restricted(sql: str, table: str, rows_sql: str) -> str:
    """``sql`` reading ``table`` as ``rows_sql``: a CTE of the table's own name shadows it, so the
    gold SQL runs unchanged on the rows a careful analyst keeps (or repairs) — a recovery SQL."""
    cte = f"{table} AS ({rows_sql})"
    head = re.match(r"\s*WITH\s+(?!RECURSIVE\b)", sql, re.IGNORECASE)
    return f"WITH {cte}, {sql[head.end():]}" if head else f"WITH {cte}\n{sql}"


def recovered(db: Database, q: CleanQuestion, overlay: Overlay, recovery_sql: str) -> str | None:
    """The expected answer, by executing the analyst's recovery SQL on the noisy database."""
    return gold_answer(db, q, overlay, sql=recovery_sql)


def copy_row(db: Database, table: str, row: dict, offset: int = 0, **changes) -> Change:
    """An insert of ``row`` (minus its _rid) under a fresh _rid, with ``changes`` applied."""
    data = {k: v for k, v in row.items() if k != ROW_ID}
    data.update(changes)
    return Change(table, "insert", db.next_rid[table] + offset, None, data)


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
