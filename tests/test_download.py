"""Checksum verification of the demo, and the download path against a loopback mirror."""

from __future__ import annotations

import functools
import http.server
import shutil
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner

from pipeline.cli import main
from pipeline.download import ChecksumError, download_demo, verify_checksums

SMALL = ["hosp/patients.csv.gz", "hosp/admissions.csv.gz", "icu/icustays.csv.gz"]


def test_shared_demo_matches_its_checksums(demo_path):
    report = verify_checksums(demo_path)
    assert report.valid and not report.mismatched
    assert report.missing == ["icu/chartevents.csv.gz"]
    assert "hosp/labevents.csv.gz" in report.ok and len(report.ok) == 33


def _mirror(tmp_path: Path, demo_path: Path, files=SMALL) -> Path:
    """A release folder whose SHA256SUMS.txt lists only ``files`` (copied from the demo)."""
    root = tmp_path / "mirror"
    sums = {line.split()[1]: line for line in (demo_path / "SHA256SUMS.txt").read_text().splitlines()}
    for rel in files:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(demo_path / rel, root / rel)
    (root / "SHA256SUMS.txt").write_text("\n".join(sums[rel] for rel in files) + "\n")
    return root


def test_corrupted_copy_is_detected(tmp_path, demo_path):
    root = _mirror(tmp_path, demo_path)
    target = root / "hosp/admissions.csv.gz"
    data = bytearray(target.read_bytes())
    data[100] ^= 0xFF
    target.write_bytes(bytes(data))
    report = verify_checksums(root)
    assert report.mismatched == ["hosp/admissions.csv.gz"] and not report.valid
    result = CliRunner().invoke(main, ["verify-demo", "--path", str(root)])
    assert result.exit_code == 1 and "MISMATCH: hosp/admissions.csv.gz" in result.output


@pytest.fixture
def serve(tmp_path):
    """Serve a folder over HTTP on loopback; yields a function folder -> base URL."""
    servers = []

    def start(folder: Path) -> str:
        handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(folder))
        handler.log_message = lambda *a, **k: None
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}/"

    yield start
    for server in servers:
        server.shutdown()


def test_download_verifies_every_file(tmp_path, demo_path, serve):
    url = serve(_mirror(tmp_path, demo_path))
    out = tmp_path / "downloaded"
    result = CliRunner().invoke(main, ["download-demo", "--out", str(out), "--url", url])
    assert result.exit_code == 0, result.output
    assert "3 files verified" in result.output
    for rel in SMALL:
        assert (out / rel).read_bytes() == (demo_path / rel).read_bytes()
    # A second run finds the files present and verified, and downloads nothing.
    again = CliRunner().invoke(main, ["download-demo", "--out", str(out), "--url", url])
    assert again.exit_code == 0 and again.output.count("present, checksum ok") == 3


def test_download_rejects_a_corrupted_file_and_keeps_nothing(tmp_path, demo_path, serve):
    root = _mirror(tmp_path, demo_path)
    (root / "icu/icustays.csv.gz").write_bytes(b"not the real file")
    out = tmp_path / "downloaded"
    with pytest.raises(ChecksumError, match="icustays.csv.gz"):
        download_demo(out, serve(root), log=lambda *_: None)
    assert not (out / "icu/icustays.csv.gz").exists()
    assert not list(out.rglob("*.tmp-*"))
