"""Staging: every source writes the registry's tables as typed Parquet with a ``_rid`` column.

A :class:`TableSink` receives Arrow data table by table (the CSV sources) or chunk by chunk
across tables (the synthetic generator), casts it to the registry's schema, numbers rows and
writes zstd Parquet under temporary names. Only :meth:`TableSink.commit` renames them into
place, so a failed run leaves no partial ``<table>.parquet`` behind.

Casting, encoding and compressing run on a small thread pool (pyarrow releases the GIL), so a
source keeps producing while earlier data is written. Each table's writes still run one at a
time in submission order, so the files are byte-identical whatever the timing.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
import threading
import time
from collections import deque
from collections.abc import Collection, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.files import temp_path
from pipeline.schema import ROW_ID, TABLES, table
from pipeline.sql import parquet_scan, path_literal, quote_string
from pipeline.workers import worker_pool

PARQUET_OPTIONS = dict(compression="zstd", compression_level=3, row_group_size=1 << 20,
                       dictionary_pagesize_limit=1 << 16)  # high-cardinality text falls back to plain early
IN_FLIGHT_BYTES = 128 << 20
"""Data handed to the writer threads but not yet written; a source that runs ahead waits."""


class StagingError(RuntimeError):
    """Bad input for staging; the message names the file, table, column or line at fault."""


class SettingError(ValueError):
    """An environment setting the build cannot use; the message names the variable."""


class MemoryBudgetError(SettingError):
    """DuckDB ran out of the memory budget (:func:`memory_limit`) on a query the data needs."""


def staged_path(staged_dir: str | os.PathLike, table_name: str) -> Path:
    return Path(staged_dir) / f"{table_name}.parquet"


def staged_tables(staged_dir: str | os.PathLike) -> list[str]:
    """The registry's tables staged in ``staged_dir``; a folder with none of them is an error."""
    present = [name for name in TABLES if staged_path(staged_dir, name).is_file()]
    if not present:
        raise FileNotFoundError(f"no staged tables (<table>.parquet) in {staged_dir}")
    return present


def attach_staged(con: duckdb.DuckDBPyConnection, staged_dir: str | os.PathLike, *, kind: str = "VIEW",
                  schema: str = "main", tables: Iterable[str] | None = None) -> list[str]:
    """Make each staged table in ``staged_dir`` queryable on ``con`` as ``schema.<name>``.

    A ``VIEW`` scans the Parquet file at query time (cheap to open, for one pass over big tables);
    a ``TABLE`` loads it once (for many small queries), its rows stored by patient
    (:func:`stored_order`). Tables without a file are skipped: the names of those present come
    back in registry order.
    """
    if kind not in ("VIEW", "TABLE"):
        raise ValueError(f"kind must be VIEW or TABLE, not {kind!r}")
    present = []
    for name in tables if tables is not None else TABLES:
        path = staged_path(staged_dir, name)
        if path.is_file():
            order = f" ORDER BY {stored_order(name)}" if kind == "TABLE" else ""
            con.execute(f"CREATE {kind} {schema}.{name} AS SELECT * FROM {parquet_scan(path)}{order}").fetchall()
            present.append(name)
    return present


def stored_order(table_name: str) -> str:
    """The order a loaded table's rows are stored in: a patient's rows together (then by ``_rid``,
    a total order), so the min/max zone maps of its row groups let a query about one patient read
    one or two of them instead of the whole table (10,000 patients: a patient's lab query 11.5 ms
    -> 4.1 ms). Staged files keep the source's order, which clusters nothing."""
    return f"subject_id, {ROW_ID}" if TABLES[table_name].has("subject_id") else ROW_ID


MEMORY_SHARE = 0.4
"""Share of the machine's memory the DuckDB buffer pools of one build may fill together, at most
:data:`MEMORY_BUDGET_MIB`."""

MEMORY_BUDGET_MIB = 2560
"""The default budget of all a build's DuckDB buffer pools together, whatever the data size: the
workers read one staged file on disk and the system's page cache keeps it, so a larger pool buys
little (10,000 patients, 2 workers: 405 s and 3,581 MiB peak at this budget, 456 s and 4,096 MiB
at 40% of 24 GB)."""


WRITER_MEMORY_MIB = 1024
"""At most this for the process writing the staged database: it streams table by table, and a larger
pool only keeps written blocks cached (10,000 patients: 3.5 GB resident at a 9.6 GB budget, 1.1 GB
at this one, 15.0 -> 17.6 s)."""


def memory_limit(processes: int = 1, at_most_mib: int | None = None) -> str:
    """Each DuckDB process's ``memory_limit``: ``EHR_ROBUSTGYM_DUCKDB_MEMORY`` (a size for all of
    them together, e.g. ``8GB`` or ``6GiB``) or :data:`MEMORY_BUDGET_MIB` (40% of the machine's
    memory if that is less), split over ``processes`` (and no more than ``at_most_mib``). Beyond it
    DuckDB evicts cached blocks and spills to its temp directory."""
    total = os.environ.get("EHR_ROBUSTGYM_DUCKDB_MEMORY")
    if total:
        budget = _bytes(total, "EHR_ROBUSTGYM_DUCKDB_MEMORY")
    else:
        budget = min(int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") * MEMORY_SHARE),
                     MEMORY_BUDGET_MIB << 20)
    share = max(256, budget // max(1, processes) >> 20)
    return f"{min(share, at_most_mib) if at_most_mib else share}MiB"


_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}


def _bytes(size: str, name: str) -> int:
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", size)
    if match is None or match.group(2).lower() not in _UNITS:
        raise SettingError(f"{name}={size!r}: not a size (e.g. 8GB, 6GiB, 512MB)")
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


def temp_dir() -> str:
    """Where DuckDB spills and the staged database file lives: ``EHR_ROBUSTGYM_TEMP_DIR`` or the
    system's temporary folder."""
    return os.environ.get("EHR_ROBUSTGYM_TEMP_DIR") or tempfile.gettempdir()


def configure(con: duckdb.DuckDBPyConnection, processes: int = 1, at_most_mib: int | None = None) -> None:
    """Bound one connection's memory (see :func:`memory_limit`) and give it a place to spill."""
    for setting, value in (("memory_limit", memory_limit(processes, at_most_mib)), ("temp_directory", temp_dir()),
                           ("enable_progress_bar", False)):
        con.execute(f"SET {setting} = {quote_string(value) if isinstance(value, str) else value}").fetchall()


_STAGED_PREFIX = "ehr-robustgym-staged-"  # then the pid of the process that made the folder


@contextlib.contextmanager
def staged_database(staged_dir: str | os.PathLike) -> Iterator[Path]:
    """A DuckDB file with every staged table, for the length of the block (then deleted).

    Stages that run many small queries from several processes attach it read-only: the data is
    on disk once, and each process holds only the blocks its buffer pool caches (bounded by
    :func:`memory_limit`) instead of its own copy of every table."""
    tables = staged_tables(staged_dir)
    _remove_orphaned_databases()
    folder = Path(tempfile.mkdtemp(prefix=f"{_STAGED_PREFIX}{os.getpid()}-", dir=temp_dir()))
    path = folder / "staged.duckdb"
    try:
        # Written by a process of its own: the writer's memory goes back to the system when that
        # process ends, instead of staying with this one's allocator for the rest of the build
        # (10,000 patients: the build process held 1,527 MiB in the question stage, now 673-781).
        with worker_pool(1) as writer:
            writer.submit(_write_staged_database, str(staged_dir), tables, str(path)).result()
        yield path
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _write_staged_database(staged_dir: str, tables: list[str], path: str) -> None:
    with duckdb.connect(path) as con:
        configure(con, at_most_mib=WRITER_MEMORY_MIB)
        # Stored plain, blocks scan as fast as an in-memory table's (compressed, the question
        # stage's small queries took 1.7x as long on the demo); disk is the cheaper resource.
        con.execute("SET force_compression = 'uncompressed'").fetchall()
        attach_staged(con, staged_dir, kind="TABLE", tables=tables)
        con.execute("CHECKPOINT").fetchall()


def _remove_orphaned_databases() -> None:
    """Delete staged database folders of processes that no longer run (a build killed by SIGKILL
    cannot delete its own)."""
    for folder in Path(temp_dir()).glob(f"{_STAGED_PREFIX}*-*"):
        pid = folder.name[len(_STAGED_PREFIX):].split("-", 1)[0]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(folder, ignore_errors=True)


def attach_database(con: duckdb.DuckDBPyConnection, path: str | os.PathLike, name: str) -> list[str]:
    """Attach a :func:`staged_database` file read-only as catalog ``name`` and let unqualified names
    reach it after ``main``'s own (no views: binding one per query adds up); its tables, in registry order."""
    con.execute(f"ATTACH {path_literal(Path(path))} AS {name} (READ_ONLY)").fetchall()
    con.execute(f"SET search_path = 'main,{name}.main'").fetchall()
    found = {r[0] for r in con.execute(f"SELECT table_name FROM duckdb_tables() WHERE database_name = '{name}'")
             .fetchall()}
    return [t for t in TABLES if t in found]


@dataclass
class StageReport:
    source: str
    out_dir: Path
    rows: dict[str, int] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)  # table -> reason
    seconds: float = 0.0

    @property
    def total_rows(self) -> int:
        return sum(self.rows.values())

    def summary(self) -> str:
        lines = [f"{name:<20} {n:>12,}" for name, n in sorted(self.rows.items())]
        lines += [f"{name:<20} {'skipped':>12}  ({why})" for name, why in sorted(self.skipped.items())]
        lines.append(
            f"staged {len(self.rows)} tables, {self.total_rows:,} rows from {self.source} "
            f"into {self.out_dir} in {self.seconds:.2f} s"
        )
        return "\n".join(lines)


class _Budget:
    """Bounds the bytes queued for writing, so a fast source cannot pile up memory."""

    def __init__(self, limit: int):
        self.limit, self.used = limit, 0
        self.cond = threading.Condition()

    def take(self, n: int) -> None:
        with self.cond:
            self.cond.wait_for(lambda: self.used == 0 or self.used + n <= self.limit)
            self.used += n

    def give(self, n: int) -> None:
        with self.cond:
            self.used -= n
            self.cond.notify_all()


class _TableWriter:
    """One table's Parquet file; its queued writes are drained by one pool thread at a time."""

    def __init__(self, table_name: str, final: Path, pool: ThreadPoolExecutor, budget: _Budget):
        self.name = table_name
        self.schema = table(table_name).arrow_schema
        self.final = final
        self.tmp = temp_path(final)
        self.writer = pq.ParquetWriter(self.tmp, self.schema, **_writer_options())
        self.rows = 0
        self.error: BaseException | None = None
        self._pool, self._budget = pool, budget
        self._queue: deque[tuple[pa.Table, int, int]] = deque()
        self._lock = threading.Lock()
        self._draining = False

    def submit(self, data: pa.Table) -> None:
        size = data.nbytes
        self._budget.take(size)
        with self._lock:
            self._queue.append((data, self.rows, size))
            self.rows += data.num_rows
            if self._draining:
                return
            self._draining = True
        self._pool.submit(self._drain)

    def _drain(self) -> None:
        while True:
            with self._lock:
                if not self._queue:
                    self._draining = False
                    return
                data, first_row, size = self._queue.popleft()
            try:
                if self.error is None:
                    self._write(data, first_row)
            except BaseException as exc:  # surfaced by TableSink.write/commit
                self.error = exc
            finally:
                self._budget.give(size)

    def _write(self, data: pa.Table, first_row: int) -> None:
        data = _cast(self.name, data)
        rid = pa.array(np.arange(first_row, first_row + data.num_rows, dtype=np.int64))
        batch = pa.Table.from_arrays(list(data.columns) + [rid], schema=self.schema)
        self.writer.write_table(batch, row_group_size=PARQUET_OPTIONS["row_group_size"])


def _writer_options() -> dict:
    return {k: v for k, v in PARQUET_OPTIONS.items() if k != "row_group_size"}


class TableSink:
    """Collects Arrow data per table; all files appear together on :meth:`commit`."""

    def __init__(self, out_dir: str | os.PathLike, tables: Collection[str]):
        self.out_dir = Path(out_dir)
        self.tables = tuple(tables)
        self._writers: dict[str, _TableWriter] = {}
        self._open = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=os.cpu_count() or 1, thread_name_prefix="parquet")
        self._budget = _Budget(IN_FLIGHT_BYTES)
        self.skipped: dict[str, str] = {}

    def write(self, table_name: str, data: pa.Table | pa.RecordBatch) -> None:
        """Append rows of ``table_name``; they are cast to the registry's types by name."""
        if table_name not in self.tables:
            return
        self._raise_failed()
        with self._open:
            writer = self._writers.get(table_name)
            if writer is None:
                self.out_dir.mkdir(parents=True, exist_ok=True)
                writer = self._writers[table_name] = _TableWriter(
                    table_name, staged_path(self.out_dir, table_name), self._pool, self._budget)
        writer.submit(_select(table_name, data))

    def skip(self, table_name: str, reason: str) -> None:
        if table_name in self.tables:
            self.skipped[table_name] = reason

    def commit(self) -> dict[str, int]:
        for name in self.tables:
            if name not in self._writers and name not in self.skipped:
                self.write(name, pa.Table.from_pylist([], schema=_data_schema(name)))
        self._pool.shutdown(wait=True)
        self._raise_failed()
        for w in self._writers.values():
            w.writer.close()
        for w in self._writers.values():
            os.replace(w.tmp, w.final)
        return {name: w.rows for name, w in self._writers.items()}

    def abort(self) -> None:
        """Stop writing and delete every temporary file (a writer broken by the failure must not stop that)."""
        self._pool.shutdown(wait=True, cancel_futures=True)
        for w in self._writers.values():
            with contextlib.suppress(Exception):
                w.writer.close()
            w.tmp.unlink(missing_ok=True)

    def _raise_failed(self) -> None:
        for w in list(self._writers.values()):
            if w.error is not None:
                raise w.error


def _data_schema(table_name: str) -> pa.Schema:
    schema = table(table_name).arrow_schema
    return schema.remove(schema.get_field_index(ROW_ID))


def _select(table_name: str, data: pa.Table | pa.RecordBatch) -> pa.Table:
    """The registry's columns of ``table_name`` in order; a missing or extra column fails here, at once."""
    if isinstance(data, pa.RecordBatch):
        data = pa.Table.from_batches([data])
    expected = _data_schema(table_name)
    missing = [f.name for f in expected if f.name not in data.column_names]
    extra = [n for n in data.column_names if n not in expected.names]
    if missing or extra:
        raise StagingError(
            f"table {table_name}: columns do not match the MIMIC-IV v2.2 registry"
            + (f"; missing {missing}" if missing else "")
            + (f"; unexpected {extra}" if extra else ""))
    return data.select(expected.names)


def _cast(table_name: str, data: pa.Table) -> pa.Table:
    expected = _data_schema(table_name)
    if data.schema.equals(expected):
        return data
    try:
        return data.cast(expected)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise StagingError(f"table {table_name}: cannot cast to registry types: {exc}") from exc


class Source(Protocol):
    """A MIMIC-IV source: writes the requested tables into a sink (or marks them skipped)."""

    name: str

    def emit(self, sink: TableSink) -> None: ...


def stage(source: Source, out_dir: str | os.PathLike, tables: Iterable[str] | None = None) -> StageReport:
    """Stage ``tables`` (default: all 31) from ``source`` into ``out_dir/<table>.parquet``."""
    wanted = tuple(tables) if tables is not None else tuple(TABLES)
    for name in wanted:
        table(name)  # unknown names fail before any work
    started = time.perf_counter()
    sink = TableSink(out_dir, wanted)
    try:
        source.emit(sink)
        rows = sink.commit()
    except BaseException:
        sink.abort()
        raise
    for name in sink.skipped:
        staged_path(out_dir, name).unlink(missing_ok=True)
    return StageReport(source.name, Path(out_dir), rows, dict(sink.skipped),
                       time.perf_counter() - started)
