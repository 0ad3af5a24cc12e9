"""Opening a pair's noisy database: an overlay on the loaded base vs a full copy of the base.

For each size, N synthetic patients are staged into a temp dir. One realistic overlay is built on
labevents (update the patient's last potassium value, insert a copy of an earlier result, delete
another), then the time to open the noisy database and answer one small query through it
("the patient's last potassium") is measured two ways:

* overlay: on an already-open base ``Database``, ``with db.noisy(overlay): query``, leaving the block;
* copy:    a new in-memory DuckDB database that copies every staged table from Parquet
           (CREATE TABLE AS SELECT), applies the same overlay with UPDATE/INSERT/DELETE, queries, closes.

Prints the median of --overlay-repeat / --copy-repeat runs, the copy/overlay ratio at each size
(goal >= 100x) and how the overlay time grows from the smallest to the largest size (goal <= 1.5x).
Both ways must give the same answer, and one different from the clean base's.

    python bench/bench_overlay.py [--patients 100,1000] [--seed 0] [--overlay-repeat 30] [--copy-repeat 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import duckdb

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pipeline.noise.overlay import Change, Database, Overlay  # noqa: E402
from pipeline.schema import ROW_ID  # noqa: E402
from pipeline.sources import make_source  # noqa: E402
from pipeline.staging import attach_staged, stage  # noqa: E402

POTASSIUM = 50971  # d_labitems itemid
LAST_POTASSIUM = (f"SELECT valuenum FROM labevents WHERE subject_id = {{subject}} AND itemid = {POTASSIUM} "
                  f"AND valuenum IS NOT NULL ORDER BY charttime DESC, {ROW_ID} DESC LIMIT 1")
PATIENT_POTASSIUM = (f"SELECT * FROM labevents WHERE subject_id = {{subject}} AND itemid = {POTASSIUM} "
                     f"ORDER BY {ROW_ID}")


def realistic_overlay(db: Database) -> tuple[int, Overlay]:
    """The patient with the most potassium results, and an overlay on three of them: the last
    value updated, an earlier result inserted again under a fresh _rid, a third one deleted."""
    subject = db.scalar(f"SELECT subject_id FROM base.labevents WHERE itemid = {POTASSIUM} AND valuenum IS NOT NULL "
                        f"GROUP BY subject_id HAVING count(*) >= 3 ORDER BY count(*) DESC, subject_id LIMIT 1")
    assert subject is not None, "no patient has three potassium results"
    last, earlier, other = db.records(
        f"SELECT * FROM base.labevents WHERE subject_id = {subject} AND itemid = {POTASSIUM} "
        f"AND valuenum IS NOT NULL ORDER BY charttime DESC, {ROW_ID} DESC LIMIT 3")
    copy = {k: v for k, v in earlier.items() if k != ROW_ID}
    return subject, Overlay([
        Change("labevents", "update", last[ROW_ID], "valuenum", round(last["valuenum"] + 1.3, 1)),
        Change("labevents", "insert", db.next_rid["labevents"], None, copy),
        Change("labevents", "delete", other[ROW_ID]),
    ])


def open_with_overlay(db: Database, overlay: Overlay, sql: str | None):
    """Open the pair's noisy database (and run ``sql`` in it, when given)."""
    with db.noisy(overlay):
        return db.scalar(sql) if sql else None


def open_full_copy(staged_dir: Path, tables: list[str], overlay: Overlay, sql: str | None):
    """A private in-memory copy of every staged table with ``overlay`` applied in place."""
    con = duckdb.connect()
    try:
        copy_base(con, staged_dir, tables)
        apply_in_place(con, overlay)
        return con.execute(sql).fetchall()[0][0] if sql else None
    finally:
        con.close()


def copy_base(con: duckdb.DuckDBPyConnection, staged_dir: Path, tables: list[str]) -> None:
    attach_staged(con, staged_dir, kind="TABLE", tables=tables)


def apply_in_place(con: duckdb.DuckDBPyConnection, overlay: Overlay) -> None:
    for c in overlay.changes:
        if c.op == "update":
            con.execute(f'UPDATE {c.table} SET "{c.column}" = ? WHERE {ROW_ID} = ?', [c.new_value, c.rid])
        elif c.op == "insert":
            row = {**c.new_value, ROW_ID: c.rid}
            columns = ", ".join(f'"{k}"' for k in row)
            con.execute(f"INSERT INTO {c.table} ({columns}) VALUES ({', '.join('?' * len(row))})", list(row.values()))
        else:
            con.execute(f"DELETE FROM {c.table} WHERE {ROW_ID} = ?", [c.rid])


def median_seconds(repeat: int, fn: Callable[[], object]) -> tuple[float, object]:
    times, results = [], set()
    for _ in range(repeat):
        start = time.perf_counter()
        results.add(fn())
        times.append(time.perf_counter() - start)
    assert len(results) == 1, f"answer changed between runs: {results}"
    return statistics.median(times), results.pop()


def measure(patients: int, seed: int, overlay_repeat: int, copy_repeat: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        staged = Path(tmp)
        rows = stage(make_source("synthetic", patients=patients, seed=seed), staged).total_rows
        start = time.perf_counter()
        db = Database(staged)
        base_load = time.perf_counter() - start
        try:
            subject, overlay = realistic_overlay(db)
            sql = LAST_POTASSIUM.format(subject=subject)
            clean = db.scalar(sql)
            open_with_overlay(db, overlay, sql)  # first use of labevents creates its patch tables, once
            overlay_s, via_overlay = median_seconds(overlay_repeat, lambda: open_with_overlay(db, overlay, sql))
            copy_s, via_copy = median_seconds(copy_repeat, lambda: open_full_copy(staged, db.tables, overlay, sql))
            open_s, _ = median_seconds(overlay_repeat, lambda: open_with_overlay(db, overlay, None))
            copy_open_s, _ = median_seconds(copy_repeat, lambda: open_full_copy(staged, db.tables, overlay, None))
            check_same_rows(db, staged, overlay, PATIENT_POTASSIUM.format(subject=subject))
        finally:
            db.close()
    assert via_overlay == via_copy, f"{patients} patients: overlay says {via_overlay}, copy says {via_copy}"
    assert via_overlay != clean, f"{patients} patients: the overlay did not change the answer ({clean})"
    return dict(patients=patients, rows=rows, base_load=base_load, overlay=overlay_s, copy=copy_s,
                open=open_s, copy_open=copy_open_s, answer=via_overlay, clean=clean)


def check_same_rows(db: Database, staged: Path, overlay: Overlay, sql: str) -> None:
    """Beyond the timed query: the patient's potassium rows are identical both ways (untimed)."""
    with db.noisy(overlay):
        via_overlay = db.rows(sql)
    con = duckdb.connect()
    try:
        copy_base(con, staged, ["labevents"])
        apply_in_place(con, overlay)
        via_copy = con.execute(sql).fetchall()
    finally:
        con.close()
    assert via_overlay == via_copy, "the overlay and the copy disagree on the patient's potassium rows"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--patients", default="100,1000", help="comma-separated sizes (default 100,1000)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--overlay-repeat", type=int, default=30)
    parser.add_argument("--copy-repeat", type=int, default=5)
    args = parser.parse_args()
    sizes = [int(n) for n in args.patients.split(",")]
    results = [measure(n, args.seed, args.overlay_repeat, args.copy_repeat) for n in sizes]

    print(f"median of {args.overlay_repeat} overlay / {args.copy_repeat} copy runs; "
          f"open + last-potassium query (update, insert, delete on labevents)")
    print(f"{'patients':>9} {'rows staged':>12} {'base load':>10} {'overlay':>10} {'full copy':>10} "
          f"{'copy/overlay':>13}  answer (clean)")
    for r in results:
        ratio = r["copy"] / r["overlay"]
        print(f"{r['patients']:>9,} {r['rows']:>12,} {r['base_load']:>8.2f} s {r['overlay'] * 1e3:>7.2f} ms "
              f"{r['copy'] * 1e3:>7.0f} ms {ratio:>12.0f}x  {r['answer']} ({r['clean']})"
              f"{'' if ratio >= 100 else '  below the 100x goal'}")
    print("opening alone (no query): the overlay's load and switch vs copying the base and patching it")
    for r in results:
        print(f"{r['patients']:>9,} patients: overlay {r['open'] * 1e3:.2f} ms, full copy {r['copy_open'] * 1e3:.0f} ms, "
              f"{r['copy_open'] / r['open']:.0f}x")
    if len(results) > 1:
        small, large = results[0], results[-1]
        for key, label in (("overlay", "open + query"), ("open", "open alone")):
            growth = large[key] / small[key]
            print(f"overlay {label} {small['patients']:,} -> {large['patients']:,} patients: {growth:.2f}x "
                  f"(goal <= 1.5x{'' if growth <= 1.5 else ', missed'})")


if __name__ == "__main__":
    main()
