"""Value-level operators: the row is there, but a cell is wrong in a way the data can reveal."""

from __future__ import annotations

from dataclasses import replace

from pipeline.noise.model import Detector
from pipeline.noise.operators.common import (
    evidence_rows,
    has_column,
    pick,
    record_proposal,
    text_of,
    update,
    value_column,
    without,
)
from pipeline.noise.overlay import Overlay
from pipeline.noise.registry import operator
from pipeline.plausibility import RULES, item_bounds
from pipeline.schema import ROW_ID

UNIT_SLIPS = (10, 100, 1000)  # decimal slips, the smallest that leaves the plausible range is used
TEXT_CONFLICT_FACTORS = (0.5, 0.7, 1.4, 1.6)  # the number drifts from its text by a visible margin

# The same quantity charted in another unit: usual unit label -> (other label, conversion).
UNIT_CONVERSIONS = {
    "Glucose": ("mmol/L", lambda v: v / 18.016),
    "Creatinine": ("umol/L", lambda v: v * 88.42),
    "Urea Nitrogen": ("mmol/L", lambda v: v * 0.357),
    "Calcium, Total": ("mmol/L", lambda v: v * 0.2495),
    "Magnesium": ("mmol/L", lambda v: v * 0.4114),
    "Phosphate": ("mmol/L", lambda v: v * 0.3229),
    "Hemoglobin": ("g/L", lambda v: v * 10),
    "Albumin": ("g/L", lambda v: v * 10),
    "Bilirubin, Total": ("umol/L", lambda v: v * 17.1),
    "Temperature Fahrenheit": ("°C", lambda v: (v - 32) * 5 / 9),
    "Temperature Celsius": ("°F", lambda v: v * 9 / 5 + 32),
}
BY_UNIT = {  # fallbacks when the item has no specific conversion
    "mg/dL": ("mg/L", lambda v: v * 10),
    "g/dL": ("g/L", lambda v: v * 10),
    "g/L": ("g/dL", lambda v: v / 10),
    "mg/L": ("mg/dL", lambda v: v / 10),
    "K/uL": ("/uL", lambda v: v * 1000),
    "m/uL": ("/uL", lambda v: v * 1_000_000),
    "IU/L": ("ukat/L", lambda v: v / 60),
    "U/L": ("ukat/L", lambda v: v / 60),
    "mm Hg": ("kPa", lambda v: v * 0.1333),
    "mmHg": ("kPa", lambda v: v * 0.1333),
    "sec": ("min", lambda v: v / 60),
    "pg/mL": ("ng/mL", lambda v: v / 1000),
    "ng/mL": ("ng/dL", lambda v: v * 100),
    "kg": ("lbs", lambda v: v * 2.20462),
    "mL": ("L", lambda v: v / 1000),
    "ml": ("L", lambda v: v / 1000),
    "mL/hour": ("L/hour", lambda v: v / 1000),
    "hour": ("min", lambda v: v * 60),
    "min": ("hour", lambda v: v / 60),
}


def _numeric_rows(db, q):
    column = value_column(q)
    rows = [r for r in evidence_rows(db, q)
            if column and isinstance(r.get(column), (int, float)) and not isinstance(r.get(column), bool)]
    return column, rows


def _item_label(db, table: str, row: dict) -> str | None:
    rule = RULES.get(table)
    if not rule or not rule.items or row.get("itemid") is None or not db.has(rule.items):
        return None
    return db.scalar(f"SELECT label FROM base.{rule.items} WHERE itemid = {row['itemid']}")


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


@operator(level="value", discrepancy="unit_error", kahn="plausibility: atemporal")
def unit_scale(db, q, params, rng):
    """Scale one value by a decimal factor (×10/×100/×1000) or chart it in the wrong unit system,
    far beyond what the item allows; the supported answer converts it back (the clean answer)."""
    column, rows = _numeric_rows(db, q)
    positive = [r for r in rows if r[column] > 0]
    if not positive:
        return None
    row = max(positive, key=lambda r: (r[column], r[ROW_ID]))  # the largest value needs the smallest slip
    label = _item_label(db, q.evidence_table, row)
    bounds = item_bounds(db.con, q.evidence_table, label)
    if bounds is None:
        return None
    factor = next((f for f in UNIT_SLIPS if row[column] * f > bounds[1]), None)
    if factor is None:
        return None
    new = round(row[column] * factor, 2)
    overlay = Overlay(_value_changes(q, row, column, new))
    return record_proposal(q, overlay, "flag", q.answer, "implausible_value",
                           [(f"{q.evidence_table} _rid={row[ROW_ID]} ({label}): {column} {row[column]} -> {new} "
                             f"(x{factor}; plausible range {bounds[0]}-{bounds[1]})")])


@operator(level="value", discrepancy="implausible_value", kahn="plausibility: atemporal")
def implausible_value(db, q, params, rng):
    """Replace one value with a physiologically impossible one; the supported answer sets it aside."""
    column, rows = _numeric_rows(db, q)
    row = pick(rng, rows)
    if row is None:
        return None
    label = _item_label(db, q.evidence_table, row)
    bounds = item_bounds(db.con, q.evidence_table, label)
    if bounds is None:
        return None
    low, high = bounds
    negative = low is not None and low >= 0 and rng.random() < 0.5
    new = round(-abs(row[column]) - 1, 2) if negative else round(high * float(rng.uniform(2, 4)), 1)
    overlay = Overlay(_value_changes(q, row, column, new))
    return record_proposal(q, overlay, "flag", without(db, q, [row[ROW_ID]]), "implausible_value",
                           [(f"{q.evidence_table} _rid={row[ROW_ID]} ({label}): {column} {row[column]} -> {new} "
                             f"(plausible range {low}-{high})")])


@operator(level="value", discrepancy="unit_mismatch", kahn="conformance: value")
def unit_label_mismatch(db, q, params, rng):
    """Chart one value in another unit (label and number converted together), unlike the item's
    other rows; the supported answer converts it back to the usual unit (the clean answer)."""
    column, rows = _numeric_rows(db, q)
    rule = RULES.get(q.evidence_table)
    if not rule or not rule.unit:
        return None
    row = pick(rng, [r for r in rows if r.get(rule.unit)])
    if row is None:
        return None
    label = _item_label(db, q.evidence_table, row)
    conversion = UNIT_CONVERSIONS.get(label) or BY_UNIT.get(row[rule.unit])
    if conversion is None:
        return None
    unit, convert = conversion
    new = float(f"{convert(row[column]):.6g}")  # enough digits to convert back exactly
    changes = [c for c in _value_changes(q, row, column, new) if c.column != "flag"]
    changes.append(update(q.evidence_table, row, rule.unit, unit))
    return record_proposal(q, Overlay(changes), "flag", q.answer, "unit_mismatch",
                           [(f"{q.evidence_table} _rid={row[ROW_ID]} ({label}): {row[column]} {row[rule.unit]} "
                             f"-> {new} {unit}")])


@operator(level="value", discrepancy="value_text_conflict", kahn="conformance: computational")
def value_text_conflict(db, q, params, rng):
    """Change the number but not its charted text: the row contradicts itself."""
    column, rows = _numeric_rows(db, q)
    rule = RULES.get(q.evidence_table)
    if not rule or not rule.text or column != rule.value:
        return None
    row = pick(rng, [r for r in rows if r.get(rule.text) and r[column]])
    if row is None:
        return None
    new = round(row[column] * float(pick(rng, TEXT_CONFLICT_FACTORS)), 2)
    overlay = Overlay([update(q.evidence_table, row, column, new)])
    return record_proposal(q, overlay, "flag", None, "value_text_conflict",
                           [(f"{q.evidence_table} _rid={row[ROW_ID]}: {column} {row[column]} -> {new}, "
                             f"text still {row[rule.text]!r}")])


@operator(level="value", discrepancy="invalid_code", kahn="conformance: value")
def invalid_code(db, q, params, rng):
    """Give one evidence row a code its dictionary does not know (wrong ICD version or a mangled
    code, or an itemid with no dictionary entry)."""
    table, rows = q.evidence_table, evidence_rows(db, q)
    rule = RULES.get(table)
    row = pick(rng, rows)
    if row is None or not rule:
        return None
    if rule.codes and db.has(rule.codes):
        other = 10 if row["icd_version"] == 9 else 9
        for code, version in ((row["icd_code"], other), (row["icd_code"][:6] + "9", row["icd_version"])):
            known = db.scalar(f"SELECT count(*) FROM base.{rule.codes} WHERE icd_code = '{code}' "
                              f"AND icd_version = {version}")
            if not known:
                changes = [update(table, row, column, new) for column, new in
                           (("icd_code", code), ("icd_version", version)) if row[column] != new]
                log = f"{table} _rid={row[ROW_ID]}: ICD-{row['icd_version']} {row['icd_code']} -> ICD-{version} {code}"
                return record_proposal(q, Overlay(changes), "flag", None, "invalid_code", [log])
        return None
    if rule.items and db.has(rule.items) and row.get("itemid") is not None:
        new = int(db.scalar(f"SELECT max(itemid) FROM base.{rule.items}")) + 1 + int(rng.integers(1000))
        proposal = record_proposal(q, Overlay([update(table, row, "itemid", new)]), "flag", None, None,
                                   [f"{table} _rid={row[ROW_ID]}: itemid {row['itemid']} -> {new} (not in {rule.items})"])
        scope = ", ".join(map(str, proposal.detector.scope[table]))
        sql = (f"SELECT count(*) FROM {table} e ANTI JOIN {rule.items} d USING (itemid) "
               f"WHERE e._rid IN ({scope})")
        return replace(proposal, detector=Detector(sql=sql, clean_sql=sql))
    return None


@operator(level="value", discrepancy="temporal_inversion", kahn="plausibility: temporal")
def temporal_inversion(db, q, params, rng):
    """Swap one evidence row's start and end: it ends before it begins, so durations are void."""
    table = q.evidence_table
    rule = RULES.get(table)
    if not rule or not rule.end:
        return None
    row = pick(rng, [r for r in evidence_rows(db, q)
                     if r.get(rule.time) is not None and r.get(rule.end) is not None
                     and r[rule.end] > r[rule.time]])
    if row is None:
        return None
    changes = [update(table, row, rule.time, row[rule.end]), update(table, row, rule.end, row[rule.time])]
    return record_proposal(q, Overlay(changes), "abstain", None, "temporal_inversion",
                           [(f"{table} _rid={row[ROW_ID]}: {rule.time} and {rule.end} swapped "
                             f"({row[rule.time]} / {row[rule.end]})")])
