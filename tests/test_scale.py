"""Scale (issue 12): a 10,000-patient synthetic build, about 22.6M staged rows, completes with all
its processes together under 4 GiB resident at the default memory budget: every worker reads the
one staged database on disk within its share of the budget instead of holding its own copy, and
a population's evidence rows stay in DuckDB (measured: 3,581 MiB at its peak, in the noise stage)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from pipeline.noise.verify import failed_checks
from pipeline.workers import process_tree, resident_bytes

PEAK_BYTES = 4 << 30


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_a_10000_patient_build_stays_under_4_gib(tmp_path):
    out, log = tmp_path / "benchmark", tmp_path / "build.log"
    command = [str(Path(sys.executable).with_name("ehr-robustgym")), "build", "--source", "synthetic",
               "--patients", "10000", "--seed", "0", "--workers", "2", "--out", str(out), "--quiet"]
    peak = 0
    with log.open("w") as sink:
        build = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT)
        try:
            while build.poll() is None:  # the sum over the build and its workers, five times a second
                peak = max(peak, sum(resident_bytes(pid) for pid in process_tree(build.pid)))
                time.sleep(0.2)
        finally:
            if build.poll() is None:  # the test failed or timed out: its workers go with it
                build.kill()
                build.wait()
    assert build.returncode == 0, log.read_text()
    assert peak <= PEAK_BYTES, f"peak RSS {peak >> 20:,} MiB over the build's processes"
    verification = pq.read_table(out / "pairs.parquet", columns=["verification"]).column("verification").to_pylist()
    assert len(verification) == json.loads((out / "manifest.json").read_text())["counts"]["pairs"] > 1000
    assert not [v for v in verification if failed_checks(json.loads(v))]  # every shipped pair passed every check
