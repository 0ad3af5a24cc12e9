"""A real local model through the real protocol: SmolLM2-135M behind llama.cpp's OpenAI-compatible
server, played by the ``openai`` agent on N pairs x both sides x K trials of a built benchmark.

Writes ``trajectories.jsonl`` (the gym's format) and ``results.parquet`` (one row an episode) to
``--out`` and prints clean and noise success, pass^1..K, how episodes ended and the time per
episode. Needs the ``local-llm`` extra (``pip install -e '.[local-llm]'``).

    python bench/local_llm_eval.py --benchmark DIR [--pairs 10] [--trials 4] [--temperature 0.7] --out DIR
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections import Counter
from math import comb
from pathlib import Path

import pyarrow as pa

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pipeline.eval.agent import make_agent  # noqa: E402
from pipeline.eval.local_llm import MODEL_ALIAS, serve  # noqa: E402
from pipeline.files import stable_int, temp_path, write_parquet  # noqa: E402
from pipeline.gym.env import Env  # noqa: E402
from pipeline.gym.models import SIDES, Limits  # noqa: E402
from pipeline.gym.recorder import Recorder  # noqa: E402

# A 135M model reads an 8k-token window: fewer steps and shorter tool output than the defaults.
LIMITS = Limits(max_steps=5, sql_rows=10, output_bytes=1_500)


def pass_hat_k(successes: dict[tuple[str, str], list[bool]], k: int) -> float:
    """pass^k by the unbiased estimator: C(c, k) / C(n, k) per task, averaged over tasks."""
    return sum(comb(sum(s), k) / comb(len(s), k) for s in successes.values()) / len(successes)


def run(benchmark: Path, out: Path, pairs: int, trials: int, temperature: float, seed: int = 0) -> list[dict]:
    """Play every (pair, side, trial); write the trajectories and results atomically; return the rows."""
    out.mkdir(parents=True, exist_ok=True)
    trajectories = out / "trajectories.jsonl"
    temp_path(trajectories).unlink(missing_ok=True)  # the Recorder appends
    try:
        rows = _play(benchmark, trajectories, pairs, trials, temperature, seed)
    finally:
        temp_path(trajectories).unlink(missing_ok=True)  # renamed into place when complete
    write_parquet(pa.Table.from_pylist(rows), out / "results.parquet")
    return rows


def _play(benchmark: Path, trajectories: Path, pairs: int, trials: int, temperature: float, seed: int) -> list[dict]:
    rows = []
    with Env(benchmark, LIMITS) as env, serve() as base_url:
        chosen = random.Random(seed).sample(sorted(env.benchmark.pairs), min(pairs, len(env.benchmark.pairs)))
        agent = make_agent("openai", model=MODEL_ALIAS, base_url=base_url, temperature=temperature)
        episodes = [(p, side, trial) for p in chosen for side in SIDES for trial in range(trials)]
        started = time.perf_counter()
        with Recorder(temp_path(trajectories)) as recorder:
            for done, (pair_id, side, trial) in enumerate(episodes, 1):
                start, t0 = env.reset(pair_id, side), time.perf_counter()
                usage = agent.play(env, start, None, random.Random(stable_int(seed, pair_id, side, trial)))
                meta = recorder.record(env, trial)["metadata"]
                rows.append({**{k: meta[k] for k in ("pair_id", "side", "trial", "termination", "steps", "intent",
                                                     "level", "noise_level", "operator")},
                             "success": meta["reward"] == 1.0, "tokens_in": usage.tokens_in,
                             "tokens_out": usage.tokens_out, "seconds": time.perf_counter() - t0,
                             "agent": agent.name, "model": agent.model})
                if sys.stdout.isatty():
                    rate = done / (time.perf_counter() - started)
                    print(f"\r{done}/{len(episodes)} episodes, {rate * 60:.1f}/min, "
                          f"ETA {(len(episodes) - done) / rate:.0f} s", end="", flush=True)
        temp_path(trajectories).replace(trajectories)
    return rows


def summary(rows: list[dict], trials: int) -> str:
    lines = [f"{len(rows)} episodes; seconds per episode: mean {sum(r['seconds'] for r in rows) / len(rows):.1f}, "
             f"max {max(r['seconds'] for r in rows):.1f}",
             "ended by: " + ", ".join(f"{t} {n}" for t, n in Counter(r["termination"] for r in rows).most_common()),
             "side   success  " + "  ".join(f"pass^{k}" for k in range(1, trials + 1))]
    for side in SIDES:
        mine = [r for r in rows if r["side"] == side]
        tasks: dict[tuple[str, str], list[bool]] = {}
        for r in mine:
            tasks.setdefault((r["pair_id"], side), []).append(r["success"])
        lines.append(f"{side:<6} {sum(r['success'] for r in mine) / len(mine):7.1%}  "
                     + "  ".join(f"{pass_hat_k(tasks, k):6.3f}" for k in range(1, trials + 1)))
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--benchmark", type=Path, required=True, help="a built benchmark folder")
    parser.add_argument("--out", type=Path, required=True, help="folder for trajectories.jsonl and results.parquet")
    parser.add_argument("--pairs", type=int, default=10, help="pairs drawn (seeded) from the benchmark")
    parser.add_argument("--trials", type=int, default=4, help="trials per pair and side")
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--seed", type=int, default=0, help="draws the pairs and seeds every episode")
    args = parser.parse_args()
    if not (args.benchmark / "pairs.parquet").is_file():
        parser.error(f"--benchmark {args.benchmark}: no pairs.parquet there (build a benchmark first)")
    rows = run(args.benchmark, args.out, args.pairs, args.trials, args.temperature, args.seed)
    print(("\n" if sys.stdout.isatty() else "") + summary(rows, args.trials))
    return 0


if __name__ == "__main__":
    sys.exit(main())
