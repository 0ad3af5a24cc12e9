"""Benchmark the synthetic source: stage N patients into a temp dir, report rows/s and peak RSS.

Usage: python bench/bench_synthetic.py [--patients 10000] [--seed 0] [--demo PATH]
Next to each table's rows per patient it prints the real demo's, when the demo folder exists.
"""

from __future__ import annotations

import argparse
import gzip
import resource
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pipeline.schema import TABLES  # noqa: E402
from pipeline.sources import make_source  # noqa: E402
from pipeline.staging import stage  # noqa: E402


def demo_rows_per_patient(demo: Path) -> dict[str, float]:
    """Data rows per patient of each demo CSV (line count minus the header)."""
    counts = {}
    for name, t in TABLES.items():
        path = demo / f"{t.relative_path}.csv.gz"
        if path.is_file():
            with gzip.open(path, "rb") as f:
                counts[name] = sum(1 for _ in f) - 1
    patients = counts.get("patients") or 100
    return {name: n / patients for name, n in counts.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--patients", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--demo", type=Path, default=REPO.parent / "shared" / "data" / "mimic-iv-demo-2.2")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        report = stage(make_source("synthetic", patients=args.patients, seed=args.seed), tmp)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    peak_mb, cpu_s = usage.ru_maxrss / 1024, usage.ru_utime + usage.ru_stime
    demo = demo_rows_per_patient(args.demo) if args.demo.is_dir() else {}
    print(f"{'table':<20} {'rows':>12} {'rows/patient':>13} {'demo rows/patient':>18}")
    for name in sorted(report.rows):
        per = report.rows[name] / args.patients
        ref = f"{demo[name]:.1f}" if name in demo else "-"
        print(f"{name:<20} {report.rows[name]:>12,} {per:>13.1f} {ref:>18}")
    print(f"\npatients {args.patients:,}: {report.total_rows:,} rows in {report.seconds:.1f} s = "
          f"{report.total_rows / report.seconds:,.0f} rows/s; peak RSS {peak_mb:,.0f} MB")
    # on a shared machine wall time depends on the neighbours; CPU time does not
    print(f"process CPU {cpu_s:.1f} s = {report.total_rows / cpu_s:,.0f} rows per CPU-second")


if __name__ == "__main__":
    main()
