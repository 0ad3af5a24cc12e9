"""Acceptance of the gym on a built benchmark (issue 9): three scripted agents over every pair.

- gold SQL on the clean side must score 100%;
- the expected behaviour on the noise side must score 100%;
- naive SQL on the noise side must score at most 10%.

Prints each score, the failures by operator with a few verdicts, and exits non-zero when a goal
is missed.

    python bench/acceptance_gym.py --benchmark /path/to/benchmark [--limit N] [--show 3]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pipeline.gym.agents import AGENTS  # noqa: E402
from pipeline.gym.env import Env  # noqa: E402
from pipeline.gym.models import Limits  # noqa: E402

RUNS = (("gold", "clean", lambda s: s == 1.0), ("expected", "noise", lambda s: s == 1.0),
        ("naive", "noise", lambda s: s <= 0.10))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--benchmark", type=Path, required=True, help="a built benchmark folder")
    parser.add_argument("--limit", type=int, default=None, help="only the first N pairs")
    parser.add_argument("--show", type=int, default=3, help="verdicts shown per failing operator")
    args = parser.parse_args()
    rows = pq.read_table(args.benchmark / "pairs.parquet").to_pylist()[:args.limit]
    env = Env(args.benchmark, Limits(sql_rows=10_000, output_bytes=2_000_000))
    ok = True
    for agent, side, goal in RUNS:
        start = time.perf_counter()
        failures: dict[str, list] = defaultdict(list)
        for row in rows:
            env.reset(row["pair_id"], side)
            obs = AGENTS[agent](env, row)
            if obs.reward != 1.0:
                failures[row["operator"]].append((row["pair_id"], obs.info))
        score = 1 - sum(map(len, failures.values())) / len(rows)
        met = goal(score)
        ok &= met
        print(f"{agent:>8} agent, {side} side: {score:.2%} of {len(rows):,} pairs "
              f"({time.perf_counter() - start:.1f} s) -> {'goal met' if met else 'GOAL MISSED'}")
        if agent != "naive":
            for op, items in sorted(failures.items()):
                print(f"    {op}: {len(items)} failing")
                for pid, info in items[:args.show]:
                    print(f"      {pid}: {info.get('reason')} | expected {info.get('expected_answer')!r} "
                          f"| given {info.get('given')}")
        else:
            passed = Counter(r["operator"] for r in rows) - Counter({op: len(v) for op, v in failures.items()})
            for op, n in sorted(passed.items()):
                print(f"    naive right on {op}: {n}")
    env.close()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
