"""Full-table invariants of staged MIMIC-IV, checked with DuckDB SQL over the Parquet files.

Great Expectations validates batches; keys, foreign keys and "event inside its stay" need
the whole table (and its parent), so they are counted here in-database. Each check returns
its violation count and a few example rows, so the real demo's own imperfections can be
reported as warnings with evidence instead of crashing the pipeline.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import duckdb

from pipeline.schema import EVENT_TIMES, FOREIGN_KEYS, TABLES, ForeignKey
from pipeline.staging import attach_staged

EXAMPLES = 5

# Windows of each parent table, as (start, end) SQL over the parent's columns.
_STAY_WINDOWS = {
    "icustays": ("stay_id", "intime", "outtime"),
    "admissions": ("hadm_id", "admittime", "dischtime"),
}


@dataclass
class Invariant:
    name: str
    table: str
    kind: str  # unique_key | foreign_key | time_in_stay | ordering
    violations: int
    checked_rows: int
    examples: list[dict] = field(default_factory=list)
    skipped: str | None = None  # why the check could not run (e.g. parent table absent)

    @property
    def ok(self) -> bool:
        return self.violations == 0


def _connect(staged_dir: Path) -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    attach_staged(con, staged_dir)
    return con


def _available(con: duckdb.DuckDBPyConnection) -> set[str]:
    return {r[0] for r in con.execute("SELECT view_name FROM duckdb_views() WHERE NOT internal").fetchall()}


def _count_and_examples(con, name, table, kind, violating_sql, total_sql, count="count(*)") -> Invariant:
    """``count`` aggregates the violating rows (a sum when they are already grouped)."""
    n = con.execute(f"SELECT coalesce({count}, 0) FROM ({violating_sql})").fetchall()[0][0]
    examples = con.sql(f"SELECT * FROM ({violating_sql}) LIMIT {EXAMPLES}").to_arrow_table().to_pylist() if n else []
    total = con.execute(total_sql).fetchall()[0][0]
    return Invariant(name, table, kind, n, total, [_jsonable(e) for e in examples])


def _jsonable(row: dict) -> dict:
    return {k: (v if isinstance(v, (int, float, str, type(None))) else str(v)) for k, v in row.items()}


def unique_key(con, table: str) -> Invariant:
    key = ", ".join(TABLES[table].key)
    sql = (f"SELECT {key}, count(*) AS n FROM {table} WHERE {' AND '.join(f'{k} IS NOT NULL' for k in TABLES[table].key)} "
           f"GROUP BY ALL HAVING count(*) > 1 ORDER BY n DESC, {key}")
    return _count_and_examples(con, f"{table}: unique ({key})", table, "unique_key", sql,
                               f"SELECT count(*) FROM {table}")


def foreign_key(con, fk: ForeignKey) -> Invariant:
    on = " AND ".join(f"c.{a} = p.{b}" for a, b in zip(fk.columns, fk.ref_columns))
    not_null = " AND ".join(f"c.{a} IS NOT NULL" for a in fk.columns)
    cols = ", ".join(f"c.{a}" for a in fk.columns)
    sql = (f"SELECT {cols}, count(*) AS rows FROM {fk.table} c ANTI JOIN "
           f"(SELECT DISTINCT {', '.join(fk.ref_columns)} FROM {fk.ref_table}) p ON {on} "
           f"WHERE {not_null} GROUP BY ALL ORDER BY rows DESC, {cols}")
    return _count_and_examples(con, fk.name, fk.table, "foreign_key", sql,
                               f"SELECT count(*) FROM {fk.table}", count="sum(rows)")


def time_in_stay(con, table: str, time_col: str, parent: str) -> Invariant:
    key, start, end = _STAY_WINDOWS[parent]
    sql = (f"SELECT c._rid, c.{key}, c.{time_col}, p.{start} AS stay_start, p.{end} AS stay_end "
           f"FROM {table} c JOIN {parent} p USING ({key}) "
           f"WHERE c.{time_col} < p.{start} OR c.{time_col} > p.{end} ORDER BY c._rid")
    return _count_and_examples(con, f"{table}.{time_col} inside {parent}", table, "time_in_stay", sql,
                               f"SELECT count(*) FROM {table} WHERE {key} IS NOT NULL")


def orderings(con, table: str) -> list[Invariant]:
    rules = {
        "admissions": [("dischtime >= admittime", "dischtime < admittime"),
                       ("deathtime only when hospital_expire_flag = 1",
                        "deathtime IS NOT NULL AND hospital_expire_flag = 0")],
        "icustays": [("outtime >= intime", "outtime < intime"),
                     ("los = (outtime - intime) in days",
                      "abs(los - epoch(outtime - intime) / 86400.0) > 1e-3")],
        "transfers": [("outtime >= intime", "outtime < intime")],
    }
    out = []
    for label, bad in rules.get(table, []):
        sql = f"SELECT * FROM {table} WHERE {bad} ORDER BY _rid"
        out.append(_count_and_examples(con, f"{table}: {label}", table, "ordering", sql,
                                       f"SELECT count(*) FROM {table}"))
    if table == "icustays":
        sql = ("SELECT i._rid, i.stay_id, i.intime, i.outtime, a.admittime, a.dischtime FROM icustays i "
               "JOIN admissions a USING (hadm_id) WHERE i.intime < a.admittime - INTERVAL 1 DAY "
               "OR i.outtime > a.dischtime + INTERVAL 1 DAY ORDER BY i._rid")
        if "admissions" in _available(con):
            out.append(_count_and_examples(con, "icustays: stay inside its admission (±1 day)", table,
                                           "ordering", sql, "SELECT count(*) FROM icustays"))
    return out


def table_invariants(staged_dir: str | os.PathLike, table: str) -> list[Invariant]:
    """All invariants whose subject is ``table``: its key, its outgoing FKs, its event times."""
    con = _connect(Path(staged_dir))
    try:
        available = _available(con)
        if table not in available:
            return []
        results: list[Invariant] = []
        if TABLES[table].key:
            results.append(unique_key(con, table))
        for fk in FOREIGN_KEYS:
            if fk.table != table:
                continue
            if fk.ref_table not in available:
                results.append(Invariant(fk.name, table, "foreign_key", 0, 0,
                                         skipped=f"{fk.ref_table} not staged"))
            else:
                results.append(foreign_key(con, fk))
        for t, col, parent in EVENT_TIMES:
            if t == table:
                if parent in available:
                    results.append(time_in_stay(con, t, col, parent))
                else:
                    results.append(Invariant(f"{t}.{col} inside {parent}", t, "time_in_stay", 0, 0,
                                             skipped=f"{parent} not staged"))
        results += orderings(con, table)
        return results
    finally:
        con.close()
