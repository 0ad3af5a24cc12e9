"""How often the label-free ``checking`` agent raises an alarm on clean questions, and how often it
catches the noise, on a built benchmark (issue 10's acceptance: <= 3% clean alarms, >= 97% noisy
detection). Runs the agent through the gym directly, without the evaluation runner.

- clean alarm: on the clean side the agent abstains or flags (its probe is named: the reason the
  clean-evidence filter still lets through);
- noisy detection: on the noise side it abstains or flags where the pair expects that, or answers
  correctly where the noise is recoverable by reading the question right (``misspelled_entity``);
- success: the gym's reward, per side; and all of these per operator.

    python bench/probe_labels.py --benchmark DIR [--limit N] [--side both|clean|noise] [--operator OP ...]
                                 [--workers 2] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import random
import re
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pipeline.eval.agent import make_agent  # noqa: E402
from pipeline.gym.env import Env  # noqa: E402

_env: Env | None = None
_PROBE = re.compile(r"^probe (\S+):")


def _open(benchmark: str) -> None:
    global _env
    _env = Env(benchmark)


def _episode(job: tuple[str, str]) -> dict:
    """One episode of the checking agent; what it did, the reward, and the probe that decided."""
    pair_id, side = job
    assert _env is not None
    agent = make_agent("checking")
    start = _env.reset(pair_id, side)
    began = time.perf_counter()
    agent.play(_env, start, None, random.Random(0))
    seconds = time.perf_counter() - began
    state, verdict = _env.state, _env.verdict or {}
    call: dict = next((m["tool_calls"][0]["function"] for m in reversed(_env.messages) if m.get("tool_calls")), {})
    arguments = json.loads(call.get("arguments") or "{}")
    text = arguments.get("reason") or arguments.get("evidence") or ""
    probe = _PROBE.match(text)
    return {"pair_id": pair_id, "side": side, "action": call.get("name", "none"), "reward": state.reward or 0.0,
            "category": arguments.get("category"), "probe": probe.group(1) if probe else None,
            "steps": state.step_count, "seconds": seconds, "why": verdict.get("reason", "")}


def _pct(n: int, d: int) -> str:
    return f"{100 * n / d:5.1f}%" if d else "    -"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--benchmark", required=True, type=Path)
    parser.add_argument("--limit", type=int, help="first N pairs (by pair_id) only")
    parser.add_argument("--side", choices=("both", "clean", "noise"), default="both")
    parser.add_argument("--operator", action="append", help="only pairs of this operator (repeatable)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", type=Path, help="write every episode as JSON lines here")
    args = parser.parse_args()
    if not (args.benchmark / "pairs.parquet").exists():
        parser.error(f"--benchmark {args.benchmark}: no pairs.parquet (build one with `ehr-robustgym build`)")
    # The harness reads the labels to score and group; the agent never sees them (it gets task=None).
    pairs = sorted((r for r in pq.read_table(args.benchmark / "pairs.parquet",
                                             columns=["pair_id", "operator", "expected_behavior"]).to_pylist()
                    if not args.operator or r["operator"] in args.operator), key=lambda r: r["pair_id"])[:args.limit]
    label = {r["pair_id"]: r for r in pairs}
    sides = ("clean", "noise") if args.side == "both" else (args.side,)
    jobs = [(r["pair_id"], s) for r in pairs for s in sides]
    began = time.perf_counter()
    tty = sys.stdout.isatty()
    with mp.get_context("spawn").Pool(args.workers, _open, (str(args.benchmark),)) as pool:
        results = []
        for i, r in enumerate(pool.imap_unordered(_episode, jobs, chunksize=16), 1):
            results.append(r)
            if tty and (i % 50 == 0 or i == len(jobs)):
                rate = i / (time.perf_counter() - began)
                print(f"\r{i:,}/{len(jobs):,} episodes, {rate:.1f}/s, ETA {(len(jobs) - i) / rate:.0f} s",
                      end="", flush=True)
    wall = time.perf_counter() - began
    if tty:
        print()
    if args.out:
        tmp = args.out.with_suffix(args.out.suffix + ".tmp")
        tmp.write_text("".join(json.dumps({**r, "operator": label[r["pair_id"]]["operator"]}) + "\n"
                               for r in sorted(results, key=lambda r: (r["pair_id"], r["side"]))))
        tmp.replace(args.out)

    def detected(r: dict) -> bool:
        if label[r["pair_id"]]["expected_behavior"] == "answer":
            return r["reward"] == 1.0
        return r["action"] in ("abstain", "flag")

    clean = [r for r in results if r["side"] == "clean"]
    noise = [r for r in results if r["side"] == "noise"]
    alarms = [r for r in clean if r["action"] != "answer"]
    print(f"benchmark {args.benchmark}: {len(pairs):,} pairs, {len(results):,} episodes in {wall:.0f} s "
          f"({len(results) / wall:.1f} episodes/s, {args.workers} workers)")
    if clean:
        print(f"clean: alarms {_pct(len(alarms), len(clean))} ({len(alarms)}/{len(clean)}), "
              f"success {_pct(sum(r['reward'] == 1 for r in clean), len(clean))}")
    if noise:
        print(f"noise: detected {_pct(sum(map(detected, noise)), len(noise))}, "
              f"any alarm {_pct(sum(r['action'] != 'answer' for r in noise), len(noise))}, "
              f"success {_pct(sum(r['reward'] == 1 for r in noise), len(noise))}")
    by_op: dict[str, dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for r in results:
        by_op[label[r["pair_id"]]["operator"]][r["side"]].append(r)
    print(f"\n{'operator':<22}{'pairs':>6}{'clean alarm':>12}{'clean ok':>10}{'detected':>10}{'noise ok':>10}"
          "  noise misses (top)")
    for op in sorted(by_op):
        c, n = by_op[op]["clean"], by_op[op]["noise"]
        misses = Counter(f"{r['action']}:{r['category'] or r['probe'] or '-'}" for r in n if r["reward"] != 1)
        print(f"{op:<22}{max(len(c), len(n)):>6}{_pct(sum(r['action'] != 'answer' for r in c), len(c)):>12}"
              f"{_pct(sum(r['reward'] == 1 for r in c), len(c)):>10}{_pct(sum(map(detected, n)), len(n)):>10}"
              f"{_pct(sum(r['reward'] == 1 for r in n), len(n)):>10}  "
              + ", ".join(f"{k} {v}" for k, v in misses.most_common(3)))
    if alarms:
        print("\nclean alarms by probe: " + ", ".join(
            f"{k} {v}" for k, v in Counter(r["probe"] or r["action"] for r in alarms).most_common()))
    wrong = Counter(r["why"] for r in clean if r["action"] == "answer" and r["reward"] != 1)
    if wrong:
        print("clean wrong answers: " + "; ".join(f"{k} ({v})" for k, v in wrong.most_common(5)))


if __name__ == "__main__":
    main()
