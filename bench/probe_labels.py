"""How often the label-free ``checking`` agent raises an alarm on clean questions, and how often it
catches the noise (issue 10's acceptance: <= 3% clean alarms, >= 97% noisy detection), read from
an evaluation run of that agent:

    ehr-robustgym eval --benchmark DIR --agent checking --workers 2 --out RUN
    python bench/probe_labels.py RUN

- clean alarm: on the clean side the agent abstains or flags (the probe that fired is named in its
  abstain reason or flag evidence: a fault the clean-evidence filter still lets through);
- noisy detection: on the noise side it abstains or flags where the pair expects that, or answers
  right where the noise is recoverable by reading the question right (``misspelled_entity``);
- success: the gym's reward, per side; and all of these per operator.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter
from pathlib import Path

import pandas as pd

_PROBE = re.compile(r"^probe (\S+):")


def probes(trajectories: Path) -> dict[tuple[str, str], str | None]:
    """(pair_id, side) -> the probe named by the episode's last tool call, if any."""
    named = {}
    with trajectories.open(encoding="utf-8") as lines:
        for line in lines:
            record = json.loads(line)
            call = next((m["tool_calls"][0]["function"] for m in reversed(record["messages"]) if m.get("tool_calls")),
                        {})
            arguments = json.loads(call.get("arguments") or "{}")
            found = _PROBE.match(str(arguments.get("reason") or arguments.get("evidence") or ""))
            named[(record["metadata"]["pair_id"], record["metadata"]["side"])] = found.group(1) if found else None
    return named


def detected(noise: pd.DataFrame) -> pd.Series:
    """Right where an answer is expected; otherwise any abstention or flag."""
    return noise["success"].where(noise["expected_behavior"] == "answer", noise["behavior"].isin(["abstain", "flag"]))


def _pct(part: float, whole: int) -> str:
    return f"{100 * part / whole:5.1f}%" if whole else "    -"


def report(run: Path) -> str:
    results = pd.read_parquet(run / "results.parquet")
    if set(results["agent"]) != {"checking"}:
        raise SystemExit(f"{run}: results of {sorted(set(results['agent']))}, not of the checking agent")
    named = probes(run / "trajectories.jsonl")
    results["probe"] = [named.get((p, s)) for p, s in zip(results["pair_id"], results["side"])]
    results["alarm"] = results["behavior"] != "answer"
    clean, noise = results[results["side"] == "clean"], results[results["side"] == "noise"]
    noise = noise.assign(detected=detected(noise))
    lines = [f"{run}: {results['pair_id'].nunique():,} pairs, {len(results):,} episodes"]
    if len(clean):
        lines.append(f"clean: alarms {_pct(clean['alarm'].sum(), len(clean))} ({clean['alarm'].sum()}/{len(clean)}), "
                     f"success {_pct(clean['success'].sum(), len(clean))}")
    if len(noise):
        lines.append(f"noise: detected {_pct(noise['detected'].sum(), len(noise))}, "
                     f"any alarm {_pct(noise['alarm'].sum(), len(noise))}, "
                     f"success {_pct(noise['success'].sum(), len(noise))}")
    lines.append(f"\n{'operator':<22}{'pairs':>6}{'clean alarm':>12}{'clean ok':>10}{'detected':>10}{'noise ok':>10}"
                 "  noise misses (top)")
    for op in sorted(results["operator"].unique()):
        c, n = clean[clean["operator"] == op], noise[noise["operator"] == op]
        misses = Counter(f"{b}:{p or '-'}" for b, p in zip(n.loc[~n["success"], "behavior"], n.loc[~n["success"], "probe"]))
        lines.append(f"{op:<22}{max(len(c), len(n)):>6}{_pct(c['alarm'].sum(), len(c)):>12}"
                     f"{_pct(c['success'].sum(), len(c)):>10}{_pct(n['detected'].sum(), len(n)):>10}"
                     f"{_pct(n['success'].sum(), len(n)):>10}  "
                     + ", ".join(f"{k} {v}" for k, v in misses.most_common(3)))
    alarms = clean[clean["alarm"]]
    if len(alarms):
        lines.append("\nclean alarms by probe: " + ", ".join(
            f"{k} {v}" for k, v in Counter(alarms["probe"].fillna(alarms["behavior"])).most_common()))
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="results folder of `ehr-robustgym eval --agent checking`")
    args = parser.parse_args()
    if not (args.run / "results.parquet").is_file():
        parser.error(f"{args.run}: no results.parquet (run `ehr-robustgym eval --agent checking --out {args.run}`)")
    print(report(args.run))
    return 0


if __name__ == "__main__":
    sys.exit(main())
