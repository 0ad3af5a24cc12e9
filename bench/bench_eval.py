"""Evaluation throughput of the rule-based agents: episodes/s with 1 and 2 worker processes.

Each (agent, workers) runs the real runner (``run_eval``) over all pairs, both sides, into a
fresh temporary folder. Two rates: end to end (wall time of the whole run: worker start,
benchmark open, episodes, journal fsyncs, final outputs) and warm (less the slowest worker's
benchmark open). Prints, per agent, both rates and the 2-worker/1-worker ratio, with the success
on each side as a sanity check.

    python bench/bench_eval.py --benchmark /path/to/benchmark [--agents oracle,naive] [--limit N]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pipeline.eval.agent import agent_names  # noqa: E402
from pipeline.eval.metrics import success  # noqa: E402
from pipeline.eval.runner import EvalConfig, run_eval  # noqa: E402

RULE_BASED = ("oracle", "naive", "checking")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--benchmark", type=Path, required=True, help="a built benchmark folder")
    parser.add_argument("--agents", default=",".join(a for a in RULE_BASED if a in agent_names()),
                        help="comma-separated agents (default: the registered rule-based ones)")
    parser.add_argument("--limit", type=int, default=None, help="only N pairs (a seeded choice)")
    args = parser.parse_args()
    for agent in args.agents.split(","):
        rates = {}
        for workers in (1, 2):
            with tempfile.TemporaryDirectory(prefix="bench_eval_") as out:
                run = run_eval(EvalConfig(args.benchmark, agent, workers=workers, limit=args.limit), out)
                results = pd.read_parquet(Path(out) / "results.parquet")
            warm = run.played / max(run.seconds - run.open_seconds, 1e-9)
            rates[workers] = (run.played / run.seconds, warm)
            print(f"{agent:>9}, {workers} worker(s): {run.played:,} episodes in {run.seconds:.1f} s "
                  f"(open {run.open_seconds:.1f} s): {rates[workers][0]:.0f} episodes/s end to end, "
                  f"{warm:.0f} warm; clean {success(results, 'clean'):.1%}, noise {success(results, 'noise'):.1%}")
        print(f"{agent:>9}: 2 workers / 1 worker = {rates[2][0] / rates[1][0]:.2f}x end to end, "
              f"{rates[2][1] / rates[1][1]:.2f}x warm")
    return 0


if __name__ == "__main__":
    sys.exit(main())
