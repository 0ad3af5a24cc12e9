"""A built benchmark opened once per process, and each episode's guarded view of it.

Every pair's overlay is loaded once into one :class:`pipeline.noise.overlay.Database`, over the
staged base attached read-only from a :func:`~pipeline.staging.staged_database` file: the
evaluation runner writes one that all its workers share, and a process opening a benchmark on
its own writes one for its lifetime. No process holds a copy of the base; each caches the blocks
it reads within its memory cap. Agent queries never run on its own views (those carry
``_rid``): every agent-facing table is a view ``SELECT * EXCLUDE (_rid)``, in schema ``clean``
over the base table, and in schema ``noisy_<table>`` over the overlay view of each table some
overlay touches. Each Env has its own DuckDB cursor whose ``overlay_id`` variable is its pair's
overlay and whose search path lists the ``noisy_`` schemas of the tables that overlay touches,
then ``clean``: untouched tables are read straight from the base, without the overlay's anti-join.
After loading, the connection is hardened for the whole process: no file system, no extension
loading, no spill directory, a memory cap, and the configuration locked.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import threading
import time
import warnings
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.gym.guard import check
from pipeline.noise.overlay import Database, changes_from_records
from pipeline.schema import ROW_ID, TABLES
from pipeline.staging import staged_database

CLEAN_SCHEMA = "clean"
NOISY_PREFIX = "noisy_"
NEEDED = ("pairs.parquet", "overlays.parquet", "staged")

# Columns of pairs.parquet the agent may see during an episode; the rest is gold.
PUBLIC = ("pair_id", "seed", "intent", "level", "noise_level", "operator", "split", "answer_type")


class QueryError(RuntimeError):
    """A guarded query failed or was stopped; the message is for the agent."""


@dataclass(frozen=True)
class Pair:
    """One pair of pairs.parquet: public fields, and the gold the environment alone reads."""

    pair_id: str
    seed: int
    intent: str
    level: str
    noise_level: str
    operator: str
    split: str
    answer_type: str
    clean_question: str
    noisy_question: str
    clean_answer: str
    expected_behavior: str
    expected_answer: str | None
    discrepancy: str

    def question(self, side: str) -> str:
        return self.clean_question if side == "clean" else self.noisy_question


class Benchmark:
    """Pairs, staged base and all overlays of one benchmark folder, shared by every Env of a process."""

    _open: ClassVar[dict[Path, Benchmark]] = {}
    _lock: ClassVar[threading.Lock] = threading.Lock()

    @classmethod
    def open(cls, folder: str | os.PathLike, sql_memory_mb: int,
             staged_file: str | os.PathLike | None = None) -> Benchmark:
        """The process's one Benchmark of ``folder``, opened on first use (over ``staged_file``
        when given: a :func:`~pipeline.staging.staged_database` of ``folder/staged``)."""
        path = Path(folder).resolve()
        with cls._lock:
            if path not in cls._open:
                cls._open[path] = cls(path, sql_memory_mb, staged_file)
            return cls._open[path]

    def __init__(self, folder: Path, sql_memory_mb: int, staged_file: str | os.PathLike | None = None):
        missing = [n for n in NEEDED if not (folder / n).exists()]
        if missing:
            raise FileNotFoundError(f"benchmark folder {folder} lacks {', '.join(missing)}: "
                                    "build one with `ehr-robustgym build`")
        self.folder = folder
        if staged_file is None:  # this process's own, deleted when it exits
            owned = contextlib.ExitStack()
            staged_file = owned.enter_context(staged_database(folder / "staged"))
            atexit.register(owned.close)
        self.staged_file = Path(staged_file)
        names = [f for f in Pair.__dataclass_fields__]
        self.pairs: dict[str, Pair] = {
            r["pair_id"]: Pair(**{k: r[k] for k in names})
            for r in pq.read_table(folder / "pairs.parquet", columns=names).to_pylist()}
        self.categories = sorted({p.discrepancy for p in self.pairs.values()})
        by_pair: dict[str, list[dict]] = defaultdict(list)
        for r in pq.read_table(folder / "overlays.parquet").to_pylist():
            by_pair[r["pair_id"]].append(r)
        self.overlay_ids = {pid: i + 1 for i, pid in enumerate(sorted(by_pair))}
        self.search_paths = {pid: ",".join([*sorted({NOISY_PREFIX + r["table_name"] for r in rows}), CLEAN_SCHEMA])
                             for pid, rows in by_pair.items()}
        self.db = Database(folder / "staged", staged_file=staged_file)
        self.db.load({self.overlay_ids[pid]: changes_from_records(rows) for pid, rows in by_pair.items()})
        self.tables = {t: [(c.name, c.type) for c in TABLES[t].columns] for t in self.db.tables}
        con = self.db.con
        con.execute(f"CREATE SCHEMA {CLEAN_SCHEMA}").fetchall()
        for t in self.db.tables:
            con.execute(f"CREATE VIEW {CLEAN_SCHEMA}.{t} AS SELECT * EXCLUDE ({ROW_ID}) FROM base.{t}").fetchall()
        for t in sorted({r["table_name"] for rows in by_pair.values() for r in rows}):
            con.execute(f"CREATE SCHEMA {NOISY_PREFIX}{t}").fetchall()
            con.execute(f"CREATE VIEW {NOISY_PREFIX}{t}.{t} AS SELECT * EXCLUDE ({ROW_ID}) FROM {self.db.overlaid(t)}").fetchall()
        row = con.execute("SELECT coalesce(sum(memory_usage_bytes), 0) FROM duckdb_memory()").fetchone()
        if row is None:
            raise RuntimeError("DuckDB returned no row for the memory in use (an aggregate always has one)")
        used = row[0]
        for setting in ("temp_directory = ''",
                        f"max_memory = '{used // 2**20 + sql_memory_mb}MB'",
                        "autoload_known_extensions = false",
                        "autoinstall_known_extensions = false",
                        "enable_external_access = false",
                        "lock_configuration = true"):
            con.execute(f"SET {setting}").fetchall()

    def pair(self, pair_id: str) -> Pair:
        try:
            return self.pairs[pair_id]
        except KeyError:
            raise KeyError(f"no pair {pair_id!r} in {self.folder / 'pairs.parquet'}") from None

    def connect(self) -> EpisodeDB:
        return EpisodeDB(self)


class EpisodeDB:
    """One Env's cursor: unqualified names show its episode's tables, without ``_rid``."""

    def __init__(self, benchmark: Benchmark):
        self.benchmark = benchmark
        self.cursor = benchmark.db.con.cursor()
        self.watchdog = Watchdog(self.cursor.interrupt)
        self.use("", "clean")

    def use(self, pair_id: str, side: str) -> None:
        noisy = side == "noise" and pair_id in self.benchmark.overlay_ids
        oid = self.benchmark.overlay_ids[pair_id] if noisy else Database.CLEAN
        path = self.benchmark.search_paths[pair_id] if noisy else CLEAN_SCHEMA
        self.cursor.execute(f"SET VARIABLE overlay_id = {int(oid)}; SET search_path = '{path}'").fetchall()

    def query(self, sql: str, seconds: float) -> pa.Table:
        """Guard ``sql``, run it with a wall-time limit, return its rows; :class:`QueryError` otherwise."""
        sql = check(sql)
        self.watchdog.arm(seconds)
        try:
            # execute() + an Arrow reader is ~20% faster on the demo's gold SQL than the relation API
            # duckdb's warning recommends (that binds the query twice)
            result = self.cursor.execute(sql)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                # duckdb's stub types to_arrow_reader() as RecordBatchReader | None, but with no open
                # result it raises InvalidInputException; it never returns None
                return result.to_arrow_reader().read_all()  # type: ignore[union-attr]
        except duckdb.InterruptException:
            raise QueryError(f"query stopped: it ran longer than the {seconds:g} s limit") from None
        except duckdb.Error as exc:
            raise QueryError(_agent_message(exc)) from None
        finally:
            self.watchdog.disarm()

    def close(self) -> None:
        self.watchdog.close()
        self.cursor.close()


class Watchdog:
    """One thread that calls ``interrupt`` when an armed deadline passes.

    A timer thread per query would cost a thread start each time (milliseconds on a busy machine);
    arming and disarming this one is a lock and a notify.
    """

    def __init__(self, interrupt: Callable[[], None]):
        self._interrupt = interrupt
        self._cond = threading.Condition()
        self._deadline: float | None = None
        self._closed = False
        threading.Thread(target=self._run, name="gym-sql-watchdog", daemon=True).start()

    def arm(self, seconds: float) -> None:
        with self._cond:
            self._deadline = time.monotonic() + seconds
            self._cond.notify()

    def disarm(self) -> None:
        with self._cond:
            self._deadline = None

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()

    def _run(self) -> None:
        with self._cond:
            while not self._closed:
                if self._deadline is None:
                    self._cond.wait()
                elif time.monotonic() >= self._deadline:
                    self._deadline = None
                    self._interrupt()
                else:
                    self._cond.wait(self._deadline - time.monotonic())


def _agent_message(exc: duckdb.Error) -> str:
    """DuckDB's message without internal schema prefixes (the agent knows tables by plain names)."""
    return _SCHEMA_PREFIX.sub("", str(exc)).strip()


_SCHEMA_PREFIX = re.compile(rf"\b(?:{CLEAN_SCHEMA}|{NOISY_PREFIX}\w+?)\.")
