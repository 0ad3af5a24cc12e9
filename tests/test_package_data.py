"""templates/ and expectations/ are found from the installed package, not from the source tree."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.expectations import EXPECTATIONS_DIR, suite_path
from pipeline.noise.export import templates_fingerprint
from pipeline.package_data import expectations_dir, package_folder, templates_dir
from pipeline.questions.templates import TEMPLATES_DIR, load_templates

REPO = Path(__file__).resolve().parent.parent


def _files(folder: Path, pattern: str) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.glob(pattern))}


def test_templates_are_the_repository_folder_byte_for_byte():
    assert TEMPLATES_DIR == templates_dir() and TEMPLATES_DIR.is_dir()
    assert _files(TEMPLATES_DIR, "*.yaml") == _files(REPO / "templates", "*.yaml")
    assert templates_fingerprint(TEMPLATES_DIR) == templates_fingerprint(REPO / "templates")
    assert len(load_templates()) == len(load_templates(REPO / "templates")) > 0


def test_expectation_suites_are_the_repository_folder_byte_for_byte():
    assert EXPECTATIONS_DIR == expectations_dir() and EXPECTATIONS_DIR.is_dir()
    assert _files(EXPECTATIONS_DIR, "*/*.json") == _files(REPO / "expectations", "*/*.json")
    assert suite_path("benchmark/pairs").is_file() and suite_path("source/patients").is_file()


def test_a_missing_data_package_is_a_clear_error():
    with pytest.raises(FileNotFoundError, match="pipeline.no_such_data is not installed: reinstall"):
        package_folder("pipeline.no_such_data")
