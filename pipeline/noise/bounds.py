"""Plausibility bounds for every numeric item: the curated table, plus data-derived bounds.

Curated bounds (``pipeline/questions/plausibility.yaml``) cover the common vitals and labs. Every
other item gets ``[0, 10 × its largest value]`` (the lower bound only when no value is negative):
no clean value can violate it, yet a unit slip by ×100 or ×1000 cannot hide inside it.
"""

from __future__ import annotations

from pipeline.noise.overlay import Database
from pipeline.questions.evidence import RULES, load_bounds

DERIVED_FACTOR = 10


def register_bounds(db: Database) -> None:
    """Register ``_bounds`` (table, label, low, high) on ``db``: curated rows win over derived ones."""
    load_bounds(db.con)
    derived = []
    for table, rule in sorted(RULES.items()):
        if not (rule.items and rule.value and db.has(table) and db.has(rule.items)):
            continue
        derived.append(
            f"SELECT '{table}' AS \"table\", d.label, CASE WHEN min(e.{rule.value}) >= 0 THEN 0.0 END AS low, "
            f"{DERIVED_FACTOR} * max(e.{rule.value}) AS high FROM base.{table} e "
            f"JOIN base.{rule.items} d USING (itemid) WHERE e.{rule.value} IS NOT NULL "
            f"GROUP BY d.label HAVING max(e.{rule.value}) > 0")
    curated = db.con.sql("SELECT * FROM _bounds").to_arrow_table()
    db.con.unregister("_bounds")
    db.con.register("_curated_bounds", curated)
    union = " UNION ALL ".join(f"SELECT * FROM ({q}) WHERE (\"table\", label) NOT IN "
                               f"(SELECT (\"table\", label) FROM _curated_bounds)" for q in derived)
    db.con.execute("CREATE TABLE _bounds AS SELECT \"table\", label, low::DOUBLE AS low, high::DOUBLE AS high "
                   f"FROM _curated_bounds{' UNION ALL ' + union if union else ''}").fetchall()
