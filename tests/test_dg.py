"""`dg` (dagster-dg-cli) works from the repository root through `[tool.dg]` in pyproject.toml."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _dg(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    (tmp_path / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    env = {**os.environ, "DAGSTER_HOME": str(tmp_path), "DAGSTER_DISABLE_TELEMETRY": "1"}
    return subprocess.run([str(Path(sys.executable).with_name("dg")), *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_dg_lists_and_checks_the_definitions(tmp_path):
    listed = _dg(tmp_path, "list", "defs", "--json")
    assert listed.returncode == 0, listed.stderr
    assets = {a["asset_key"]: a for a in json.loads(listed.stdout)["assets"]}
    assert assets["benchmark"]["dependency_keys"] == ["verified_pairs"]
    assert sum(a["group_name"] == "mimic_hosp" for a in assets.values()) == 22
    assert sum(a["group_name"] == "mimic_icu" for a in assets.values()) == 9
    checked = _dg(tmp_path, "check", "defs")
    assert checked.returncode == 0, checked.stderr
    assert "All definitions loaded successfully" in checked.stdout + checked.stderr
