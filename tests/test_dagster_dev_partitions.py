"""`dagster dev` as a fresh clone runs it (no DAGSTER_HOME: the project's dagster.yaml applies):
the sensor adds seeds 0–4, a backfill of seeds 0 and 1 runs as two queued runs one after the
other, both seed folders are written and differ, and the partitions view renders in Chromium."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from pipeline.schema import TABLES

REPO = Path(__file__).resolve().parent.parent
LOCATION = {"repositoryLocationName": "ehr_robustgym", "repositoryName": "__repository__", "jobName": "__ASSET_JOB"}
PARTITIONED = ["slot_pools", "clean_questions", "noise_candidates_record", "noise_candidates_value",
               "noise_candidates_query", "verified_pairs", "benchmark", "perturbation_audit"]
pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _graphql(port: int, query: str, variables: dict | None = None) -> dict:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/graphql",
                                 data=json.dumps({"query": query, "variables": variables or {}}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.load(r)


def _wait(what: str, seconds: float, poll):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            value = poll()
        except (OSError, KeyError, TypeError, ValueError):
            value = None
        if value:
            return value
        time.sleep(3)
    raise AssertionError(f"{what}: not within {seconds} s")


def _partition_keys(port: int) -> list[str]:
    data = _graphql(port, '{ assetNodeOrError(assetKey: {path: ["benchmark"]}) { ... on AssetNode { partitionKeys } } }')
    return data["data"]["assetNodeOrError"]["partitionKeys"]


def _runs(port: int, tag: dict) -> list[dict]:
    data = _graphql(port, """query($tags: [ExecutionTag!]) { runsOrError(filter: {tags: $tags}) {
        ... on Runs { results { runId status startTime endTime tags { key value } } } } }""", {"tags": [tag]})
    return data["data"]["runsOrError"]["results"]


def _finished_status(port: int, run_id: str) -> str | None:
    data = _graphql(port, 'query($id: ID!) { runOrError(runId: $id) { ... on Run { status } } }', {"id": run_id})
    status = data["data"]["runOrError"]["status"]
    return status if status in ("SUCCESS", "FAILURE", "CANCELED") else None


def _finished(runs: list[dict], count: int) -> list[dict] | None:
    done = [r for r in runs if r["status"] in ("SUCCESS", "FAILURE", "CANCELED")]
    return done if len(runs) == count and len(done) == count else None


def test_fresh_dagster_dev_backfills_two_seed_partitions_one_run_at_a_time(tmp_path):
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k != "DAGSTER_HOME"}
    env["DAGSTER_DISABLE_TELEMETRY"] = "1"
    env["HOME"] = str(tmp_path / "home")  # Dagster's per-user files (~/.dagster) stay in the test's folder
    config = {"resources": {"benchmark_run": {"config": {
        "patients": 100, "questions_per_template": 2, "workers": 1, "data_dir": str(tmp_path / "data")}}}}
    dagster = Path(sys.executable).with_name("dagster")
    proc = subprocess.Popen([str(dagster), "dev", "-p", str(port), "-h", "127.0.0.1"], cwd=REPO, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        assert _wait("the sensor adds seeds 0-4", 240, lambda: _partition_keys(port)) == ["0", "1", "2", "3", "4"]
        staging = _graphql(port, """mutation($p: ExecutionParams!) { launchRun(executionParams: $p) {
            __typename ... on LaunchRunSuccess { run { runId } } ... on PythonError { message } } }""", {"p": {
            "selector": {**LOCATION, "assetSelection": [{"path": [t]} for t in TABLES], "assetCheckSelection": []},
            "runConfigData": config}})["data"]["launchRun"]
        assert staging["__typename"] == "LaunchRunSuccess", staging
        run_id = staging["run"]["runId"]
        assert _wait("staging", 300, lambda: _finished_status(port, run_id)) == "SUCCESS"
        backfill = _graphql(port, """mutation($p: LaunchBackfillParams!) { launchPartitionBackfill(backfillParams: $p) {
            __typename ... on LaunchBackfillSuccess { backfillId } ... on PythonError { message } } }""", {"p": {
            "partitionNames": ["0", "1"], "assetSelection": [{"path": [a]} for a in PARTITIONED],
            "runConfigData": config}})["data"]["launchPartitionBackfill"]
        assert backfill["__typename"] == "LaunchBackfillSuccess", backfill
        runs = _wait("the backfill's two runs", 900,
                     lambda: _finished(_runs(port, {"key": "dagster/backfill", "value": backfill["backfillId"]}), 2))
        assert [r["status"] for r in runs] == ["SUCCESS", "SUCCESS"], runs
        first, second = sorted(runs, key=lambda r: r["startTime"])
        assert first["endTime"] <= second["startTime"]  # max_concurrent_runs: 1 queued the second run
        folders = [tmp_path / "data" / "benchmark" / "synthetic" / f"seed={s}" for s in (0, 1)]
        for folder in folders:
            assert (folder / "pairs.parquet").is_file() and (folder / "audit.html").is_file()
        assert (folders[0] / "pairs.parquet").read_bytes() != (folders[1] / "pairs.parquet").read_bytes()
        assert _graphql(port, "mutation { setNuxSeen }")["data"]["setNuxSeen"]  # no welcome dialog on top
        for asset, height in (("benchmark", 900), ("perturbation_audit", 2400)):  # the partitions view
            shot = tmp_path / f"{asset}.png"
            subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                            f"--window-size=1400,{height}", "--virtual-time-budget=20000", f"--screenshot={shot}",
                            f"http://127.0.0.1:{port}/assets/{asset}?view=partitions&partition=1"],
                           check=True, capture_output=True, timeout=180)
            assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
