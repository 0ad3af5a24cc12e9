"""The ``ehr-robustgym`` console script: every command documents itself; bad input is named."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

import pipeline.cli
import pipeline.questions.templates
from pipeline.cli import main
from pipeline.staging import StagingError


@pytest.mark.parametrize("command", sorted(main.commands))
def test_every_command_has_help(command):
    result = CliRunner().invoke(main, [command, "--help"])
    assert result.exit_code == 0 and "Usage:" in result.output and "--help" in result.output


def test_bad_source_folder_is_a_clear_error(tmp_path):
    result = CliRunner().invoke(main, ["stage", "--source", "demo", "--path", str(tmp_path / "nowhere"),
                                       "--out", str(tmp_path / "out")])
    assert result.exit_code == 1 and "does not exist" in result.output
    assert not (tmp_path / "out").exists()
    result = CliRunner().invoke(main, ["build", "--source", "mimic", "--out", str(tmp_path / "b")])
    assert result.exit_code == 1 and "needs --path" in result.output


def _error_line(result) -> str:
    """The one line an expected error prints; no traceback."""
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.output
    assert "Traceback" not in result.output
    last = result.output.strip().splitlines()[-1]
    assert last.startswith("Error: ")
    return last


def test_a_missing_source_folder_is_one_line_and_debug_shows_the_traceback(tmp_path):
    args = ["build", "--source", "demo", "--path", "/nonexistent", "--out", str(tmp_path / "b")]
    result = CliRunner().invoke(main, args)
    assert _error_line(result) == "Error: MIMIC-IV folder /nonexistent does not exist"
    assert result.output.strip() == _error_line(result)
    result = CliRunner().invoke(main, ["--debug", *args])
    assert result.exit_code == 1 and isinstance(result.exception, StagingError)


def test_a_broken_template_is_one_line(tmp_path, monkeypatch):
    broken = tmp_path / "templates"
    broken.mkdir()
    (broken / "broken.yaml").write_text("- id: x\n  questions: [unclosed\n")
    monkeypatch.setattr(pipeline.questions.templates, "TEMPLATES_DIR", broken)
    result = CliRunner().invoke(main, ["build", "--patients", "2", "--out", str(tmp_path / "b")])
    assert _error_line(result).startswith("Error: broken.yaml: not valid YAML")
    assert not (tmp_path / "b" / "pairs.parquet").exists()


def test_unreadable_input_is_one_line_with_a_hint(tmp_path):
    (tmp_path / "patients.parquet").write_bytes(b"")
    line = _error_line(CliRunner().invoke(main, ["check", "--staged", str(tmp_path)]))
    assert "Parquet file size is 0 bytes" in line and "--debug" in line
    (tmp_path / "empty").mkdir()
    line = _error_line(CliRunner().invoke(main, ["questions", "--staged", str(tmp_path / "empty"), "--seed", "0",
                                                 "--workers", "1", "--out", str(tmp_path / "q.parquet")]))
    assert line.startswith("Error: no staged tables") and "--debug" in line


def test_a_bad_memory_setting_is_one_line_naming_the_variable(tmp_path, monkeypatch):
    monkeypatch.setenv("EHR_ROBUSTGYM_DUCKDB_MEMORY", "lots")
    line = _error_line(CliRunner().invoke(main, ["build", "--patients", "20", "--seed", "0", "--workers", "1",
                                                 "--out", str(tmp_path / "b")]))
    assert line.startswith("Error: EHR_ROBUSTGYM_DUCKDB_MEMORY='lots': not a size") and "--debug" not in line
    assert not (tmp_path / "b" / "pairs.parquet").exists()


def test_a_bug_keeps_its_traceback(tmp_path, monkeypatch):
    def boom(*args, **kwargs):
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(pipeline.cli, "stage", boom)
    result = CliRunner().invoke(main, ["stage", "--patients", "2", "--out", str(tmp_path / "s")])
    assert result.exit_code == 1 and isinstance(result.exception, ZeroDivisionError)
    assert "Error:" not in result.output


def test_check_of_a_folder_without_staged_tables_fails(tmp_path):
    result = CliRunner().invoke(main, ["check", "--staged", str(tmp_path)])
    assert result.exit_code == 1 and f"no staged tables (<table>.parquet) in {tmp_path}" in result.output


def test_questions_on_a_folder_without_staged_tables_fails_in_one_line(tmp_path):
    result = CliRunner().invoke(main, ["questions", "--staged", str(tmp_path), "--seed", "0",
                                       "--out", str(tmp_path / "q.parquet"), "--workers", "2"])
    assert result.exit_code == 1 and f"no staged tables (<table>.parquet) in {tmp_path}" in result.output
    assert "Traceback" not in result.output


def test_verification_progress_reports_shards_rate_and_eta():
    from pipeline.progress import verification_progress

    lines: list[str] = []
    progress = verification_progress(lines.append)
    progress(1, 4, [{"verified": True}, {"verified": False}])
    progress(4, 4, [{"verified": True}])
    assert lines[0].startswith("verification: shard 1/4, 2 candidates verified (1 passed all checks), ")
    assert "candidates/s, ETA" in lines[0] and lines[1].endswith("ETA 0 s")
