"""The report of one or several evaluation runs: ``report.md``, ``metrics.json`` and PNG plots.

Written into the first results folder, atomically. Plots are drawn with matplotlib's Agg canvas on
a plain :class:`~matplotlib.figure.Figure` (no pyplot state, safe inside Dagster), and each carries
its own title, axis labels and legend so it reads without the markdown.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from pipeline.eval.metrics import GROUPS, RS_COSTS, summarize
from pipeline.eval.runner import RESULTS
from pipeline.files import AtomicFolder
from pipeline.gym.models import SIDES

REPORT, METRICS = "report.md", "metrics.json"
SIDE_COLOURS = {"clean": "#4c72b0", "noise": "#dd8452"}


class ReportError(ValueError):
    """A results folder cannot be reported (no results.parquet, or no episodes in it)."""


@dataclass(frozen=True)
class Run:
    label: str
    folder: Path
    summary: dict


def load_results(folder: str | os.PathLike) -> pd.DataFrame:
    path = Path(folder) / RESULTS
    if not path.is_file():
        raise ReportError(f"{folder} has no {RESULTS}: write one with `ehr-robustgym eval --out {folder}`")
    df = pd.read_parquet(path)
    if not len(df):
        raise ReportError(f"{path} holds no episodes")
    return df


def load_runs(folders: list[Path], resamples: int, seed: int) -> list[Run]:
    """Summaries labelled by agent (and model); a label two folders share gets its folder's name."""
    summaries = [summarize(load_results(f), resamples, seed) for f in folders]
    labels = [s["agent"] + (f" ({s['model']})" if s["model"] else "") for s in summaries]
    labels = [f"{label} [{f.name}]" if labels.count(label) > 1 else label for label, f in zip(labels, folders)]
    return [Run(label, f, s) for label, f, s in zip(labels, folders, summaries)]


def write_report(folder: str | os.PathLike, compare: Sequence[str | os.PathLike] = (), resamples: int = 1000,
                 seed: int = 0) -> dict[str, Path]:
    """Write the report of ``folder`` (compared with ``compare``) into ``folder``; returns the files."""
    folders = [Path(folder), *map(Path, compare)]
    runs = load_runs(folders, resamples, seed)
    out = AtomicFolder(folders[0])
    files: dict[str, Path] = {}
    try:
        plots = {"by_intent": lambda: plot_by(runs, "intent"), "by_noise_level": lambda: plot_by(runs, "noise_level"),
                 "pass_hat_k": lambda: plot_pass_hat_k(runs)}
        if len(runs) > 1:
            plots["operator_heatmap"] = lambda: plot_operator_heatmap(runs)
        for name, draw in plots.items():
            figure = draw()
            FigureCanvasAgg(figure).print_png(out.path(f"{name}.png"))
            files[name] = folders[0] / f"{name}.png"
        metrics = {**runs[0].summary, "compare": [{"label": r.label, "folder": str(r.folder), **r.summary}
                                                  for r in runs[1:]]}
        out.write_text(METRICS, json.dumps(metrics, indent=1))
        out.write_text(REPORT, markdown(runs, [f"{name}.png" for name in plots]))
        out.commit()
    finally:
        out.abort()
    return {"report": folders[0] / REPORT, "metrics": folders[0] / METRICS, **files}


# ---------------------------------------------------------------------------- markdown
def _pct(estimate: dict | float | None, ci: bool = True) -> str:
    if estimate is None:
        return "–"
    if isinstance(estimate, dict):
        text = f"{estimate['value']:.1%}"
        if ci and estimate.get("ci95"):
            lo, hi = estimate["ci95"]
            text += f" [{lo:.1%}, {hi:.1%}]"
        return text
    return f"{estimate:.1%}"


def _num(estimate: dict | None) -> str:
    if estimate is None:
        return "–"
    lo, hi = estimate["ci95"] or (np.nan, np.nan)
    return f"{estimate['value']:+.3f} [{lo:+.3f}, {hi:+.3f}]"


def headline_rows(run: Run) -> list[str]:
    s = run.summary
    paired = s["paired"]
    both = f"{paired['both_right']:.1%}" if paired.get("n") else "–"
    return [run.label, _pct(s["success"]["clean"]), _pct(s["success"]["noise"]), _pct(s["gap"]), both,
            *(_num(s["rs"]["all"][str(c)]) for c in RS_COSTS)]


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *("| " + " | ".join(row) + " |" for row in rows), ""]


def markdown(runs: list[Run], plots: list[str]) -> str:
    main = runs[0].summary
    lines = [f"# Evaluation: {' vs '.join(r.label for r in runs)}", "",
             f"{main['episodes']:,} episodes over {main['pairs']:,} pairs "
             f"(trials per task: clean {main['trials']['clean']['min']}–{main['trials']['clean']['max']}, "
             f"noise {main['trials']['noise']['min']}–{main['trials']['noise']['max']}). "
             f"Intervals: 95% bootstrap over pairs ({main['bootstrap']['resamples']} resamples, "
             f"seed {main['bootstrap']['seed']}). RS(c): +1 right, 0 wrong without an answer, "
             "−c wrong or unsupported answer; both sides pooled.", "", "## Clean vs Noise", ""]
    lines += _table(["agent", "clean", "noise", "gap", "both right", *(f"RS({c})" for c in RS_COSTS)],
                    [headline_rows(r) for r in runs])
    lines += ["## pass^k (all k trials of a task right) and pass@k", ""]
    for run in runs:
        ks = sorted({k for side in SIDES for k in run.summary["pass_hat_k"][side]}, key=int)
        rows = [[f"{run.label}, {side}", *(_pct(run.summary["pass_hat_k"][side].get(k)) for k in ks),
                 *(_pct(run.summary["pass_at_k"][side].get(k)) for k in ks)] for side in SIDES]
        lines += _table(["agent, side", *(f"pass^{k}" for k in ks), *(f"pass@{k}" for k in ks)], rows)
    for key in GROUPS:
        lines += [f"## By {key.replace('_', ' ')}", ""]
        for run in runs:
            by = run.summary["by"].get(key, {})
            lines += [f"**{run.label}**", ""] if len(runs) > 1 else []
            lines += _table([key, "clean", "noise", "gap", "episodes (clean/noise)"],
                            [[value, _pct(e["clean"]), _pct(e["noise"]),
                              f"{e['gap']:+.1%}" if e["gap"] is not None else "–", f"{e['n_clean']}/{e['n_noise']}"]
                             for value, e in by.items()])
    lines += ["## Final behaviour (episodes)", ""]
    behaviours = sorted({b for r in runs for side in SIDES for b in r.summary["behavior"].get(side, {})})
    lines += _table(["agent, side", *behaviours],
                    [[f"{r.label}, {side}", *(str(r.summary["behavior"].get(side, {}).get(b, 0)) for b in behaviours)]
                     for r in runs for side in SIDES])
    lines += ["## Cost per episode (mean)", ""]
    costs = ["steps", "tokens_in", "tokens_out", "seconds"]
    lines += _table(["agent", *costs], [[r.label, *(f"{r.summary['cost'].get(c, 0):.3g}" for c in costs)] for r in runs])
    lines += ["## Plots", "", *(f"![{p}]({p})" for p in plots), ""]
    return "\n".join(lines)


# ---------------------------------------------------------------------------- plots
def plot_by(runs: list[Run], key: str) -> Figure:
    """Clean vs noise success per value of ``key``, one panel per run."""
    figure = Figure(figsize=(9, 3.2 * len(runs)), layout="constrained")
    for ax, run in zip(figure.subplots(len(runs), 1, squeeze=False)[:, 0], runs):
        by = run.summary["by"].get(key, {})
        values = list(by)
        x = np.arange(len(values))
        for offset, side in ((-0.2, "clean"), (0.2, "noise")):
            bars = ax.bar(x + offset, [by[v][side] if by[v][side] is not None else np.nan for v in values], 0.4,
                          label=side, color=SIDE_COLOURS[side])
            ax.bar_label(bars, labels=[f"{by[v][side]:.0%}" if by[v][side] is not None else "" for v in values],
                         fontsize="x-small")
        ax.set_xticks(x, values, rotation=30 if len(values) > 5 else 0, ha="right" if len(values) > 5 else "center")
        ax.set_ylim(0, 1.12)
        ax.set_ylabel("success (share of episodes)")
        ax.set_title(f"{run.label}: clean vs noise success by {key.replace('_', ' ')}")
        ax.legend(loc="upper left", bbox_to_anchor=(1, 1))
    return figure


def plot_pass_hat_k(runs: list[Run]) -> Figure:
    """pass^k against k, one line per run and side."""
    figure = Figure(figsize=(6, 4), layout="constrained")
    ax = figure.subplots()
    for run in runs:
        for side in SIDES:
            curve = run.summary["pass_hat_k"][side]
            if curve:
                ks = sorted(map(int, curve))
                ax.plot(ks, [curve[str(k)]["value"] for k in ks], marker="o",
                        linestyle="-" if side == "clean" else "--", label=f"{run.label}, {side}")
    ax.set_xlabel("k (trials that must all succeed)")
    ax.set_ylabel("pass^k")
    ax.set_ylim(0, 1.05)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_title("pass^k: consistency over repeated trials")
    ax.legend(fontsize="small")
    return figure


def plot_operator_heatmap(runs: list[Run]) -> Figure:
    """Noise-side success per operator (rows) and agent (columns)."""
    operators = sorted({op for r in runs for op in r.summary["by"].get("operator", {})})
    grid = np.array([[(r.summary["by"]["operator"].get(op) or {}).get("noise", np.nan) for r in runs]
                     for op in operators], dtype=float)
    figure = Figure(figsize=(2 + 1.4 * len(runs), 1 + 0.35 * len(operators)), layout="constrained")
    ax = figure.subplots()
    image = ax.imshow(grid, vmin=0, vmax=1, cmap="RdYlGn", aspect="auto")
    ax.set_xticks(range(len(runs)), [r.label for r in runs], rotation=20, ha="right")
    ax.set_yticks(range(len(operators)), operators)
    for (i, j), value in np.ndenumerate(grid):
        if not np.isnan(value):
            ax.text(j, i, f"{value:.0%}", ha="center", va="center", fontsize="small")
    ax.set_title("noise-side success by operator")
    figure.colorbar(image, ax=ax, label="success")
    return figure
