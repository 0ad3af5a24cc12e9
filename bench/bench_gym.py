"""The gym's costs on a built benchmark: open, reset, sql step, python step, scripted episodes/s.

- open: loading the benchmark once per process (staged base plus every overlay);
- reset: ``env.reset(pair, side)`` over --pairs pairs, both sides (p50/p95);
- sql step: one ``sql`` tool call running the pair's gold SQL, both sides (p50/p95);
- python step: ``python`` calls on a warm worker (p50/p95), and the worker's cold start;
- episodes/s: the scripted gold agent (sql step + answer) on the clean side, over all pairs,
  in 1 and 2 worker processes (each opens the benchmark first; only the episodes are timed).

Goals (issue 9): sql p50 <= 10 ms, reset <= 5 ms, >= 200 scripted episodes/s on 2 cores.

    python bench/bench_gym.py --benchmark /path/to/benchmark [--pairs 1000] [--python-calls 200]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import time
from pathlib import Path

import duckdb
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pipeline.gym.agents import AGENTS  # noqa: E402
from pipeline.gym.env import Env  # noqa: E402
from pipeline.staging import attach_staged  # noqa: E402


def pct(values: list[float], q: float) -> float:
    return sorted(values)[min(len(values) - 1, int(q * len(values)))] * 1000


def line(name: str, values: list[float]) -> str:
    return f"{name:<28} p50 {pct(values, 0.5):7.2f} ms   p95 {pct(values, 0.95):7.2f} ms   (n={len(values):,})"


def _episodes(benchmark: Path, rows: list[dict], start, out) -> None:
    env = Env(benchmark)
    start.wait()
    begin = time.perf_counter()
    for row in rows:
        env.reset(row["pair_id"], "clean")
        AGENTS["gold"](env, row)
    out.put((len(rows), time.perf_counter() - begin))


def plain_duckdb_seconds(benchmark: Path, rows: list[dict]) -> list[float]:
    """The baseline: each gold SQL on the clean staged tables in a plain in-memory DuckDB, fetched
    in full, with no guard, no limits and no overlay views (both sides, as the sql steps)."""
    con = duckdb.connect(config={"threads": 1})
    attach_staged(con, benchmark / "staged", kind="TABLE")
    times = []
    for _ in ("clean", "noise"):
        for row in rows:
            t = time.perf_counter()
            con.execute(row["gold_sql"]).fetchall()
            times.append(time.perf_counter() - t)
    con.close()
    return times


def episodes_per_second(benchmark: Path, rows: list[dict], workers: int) -> tuple[float, float]:
    ctx = mp.get_context("spawn")
    start, out = ctx.Barrier(workers + 1), ctx.Queue()
    procs = [ctx.Process(target=_episodes, args=(benchmark, rows[i::workers], start, out)) for i in range(workers)]
    for p in procs:
        p.start()
    start.wait()
    begin = time.perf_counter()
    results = [out.get() for _ in procs]
    wall = time.perf_counter() - begin
    for p in procs:
        p.join()
    return sum(n for n, _ in results) / wall, wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--benchmark", type=Path, required=True)
    parser.add_argument("--pairs", type=int, default=1000, help="pairs timed for reset and sql")
    parser.add_argument("--python-calls", type=int, default=200)
    parser.add_argument("--episodes", type=int, default=None, help="pairs for episodes/s (default: all)")
    args = parser.parse_args()
    rows = pq.read_table(args.benchmark / "pairs.parquet").to_pylist()

    begin = time.perf_counter()
    env = Env(args.benchmark)
    print(f"open (once per process)      {time.perf_counter() - begin:7.2f} s   "
          f"({len(env.benchmark.pairs):,} pairs, {len(env.benchmark.overlay_ids):,} overlays)")
    sample = rows[:args.pairs]
    resets, sqls = [], []
    for side in ("clean", "noise"):
        for row in sample:
            t = time.perf_counter()
            env.reset(row["pair_id"], side)
            resets.append(time.perf_counter() - t)
            t = time.perf_counter()
            env.step({"name": "sql", "arguments": {"query": row["gold_sql"]}})
            sqls.append(time.perf_counter() - t)
    print(line("reset", resets))
    print(line("sql step (gold SQL)", sqls))
    plain = plain_duckdb_seconds(args.benchmark, sample)
    print(line("baseline: plain DuckDB", plain))
    print(f"sql step / plain DuckDB      p50 {pct(sqls, 0.5) / pct(plain, 0.5):7.2f}x  "
          "(guard, caps and episode views over the same query on the same tables)")

    env.reset(rows[0]["pair_id"], "noise")
    t = time.perf_counter()
    env.step({"name": "python", "arguments": {"code": "x = 0"}})
    cold = time.perf_counter() - t
    warm = []
    for i in range(args.python_calls):
        t = time.perf_counter()
        env.step({"name": "python", "arguments": {"code": f"x += {i}\nprint(x)"}})
        warm.append(time.perf_counter() - t)
        if env.state.step_count >= env.limits.max_steps - 1:
            env.reset(rows[0]["pair_id"], "noise")
            env.step({"name": "python", "arguments": {"code": "x = 0"}})
    with_sql = []
    env.reset(rows[0]["pair_id"], "noise")
    env.step({"name": "python", "arguments": {"code": "x = 0"}})
    for _ in range(20):  # one warm worker, as for the plain python steps
        t = time.perf_counter()
        env.step({"name": "python", "arguments": {"code": "df = sql('SELECT * FROM patients')\nprint(len(df))"}})
        with_sql.append(time.perf_counter() - t)
    print(f"python worker cold start     {cold * 1000:7.1f} ms")
    print(line("python step (warm)", warm))
    print(line("python step, sql() of 100 rows", with_sql))
    env.close()

    episode_rows = rows[:args.episodes]
    for workers in (1, 2):
        rate, wall = episodes_per_second(args.benchmark, episode_rows, workers)
        print(f"scripted episodes/s, {workers} worker{'s' if workers > 1 else ' '} {rate:7.1f}   "
              f"({len(episode_rows):,} gold-SQL episodes in {wall:.1f} s)")


if __name__ == "__main__":
    main()
