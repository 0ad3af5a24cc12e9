"""A real local model through the real protocol: SmolLM2-135M behind llama.cpp's OpenAI-compatible
server, played by the ``openai`` agent on N pairs x both sides x K trials of a built benchmark.

The episodes go through the evaluation runner (``ehr-robustgym eval``'s code: a rerun into the same
``--out`` resumes), which writes ``trajectories.jsonl`` (the gym's format) and ``results.parquet``;
then the report (``report.md``, ``metrics.json``, plots) is written there too, and clean and noise
success, pass^1..K, how episodes ended and the time per episode are printed. Needs the
``local-llm`` extra (``pip install -e '.[local-llm]'``).

    python bench/local_llm_eval.py --benchmark DIR [--pairs 10] [--trials 4] [--temperature 0.7] --out DIR
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pipeline.eval.local_llm import MODEL_ALIAS, serve  # noqa: E402
from pipeline.eval.metrics import pass_hat_k, success  # noqa: E402
from pipeline.eval.report import write_report  # noqa: E402
from pipeline.eval.runner import EvalConfig, run_eval  # noqa: E402
from pipeline.gym.models import SIDES, Limits  # noqa: E402

# A 135M model reads an 8k-token window: fewer steps and shorter tool output than the defaults.
LIMITS = Limits(max_steps=5, sql_rows=10, output_bytes=1_500)


def run(benchmark: Path, out: Path, pairs: int, trials: int, temperature: float, seed: int = 0,
        threads: int = 1) -> pd.DataFrame:
    """Serve the model, play every unfinished (pair, side, trial) into ``out``, write the report;
    return the results."""
    with serve(threads=threads) as base_url:
        config = EvalConfig(benchmark=benchmark, agent="openai", trials=trials, limit=pairs, seed=seed, limits=LIMITS,
                            options={"model": MODEL_ALIAS, "base_url": base_url, "temperature": temperature})
        summary = run_eval(config, out, log=print if sys.stdout.isatty() else None)
    write_report(out)
    return pd.read_parquet(summary.results)


def summary(results: pd.DataFrame, trials: int) -> str:
    seconds = results["seconds"]
    lines = [f"{len(results)} episodes; seconds per episode: mean {seconds.mean():.1f}, max {seconds.max():.1f}",
             "ended by: " + ", ".join(f"{t} {n}" for t, n in results["termination"].value_counts().items()),
             "side   success  " + "  ".join(f"pass^{k}" for k in range(1, trials + 1))]
    for side in SIDES:
        lines.append(f"{side:<6} {success(results, side):7.1%}  "
                     + "  ".join(f"{pass_hat_k(results, k, side):6.3f}" for k in range(1, trials + 1)))
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--benchmark", type=Path, required=True, help="a built benchmark folder")
    parser.add_argument("--out", type=Path, required=True, help="results folder (a rerun into it resumes)")
    parser.add_argument("--pairs", type=int, default=10, help="pairs drawn (seeded) from the benchmark")
    parser.add_argument("--trials", type=int, default=4, help="trials per pair and side")
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--seed", type=int, default=0, help="draws the pairs and seeds every episode")
    parser.add_argument("--threads", type=int, default=1, help="llama.cpp threads (more only on an idle machine)")
    args = parser.parse_args()
    if not (args.benchmark / "pairs.parquet").is_file():
        parser.error(f"--benchmark {args.benchmark}: no pairs.parquet there (build a benchmark first)")
    results = run(args.benchmark, args.out, args.pairs, args.trials, args.temperature, args.seed, args.threads)
    print(summary(results, args.trials))
    return 0


if __name__ == "__main__":
    sys.exit(main())
