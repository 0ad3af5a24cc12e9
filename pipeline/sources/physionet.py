"""Real MIMIC-IV in PhysioNet layout (``hosp/*.csv.gz``, ``icu/*.csv.gz``): the demo or a full copy.

Files are read by DuckDB with the registry's explicit types (no sniffing) and streamed in Arrow
batches, so memory stays bounded on full MIMIC-IV. Headers are checked against the registry
before reading, so a missing or extra column is named rather than surfacing as a type error.
"""

from __future__ import annotations

import gzip
import os
import re
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import duckdb

from pipeline.schema import HOSP, ICU, TABLES, Table
from pipeline.sql import path_literal
from pipeline.staging import StagingError, TableSink

BATCH_ROWS = 1 << 18


def locate(root: Path, t: Table) -> Path | None:
    """The file holding ``t`` under ``root`` (``.csv.gz`` preferred over ``.csv``), or None."""
    for suffix in (".csv.gz", ".csv"):
        candidate = root / f"{t.relative_path}{suffix}"
        if candidate.is_file():
            return candidate
    return None


def check_layout(root: Path) -> None:
    if not root.is_dir():
        raise StagingError(f"MIMIC-IV folder {root} does not exist")
    missing = [m for m in (HOSP, ICU) if not (root / m).is_dir()]
    if missing:
        raise StagingError(
            f"{root} is not a MIMIC-IV folder in PhysioNet layout: no {' or '.join(m + '/' for m in missing)} "
            "subfolder (expected hosp/*.csv.gz and icu/*.csv.gz)")


def read_header(path: Path) -> list[str]:
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt", encoding="utf-8", newline="") as f:
            line = f.readline()
    except (OSError, EOFError, zlib.error, UnicodeDecodeError) as exc:
        raise StagingError(f"{path}: cannot read the header line: {exc}") from exc
    if not line.strip():
        raise StagingError(f"{path}: file is empty (no header line)")
    return [c.strip().strip('"') for c in line.rstrip("\r\n").split(",")]


def check_header(path: Path, t: Table) -> None:
    header = read_header(path)
    if tuple(header) == t.column_names:
        return
    missing = [c for c in t.column_names if c not in header]
    extra = [c for c in header if c not in t.column_names]
    detail = []
    if missing:
        detail.append(f"missing column(s) {', '.join(missing)}")
    if extra:
        detail.append(f"unexpected column(s) {', '.join(extra)}")
    if not detail:
        detail.append(f"columns out of order: expected {', '.join(t.column_names)}")
    raise StagingError(f"{path}: header does not match MIMIC-IV v2.2 table {t.name}: {'; '.join(detail)}")


_LINE = re.compile(r"Line:\s*(\d+)", re.IGNORECASE)


def _explain(path: Path, t: Table, exc: Exception) -> StagingError:
    msg = str(exc)
    where = [str(path)]
    m = _LINE.search(msg)
    if m:
        where.append(f"line {m.group(1)}")
    for c in t.column_names:
        if re.search(rf'(?:column|Column)\s*"?{re.escape(c)}"?\b', msg):
            where.append(f"column {c} ({t.column(c).type})")
            break
    first = msg.strip().splitlines()[0] if msg.strip() else type(exc).__name__
    return StagingError(f"{', '.join(where)}: {first}")


def read_csv_sql(path: Path, t: Table) -> str:
    columns = ", ".join(f"'{c.name}': '{c.type}'" for c in t.columns)
    return (
        f"SELECT * FROM read_csv({path_literal(path)}, columns={{{columns}}}, header=true, "
        "auto_detect=false, delim=',', quote='\"', escape='\"', nullstr='', "
        "strict_mode=true, null_padding=false, parallel=false)"
    )


@dataclass
class PhysioNetSource:
    """The ``demo`` or ``mimic`` source: a folder in PhysioNet layout."""

    path: Path
    name: str = "mimic"

    def __post_init__(self) -> None:
        self.path = Path(self.path)

    def emit(self, sink: TableSink) -> None:
        check_layout(self.path)
        plan = []
        for name in sink.tables:
            t = TABLES[name]
            path = locate(self.path, t)
            if path is None:
                sink.skip(name, f"{t.relative_path}.csv.gz not found under {self.path}")
                continue
            check_header(path, t)
            plan.append((t, path))
        con = duckdb.connect()
        try:
            con.execute("SET preserve_insertion_order = true").fetchall()
            # gzip streams decompress on one core each: read tables side by side.
            with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
                for done in [pool.submit(self._copy, con.cursor(), t, path, sink) for t, path in plan]:
                    done.result()
        finally:
            con.close()

    @staticmethod
    def _copy(cursor: duckdb.DuckDBPyConnection, t: Table, path: Path, sink: TableSink) -> None:
        try:
            for batch in cursor.sql(read_csv_sql(path, t)).to_arrow_reader(BATCH_ROWS):
                sink.write(t.name, batch)
        except (duckdb.Error, OSError) as exc:
            raise _explain(path, t, exc) from exc
        finally:
            cursor.close()

