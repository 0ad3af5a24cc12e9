"""The ``ehr-robustgym`` console script: every command documents itself; bad input is named."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from pipeline.cli import main


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
