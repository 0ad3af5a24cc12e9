"""Fetch the open-access MIMIC-IV Clinical Database Demo v2.2 and verify it against SHA256SUMS.

Every file is downloaded to a temporary name, hashed while streaming, and renamed only when
its digest matches PhysioNet's ``SHA256SUMS.txt``; a mismatch removes the file and fails.
"""

from __future__ import annotations

import hashlib
import os
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.files import sha256_file, temp_path

DEMO_URL = "https://physionet.org/files/mimic-iv-demo/2.2/"
SUMS_FILE = "SHA256SUMS.txt"
CHUNK = 1 << 20


class ChecksumError(RuntimeError):
    pass


@dataclass
class ChecksumReport:
    root: Path
    ok: list[str] = field(default_factory=list)
    mismatched: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)

    @property
    def valid(self) -> bool:
        return not self.mismatched


def parse_sums(text: str) -> dict[str, str]:
    """``{relative path: sha256}`` from a ``sha256sum``-style listing."""
    sums = {}
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split(maxsplit=1)
        if len(parts) != 2 or len(parts[0]) != 64:
            raise ChecksumError(f"{SUMS_FILE} line {n} is not '<sha256> <path>': {line!r}")
        sums[parts[1].strip().lstrip("*")] = parts[0].lower()
    return sums


def verify_checksums(root: str | os.PathLike) -> ChecksumReport:
    """Check every file listed in ``root/SHA256SUMS.txt``; absent files are listed, not failed."""
    root = Path(root)
    sums_path = root / SUMS_FILE
    if not sums_path.is_file():
        raise ChecksumError(f"{sums_path} not found: not a PhysioNet release folder")
    report = ChecksumReport(root)
    for rel, expected in sorted(parse_sums(sums_path.read_text()).items()):
        path = root / rel
        if not path.is_file():
            report.missing.append(rel)
        elif sha256_file(path) == expected:
            report.ok.append(rel)
        else:
            report.mismatched.append(rel)
    return report


def _fetch(url: str, dest: Path, expected: str | None = None) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(dest)
    digest = hashlib.sha256()
    try:
        with urllib.request.urlopen(url, timeout=60) as response, open(tmp, "wb") as out:
            while chunk := response.read(CHUNK):
                digest.update(chunk)
                out.write(chunk)
        if expected is not None and digest.hexdigest() != expected:
            raise ChecksumError(f"{url}: sha256 {digest.hexdigest()} does not match {SUMS_FILE} ({expected})")
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)


def download_demo(out: str | os.PathLike, base_url: str = DEMO_URL, log=print) -> ChecksumReport:
    """Download every file listed in the release's SHA256SUMS.txt into ``out``, verified."""
    out = Path(out)
    base_url = base_url if base_url.endswith("/") else base_url + "/"
    out.mkdir(parents=True, exist_ok=True)
    _fetch(base_url + SUMS_FILE, out / SUMS_FILE)
    sums = parse_sums((out / SUMS_FILE).read_text())
    for i, (rel, expected) in enumerate(sorted(sums.items()), 1):
        dest = out / rel
        if dest.is_file() and sha256_file(dest) == expected:
            log(f"[{i}/{len(sums)}] {rel}: present, checksum ok")
            continue
        log(f"[{i}/{len(sums)}] {rel}: downloading")
        _fetch(base_url + rel, dest, expected)
    return verify_checksums(out)

