"""The evaluation runner on the small gym benchmark: baselines, outputs, resume after a kill."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from gym_benchmark import make_benchmark

from pipeline.cli import main
from pipeline.eval.agent import Usage
from pipeline.eval.runner import (
    JOURNAL,
    RESULT_SCHEMA,
    EvalConfig,
    EvalError,
    play_episode,
    read_journal,
    run_eval,
    run_identity,
    select_pairs,
)
from pipeline.gym.env import Env
from pipeline.gym.models import Limits

CLI = Path(sys.executable).with_name("ehr-robustgym")


@pytest.fixture(scope="module")
def bench(tmp_path_factory) -> Path:
    return make_benchmark(tmp_path_factory.mktemp("eval_bench"))


@pytest.fixture(scope="module")
def pairs(bench) -> list[dict]:
    return pq.read_table(bench / "pairs.parquet").to_pylist()


def results(folder: Path) -> pd.DataFrame:
    return pd.read_parquet(folder / "results.parquet")


def test_oracle_is_right_on_both_sides_and_outputs_match(bench, pairs, tmp_path):
    run = run_eval(EvalConfig(bench, "oracle", trials=2, workers=2), tmp_path)
    assert (run.total, run.played, run.skipped, run.succeeded) == (36, 36, 0, 36)
    df = results(tmp_path)
    assert list(df.columns) == RESULT_SCHEMA.names
    assert df["success"].all() and (df["reward"] == 1.0).all()
    assert list(zip(df["pair_id"], df["side"], df["trial"])) == sorted(
        (p["pair_id"], s, t) for p in pairs for s in ("clean", "noise") for t in range(2))
    expected = {p["pair_id"]: p["expected_behavior"] for p in pairs}
    noise = df[df["side"] == "noise"]
    assert list(noise["behavior"]) == [expected[p] for p in noise["pair_id"]]
    assert (df[df["side"] == "clean"]["tool_calls"] == json.dumps({"answer": 1, "sql": 1})).all()
    trajectories = [json.loads(line) for line in (tmp_path / "trajectories.jsonl").read_text().splitlines()]
    assert [(t["metadata"]["pair_id"], t["metadata"]["side"], t["metadata"]["trial"]) for t in trajectories] == \
        list(zip(df["pair_id"], df["side"], df["trial"]))
    first = trajectories[0]
    assert {"messages", "tools", "metadata"} <= set(first) and first["metadata"]["agent"] == "oracle"
    assert first["messages"][0]["role"] == "system" and first["messages"][-1]["role"] == "tool"


def test_workers_share_the_runner_s_staged_base_and_leave_no_copy_behind(bench, tmp_path, monkeypatch):
    """The runner writes one staged database all its workers attach; a worker writing its own would
    leave it behind (a multiprocessing child exits without running exit handlers)."""
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setenv("EHR_ROBUSTGYM_TEMP_DIR", str(temp))
    run = run_eval(EvalConfig(bench, "oracle", trials=1, workers=2), tmp_path / "run")
    assert run.played == run.succeeded == 18
    assert list(temp.iterdir()) == []


def test_naive_is_right_on_clean_and_wrong_where_the_noise_changes_the_answer(bench, tmp_path):
    run_eval(EvalConfig(bench, "naive", sides=("noise",)), tmp_path)
    df = results(tmp_path).set_index("pair_id")
    assert set(df["side"]) == {"noise"} and (df["behavior"] == "answer").all() and df["answered"].all()
    assert not df.loc[["p_count", "p_maxlab", "p_admits"], "success"].any()  # overlays change these answers
    assert df.loc[["p_gender", "p_oldest"], "success"].all()  # no overlay, an answer expected


def test_limit_takes_a_seeded_choice_of_pairs():
    ids = [f"p{i:02d}" for i in range(20)]
    assert select_pairs(ids, None, 0) == ids
    first = select_pairs(ids, 5, 0)
    assert first == sorted(first) and len(first) == 5 and first == select_pairs(reversed(ids), 5, 0)
    assert first != select_pairs(ids, 5, 1)


def test_a_rerun_skips_finished_episodes_and_may_add_trials(bench, tmp_path):
    config = EvalConfig(bench, "naive", trials=1, limit=3)
    assert run_eval(config, tmp_path).played == 6
    again = run_eval(config, tmp_path)
    assert (again.played, again.skipped) == (0, 6)
    more = run_eval(EvalConfig(bench, "naive", trials=2, limit=3), tmp_path)
    assert (more.played, more.skipped) == (6, 6)
    df = results(tmp_path)
    assert len(df) == 12 and not df.duplicated(["pair_id", "side", "trial"]).any()


def test_a_folder_of_another_run_is_refused(bench, tmp_path):
    run_eval(EvalConfig(bench, "naive", limit=1), tmp_path)
    with pytest.raises(EvalError, match="another run.*agent"):
        run_eval(EvalConfig(bench, "oracle", limit=1), tmp_path)


def test_the_run_s_limits_reach_the_gym_and_identify_the_run(bench, tmp_path):
    one_step = Limits(max_steps=1)  # naive spends its one step on SQL: every episode hits the limit
    run_eval(EvalConfig(bench, "naive", limit=2, limits=one_step), tmp_path)
    df = results(tmp_path)
    assert len(df) == 4 and (df["termination"] == "step_limit").all() and (df["steps"] == 1).all()
    with pytest.raises(EvalError, match="another run.*limits"):
        run_eval(EvalConfig(bench, "naive", limit=2), tmp_path)


def test_where_a_model_is_served_does_not_identify_the_run(bench):
    config = EvalConfig(bench, "openai", options={"model": "m", "base_url": "http://127.0.0.1:1/v1"})
    moved = replace(config, options={"model": "m", "base_url": "http://127.0.0.1:2/v1"})
    assert run_identity(config) == run_identity(moved)
    assert run_identity(config) != run_identity(replace(config, options={"model": "other"}))


def test_bad_agent_options_and_input_fail_before_any_episode(bench, tmp_path):
    with pytest.raises(EvalError, match="does not take the options model"):
        run_eval(EvalConfig(bench, "oracle", options={"model": "x"}), tmp_path / "a")
    with pytest.raises(EvalError, match="unknown agent 'nobody'"):
        run_eval(EvalConfig(bench, "nobody"), tmp_path / "b")
    with pytest.raises(EvalError, match="--split dev"):
        run_eval(EvalConfig(bench, "oracle", split="dev"), tmp_path / "c")
    with pytest.raises(EvalError, match="no pairs.parquet"):
        run_eval(EvalConfig(tmp_path, "oracle"), tmp_path / "d")
    assert not (tmp_path / "a").exists()


def test_an_agent_that_stops_before_the_end_is_an_error(bench):
    class Quitter:
        name, model, uses_labels = "quitter", None, False

        def play(self, env, start, task, rng):
            return Usage()

    with Env(bench) as env, pytest.raises(EvalError, match="returned before the episode of p_count"):
        play_episode(env, Quitter(), ("p_count", "clean", 0), None, 0)


def test_a_journal_line_cut_by_a_kill_is_dropped(tmp_path):
    journal = tmp_path / JOURNAL
    journal.write_text('{"result": {"pair_id": "a"}}\n{"result": {"pai')
    assert [e.result for e in read_journal(journal)] == [{"pair_id": "a"}]
    assert journal.read_text() == '{"result": {"pair_id": "a"}}\n'


def _eval_command(bench: Path, out: Path) -> list[str]:
    return [str(CLI), "eval", "--benchmark", str(bench), "--agent", "naive", "--trials", "12", "--workers", "2",
            "--out", str(out)]


def _lines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


@pytest.mark.slow  # three CLI runs with two workers each: ~50 s on a loaded 2-core machine
def test_a_killed_run_resumes_to_the_same_results_without_duplicates(bench, tmp_path):
    total = 9 * 2 * 12
    killed = tmp_path / "killed"
    proc = subprocess.Popen(_eval_command(bench, killed), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while _lines(killed / JOURNAL) < 10 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, proc.stderr.read().decode()
    done = _lines(killed / JOURNAL)
    assert 10 <= done < total and not (killed / "results.parquet").exists()
    with (killed / JOURNAL).open("a") as f:
        f.write('{"result": {"pair_id": "cut sho')  # as if killed mid-line
    rerun = subprocess.run(_eval_command(bench, killed), capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    assert f"{total - done:,} episodes played, {done:,} already done" in rerun.stdout
    whole = tmp_path / "whole"
    assert subprocess.run(_eval_command(bench, whole), capture_output=True, timeout=300).returncode == 0
    a, b = results(killed), results(whole)
    assert len(a) == total and not a.duplicated(["pair_id", "side", "trial"]).any()
    pd.testing.assert_frame_equal(a.drop(columns="seconds"), b.drop(columns="seconds"))

    def without_seconds(folder):
        records = [json.loads(line) for line in (folder / "trajectories.jsonl").read_text().splitlines()]
        for r in records:
            r["metadata"].pop("seconds")
        return records
    assert without_seconds(killed) == without_seconds(whole)


def test_cli_eval_reports_errors_in_one_line(bench, tmp_path):
    result = CliRunner().invoke(main, ["eval", "--benchmark", str(bench), "--agent", "oracle", "--model", "m",
                                       "--out", str(tmp_path)])
    assert result.exit_code == 1 and "Error: agent 'oracle' does not take the options model" in result.output
    result = CliRunner().invoke(main, ["eval", "--benchmark", str(bench), "--agent", "nobody", "--out", str(tmp_path)])
    assert result.exit_code == 2 and "'nobody' is not one of" in result.output


def test_progress_lines_are_throttled_and_the_last_one_always_shown():
    from pipeline.progress import episode_progress

    lines: list[str] = []
    progress = episode_progress(lines.append, 100, every=3600)
    for done in range(1, 101):
        progress(done, done // 2)
    assert len(lines) == 1 and lines[0].startswith("eval: 100/100 episodes, 50.0% right,") and "ETA 0 s" in lines[0]
