"""Metrics over result records (rows of ``results.parquet``): pure functions, no I/O.

- success on each side, overall and by intent, level, noise level and operator;
- the robustness gap (clean − noise) and its paired view (the same pair and trial on both sides);
- pass^k, the chance that k trials of a task all succeed, by the unbiased estimator
  C(c, k) / C(n, k) per task (n trials, c right) averaged over tasks (a task is a pair on one side),
  and pass@k (at least one of k right) for reference;
- the reliability score RS(c): +1 right, 0 for a wrong episode without an answer (abstained, or a
  flag carrying none, or no terminal call), −c for a wrong or unsupported answer;
- 95% bootstrap intervals that resample pairs (both sides and all trials of a pair move together),
  seeded. Every statistic is a mean of per-unit values, so one resampling matrix serves them all.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from pipeline.gym.models import SIDES

GROUPS = ("intent", "level", "noise_level", "operator")
RS_COSTS = (0, 5, 10)
NEEDED = ("pair_id", "side", "trial", "success", "answered")


def frame(records: pd.DataFrame | Iterable[dict]) -> pd.DataFrame:
    df = records if isinstance(records, pd.DataFrame) else pd.DataFrame(list(records))
    if df.empty and not len(df.columns):
        df = pd.DataFrame(columns=list(NEEDED))
    if missing := [c for c in NEEDED if c not in df.columns]:
        raise ValueError(f"result records lack column(s) {', '.join(missing)}")
    return df


def _side(df: pd.DataFrame, side: str | None) -> pd.DataFrame:
    return df if side is None else df[df["side"] == side]


def success(records, side: str | None = None) -> float | None:
    """Share of episodes right (None when there is none)."""
    df = _side(frame(records), side)
    return float(df["success"].mean()) if len(df) else None


def success_by(records, key: str) -> dict[str, dict]:
    """Per value of ``key``: success on each side, the gap, and the episode counts."""
    df = frame(records)
    table = df.groupby([key, "side"])["success"].agg(["mean", "size"]).unstack("side")
    out = {}
    for value, row in table.iterrows():
        entry: dict = {}
        for side in SIDES:
            has = ("size", side) in row.index and not pd.isna(row[("size", side)])
            entry[side] = float(row[("mean", side)]) if has else None
            entry[f"n_{side}"] = int(row[("size", side)]) if has else 0
        entry["gap"] = entry["clean"] - entry["noise"] if None not in (entry["clean"], entry["noise"]) else None
        out[str(value)] = entry
    return out


def paired(records) -> dict[str, float | int]:
    """Over (pair, trial) played on both sides: shares right on both, on clean only, on noise only, on neither."""
    df = frame(records)
    wide = df.pivot_table(index=["pair_id", "trial"], columns="side", values="success", aggfunc="first")
    if not set(SIDES) <= set(wide.columns):
        return {"n": 0}
    wide = wide.dropna(subset=list(SIDES)).astype(bool)
    clean, noise = wide["clean"], wide["noise"]
    n = len(wide)
    shares = {"both_right": clean & noise, "clean_only": clean & ~noise, "noise_only": ~clean & noise,
              "both_wrong": ~clean & ~noise}
    return {"n": n, **{name: round(float(hit.sum() / n), 6) for name, hit in shares.items()}}


def task_counts(records, side: str | None = None) -> pd.DataFrame:
    """One row per task (pair, side): trials ``n`` and right ``c``."""
    df = _side(frame(records), side)
    return (df.groupby(["pair_id", "side"])["success"].agg(n="size", c="sum").reset_index())


def _need_trials(tasks: pd.DataFrame, k: int) -> None:
    if k < 1:
        raise ValueError(f"k must be at least 1; got {k}")
    short = tasks[tasks["n"] < k]
    if len(short):
        first = short.iloc[0]
        raise ValueError(f"pass^{k} needs at least {k} trials per task; {len(short)} task(s) have fewer, "
                         f"e.g. pair {first['pair_id']} ({first['side']}) with {first['n']}")


def pass_hat_values(tasks: pd.DataFrame, k: int) -> np.ndarray:
    """C(c, k) / C(n, k) for each task (the chance that k trials drawn without replacement all succeed)."""
    _need_trials(tasks, k)
    return np.array([math.comb(c, k) / math.comb(n, k) for n, c in zip(tasks["n"], tasks["c"])], dtype=float)


def pass_at_values(tasks: pd.DataFrame, k: int) -> np.ndarray:
    """1 − C(n − c, k) / C(n, k) for each task (at least one of k trials right)."""
    _need_trials(tasks, k)
    return np.array([1 - math.comb(n - c, k) / math.comb(n, k) for n, c in zip(tasks["n"], tasks["c"])], dtype=float)


def pass_hat_k(records, k: int, side: str | None = None) -> float | None:
    """pass^k averaged over tasks; ValueError when a task has fewer than k trials."""
    tasks = task_counts(records, side)
    return float(pass_hat_values(tasks, k).mean()) if len(tasks) else None


def pass_at_k(records, k: int, side: str | None = None) -> float | None:
    tasks = task_counts(records, side)
    return float(pass_at_values(tasks, k).mean()) if len(tasks) else None


def reliability_values(records, cost: float) -> np.ndarray:
    """Per episode: +1 right, 0 wrong without an answer, −cost wrong with an answer."""
    df = frame(records)
    return np.where(df["success"], 1.0, np.where(df["answered"], -float(cost), 0.0))


def reliability(records, cost: float, side: str | None = None) -> float | None:
    df = _side(frame(records), side)
    return float(reliability_values(df, cost).mean()) if len(df) else None


# ---------------------------------------------------------------------------- bootstrap over pairs
@dataclass(frozen=True)
class Resamples:
    """``weights[b, i]``: how often pair ``pairs[i]`` is drawn in resample ``b``."""

    pairs: pd.Index
    weights: np.ndarray

    @classmethod
    def draw(cls, pair_ids: Iterable[str], n: int = 1000, seed: int = 0) -> Resamples:
        pairs = pd.Index(sorted(set(pair_ids)))
        rng = np.random.default_rng(seed)
        return cls(pairs, rng.multinomial(len(pairs), np.full(len(pairs), 1 / len(pairs)), size=n).astype(float))

    def means(self, pair_ids: Iterable[str], values: np.ndarray) -> np.ndarray:
        """The mean of ``values`` (one per unit, units tagged by pair) in every resample."""
        index = self.pairs.get_indexer(pd.Index(pair_ids))
        if (index < 0).any():
            raise ValueError("a unit belongs to a pair outside the resampled pairs")
        total = np.bincount(index, weights=values, minlength=len(self.pairs))
        count = np.bincount(index, minlength=len(self.pairs)).astype(float)
        with np.errstate(invalid="ignore", divide="ignore"):
            return (self.weights @ total) / (self.weights @ count)


def interval(samples: np.ndarray, level: float = 0.95) -> list[float] | None:
    samples = samples[~np.isnan(samples)]
    if not len(samples):
        return None
    lo, hi = np.percentile(samples, [50 * (1 - level), 50 * (1 + level)])
    return [round(float(lo), 6), round(float(hi), 6)]


def bootstrap_ci(pair_ids: Iterable[str], values: np.ndarray, n: int = 1000, seed: int = 0) -> list[float] | None:
    """95% interval of the mean of ``values`` (one per unit, tagged by pair), resampling pairs."""
    pair_ids = list(pair_ids)
    return interval(Resamples.draw(pair_ids, n, seed).means(pair_ids, np.asarray(values, dtype=float)))


# ---------------------------------------------------------------------------- everything at once
def summarize(records, resamples: int = 1000, seed: int = 0) -> dict:
    """Every metric of one run, JSON-ready (``metrics.json``); a side without episodes gives None."""
    df = frame(records)
    if not len(df):
        raise ValueError("no result records to summarize")
    boot = Resamples.draw(df["pair_id"], resamples, seed)

    def estimate(units: pd.DataFrame, values: np.ndarray) -> dict | None:
        if not len(units):
            return None
        return {"value": round(float(np.mean(values)), 6),
                "ci95": interval(boot.means(units["pair_id"], values)), "n": len(units)}

    sides: dict[str, pd.DataFrame] = {side: df[df["side"] == side] for side in SIDES}
    out: dict = {
        "agent": _single(df, "agent"), "model": _single(df, "model"),
        "episodes": len(df), "pairs": int(df["pair_id"].nunique()),
        "success": {s: estimate(d, d["success"].to_numpy(float)) for s, d in sides.items()},
    }
    both = df[df["pair_id"].isin(set(sides["clean"]["pair_id"]) & set(sides["noise"]["pair_id"]))]
    gap = None
    if len(both):
        clean, noise = both[both["side"] == "clean"], both[both["side"] == "noise"]
        samples = (boot.means(clean["pair_id"], clean["success"].to_numpy(float))
                   - boot.means(noise["pair_id"], noise["success"].to_numpy(float)))
        gap = {"value": round(float(clean["success"].mean() - noise["success"].mean()), 6),
               "ci95": interval(samples), "n_pairs": int(both["pair_id"].nunique())}
    out["gap"] = gap
    out["paired"] = paired(df)
    out["rs"] = {s: {str(c): estimate(d, reliability_values(d, c)) for c in RS_COSTS}
                 for s, d in {**sides, "all": df}.items()}
    out["trials"], out["pass_hat_k"], out["pass_at_k"] = {}, {}, {}
    for side, d in sides.items():
        tasks = task_counts(d)
        most = int(tasks["n"].min()) if len(tasks) else 0
        out["trials"][side] = {"min": most, "max": int(tasks["n"].max()) if len(tasks) else 0}
        out["pass_hat_k"][side] = {str(k): estimate(tasks, pass_hat_values(tasks, k)) for k in range(1, most + 1)}
        out["pass_at_k"][side] = {str(k): round(float(pass_at_values(tasks, k).mean()), 6)
                                  for k in range(1, most + 1)}
    out["by"] = {key: success_by(df, key) for key in GROUPS if key in df.columns}
    out["behavior"] = {s: {str(b): int(n) for b, n in d["behavior"].value_counts().sort_index().items()}
                       for s, d in sides.items()} if "behavior" in df.columns else {}
    out["cost"] = {col: round(float(df[col].mean()), 6) for col in ("steps", "tokens_in", "tokens_out", "seconds")
                   if col in df.columns}
    out["bootstrap"] = {"resamples": resamples, "seed": seed, "unit": "pair", "level": 0.95}
    return out


def _single(df: pd.DataFrame, column: str) -> str | None:
    """The one value of ``column`` (e.g. the agent), joined when a results file mixes several."""
    if column not in df.columns:
        return None
    values = sorted({str(v) for v in df[column].dropna()})
    return ",".join(values) or None
