"""The report on tiny results files: markdown, metrics.json and PNG plots, alone and compared."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from pipeline.cli import main
from pipeline.eval.report import ReportError, write_report
from pipeline.eval.runner import RESULT_SCHEMA

PNG = b"\x89PNG\r\n\x1a\n"
OPERATORS = ("unit_error", "duplicate_record", "missing_evidence")


def write_results(folder: Path, agent: str, noise_right: set[int], trials: int = 2) -> Path:
    """Six pairs, both sides, ``trials`` trials; clean always right, noise right for the pairs given."""
    rows = []
    for i in range(6):
        for side in ("clean", "noise"):
            for trial in range(trials):
                right = side == "clean" or i in noise_right
                rows.append({
                    "pair_id": f"p{i}", "side": side, "trial": trial, "success": right, "reward": float(right),
                    "termination": "answer", "behavior": "answer", "expected_behavior": "answer", "answered": True,
                    "steps": 2, "tool_calls": '{"answer": 1, "sql": 1}', "tokens_in": 0, "tokens_out": 0,
                    "seconds": 0.01, "intent": ("lookup", "count")[i % 2], "level": "patient",
                    "noise_level": ("record", "value", "query")[i % 3], "operator": OPERATORS[i % 3],
                    "split": "test", "agent": agent, "model": None})
    folder.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=RESULT_SCHEMA), folder / "results.parquet")
    return folder


def test_report_of_one_run(tmp_path):
    folder = write_results(tmp_path / "naive", "naive", noise_right={0, 3})
    files = write_report(folder)
    assert set(files) == {"report", "metrics", "by_intent", "by_noise_level", "pass_hat_k"}
    for name in ("by_intent", "by_noise_level", "pass_hat_k"):
        assert files[name].read_bytes().startswith(PNG)
    metrics = json.loads(files["metrics"].read_text())
    assert metrics["success"]["noise"]["value"] == pytest.approx(2 / 6)
    assert metrics["pass_hat_k"]["noise"]["2"]["value"] == pytest.approx(2 / 6)
    assert metrics["by"]["operator"]["unit_error"]["noise"] == 1.0  # p0 and p3
    assert metrics["rs"]["all"]["10"]["value"] == pytest.approx((12 + 4 - 10 * 8) / 24)
    assert metrics["compare"] == []
    text = files["report"].read_text()
    assert "| naive | 100.0% [100.0%, 100.0%] | 33.3% [" in text
    assert "![pass_hat_k.png](pass_hat_k.png)" in text and "operator_heatmap" not in text
    assert not list(folder.glob(".*tmp*"))


def test_report_compares_runs_with_an_operator_heatmap(tmp_path):
    naive = write_results(tmp_path / "naive", "naive", noise_right=set())
    oracle = write_results(tmp_path / "oracle", "oracle", noise_right=set(range(6)), trials=3)
    result = CliRunner().invoke(main, ["report", str(naive), "--compare", str(oracle)])
    assert result.exit_code == 0, result.output
    assert (naive / "operator_heatmap.png").read_bytes().startswith(PNG)
    metrics = json.loads((naive / "metrics.json").read_text())
    assert [c["label"] for c in metrics["compare"]] == ["oracle"]
    assert metrics["compare"][0]["pass_hat_k"]["noise"]["3"]["value"] == 1.0
    text = (naive / "report.md").read_text()
    assert "# Evaluation: naive vs oracle" in text and "| oracle | 100.0%" in text


def test_report_needs_a_results_file(tmp_path):
    with pytest.raises(ReportError, match="no results.parquet"):
        write_report(tmp_path)
    result = CliRunner().invoke(main, ["report", str(tmp_path)])
    assert result.exit_code == 1 and "has no results.parquet" in result.output
