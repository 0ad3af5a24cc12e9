"""The clean-evidence filter: a candidate question is kept only if the rows its answer rests on
pass the same checks the noise detectors use (SPEC §3: real MIMIC already holds noise).

Checks, each one SQL query over all candidates' evidence at once, first failing reason wins:
missing value or timestamp, stop before start, duplicate event key (conflicting or exact),
value outside the item's plausibility bounds, unit other than the item's usual unit, value text
contradicting the number, ICD code absent from its dictionary, broken hadm_id/stay_id link (or a
null link while the time lies inside a stay), time outside the stay. The rules and bounds live
in :mod:`pipeline.plausibility`, shared with the noise stage.

The answer rows are not all the gold SQL reads: to pick "the last value" or "the longest order"
it scans every row of that entity in that stay. A careful analyst probing that scope raises an
alarm too, so the scope checks look at each evidence row's group - same table, subject, entity
(item, drug, medication, test) and stay - for a stop before its start, a time outside its own
stay, and at the entity across the table for several units; and at the rows of the same subject
and entity whose hadm_id is NULL although their time lies inside the evidence's admission (rows
the gold SQL silently skips). For a patient's question one such row rejects it; a population
question's scope must reach a material share of bad rows (one row among hundreds does not move an
aggregate). Noise detectors ask for their own reason only, so these never run for them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.plausibility import PARENT_TIME, RULES, Rule
from pipeline.schema import TABLES

REASONS = ("no_evidence", "missing_value", "missing_timestamp", "temporal_inversion",
           "duplicate_conflict", "duplicate_exact", "implausible_value", "unit_mismatch",
           "value_text_conflict", "invalid_code", "orphan_link", "time_outside_stay",
           "inverted_in_scope", "outside_stay_in_scope", "several_units", "unlinked_in_stay")

INLINE_ROWS = 64
"""Evidence rows up to which one candidate's are named in the query itself: registering them as an
Arrow table and joining it costs more than a noise detector's whole check."""

# the column naming what an event is about, for tables with no itemid
_ENTITY = {"prescriptions": "drug", "emar": "medication", "microbiologyevents": "test_itemid"}


def _scope_group(table: str) -> tuple[str, str] | None:
    """(entity column, stay column) of the evidence rows' scope groups; None for tables without events."""
    t = TABLES[table]
    entity = "itemid" if t.has("itemid") else _ENTITY.get(table)
    if entity is None or not (t.has("subject_id") and t.has("hadm_id")):
        return None
    return entity, "stay_id" if t.has("stay_id") else "hadm_id"


def _scope_ctes(table: str) -> str:
    """``g``: each candidate's scope groups; ``s``: the rows of those groups (for tables with a scope)."""
    group = _scope_group(table)
    if group is None:
        return ""
    entity, stay = group
    keys = ", ".join(dict.fromkeys(("subject_id", entity, stay, "hadm_id")))
    return f""",
        g AS MATERIALIZED (SELECT DISTINCT cand, {keys} FROM e),
        s AS MATERIALIZED (SELECT g.cand, t.* FROM (SELECT DISTINCT cand, subject_id, {entity}, {stay} FROM g) g
                           JOIN {table} t USING (subject_id, {entity}, {stay}))"""


_ADMISSION_WINDOW = "least(a.admittime, coalesce(a.edregtime, a.admittime)) AND a.dischtime"  # ED time counts


def row_checks(table: str, rule: Rule, present: set[str]) -> list[str]:
    """SELECT cand, reason ... queries over ``e`` (this table's evidence rows joined to the table): the
    faults one evidence row shows. Public: the checking agent probes with the same rules."""
    q: list[str] = []
    t = TABLES[table]
    if rule.value:
        q.append(f"SELECT cand, 'missing_value' FROM e WHERE {rule.value} IS NULL")
    if rule.time:
        q.append(f"SELECT cand, 'missing_timestamp' FROM e WHERE {rule.time} IS NULL")
    if rule.end:
        q.append(f"SELECT cand, 'temporal_inversion' FROM e WHERE {rule.end} < {rule.time}")
    key = ", ".join(rule.key)
    distinct_value = f"count(DISTINCT {rule.value})" if rule.value else "1"
    q.append(f"""SELECT e.cand, CASE WHEN k.nv > 1 THEN 'duplicate_conflict' ELSE 'duplicate_exact' END
                 FROM e JOIN (SELECT {key}, {distinct_value} AS nv
                              FROM {table} SEMI JOIN (SELECT DISTINCT {key} FROM e) k USING ({key})
                              GROUP BY ALL HAVING count(*) > 1) k USING ({key})""")
    if rule.items in present:
        q.append(f"""SELECT e.cand, 'implausible_value' FROM e JOIN {rule.items} d ON d.itemid = e.itemid
                     JOIN _bounds b ON b.table = '{table}' AND b.label = d.label
                     WHERE e.{rule.value} NOT BETWEEN b.low AND b.high""")
    if rule.unit:
        q.append(f"""SELECT e.cand, 'unit_mismatch' FROM e JOIN (
                       SELECT itemid, {rule.unit} AS usual FROM (
                         SELECT itemid, {rule.unit}, count(*) AS n FROM {table}
                         WHERE itemid IN (SELECT itemid FROM e) GROUP BY ALL)
                       QUALIFY row_number() OVER (PARTITION BY itemid ORDER BY n DESC, {rule.unit}) = 1
                     ) u USING (itemid) WHERE e.{rule.unit} IS DISTINCT FROM u.usual""")
    if rule.text:
        q.append(f"""SELECT cand, 'value_text_conflict' FROM e
                     WHERE abs(TRY_CAST({rule.text} AS DOUBLE) - {rule.value}) > 1e-6""")
    if rule.codes in present:
        q.append(f"""SELECT cand, 'invalid_code' FROM e ANTI JOIN {rule.codes} d
                     ON d.icd_code = e.icd_code AND d.icd_version = e.icd_version""")
    if t.has("hadm_id") and table != "admissions" and "admissions" in present:
        inside = f"e.{rule.time} BETWEEN {_ADMISSION_WINDOW}"
        q.append("""SELECT e.cand, 'orphan_link' FROM e LEFT JOIN admissions a ON a.hadm_id = e.hadm_id
                     WHERE e.hadm_id IS NOT NULL AND a.subject_id IS DISTINCT FROM e.subject_id""")
        if rule.time:
            q.append(f"""SELECT e.cand, 'orphan_link' FROM e JOIN admissions a ON a.subject_id = e.subject_id
                         WHERE e.hadm_id IS NULL AND {inside}""")
        if PARENT_TIME.get((table, rule.time)) == "admissions":
            q.append(f"""SELECT e.cand, 'time_outside_stay' FROM e JOIN admissions a ON a.hadm_id = e.hadm_id
                         WHERE NOT ({inside})""")
    if t.has("stay_id") and table != "icustays" and "icustays" in present:
        q.append("""SELECT e.cand, 'orphan_link' FROM e LEFT JOIN icustays i ON i.stay_id = e.stay_id
                     WHERE i.hadm_id IS DISTINCT FROM e.hadm_id""")
        if PARENT_TIME.get((table, rule.time)) == "icustays":
            q.append(f"""SELECT e.cand, 'time_outside_stay' FROM e JOIN icustays i ON i.stay_id = e.stay_id
                         WHERE e.{rule.time} NOT BETWEEN i.intime AND i.outtime""")
    return q


def scope_checks(table: str, rule: Rule, present: set[str]) -> list[str]:
    """SELECT cand, reason, rows ... queries over ``g`` and ``s`` (see :func:`_scope_ctes`): how many
    rows of each candidate's scope show the problem."""
    group = _scope_group(table)
    if group is None:
        return []
    entity, _ = group
    q: list[str] = []
    if rule.end:
        q.append(f"SELECT cand, 'inverted_in_scope', count(*) FROM s WHERE {rule.end} < {rule.time} GROUP BY cand")
    parent = PARENT_TIME.get((table, rule.time or ""))
    if parent == "admissions" and parent in present:
        q.append(f"""SELECT s.cand, 'outside_stay_in_scope', count(*) FROM s JOIN admissions a USING (hadm_id)
                     WHERE NOT (s.{rule.time} BETWEEN {_ADMISSION_WINDOW}) GROUP BY s.cand""")
    if parent == "icustays" and parent in present:
        q.append(f"""SELECT s.cand, 'outside_stay_in_scope', count(*) FROM s JOIN icustays i USING (stay_id)
                     WHERE s.{rule.time} NOT BETWEEN i.intime AND i.outtime GROUP BY s.cand""")
    if rule.unit:
        q.append(f"""SELECT s.cand, 'several_units', count(*) FROM s JOIN (
                       SELECT itemid FROM {table} WHERE {rule.value} IS NOT NULL AND itemid IN (SELECT itemid FROM g)
                       GROUP BY itemid HAVING count(DISTINCT coalesce({rule.unit}, '')) > 1) USING (itemid)
                     GROUP BY s.cand""")
    if rule.time and "admissions" in present:  # rows the evidence itself holds are not skipped
        q.append(f"""SELECT g.cand, 'unlinked_in_stay', count(DISTINCT t._rid) FROM g JOIN admissions a USING (hadm_id)
                     JOIN {table} t ON t.subject_id = g.subject_id AND t.{entity} = g.{entity} AND t.hadm_id IS NULL
                     WHERE t.{rule.time} BETWEEN {_ADMISSION_WINDOW}
                       AND NOT EXISTS (SELECT 1 FROM e WHERE e.cand = g.cand AND e._rid = t._rid)
                     GROUP BY g.cand""")
    return q


Evidence = dict[int, list[tuple[str, int]]] | pa.Table
"""Candidates' evidence rows: ``(table_name, _rid)`` pairs by candidate number, or all of them as a
table (``cand``, ``table_name``, ``_rid``), as the question stage keeps a population's rows: at
10,000 patients a template's candidates can rest on millions of rows, a gigabyte as Python tuples."""


def check_evidence(con: duckdb.DuckDBPyConnection, evidence: Evidence, present: set[str],
                   material: float = 0.0, candidates: Iterable[int] = ()) -> dict[int, str]:
    """Reason per rejected candidate (``{cand: reason}``); candidates absent from the result are clean.
    A candidate without rows (one of ``evidence``'s keys, or of ``candidates`` for a table) has
    ``no_evidence``; ``material``: see :func:`evidence_violations`."""
    if isinstance(evidence, pa.Table):
        have = set(pc.unique(evidence.column("cand")).to_pylist())
        rejected = {c: "no_evidence" for c in candidates if c not in have}
    else:
        rejected = {c: "no_evidence" for c, rows in evidence.items() if not rows}
    for c, reasons in evidence_violations(con, evidence, present, material=material).items():
        rejected[c] = min(reasons, key=REASONS.index)
    return rejected


def violations_sql(table: str, e: str, present: set[str], reasons: set[str] | None = None,
                   material: float = 0.0) -> str | None:
    """The statement listing ``(cand, reason)`` for the evidence rows ``e`` (``cand``, then the
    columns of ``table``) that :func:`evidence_violations` runs per table; None when no check of
    ``reasons`` applies to ``table``."""
    rule = RULES.get(table)
    if rule is None:
        return None
    checks, scoped = ([sql for sql in kind(table, rule, present) if reasons is None or any(f"'{r}'" in sql for r in reasons)]
                      for kind in (row_checks, scope_checks))
    if not checks + scoped:
        return None
    if scoped:
        checks.append(f"""SELECT h.cand, h.reason FROM ({" UNION ALL ".join(scoped)}) h (cand, reason, n)
                          JOIN (SELECT cand, count(*) AS n FROM s GROUP BY cand) z USING (cand)
                          WHERE h.n > {float(material)} * z.n""")
    body = "\nUNION ALL\n".join(checks)
    return f"""
        WITH e AS MATERIALIZED ({e}){_scope_ctes(table) if scoped else ""}
        {body}"""


def named_rows(cand: int, rows: list[tuple[str, int]], present: set[str]) -> tuple[str, str] | None:
    """The table and the rows SQL (:func:`violations_sql`'s ``e``) of one candidate's few evidence
    rows of one table (up to :data:`INLINE_ROWS`), named in the statement itself; None for more rows
    or tables. Read through an overlay's CTEs, such rows may go in one statement with other
    candidates', each on its own overlay."""
    tables = {t for t, _ in rows}
    if len(tables) != 1 or len(rows) > INLINE_ROWS:
        return None
    table = tables.pop()
    _require_staged({table}, present)
    return table, _rows_named(cand, table, [r for _, r in rows])


_READ = re.compile(r"\b(?:FROM|JOIN)\s+([A-Za-z_]\w*)", re.IGNORECASE)


def rule_reads(table: str, present: set[str], reasons: set[str]) -> set[str]:
    """The tables that :func:`violations_sql`'s checks of ``reasons`` on ``table`` read besides the
    evidence rows: where a candidate's overlay touches none of them, its rows can be checked in one
    statement with other candidates' rows (each on its own overlay)."""
    sql = violations_sql(table, "SELECT NULL AS cand", present, reasons)
    return set(_READ.findall(sql)) - {"e", "g", "s"} if sql else set()


def _require_staged(table_names: set[str], present: set[str]) -> None:
    unknown = sorted(table_names - set(RULES) - present)
    if unknown:
        raise ValueError(f"evidence names table(s) {unknown} that are not staged")


def _rows_named(cand: int, table: str, rids: list[int]) -> str:
    mine = sorted(rids)
    return (f"SELECT {int(cand)} AS cand, t.* FROM {table} t WHERE t._rid IN ({', '.join(map(str, mine))}) "
            f"AND t._rid BETWEEN {mine[0]} AND {mine[-1]}")  # the range lets zone maps skip


def evidence_violations(con: duckdb.DuckDBPyConnection, evidence: Evidence, present: set[str],
                        reasons: set[str] | None = None, material: float = 0.0) -> dict[int, set[str]]:
    """Every reason that fires for each candidate's evidence rows; with ``reasons``, only the checks
    that can report one of them run (a noise detector asks for its own reason only). A scope reason
    fires when its rows are more than the ``material`` share of the scope's rows: any row for a
    patient's question; a population aggregate over hundreds of rows is not moved by one of them."""
    inline = None  # the one candidate whose few rows the queries name themselves
    if isinstance(evidence, pa.Table):
        table_names = set(pc.unique(evidence.column("table_name")).to_pylist())
    else:
        rows = [(c, t, r) for c, ev in evidence.items() for t, r in ev]
        table_names = {t for _, t, _ in rows}
        if len(evidence) == 1 and len(rows) <= INLINE_ROWS:
            inline = next(iter(evidence))
        elif rows:
            cand, tables, rids = zip(*rows)
            evidence = pa.table({"cand": pa.array(cand, pa.int32()), "table_name": list(tables),
                                 "_rid": pa.array(rids, pa.int64())})
    if not table_names:
        return {}
    _require_staged(table_names, present)
    if inline is None:
        con.register("_ev", evidence)
    found: dict[int, set[str]] = {}
    try:
        for table in sorted(table_names):
            if inline is not None:
                e = _rows_named(inline, table, [r for t, r in evidence[inline] if t == table])
            else:
                e = f"SELECT ev.cand, t.* FROM _ev ev JOIN {table} t ON t._rid = ev._rid WHERE ev.table_name = '{table}'"
            sql = violations_sql(table, e, present, reasons, material)
            if sql is None:
                continue
            for c, reason in con.execute(sql).fetchall():
                found.setdefault(c, set()).add(reason)
    finally:
        if inline is None:
            con.unregister("_ev")
    return found
