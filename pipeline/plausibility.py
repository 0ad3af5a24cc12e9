"""What plausible MIMIC-IV rows look like: per-table rules and per-item value bounds.

The clean-evidence filter (:mod:`pipeline.questions.evidence`) and the noise operators and
detectors (:mod:`pipeline.noise`) judge rows by these same rules and bounds, so a question kept
as clean and a perturbation detected as noise are measured against one standard.

Bounds: the curated table (``plausibility.yaml``, next to this module) covers the common vitals
and labs. For the noise stage every other item gets ``[0, 10 × its largest value]`` (the lower
bound only when no value is negative): no clean value can violate it, yet a unit slip by ×100 or
×1000 cannot hide inside it.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

import duckdb
import pyarrow as pa
import yaml

from pipeline.schema import EVENT_TIMES

BOUNDS_FILE = Path(__file__).with_name("plausibility.yaml")
DERIVED_FACTOR = 10


@dataclass(frozen=True)
class Rule:
    """How to judge one table's rows: event identity, value, times, dictionaries."""

    # The event's identity, never NULL: two rows sharing it record one event twice. It leaves out
    # row ids (labevent_id, hadm_id, seq_num ...) wherever the event has an identity of its own.
    key: tuple[str, ...]
    value: str | None = None
    time: str | None = None
    end: str | None = None
    unit: str | None = None
    items: str | None = None  # item dictionary, for bounds by label
    text: str | None = None  # free-text twin of a numeric value
    codes: str | None = None  # ICD dictionary


RULES: dict[str, Rule] = {
    "labevents": Rule(("subject_id", "itemid", "charttime"), "valuenum", "charttime",
                      unit="valueuom", items="d_labitems", text="value"),
    "chartevents": Rule(("stay_id", "itemid", "charttime"), "valuenum", "charttime",
                        unit="valueuom", items="d_items", text="value"),
    "outputevents": Rule(("stay_id", "itemid", "charttime"), "value", "charttime", unit="valueuom",
                         items="d_items"),
    "inputevents": Rule(("orderid", "itemid"), "amount", "starttime", "endtime", "amountuom", "d_items"),
    "datetimeevents": Rule(("stay_id", "itemid", "charttime"), "value", "charttime"),
    "procedureevents": Rule(("orderid",), "value", "starttime", "endtime"),
    "prescriptions": Rule(("pharmacy_id", "drug"), None, "starttime", "stoptime"),
    "emar": Rule(("emar_id",), None, "charttime"),
    "diagnoses_icd": Rule(("hadm_id", "icd_code", "icd_version"), "icd_code", codes="d_icd_diagnoses"),
    "procedures_icd": Rule(("hadm_id", "icd_code", "icd_version", "chartdate"), "icd_code", "chartdate",
                           codes="d_icd_procedures"),
    "drgcodes": Rule(("hadm_id", "drg_type"), "description"),
    "microbiologyevents": Rule(("microevent_id",), None, "chartdate"),
    "hcpcsevents": Rule(("hadm_id", "hcpcs_cd", "seq_num"), "hcpcs_cd", "chartdate"),
    "admissions": Rule(("subject_id", "admittime"), None, "admittime", "dischtime"),
    "icustays": Rule(("subject_id", "intime"), None, "intime", "outtime"),
    "transfers": Rule(("subject_id", "intime", "eventtype"), None, "intime", "outtime"),
    "patients": Rule(("subject_id",)),
    "services": Rule(("hadm_id", "transfertime", "curr_service"), None, "transfertime"),
}

# (event table, time column) -> the stay (admissions or icustays) that time must lie inside.
PARENT_TIME: dict[tuple[str, str], str] = {(t, c): p for t, c, p in EVENT_TIMES}


def curated_bounds() -> pa.Table:
    """The curated plausibility table (table, label, low, high)."""
    rows = yaml.safe_load(BOUNDS_FILE.read_text(encoding="utf-8"))
    return pa.Table.from_pylist(rows, schema=pa.schema([("table", pa.string()), ("label", pa.string()),
                                                        ("low", pa.float64()), ("high", pa.float64())]))


def load_bounds(con: duckdb.DuckDBPyConnection) -> None:
    """Register the curated plausibility table as ``_bounds`` (table, label, low, high) on ``con``."""
    con.register("_bounds", curated_bounds())


def register_bounds(con: duckdb.DuckDBPyConnection, tables: Collection[str], bounds: pa.Table | None = None) -> None:
    """Create ``_bounds`` on ``con``: ``bounds`` (a :func:`bounds_table` measured once and shared by
    worker processes), or else measured here from the staged ``tables``."""
    con.register("_measured_bounds", bounds_table(con, tables) if bounds is None else bounds)
    try:
        con.execute("CREATE TABLE _bounds AS SELECT * FROM _measured_bounds").fetchall()
    finally:
        con.unregister("_measured_bounds")


def bounds_table(con: duckdb.DuckDBPyConnection, tables: Collection[str]) -> pa.Table:
    """(table, label, low, high) for every numeric item of the staged ``tables``, read under their
    MIMIC names (on an overlay database: while the clean base is active). Curated rows win over
    derived ones. Each derived bound aggregates a whole event table: measure once per build."""
    derived = []
    for table, rule in sorted(RULES.items()):
        if not (rule.items and rule.value and table in tables and rule.items in tables):
            continue
        derived.append(
            f"SELECT '{table}' AS \"table\", d.label, CASE WHEN min(e.{rule.value}) >= 0 THEN 0.0 END AS low, "
            f"{DERIVED_FACTOR} * max(e.{rule.value}) AS high FROM {table} e "
            f"JOIN {rule.items} d USING (itemid) WHERE e.{rule.value} IS NOT NULL "
            f"GROUP BY d.label HAVING max(e.{rule.value}) > 0")
    con.register("_curated_bounds", curated_bounds())
    try:
        union = " UNION ALL ".join(f"SELECT * FROM ({q}) WHERE (\"table\", label) NOT IN "
                                   f"(SELECT (\"table\", label) FROM _curated_bounds)" for q in derived)
        return con.sql("SELECT \"table\", label, low::DOUBLE AS low, high::DOUBLE AS high "
                       f"FROM _curated_bounds{' UNION ALL ' + union if union else ''}").to_arrow_table()
    finally:
        con.unregister("_curated_bounds")


def item_bounds(con: duckdb.DuckDBPyConnection, table: str, label: str | None) -> tuple[float | None, float] | None:
    """(low, high) of the item ``label`` of ``table`` in ``_bounds``; None when it has none."""
    if label is None:
        return None
    rows = con.execute("SELECT low, high FROM _bounds WHERE \"table\" = ? AND label = ?", [table, label]).fetchall()
    return rows[0] if rows else None
