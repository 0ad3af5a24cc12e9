"""The whole build (``ehr-robustgym build``) on synthetic data at several sizes: time and memory.

Each size runs ``pipeline.build.build`` in a fresh child process (so one size's memory does not
carry into the next), which writes its stage timings, rows staged and pairs shipped to a JSON file.
Meanwhile a thread samples the resident set (``/proc/<pid>/statm``) of the child and all its
descendants (the verification worker processes) every 0.2 s: the peak of their sum is the memory
the build needs; the largest single process is the kernel's own high-water mark (``wait4``),
exact. Prints one line per size as it finishes, then a table with each size's total wall time
and peak summed RSS as a ratio to the first (smallest) size's. Outputs go to a temporary folder
(or --out) and are deleted after each size unless --keep. Linux only (reads /proc).

    python bench/bench_build.py [--sizes 1000,10000,100000] [--workers N] [--seed 0] [--out DIR] [--keep] [--profile]

The default sizes take long on a small machine (1,000 patients alone is about 5 minutes on 2 cores):
try small sizes first.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pipeline.workers import process_tree, resident_bytes  # noqa: E402

STAGES = ("stage", "questions", "noise", "export")
MB = 1024 * 1024


def run_child(patients: int, seed: int, workers: int | None, out: Path, summary: Path) -> None:
    """In the child process: build, then write what the parent reports."""
    from pipeline.build import build

    marker = stage_marker(summary)

    def log(line: str) -> None:
        finished, _, rest = line.partition(": ")
        if finished in STAGES and rest.startswith("done"):  # tell the sampler which stage runs now
            marker.write_text(STAGES[STAGES.index(finished) + 1] if finished != STAGES[-1] else finished)
        if sys.stdout.isatty():
            print(f"  [{patients:,} patients] {line}", flush=True)

    marker.write_text(STAGES[0])
    report = build("synthetic", out, seed, patients=patients, workers=workers, log=log)
    summary.write_text(json.dumps({"rows": report.stage.total_rows, "timings": report.timings,
                                   "pairs": report.manifest["counts"]["pairs"], "profile": report.profile()}))


def stage_marker(summary: Path) -> Path:
    """The file in which the child names the build stage running now, for the parent's sampler."""
    return summary.with_suffix(".stage")


class TreeSampler(threading.Thread):
    """Peak over time of the summed RSS of a process tree, and of its largest process; and per
    build stage (named in the ``stage`` file the child keeps), the peaks of the build process
    itself, of its workers summed and of the largest worker: who holds the memory, and when."""

    def __init__(self, root: int, stage: Path, every: float = 0.2):
        super().__init__(daemon=True)
        self.root, self.stage, self.every, self.done = root, stage, every, threading.Event()
        self.peak_sum = self.peak_one = self.peak_processes = 0
        self.by_stage: dict[str, list[int]] = {}  # stage -> [build, workers summed, largest worker]

    def run(self) -> None:
        while not self.done.is_set():
            tree = process_tree(self.root)
            sizes = [resident_bytes(pid) for pid in tree]
            self.peak_sum = max(self.peak_sum, sum(sizes))
            self.peak_one = max(self.peak_one, max(sizes, default=0))
            self.peak_processes = max(self.peak_processes, sum(s > 0 for s in sizes))
            try:
                stage = self.stage.read_text() or "start"
            except OSError:
                stage = "start"
            peaks = self.by_stage.setdefault(stage, [0, 0, 0])
            for k, size in enumerate((sizes[0] if sizes else 0, sum(sizes[1:]), max(sizes[1:], default=0))):
                peaks[k] = max(peaks[k], size)
            self.done.wait(self.every)


def measure(patients: int, args: argparse.Namespace, folder: Path) -> dict | None:
    """One size in a fresh child process; None when the build failed."""
    out, summary = folder / f"patients={patients}", folder / f"patients={patients}.json"
    command = [sys.executable, str(Path(__file__).resolve()), "--child", str(patients), "--seed", str(args.seed),
               "--out", str(out), "--summary", str(summary)]
    if args.workers:
        command += ["--workers", str(args.workers)]
    start = time.perf_counter()
    child = subprocess.Popen(command)
    sampler = TreeSampler(child.pid, stage_marker(summary))
    sampler.start()
    try:
        _, status, usage = os.wait4(child.pid, 0)  # rusage of the child and its reaped descendants
        child.returncode = os.waitstatus_to_exitcode(status)
    finally:
        if child.returncode is None:
            child.kill()
            child.wait()
        sampler.done.set()
        sampler.join()
    wall = time.perf_counter() - start
    try:
        if child.returncode != 0:
            print(f"{patients:>9,} patients: build failed (exit code {child.returncode})", flush=True)
            return None
        result = json.loads(summary.read_text())
    finally:
        if not args.keep:
            shutil.rmtree(out, ignore_errors=True)
            summary.unlink(missing_ok=True)
        sampler.stage.unlink(missing_ok=True)
    result.update(patients=patients, wall=wall, total=sum(result["timings"].values()), peak_sum=sampler.peak_sum,
                  peak_one=max(usage.ru_maxrss * 1024, sampler.peak_one), processes=sampler.peak_processes)
    print(f"{patients:>9,} patients: {result['rows']:,} rows staged, {result['pairs']:,} pairs, build "
          f"{result['total']:.1f} s ({', '.join(f'{k} {v:.1f} s' for k, v in result['timings'].items())}), "
          f"peak RSS {result['peak_sum'] / MB:,.0f} MB over {result['processes']} processes "
          f"(largest {result['peak_one'] / MB:,.0f} MB)", flush=True)
    for name, (own, workers, largest) in sampler.by_stage.items():
        print(f"    {name:<10} peak RSS: build process {own / MB:,.0f} MB, workers {workers / MB:,.0f} MB "
              f"(largest {largest / MB:,.0f} MB)", flush=True)
    if args.profile:
        print(result["profile"], flush=True)
    return result


def table(results: list[dict]) -> str:
    head = ["patients", "rows staged", *(f"{s} s" for s in STAGES), "total s", "time x",
            "peak RSS MB", "RSS x", "largest MB", "pairs"]
    base = results[0]
    rows = [[f"{r['patients']:,}", f"{r['rows']:,}", *(f"{r['timings'].get(s, 0):.1f}" for s in STAGES),
             f"{r['total']:.1f}", f"{r['total'] / base['total']:.2f}", f"{r['peak_sum'] / MB:,.0f}",
             f"{r['peak_sum'] / base['peak_sum']:.2f}", f"{r['peak_one'] / MB:,.0f}", f"{r['pairs']:,}"]
            for r in results]
    widths = [max(len(row[i]) for row in [head, *rows]) for i in range(len(head))]
    return "\n".join("  ".join(cell.rjust(w) for cell, w in zip(row, widths)) for row in [head, *rows])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000,100000", help="comma-separated patient counts")
    parser.add_argument("--workers", type=int, default=None, help="worker processes (default: one per core)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="folder for the builds (default: a temporary one)")
    parser.add_argument("--keep", action="store_true", help="keep each size's benchmark folder")
    parser.add_argument("--profile", action="store_true", help="print each size's time by stage, operator and check")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--summary", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        run_child(args.child, args.seed, args.workers, args.out, args.summary)
        return 0

    import duckdb
    import pyarrow

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so a killed bench still ends its build and cleans up

    sizes = [int(s) for s in args.sizes.split(",")]
    folder = args.out or Path(tempfile.mkdtemp(prefix="bench_build_"))
    folder.mkdir(parents=True, exist_ok=True)
    print(f"duckdb {duckdb.__version__}, pyarrow {pyarrow.__version__}, Python {sys.version.split()[0]}; "
          f"{os.cpu_count()} CPUs ({len(os.sched_getaffinity(0))} usable); workers {args.workers or 'default'}, "
          f"seed {args.seed}", flush=True)
    try:
        results = [r for n in sizes if (r := measure(n, args, folder)) is not None]
    finally:
        if args.keep:
            print(f"kept {folder}")
        elif args.out is None:
            shutil.rmtree(folder, ignore_errors=True)
    if results:
        print()
        print(table(results))
    return 0 if len(results) == len(sizes) else 1


if __name__ == "__main__":
    sys.exit(main())
