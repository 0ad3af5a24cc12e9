"""`dagster dev` from the repository root loads the code location with no flags."""

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

REPO = Path(__file__).resolve().parent.parent
QUERY = """{ workspaceOrError { ... on Workspace { locationEntries { name
  locationOrLoadError { __typename ... on RepositoryLocation { repositories {
    assetNodes { assetKey { path } groupName assetChecksOrError { ... on AssetChecks { checks { name } } } }
  } } ... on PythonError { message } } } } } }"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _graphql(port: int) -> dict:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/graphql", data=json.dumps({"query": QUERY}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.load(r)


@pytest.mark.slow
def test_dagster_dev_shows_the_whole_graph_with_checks(tmp_path):
    port = _free_port()
    env = {**os.environ, "DAGSTER_HOME": str(tmp_path), "DAGSTER_DISABLE_TELEMETRY": "1"}
    (tmp_path / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    dagster = Path(sys.executable).with_name("dagster")
    proc = subprocess.Popen([str(dagster), "dev", "-p", str(port), "-h", "127.0.0.1"], cwd=REPO, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline, location = time.monotonic() + 240, None
        while time.monotonic() < deadline:
            try:
                entries = _graphql(port)["data"]["workspaceOrError"]["locationEntries"]
                location = entries[0]["locationOrLoadError"] if entries else None
            except (OSError, KeyError, TypeError, ValueError):
                location = None
            if location:
                break
            time.sleep(2)
        assert location is not None, "dagster dev did not load within 240 s"
        assert location["__typename"] == "RepositoryLocation", location
        nodes = location["repositories"][0]["assetNodes"]
        by_group: dict[str, set] = {}
        for n in nodes:
            by_group.setdefault(n["groupName"], set()).add(n["assetKey"]["path"][-1])
        assert len(by_group["mimic_hosp"]) == 22 and len(by_group["mimic_icu"]) == 9
        assert by_group["questions"] == {"slot_pools", "clean_questions"}
        assert by_group["noise"] == {"noise_candidates_record", "noise_candidates_value", "noise_candidates_query",
                                     "verified_pairs"}
        assert by_group["benchmark"] == {"benchmark"}
        assert by_group["audit"] == {"perturbation_audit"}
        assert by_group["evaluation"] == {"evaluation"}
        labevents = next(n for n in nodes if n["assetKey"]["path"] == ["labevents"])
        assert {c["name"] for c in labevents["assetChecksOrError"]["checks"]} == {"expectations", "integrity"}
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
