"""One pair's database as a standalone DuckDB file, for a reviewer's duckdb CLI or SQL tool.

The clean side is the benchmark's staged tables; the noise side is the same with the pair's
overlay applied (:class:`pipeline.noise.overlay.Database`). Either way the file holds the
MIMIC-IV tables as the agent sees them: registry names and columns, no ``_rid``, no other pair.
"""

from __future__ import annotations

import contextlib
import os
import shlex
from dataclasses import dataclass
from pathlib import Path

import duckdb
import pyarrow.parquet as pq

from pipeline.files import temp_path
from pipeline.layout import RunLayout
from pipeline.noise.overlay import Database, changes_from_records
from pipeline.schema import ROW_ID, TABLES
from pipeline.sql import parquet_scan, path_literal
from pipeline.staging import staged_path

SIDES = ("clean", "noise")


class ExportError(RuntimeError):
    """The benchmark folder lacks what the export needs; the message says what."""


@dataclass
class PairExport:
    out: Path
    tables: dict[str, int]  # table -> rows written
    changed: int  # overlay rows applied

    def summary(self) -> str:
        return (f"wrote {self.out}: {len(self.tables)} tables, {sum(self.tables.values()):,} rows"
                f" ({self.changed} overlay change(s) applied)")


def export_command(benchmark: str | os.PathLike, pair_id: str, side: str, out: str | os.PathLike) -> str:
    """The shell command that exports ``pair_id``'s ``side`` (shown on the audit page)."""
    return shlex.join(["ehr-robustgym", "export-pair", "--benchmark", str(benchmark), "--pair", pair_id,
                       "--side", side, "--out", str(out)])


def export_pair(benchmark: str | os.PathLike, pair_id: str, side: str, out: str | os.PathLike) -> PairExport:
    """Write ``side`` (``clean`` or ``noise``) of pair ``pair_id`` in ``benchmark`` to the DuckDB
    file ``out``, atomically: the file appears complete or not at all."""
    if side not in SIDES:
        raise ExportError(f"side must be one of {', '.join(SIDES)}, not {side!r}")
    layout = RunLayout(Path(benchmark))
    staged = layout.published_staged
    for needed in (layout.pairs, layout.overlays, staged):
        if not needed.exists():
            raise ExportError(f"{needed} not found: is {benchmark} a benchmark folder?")
    if not pq.read_table(layout.pairs, columns=["pair_id"], filters=[("pair_id", "=", pair_id)]).num_rows:
        raise ExportError(f"no pair {pair_id!r} in {layout.pairs}")
    changes = pq.read_table(layout.overlays, filters=[("pair_id", "=", pair_id)]).to_pylist()
    overlay = changes_from_records(changes) if side == "noise" else changes_from_records([])
    present = [t for t in TABLES if staged_path(staged, t).is_file()]
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(out)
    tmp.unlink(missing_ok=True)
    # Only the tables the overlay touches are loaded; the rest stream from Parquet into the file.
    db = Database(staged, tables=overlay.tables) if overlay else None
    con = db.con if db else duckdb.connect()
    written: dict[str, int] = {}
    try:
        con.execute(f"ATTACH {path_literal(tmp)} AS export").fetchall()
        with db.noisy(overlay) if db else contextlib.nullcontext():
            for table in present:
                rows = (Database.overlaid(table) if table in overlay.tables
                        else parquet_scan(staged_path(staged, table)))
                con.execute(f"CREATE TABLE export.{table} AS SELECT * EXCLUDE ({ROW_ID}) FROM {rows} "
                            f"ORDER BY {ROW_ID}").fetchall()
                written[table] = con.execute(f"SELECT count(*) FROM export.{table}").fetchone()[0]
        con.execute("DETACH export").fetchall()
        os.replace(tmp, out)
    except duckdb.Error as exc:
        raise ExportError(f"exporting {pair_id} ({side}) failed: {exc}") from exc
    finally:
        con.close()
        tmp.unlink(missing_ok=True)
        Path(f"{tmp}.wal").unlink(missing_ok=True)
    return PairExport(out, written, len(overlay.changes))
