"""Record-level operators: whole rows go missing, repeat, lose their link or their time.

Each expected answer is what the analyst's recovery SQL gives on the noisy database (de-duplicate
on the event key, re-link by time, set aside rows outside their stay, fall back on a time the row
keeps), or no answer when the data cannot settle it (docs/labels.md).
"""

from __future__ import annotations

import datetime as dt

from pipeline.noise.model import Detector, Proposal
from pipeline.noise.operators.common import (
    STAYS,
    UNANSWERABLE_WHEN_EMPTY,
    copy_row,
    first_evidence_row,
    gold_answer,
    has_column,
    inside,
    pick,
    pick_evidence_row,
    record_proposal,
    recovered,
    relinked,
    restricted,
    shifted,
    stay_fits,
    stay_link,
    text_of,
    time_column,
    timestamp,
    update,
    value_column,
)
from pipeline.noise.overlay import Change, Database, Overlay
from pipeline.noise.registry import operator
from pipeline.plausibility import PARENT_TIME, RULES
from pipeline.questions.templates import sql_literal
from pipeline.schema import ROW_ID, TABLES

CONFLICT_FACTORS = (0.6, 0.75, 1.3, 1.5)  # a twin's value: different, yet plausible
CONFLICT_HOURS = (-12, -6, 6, 12, 24)  # a twin's date-time value
# How far outside its stay a displaced row lands, in minutes: the demo's events outside their
# admission or ICU stay lie minutes to ~20 hours beyond it.
DISPLACEMENT_MINUTES = (60, 24 * 60)
# Times a row carries besides its event time; a displacement moves them with it, so nothing in
# the row betrays the true time (charttime stays before storetime, the duration is kept).
COMPANION_TIMES = ("storetime", "scheduletime")
# (table, time column) -> the same row's own stand-in for that time when it is blank: exact
# (a stay's length, a date within its time) or close (when the result was stored).
PROXIES: dict[tuple[str, str], str] = {
    ("icustays", "intime"): "outtime - to_microseconds(CAST(los * 86400e6 AS BIGINT))",
    ("icustays", "outtime"): "intime + to_microseconds(CAST(los * 86400e6 AS BIGINT))",
    ("microbiologyevents", "chartdate"): "date_trunc('day', charttime)",
    **{(t, str(RULES[t].time)): "storetime" for t in ("labevents", "chartevents", "outputevents", "datetimeevents",
                                                  "emar", "inputevents", "procedureevents")},
}
# Per stay table (the parent a link points at): its link column and the window its events lie in.


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


def fresh_key(db: Database, table: str, row: dict) -> dict:
    """New values for the row-id columns outside the event key (labevent_id, hadm_id, seq_num within
    its admission ...): a twin is another record of the same event, never the same record twice.
    Where the row id is the event's only identity (emar_id, microevent_id) the twin repeats it."""
    out = {}
    for column in TABLES[table].key:
        if column in RULES[table].key:
            continue
        if column == "seq_num":
            largest = db.scalar(f"SELECT max(seq_num) FROM base.{table} WHERE hadm_id = {row['hadm_id']}")
        else:
            largest = db.largest(table, column)
        out[column] = int(largest or 0) + 1
    return out


def deduplicated(table: str, by: tuple[str, ...], descending: bool = False) -> str:
    """``table`` keeping one row per ``by`` (``_rid`` only breaks the tie)."""
    order = f"{ROW_ID} DESC" if descending else ROW_ID
    return (f"SELECT * FROM {table} QUALIFY row_number() OVER (PARTITION BY {', '.join(by)} "
            f"ORDER BY {order}) = 1")


@operator(level="record", discrepancy="duplicate_record", kahn="plausibility: uniqueness")
def duplicate_exact(db, q, params, rng):
    """Insert a second record of one evidence event (its own row id, every other cell equal); the
    analyst de-duplicates on the event key and value and answers."""
    table = q.evidence_table
    row = pick_evidence_row(db, q, rng)
    if row is None or table not in RULES:
        return None
    change = copy_row(db, table, row, **fresh_key(db, table, row))
    rule = RULES[table]
    sql = restricted(q.gold_sql, table, deduplicated(table, rule.key + tuple(
        c for c in (rule.value,) if c and c not in rule.key)))
    overlay = Overlay([change])
    return record_proposal(q, overlay, "flag", recovered(db, q, overlay, sql), "duplicate_exact",
                           [f"copied {table} row _rid={row[ROW_ID]} as _rid={change.rid}"], recovery_sql=sql)


def _conflicting(db: Database, table: str, column: str, row: dict, rng) -> dict | None:
    """The twin's changed cells: another plausible value, and the cells derived from it (the
    value's text, a lab's abnormal flag against its reference range, an infusion's rate)."""
    old = row[column]
    if isinstance(old, (int, float)) and not isinstance(old, bool):
        factor = float(pick(rng, list(CONFLICT_FACTORS)))
        new = round(old * factor, 2) if old else 1.0
        changes: dict = {column: new}
        if column == "valuenum" and has_column(table, "value"):
            changes["value"] = text_of(new, row.get("value"))
        if column == "amount" and isinstance(row.get("rate"), (int, float)):
            changes["rate"] = round(row["rate"] * new / old, 4) if old else row["rate"]
        if has_column(table, "flag") and (row.get("ref_range_lower") is not None
                                          or row.get("ref_range_upper") is not None):
            lo, hi = row.get("ref_range_lower"), row.get("ref_range_upper")
            changes["flag"] = "abnormal" if (lo is not None and new < lo) or (hi is not None and new > hi) else None
        return changes
    if isinstance(old, dt.datetime):  # a recorded date-time value (datetimeevents): hours apart
        return {column: old + dt.timedelta(hours=int(pick(rng, list(CONFLICT_HOURS))))}
    others = [r[0] for r in db.rows(
        f"SELECT DISTINCT {column} FROM base.{table} WHERE {column} IS NOT NULL "
        f"AND {column} <> {sql_literal(old)} ORDER BY 1 LIMIT 50")]
    new = pick(rng, others)
    return None if new is None else {column: new}


@operator(level="record", discrepancy="conflicting_duplicate", kahn="plausibility: uniqueness")
def duplicate_conflict(db, q, params, rng):
    """Insert a second record of one evidence event with another value. The analyst keeps one
    record per event: when either choice gives the same answer it is the answer, otherwise which
    record holds is unknowable and the agent flags the conflict without an answer."""
    table, column = q.evidence_table, value_column(q)
    row = pick_evidence_row(db, q, rng, f"{column} IS NOT NULL") if has_column(table, column) else None
    if row is None or table not in RULES or column != RULES[table].value or column in RULES[table].key:
        return None  # the event's identity, or a cell the duplicate check does not compare
    changes = _conflicting(db, table, column, row, rng)
    if changes is None:
        return None
    overlay = Overlay([copy_row(db, table, row, **fresh_key(db, table, row), **changes)])
    key = RULES[table].key
    sql = restricted(q.gold_sql, table, deduplicated(table, key))
    either = recovered(db, q, overlay, sql)
    if either != recovered(db, q, overlay, restricted(q.gold_sql, table, deduplicated(table, key, True))):
        either, sql = None, None
    return record_proposal(q, overlay, "flag", either, "duplicate_conflict",
                           [(f"inserted a twin of {table} _rid={row[ROW_ID]} with {column} "
                             f"{row[column]!r} -> {changes[column]!r}")], recovery_sql=sql)


@operator(level="record", discrepancy="broken_link", kahn="conformance: relational")
def orphan_link(db, q, params, rng):
    """Point one evidence row's stay link (stay_id, else hadm_id) at a stay that does not exist.
    The analyst re-links a dangling row to the patient's one stay containing its time (or the
    patient's only admission, for rows without a time) and answers; when no single stay fits,
    the row cannot be placed and the agent abstains."""
    table = q.evidence_table
    linked = stay_link(table)
    if linked is None:
        return None
    link, parent = linked
    time = time_column(q)
    timed = "" if time is None else f" AND {time} IS NOT NULL" if has_column(table, time) else " AND false"
    row = pick_evidence_row(db, q, rng, f"{link} IS NOT NULL{timed}")
    if row is None:
        return None
    top = db.largest(parent, link)
    dangling = int(top) + int(rng.integers(1, 1000))
    overlay = Overlay([update(table, row, link, dangling)])
    patient = "" if row.get("subject_id") is None else f"AND t.subject_id = {row['subject_id']} "  # skips to it
    fitting = db.scalar(f"SELECT count(*) FROM base.{parent} p, base.{table} t WHERE t.{ROW_ID} = {row[ROW_ID]} "
                        f"{patient}AND {stay_fits(table, time)}")
    sql = restricted(q.gold_sql, table, relinked(table, time)) if fitting == 1 else None
    expected = recovered(db, q, overlay, sql) if sql else None
    return record_proposal(q, overlay, "flag" if sql else "abstain", expected, "orphan_link",
                           [f"{table} _rid={row[ROW_ID]}: {link} {row[link]} -> {dangling} (no such stay); "
                            f"{fitting} stay(s) of the patient fit the row"], recovery_sql=sql)


@operator(level="record", discrepancy="time_outside_stay", kahn="plausibility: temporal")
def time_displaced(db, q, params, rng):
    """Move the earliest evidence row to an hour to a day after its stay ended, or the latest to
    as long before it began (the size of MIMIC's own charting slips), with the row's other times.
    The analyst sets aside rows whose time lies outside their stay and answers; a displacement the
    question does not depend on is no pair."""
    table, column = q.evidence_table, time_column(q)
    parent = PARENT_TIME.get((table, column))
    if parent is None:
        return None
    link, start, end = STAYS[parent]
    timed = f"{timestamp(table, column)} AND {link} IS NOT NULL" if has_column(table, link) else "false"
    earliest = first_evidence_row(db, q, timed, f"{column}, {ROW_ID}")
    if earliest is None:
        return None
    sql = restricted(q.gold_sql, table, (f"SELECT t.* FROM {table} t LEFT JOIN {parent} p ON p.{link} = t.{link} "
                                         f"WHERE p.{link} IS NULL OR t.{column} IS NULL "
                                         f"OR {inside(table, column, start, end)}"))
    minutes = int(rng.integers(*DISPLACEMENT_MINUTES))
    first = bool(rng.integers(2))
    for after in (first, not first):  # whichever way the question depends on
        row = earliest if after else first_evidence_row(db, q, timed, f"{column} DESC, {ROW_ID} DESC")
        edge = db.scalar(f"SELECT {end if after else start} FROM base.{parent} p WHERE p.{link} = {row[link]}")
        if edge is None:
            continue
        new = (edge + dt.timedelta(minutes=minutes if after else -minutes)).replace(second=0, microsecond=0)
        days = (new - row[column]).total_seconds() / 86400
        overlay = Overlay([update(table, row, column, new)])
        for other in (RULES[table].end, *COMPANION_TIMES):
            if has_column(table, other) and isinstance(row.get(other), dt.datetime):
                overlay.changes.append(update(table, row, other, shifted(row[other], days)))
        naive, expected = gold_answer(db, q, overlay), recovered(db, q, overlay, sql)
        if naive in (q.answer, expected):  # the time does not matter, or setting the row aside does not
            continue
        return record_proposal(q, overlay, "flag" if expected is not None else "abstain", expected,
                               "time_outside_stay",
                               [f"{table} _rid={row[ROW_ID]}: {column} {row[column]} -> {new} "
                                f"({minutes} min {'after' if after else 'before'} the stay)"],
                               recovery_sql=sql if expected is not None else None)
    return None


@operator(level="record", discrepancy="missing_time", kahn="completeness")
def missing_timestamp(db, q, params, rng):
    """Blank the time of the latest evidence row. Where the row keeps a stand-in (an ICU stay's
    length, the culture's charttime, when the result was stored) and the answer with it is the
    one the data supports, the analyst falls back on it and answers; otherwise the time cannot be
    re-established and the agent abstains."""
    table, column = q.evidence_table, time_column(q)
    timed = f"{column} IS NOT NULL" if has_column(table, column) else "false"
    row = first_evidence_row(db, q, timed, f"{column} DESC, {ROW_ID} DESC")
    if row is None:
        return None
    overlay = Overlay([update(table, row, column, None)])
    proxy = PROXIES.get((table, column))
    sql = expected = None
    if proxy:
        sql = restricted(q.gold_sql, table,
                         f"SELECT * REPLACE (coalesce({column}, {proxy}) AS {column}) FROM {table}")
        expected = recovered(db, q, overlay, sql)
        if expected != q.answer:  # the stand-in is blank too, or too coarse for what this question asks
            sql = expected = None
    return record_proposal(q, overlay, "flag" if sql else "abstain", expected, "missing_timestamp",
                           [f"{table} _rid={row[ROW_ID]}: {column} {row[column]} -> NULL"
                            f"{f' (kept: {proxy})' if sql else ''}"], recovery_sql=sql)
