"""Record-level operators: whole rows go missing, repeat, lose their link or their time."""

from __future__ import annotations

import datetime as dt

from pipeline.noise.model import Detector, Proposal
from pipeline.noise.operators.common import (
    UNANSWERABLE_WHEN_EMPTY,
    copy_row,
    evidence_rows,
    has_column,
    pick,
    record_proposal,
    shifted,
    text_of,
    time_column,
    update,
    value_column,
    without,
)
from pipeline.noise.overlay import Change, Overlay
from pipeline.noise.registry import operator
from pipeline.plausibility import PARENT_TIME, RULES
from pipeline.questions.templates import sql_literal
from pipeline.schema import ROW_ID

CONFLICT_FACTORS = (0.6, 0.75, 1.3, 1.5)  # a twin's value: different, yet plausible


@operator(level="record", discrepancy="missing_evidence", kahn="completeness")
def drop_evidence(db, q, params, rng):
    """Delete every evidence row: no supported answer remains, so the agent should abstain."""
    if q.answer_type not in UNANSWERABLE_WHEN_EMPTY or not q.evidence_rids():
        return None
    overlay = Overlay([Change(q.evidence_table, "delete", r) for r in q.evidence_rids()])
    _, _, evidence_sql = q.rerender(q.slots)
    empty = (f"SELECT CASE WHEN count(*) = 0 THEN 1 ELSE 0 END FROM ({evidence_sql}) AS evidence "
             f"WHERE table_name = '{q.evidence_table}'")
    with db.noisy(overlay):
        if db.scalar(empty) != 1:  # other rows step in (the "last" one is now another): an answer remains
            return None
    return Proposal(overlay, q.question, q.gold_sql, "abstain", None, Detector(sql=empty, clean_sql=empty),
                    [f"deleted {len(overlay.changes)} {q.evidence_table} row(s) the answer rests on"],
                    dict(q.slots))


@operator(level="record", discrepancy="duplicate_record", kahn="plausibility: uniqueness")
def duplicate_exact(db, q, params, rng):
    """Insert an exact copy of one evidence row; the supported answer is the de-duplicated one."""
    row = pick(rng, evidence_rows(db, q))
    if row is None:
        return None
    change = copy_row(db, q.evidence_table, row)
    return record_proposal(q, Overlay([change]), "flag", q.answer, "duplicate_exact",
                           [f"copied {q.evidence_table} row _rid={row[ROW_ID]} as _rid={change.rid}"])


@operator(level="record", discrepancy="conflicting_duplicate", kahn="plausibility: uniqueness")
def duplicate_conflict(db, q, params, rng):
    """Insert a row with the same event key but another value: which one holds is unknowable."""
    column = value_column(q)
    rows = [r for r in evidence_rows(db, q) if column and r.get(column) is not None]
    row = pick(rng, rows)
    if row is None:
        return None
    old = row[column]
    if isinstance(old, (int, float)) and not isinstance(old, bool):
        factor = float(pick(rng, CONFLICT_FACTORS))
        new = round(old * factor, 2) if old else 1.0
        changes = {column: new}
        if column == "valuenum" and has_column(q.evidence_table, "value"):
            changes["value"] = text_of(new, row.get("value"))
    else:
        others = [r[0] for r in db.rows(
            f"SELECT DISTINCT {column} FROM base.{q.evidence_table} WHERE {column} IS NOT NULL "
            f"AND {column} <> {sql_literal(old)} ORDER BY 1 LIMIT 50")]
        new = pick(rng, others)
        if new is None:
            return None
        changes = {column: new}
    change = copy_row(db, q.evidence_table, row, **changes)
    return record_proposal(q, Overlay([change]), "flag", None, "duplicate_conflict",
                           [(f"inserted a twin of {q.evidence_table} _rid={row[ROW_ID]} with {column} "
                             f"{old!r} -> {new!r}")])


@operator(level="record", discrepancy="broken_link", kahn="conformance: relational")
def orphan_link(db, q, params, rng):
    """Unlink one evidence row from its stay (NULL or another patient's id); its time still lies
    inside the true stay, so a careful agent re-links it and answers as on the clean data."""
    table, rows = q.evidence_table, evidence_rows(db, q)
    row = pick(rng, [r for r in rows if r.get("hadm_id") is not None])
    if row is None or table in ("admissions", "icustays", "patients"):
        return None
    if has_column(table, "stay_id") and row.get("stay_id") is not None:
        other = db.scalar(f"SELECT stay_id FROM base.icustays WHERE hadm_id <> {row['hadm_id']} "
                          f"ORDER BY hash(stay_id + {int(rng.integers(1 << 30))}) LIMIT 1")
        column, new = "stay_id", other
    elif not RULES.get(table) or not RULES[table].time:
        return None
    else:
        column, new = "hadm_id", None
    change = update(table, row, column, new)
    return record_proposal(q, Overlay([change]), "flag", q.answer, "orphan_link",
                           [f"{table} _rid={row[ROW_ID]}: {column} {row[column]} -> {new}"])


def _stay_end(db, table: str, time_col: str, row: dict):
    parent = PARENT_TIME.get((table, time_col))
    if parent == "icustays" and row.get("stay_id") is not None:
        return db.scalar(f"SELECT outtime FROM base.icustays WHERE stay_id = {row['stay_id']}")
    if parent == "admissions" and row.get("hadm_id") is not None:
        return db.scalar(f"SELECT dischtime FROM base.admissions WHERE hadm_id = {row['hadm_id']}")
    return None


@operator(level="record", discrepancy="time_outside_stay", kahn="plausibility: temporal")
def time_displaced(db, q, params, rng):
    """Move the earliest evidence row to days after its stay ended (as MIMIC's charting slips do);
    the supported answer sets that row aside."""
    table, column = q.evidence_table, time_column(q)
    rows = [r for r in evidence_rows(db, q) if column and isinstance(r.get(column), dt.datetime)]
    if not rows:
        return None
    row = min(rows, key=lambda r: (r[column], r[ROW_ID]))
    end = _stay_end(db, table, column, row)
    if end is None:
        return None
    new = (end + dt.timedelta(hours=int(rng.integers(24, 24 * 6)))).replace(second=0, microsecond=0)
    delta_days = (new - row[column]).total_seconds() / 86400
    overlay = Overlay([update(table, row, column, new)])
    rule = RULES.get(table)
    if rule and rule.end and isinstance(row.get(rule.end), dt.datetime):
        overlay.changes.append(update(table, row, rule.end, shifted(row[rule.end], delta_days)))
    expected = without(db, q, [row[ROW_ID]])
    return record_proposal(q, overlay, "flag", expected, "time_outside_stay",
                           [f"{table} _rid={row[ROW_ID]}: {column} {row[column]} -> {new} (stay ended {end})"])


@operator(level="record", discrepancy="missing_time", kahn="completeness")
def missing_timestamp(db, q, params, rng):
    """Blank the time of the latest evidence row: first/last/trend can no longer be established."""
    table, column = q.evidence_table, time_column(q)
    rows = [r for r in evidence_rows(db, q) if column and r.get(column) is not None]
    if not rows:
        return None
    row = max(rows, key=lambda r: (r[column], r[ROW_ID]))
    return record_proposal(q, Overlay([update(table, row, column, None)]), "abstain", None, "missing_timestamp",
                           [f"{table} _rid={row[ROW_ID]}: {column} {row[column]} -> NULL"])
