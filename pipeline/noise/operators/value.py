"""Value-level operators: the row is there, but a cell is wrong in a way the data can reveal.

Each operator also writes the careful analyst's repair as SQL over the evidence table (the item's
plausibility bounds, units and code versions inlined as literals) and labels the pair with what
that repair gives on the noisy database: ``flag`` with the recovered answer when the data
determines it, ``flag``/``abstain`` without one when it does not (docs/labels.md).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import replace

from pipeline.noise.model import AMBIGUOUS, Detector
from pipeline.noise.operators.common import (
    evidence_row,
    evidence_select,
    has_column,
    icd_reversioned,
    numeric,
    pick,
    pick_evidence_row,
    record_proposal,
    recovered,
    restricted,
    text_of,
    timestamp,
    update,
    value_column,
)
from pipeline.noise.overlay import Overlay
from pipeline.noise.registry import operator
from pipeline.plausibility import RULES, item_bounds
from pipeline.schema import ROW_ID

UNIT_SLIPS = (10, 100, 1000)  # decimal slips; one is used only when it alone maps the value back
TEXT_CONFLICT_FACTORS = (0.5, 0.7, 1.4, 1.6)  # the number drifts from its text by a visible margin
# Real inversions (the demo's 753 prescriptions whose stoptime precedes starttime) are whole-hour
# slips: half of them 1 h, 90% at most 17 h. Drawn uniformly from these, the sizes follow suit.
INVERSION_HOURS = (1, 1, 1, 1, 1, 2, 3, 6, 9, 12, 17)

# The same quantity charted in another unit: usual unit label -> (other label, scale, shift), the
# other unit's number being ``value * scale + shift`` (public conversions, inverted in recovery SQL).
UNIT_CONVERSIONS = {
    "Glucose": ("mmol/L", 1 / 18.016, 0.0),
    "Creatinine": ("umol/L", 88.42, 0.0),
    "Urea Nitrogen": ("mmol/L", 0.357, 0.0),
    "Calcium, Total": ("mmol/L", 0.2495, 0.0),
    "Magnesium": ("mmol/L", 0.4114, 0.0),
    "Phosphate": ("mmol/L", 0.3229, 0.0),
    "Hemoglobin": ("g/L", 10.0, 0.0),
    "Albumin": ("g/L", 10.0, 0.0),
    "Bilirubin, Total": ("umol/L", 17.1, 0.0),
    "Temperature Fahrenheit": ("°C", 5 / 9, -160 / 9),
    "Temperature Celsius": ("°F", 9 / 5, 32.0),
}
BY_UNIT = {  # fallbacks when the item has no specific conversion
    "mg/dL": ("mg/L", 10.0, 0.0),
    "g/dL": ("g/L", 10.0, 0.0),
    "g/L": ("g/dL", 0.1, 0.0),
    "mg/L": ("mg/dL", 0.1, 0.0),
    "K/uL": ("/uL", 1000.0, 0.0),
    "m/uL": ("/uL", 1_000_000.0, 0.0),
    "IU/L": ("ukat/L", 1 / 60, 0.0),
    "U/L": ("ukat/L", 1 / 60, 0.0),
    "mm Hg": ("kPa", 0.1333, 0.0),
    "mmHg": ("kPa", 0.1333, 0.0),
    "sec": ("min", 1 / 60, 0.0),
    "pg/mL": ("ng/mL", 0.001, 0.0),
    "ng/mL": ("ng/dL", 100.0, 0.0),
    "kg": ("lbs", 2.20462, 0.0),
    "mL": ("L", 0.001, 0.0),
    "ml": ("L", 0.001, 0.0),
    "mL/hour": ("L/hour", 0.001, 0.0),
    "hour": ("min", 60.0, 0.0),
    "min": ("hour", 1 / 60, 0.0),
}


def _real(table: str, column: str | None) -> str:
    """SQL true where ``column`` holds a number that is not NaN (:func:`numeric`)."""
    kind = numeric(table, column)
    return kind if kind == "false" else f"{kind} AND NOT isnan({column})"


def _item_label(db, table: str, row: dict) -> str | None:
    rule = RULES.get(table)
    if not rule or not rule.items or row.get("itemid") is None or not db.has(rule.items):
        return None
    return db.scalar(f"SELECT label FROM base.{rule.items} WHERE itemid = {row['itemid']}")


def _sql(value) -> str:
    """A literal for the recovery SQL: numbers exactly (repr), text quoted."""
    return repr(float(value)) if isinstance(value, (int, float)) else "'" + str(value).replace("'", "''") + "'"


def _value_changes(q, row: dict, column: str, new: float) -> list:
    """Update the number and keep its text twin (and a lab's abnormal flag) consistent with it."""
    table = q.evidence_table
    changes = [update(table, row, column, new)]
    if column == "valuenum" and has_column(table, "value"):
        changes.append(update(table, row, "value", text_of(new, row.get("value"))))
    if has_column(table, "flag") and None not in (row.get("ref_range_lower"), row.get("ref_range_upper")):
        flag = None if row["ref_range_lower"] <= new <= row["ref_range_upper"] else "abnormal"
        if flag != row.get("flag"):
            changes.append(update(table, row, "flag", flag))
    return changes


def _recovery(db, q, overlay: Overlay, rows_sql: str) -> tuple[str | None, str | None]:
    """(expected answer, recovery SQL): the gold SQL over the analyst's repaired ``rows_sql`` of
    the evidence table, executed on the noisy database; (None, None) when it leaves no answer."""
    sql = restricted(q.gold_sql, q.evidence_table, rows_sql)
    expected = recovered(db, q, overlay, sql)
    return (None, None) if expected in (None, AMBIGUOUS) else (expected, sql)


@operator(level="value", discrepancy="unit_error", kahn="plausibility: atemporal")
def unit_scale(db, q, params, rng):
    """Scale one value by a decimal factor (×10/×100/×1000) far beyond what the item allows — only
    a factor that alone maps it back into the range of the item's other values, so the analyst
    can divide it back: flag with that recovered answer."""
    table = q.evidence_table
    column = value_column(q)
    real = _real(table, column)
    if real == "false":
        return None
    item = "itemid" if has_column(table, "itemid") else "NULL"
    items: dict = {}  # itemid -> (label, bounds, seen): the same for all of an item's rows
    for rid, itemid, value in evidence_select(db, q, f"{ROW_ID}, {item}, {column}", f"{real} AND {column} > 0",
                                              f"{column} DESC, {ROW_ID}"):
        if itemid not in items:
            label = _item_label(db, table, {"itemid": itemid})
            bounds = item_bounds(db.con, table, label)
            seen = None
            if bounds is not None:
                floor = "" if bounds[0] is None else f" AND {column} >= {_sql(bounds[0])}"
                seen = db.rows(f"SELECT min({column}), max({column}) FROM base.{table} "
                               f"WHERE itemid = {itemid} AND {column} <= {_sql(bounds[1])}{floor}")[0]
            items[itemid] = label, bounds, seen
        label, bounds, seen = items[itemid]
        if seen is None or seen[0] is None:
            continue
        for factor in UNIT_SLIPS:
            new = round(value * factor, 6)
            fits = [d for d in UNIT_SLIPS if seen[0] <= new / d <= seen[1]]
            if new > bounds[1] and fits == [factor]:
                return _scaled(db, q, evidence_row(db, q, rid), column, new, factor, label, bounds, seen)
    return None


def _scaled(db, q, row, column, new, factor, label, bounds, seen):
    table = q.evidence_table
    overlay = Overlay(_value_changes(q, row, column, new))
    back = " ".join(f"WHEN {column} / {d} BETWEEN {_sql(seen[0])} AND {_sql(seen[1])} THEN {d}" for d in UNIT_SLIPS)
    expected, sql = _recovery(db, q, overlay, (
        f"SELECT * REPLACE (CASE WHEN itemid = {row['itemid']} AND {column} > {_sql(bounds[1])} "
        f"THEN {column} / CASE {back} END ELSE {column} END AS {column}) FROM {table}"))
    return record_proposal(q, overlay, "flag", expected, "implausible_value",
                           [(f"{table} _rid={row[ROW_ID]} ({label}): {column} {row[column]} -> {new} "
                             f"(x{factor}; plausible range {bounds[0]}-{bounds[1]}, item's values "
                             f"{seen[0]}-{seen[1]})")], recovery_sql=sql)


@operator(level="value", discrepancy="implausible_value", kahn="plausibility: atemporal")
def implausible_value(db, q, params, rng):
    """Replace one value with a physiologically impossible one; the analyst sets aside the item's
    values outside its plausibility bounds: flag with what the rest gives (if anything)."""
    table, column = q.evidence_table, value_column(q)
    row = pick_evidence_row(db, q, rng, numeric(table, column))
    if row is None:
        return None
    label = _item_label(db, table, row)
    bounds = item_bounds(db.con, table, label)
    if bounds is None:
        return None
    low, high = bounds
    negative = low is not None and low >= 0 and rng.random() < 0.5
    new = round(-abs(row[column]) - 1, 2) if negative else round(high * float(rng.uniform(2, 4)), 1)
    overlay = Overlay(_value_changes(q, row, column, new))
    outside = f"{column} > {_sql(high)}" + ("" if low is None else f" OR {column} < {_sql(low)}")
    expected, sql = _recovery(db, q, overlay, (
        f"SELECT * FROM {table} WHERE NOT coalesce(itemid = {row['itemid']} AND ({outside}), false)"))
    return record_proposal(q, overlay, "flag", expected, "implausible_value",
                           [(f"{table} _rid={row[ROW_ID]} ({label}): {column} {row[column]} -> {new} "
                             f"(plausible range {low}-{high})")], recovery_sql=sql)


@operator(level="value", discrepancy="unit_mismatch", kahn="conformance: value")
def unit_label_mismatch(db, q, params, rng):
    """Chart one value in another unit (label and number converted together), unlike the item's
    other rows; the analyst converts that unit back (a public conversion): flag with the result."""
    table, column = q.evidence_table, value_column(q)
    rule = RULES.get(table)
    if not rule or not rule.unit:
        return None
    row = pick_evidence_row(db, q, rng, f"{numeric(table, column)} AND {rule.unit} <> ''")  # a unit is charted
    if row is None:
        return None
    label = _item_label(db, table, row)
    conversion = UNIT_CONVERSIONS.get(label) or BY_UNIT.get(row[rule.unit])
    if conversion is None:
        return None
    unit, scale, shift = conversion
    new = float(f"{row[column] * scale + shift:.6g}")  # enough digits to convert back exactly
    changes = [c for c in _value_changes(q, row, column, new) if c.column != "flag"]
    changes.append(update(table, row, rule.unit, unit))
    overlay = Overlay(changes)
    other = f"itemid = {row['itemid']} AND {rule.unit} = {_sql(unit)}"
    back = f"{column} / {_sql(scale)}" if not shift else f"({column} - {_sql(shift)}) / {_sql(scale)}"
    expected, sql = _recovery(db, q, overlay, (
        f"SELECT * REPLACE (CASE WHEN {other} THEN {back} ELSE {column} END AS {column}, "
        f"CASE WHEN {other} THEN {_sql(row[rule.unit])} ELSE {rule.unit} END AS {rule.unit}) FROM {table}"))
    return record_proposal(q, overlay, "flag", expected, "unit_mismatch",
                           [(f"{table} _rid={row[ROW_ID]} ({label}): {row[column]} {row[rule.unit]} "
                             f"-> {new} {unit}")], recovery_sql=sql)


@operator(level="value", discrepancy="value_text_conflict", kahn="conformance: computational")
def value_text_conflict(db, q, params, rng):
    """Change the number but not its charted text: the row contradicts itself. MIMIC derives the
    number from the charted text, so the analyst reads the text: flag with that answer."""
    table = q.evidence_table
    column = value_column(q)
    rule = RULES.get(table)
    if not rule or not rule.text or column != rule.value:
        return None
    # the charted text reads as the number (TRY_CAST reads texts as float() does, bar non-ASCII digits)
    row = pick_evidence_row(db, q, rng, f"{_real(table, column)} AND {column} <> 0 "
                                        f"AND TRY_CAST({rule.text} AS DOUBLE) = {column}")
    if row is None:
        return None
    new = round(row[column] * float(pick(rng, TEXT_CONFLICT_FACTORS)), 2)
    overlay = Overlay([update(table, row, column, new)])
    expected, sql = _recovery(db, q, overlay, (
        f"SELECT * REPLACE (coalesce(TRY_CAST({rule.text} AS DOUBLE), {column}) AS {column}) FROM {table}"))
    return record_proposal(q, overlay, "flag", expected, "value_text_conflict",
                           [(f"{table} _rid={row[ROW_ID]}: {column} {row[column]} -> {new}, "
                             f"text still {row[rule.text]!r}")], recovery_sql=sql)


@operator(level="value", discrepancy="invalid_code", kahn="conformance: value")
def invalid_code(db, q, params, rng):
    """Give one evidence row a code its dictionary does not know: an ICD code under the wrong
    version (the analyst reads a code known under one version only under that version: flag with
    the recovered answer), else a mangled code or an itemid that matches nothing (flag, no answer)."""
    table = q.evidence_table
    rule = RULES.get(table)
    row = pick_evidence_row(db, q, rng)
    if row is None or not rule:
        return None
    if rule.codes and db.has(rule.codes):
        return _icd_code(db, q, row, rule.codes)
    if rule.items and db.has(rule.items) and row.get("itemid") is not None:
        new = int(db.largest(rule.items, "itemid")) + 1 + int(rng.integers(1000))
        proposal = record_proposal(q, Overlay([update(table, row, "itemid", new)]), "flag", None, None,
                                   [f"{table} _rid={row[ROW_ID]}: itemid {row['itemid']} -> {new} (not in {rule.items})"])
        scope = ", ".join(map(str, proposal.detector.scope[table]))
        sql = (f"SELECT count(*) FROM {table} e ANTI JOIN {rule.items} d USING (itemid) "
               f"WHERE e._rid IN ({scope})")
        return replace(proposal, detector=Detector(sql=sql, clean_sql=sql))
    return None


def _icd_code(db, q, row: dict, codes: str):
    table, code, version = q.evidence_table, row["icd_code"], row["icd_version"]
    flipped, mangled = (code, 10 if version == 9 else 9), (code[:6] + "9", version)
    for new_code, new_version in (flipped, mangled):
        if db.scalar(f"SELECT count(*) FROM base.{codes} WHERE icd_code = {_sql(new_code)} "
                     f"AND icd_version = {new_version}"):
            continue
        changes = [update(table, row, column, new) for column, new in
                   (("icd_code", new_code), ("icd_version", new_version)) if row[column] != new]
        overlay = Overlay(changes)
        expected, sql = None, None
        if new_code == code:  # the code itself is intact: its only version gives it back
            expected, sql = _recovery(db, q, overlay, icd_reversioned(table, codes))
        elif db.scalar(f"SELECT count(*) FROM base.{codes} WHERE icd_code = {_sql(new_code)}"):
            continue  # a mangled code that is valid under the other version would read as that one
        log = f"{table} _rid={row[ROW_ID]}: ICD-{version} {code} -> ICD-{new_version} {new_code}"
        return record_proposal(q, overlay, "flag", expected, "invalid_code", [log], recovery_sql=sql)
    return None


@operator(level="value", discrepancy="temporal_inversion", kahn="plausibility: temporal")
def temporal_inversion(db, q, params, rng):
    """Move one evidence row's end a few whole hours before its start (and its derived length of
    stay with it), as real entry slips do: the true end is lost. A patient's question that rests
    on it is abstained from; a population answer sets that one end aside and is flagged."""
    table = q.evidence_table
    rule = RULES.get(table)
    if not rule or not rule.end:
        return None
    alive = " AND deathtime IS NULL" if has_column(table, "deathtime") else ""  # a death time would show the end
    row = pick_evidence_row(db, q, rng, f"{timestamp(table, rule.time)} AND {timestamp(table, rule.end)} "
                                        f"AND {rule.end} > {rule.time}{alive}")
    if row is None:
        return None
    end = row[rule.time] - dt.timedelta(hours=int(pick(rng, INVERSION_HOURS)))
    changes = [update(table, row, rule.end, end)]
    derived = has_column(table, "los")
    if derived:
        changes.append(update(table, row, "los", (end - row[rule.time]).total_seconds() / 86400))
    overlay = Overlay(changes)
    log = [f"{table} _rid={row[ROW_ID]}: {rule.end} {row[rule.end]} -> {end} (start {row[rule.time]})"]
    if q.template.level != "population":
        return record_proposal(q, overlay, "abstain", None, "temporal_inversion", log)
    lost = f"{rule.end} < {rule.time}"
    los = f", CASE WHEN {lost} THEN NULL ELSE los END AS los" if derived else ""
    expected, sql = _recovery(db, q, overlay, (
        f"SELECT * REPLACE (CASE WHEN {lost} THEN NULL ELSE {rule.end} END AS {rule.end}{los}) FROM {table}"))
    return record_proposal(q, overlay, "flag" if expected is not None else "abstain", expected,
                           "temporal_inversion", log, recovery_sql=sql)
