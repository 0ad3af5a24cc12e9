"""Staging the real MIMIC-IV demo: this project (typed DuckDB → Parquet) vs pandas.read_csv → Parquet.

Both sides read the same 30 gzip CSV files and write zstd Parquet; pandas gets the registry's
dtypes too, so it does no type guessing either. Prints wall times and the speed-up ratio
measured in this run (best of --repeat runs each).

    python bench/bench_staging.py [--demo ../shared/data/mimic-iv-demo-2.2] [--repeat 3]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import pandas as pd

from pipeline.schema import TABLES
from pipeline.sources import make_source
from pipeline.sources.physionet import locate
from pipeline.staging import stage

REPO = Path(__file__).resolve().parent.parent
PANDAS_DTYPES = {"INTEGER": "Int32", "SMALLINT": "Int16", "DOUBLE": "float64", "VARCHAR": "string"}


def stage_with_pandas(demo: Path, out: Path, typed: bool) -> int:
    """``typed``: the registry's types, as staging writes them; else pandas' own type inference."""
    rows = 0
    for t in TABLES.values():
        path = locate(demo, t)
        if path is None:
            continue
        if typed:
            dtypes = {c.name: PANDAS_DTYPES[c.type] for c in t.columns if c.type in PANDAS_DTYPES}
            dates = [c.name for c in t.columns if c.type in ("TIMESTAMP", "DATE")]
            frame = pd.read_csv(path, dtype=dtypes, parse_dates=dates, keep_default_na=False, na_values=[""])
        else:
            frame = pd.read_csv(path, low_memory=False)
        frame["_rid"] = range(len(frame))
        frame.to_parquet(out / f"{t.name}.parquet", compression="zstd", index=False)
        rows += len(frame)
    return rows


def best_of(repeat: int, fn) -> tuple[float, int]:
    times, result = [], 0
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return min(times), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--demo", type=Path, default=REPO.parent / "shared/data/mimic-iv-demo-2.2")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        ours_dir, pandas_dir = Path(tmp, "ours"), Path(tmp, "pandas")
        pandas_dir.mkdir()
        ours_s, ours_rows = best_of(args.repeat, lambda: stage(make_source("demo", args.demo), ours_dir).total_rows)
        typed_s, typed_rows = best_of(args.repeat, lambda: stage_with_pandas(args.demo, pandas_dir, True))
        plain_s, plain_rows = best_of(args.repeat, lambda: stage_with_pandas(args.demo, pandas_dir, False))
    assert ours_rows == typed_rows == plain_rows, (ours_rows, typed_rows, plain_rows)
    print(f"rows staged                          {ours_rows:>12,}")
    print(f"ehr-robustgym stage                  {ours_s:>10.2f} s  ({ours_rows / ours_s:,.0f} rows/s)")
    print(f"pandas.read_csv, registry types      {typed_s:>10.2f} s  speed-up {typed_s / ours_s:.2f}x")
    print(f"pandas.read_csv, inferred types      {plain_s:>10.2f} s  speed-up {plain_s / ours_s:.2f}x")


if __name__ == "__main__":
    main()
