"""Shared fixtures: the real MIMIC-IV demo from ../shared, staged once per test session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
os.environ.setdefault("DAGSTER_DISABLE_TELEMETRY", "1")

REPO = Path(__file__).resolve().parent.parent
DEMO = REPO.parent / "shared" / "data" / "mimic-iv-demo-2.2"


@pytest.fixture(scope="session")
def demo_path() -> Path:
    if not (DEMO / "hosp").is_dir():
        pytest.skip(f"the MIMIC-IV demo is not at {DEMO}")
    return DEMO


@pytest.fixture(scope="session")
def demo_staged(demo_path, tmp_path_factory) -> Path:
    """The real demo staged to Parquet (read-only for tests: copy before changing)."""
    from pipeline.sources import make_source
    from pipeline.staging import stage

    out = tmp_path_factory.mktemp("demo_staged")
    stage(make_source("demo", demo_path), out)
    return out
