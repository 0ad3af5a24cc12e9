"""Atomic output and stable hashing, shared by every stage.

Outputs are written under a temporary name beside their final path and renamed into place, so a
reader never sees a half-written file; :class:`AtomicFolder` does the same for a set of files.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

PARQUET_COMPRESSION = dict(compression="zstd", compression_level=3)


def stable_int(*parts) -> int:
    """A 64-bit integer from the parts' text: seeds and orders that never depend on the run."""
    return int.from_bytes(hashlib.sha256("|".join(map(str, parts)).encode()).digest()[:8], "big")


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def temp_path(final: Path) -> Path:
    """The temporary name ``final`` is written under before it is renamed into place."""
    return final.with_name(f".{final.name}.tmp-{os.getpid()}")


def write_parquet(table: pa.Table, out: str | os.PathLike) -> None:
    """Write one Parquet file atomically."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(out)
    try:
        pq.write_table(table, tmp, **PARQUET_COMPRESSION)
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)


class AtomicFolder:
    """Collects files under temporary names inside ``out``; :meth:`commit` renames them all."""

    def __init__(self, out: Path):
        self.out = out
        self.pending: list[tuple[Path, Path]] = []
        out.mkdir(parents=True, exist_ok=True)

    def path(self, name: str) -> Path:
        final = self.out / name
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = temp_path(final)
        self.pending.append((tmp, final))
        return tmp

    def write_parquet(self, name: str, table: pa.Table) -> Path:
        tmp = self.path(name)
        pq.write_table(table, tmp, **PARQUET_COMPRESSION)
        return tmp

    def write_text(self, name: str, text: str) -> Path:
        tmp = self.path(name)
        tmp.write_text(text, encoding="utf-8")
        return tmp

    def commit(self) -> None:
        for tmp, final in self.pending:
            os.replace(tmp, final)
        self.pending.clear()

    def abort(self) -> None:
        for tmp, _ in self.pending:
            tmp.unlink(missing_ok=True)
        self.pending.clear()


def link_or_copy(src: Path, dst: Path) -> None:
    """Put ``src`` at ``dst`` atomically: a hard link (no extra space), or a copy across file systems."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(dst)
    tmp.unlink(missing_ok=True)
    try:
        try:
            os.link(src, tmp)
        except OSError:
            shutil.copyfile(src, tmp)
        os.replace(tmp, dst)
    finally:
        tmp.unlink(missing_ok=True)
