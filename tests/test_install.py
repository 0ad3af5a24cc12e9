"""A regular install works: the wheel ships every module, the templates and the expectation
suites, and installed into a fresh venv it builds a benchmark from a folder outside the checkout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from pipeline.noise.export import templates_fingerprint

REPO = Path(__file__).resolve().parent.parent
NOT_SHIPPED = {".git", ".venv", "build", "dist", "data"}  # top-level folders left out of the clean copy


def _ignore(folder: str, names: list[str]) -> set[str]:
    top = Path(folder) == REPO
    return {n for n in names if n in ("__pycache__", ".pytest_cache") or n.endswith(".egg-info")
            or (top and n in NOT_SHIPPED)}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel, built from a clean copy of the checkout (a stale build/ must not leak into it)."""
    import shutil

    src = tmp_path_factory.mktemp("src") / "ehr-robustgym"
    shutil.copytree(REPO, src, ignore=_ignore)
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(out), str(src)],
                   check=True, timeout=300)
    (whl,) = out.glob("ehr_robustgym-*.whl")
    return whl


@pytest.mark.slow
def test_the_wheel_ships_every_module_and_data_file(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = {p.relative_to(REPO).as_posix() for ext in ("py", "csv", "yaml")
                for p in (REPO / "pipeline").rglob(f"*.{ext}") if "__pycache__" not in p.parts}
    expected |= {f"pipeline/templates/{p.name}" for p in (REPO / "templates").glob("*.yaml")}
    expected |= {"pipeline/expectations_data/" + p.relative_to(REPO / "expectations").as_posix()
                 for p in (REPO / "expectations").rglob("*.json")}
    assert len(expected) > 50 and not expected - names, sorted(expected - names)


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_a_regular_install_builds_from_outside_the_checkout(wheel, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    subprocess.run([str(venv / "bin" / "pip"), "install", "--quiet", str(wheel)], check=True, timeout=900)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(GX_ANALYTICS_ENABLED="false", DAGSTER_DISABLE_TELEMETRY="1")

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(args, cwd=elsewhere, env=env, capture_output=True, text=True, timeout=600)

    where = run(str(venv / "bin" / "python"), "-c",
                "import pipeline.package_data as d; print(d.__file__); print(d.templates_dir()); print(d.expectations_dir())")
    assert where.returncode == 0, where.stderr
    assert all(Path(line).is_relative_to(venv) for line in where.stdout.split()), where.stdout

    cli = str(venv / "bin" / "ehr-robustgym")
    built = run(cli, "build", "--source", "synthetic", "--patients", "60", "--questions-per-template", "3",
                "--per-template", "5", "--workers", "2", "--out", "./bench")
    assert built.returncode == 0, built.stderr[-3000:]
    bench = elsewhere / "bench"
    assert all((bench / f).is_file() for f in ("pairs.parquet", "overlays.parquet", "clean_questions.parquet",
                                              "README.md"))
    manifest = json.loads((bench / "manifest.json").read_text())
    assert manifest["inputs"]["templates_sha256"] == templates_fingerprint(REPO / "templates")
    assert manifest["code_version"] == {"package": "0.1.0", "git_commit": "unknown"}
    assert manifest["counts"]["pairs"] > 0

    bad = run(cli, "build", "--source", "demo", "--path", "/nonexistent", "--out", "./b")
    assert bad.returncode == 1 and bad.stderr.strip() == "Error: MIMIC-IV folder /nonexistent does not exist"
