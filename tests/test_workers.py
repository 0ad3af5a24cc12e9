"""Worker pools die with their parent: a killed build leaves no orphan burning CPU."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline.workers import process_tree

POOL_SCRIPT = """
import os, sys, time
from pipeline.workers import worker_pool
with worker_pool(2) as pool:
    pids = {pool.submit(os.getpid).result() for _ in range(20)}
    futures = [pool.submit(time.sleep, 600) for _ in range(2)]
    print(" ".join(map(str, sorted(pids))), flush=True)
    time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False


def _gone(pids: list[int], seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not any(_alive(p) for p in pids):
            return True
        time.sleep(0.2)
    return False


def test_workers_exit_when_their_parent_is_killed():
    parent = subprocess.Popen([sys.executable, "-c", POOL_SCRIPT], stdout=subprocess.PIPE, text=True,
                              start_new_session=True)
    try:
        workers = [int(p) for p in parent.stdout.readline().split()]
        assert workers and all(_alive(p) for p in workers)
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        assert _gone(workers), f"workers {workers} outlived their parent"
    finally:
        os.killpg(parent.pid, signal.SIGKILL) if parent.poll() is None else None


def _sha(folder: Path) -> dict[str, str]:
    return {name: hashlib.sha256((folder / name).read_bytes()).hexdigest()
            for name in ("pairs.parquet", "overlays.parquet", "clean_questions.parquet")}


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_a_build_killed_mid_stage_leaves_no_process_and_reruns_identically(tmp_path):
    cli = [str(Path(sys.executable).with_name("ehr-robustgym")), "build", "--source", "synthetic", "--patients", "80",
           "--questions-per-template", "3", "--per-template", "6", "--workers", "2"]
    reference = tmp_path / "reference"
    subprocess.run([*cli, "--out", str(reference)], check=True, capture_output=True, timeout=900)
    out = tmp_path / "killed"
    build = subprocess.Popen([*cli, "--out", str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True)
    try:
        deadline = time.monotonic() + 600
        workers: list[int] = []
        while time.monotonic() < deadline and build.poll() is None:
            workers = [p for p in process_tree(build.pid)[1:] if "spawn" in Path(f"/proc/{p}/cmdline").read_text(errors="replace")]
            if len(workers) >= 2:
                break
            time.sleep(0.2)
        assert len(workers) >= 2, "the build never started its worker pool"
        time.sleep(1.0)
        build.send_signal(signal.SIGKILL)
        build.wait(10)
        assert _gone(workers), f"workers {workers} outlived the killed build"
    finally:
        if build.poll() is None:
            os.killpg(build.pid, signal.SIGKILL)
    subprocess.run([*cli, "--out", str(out)], check=True, capture_output=True, timeout=900)
    assert _sha(out) == _sha(reference)
