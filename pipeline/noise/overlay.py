"""Overlays: a pair's noisy database is the staged base plus a handful of row changes.

The base tables live once in a DuckDB connection (schema ``base``, or an attached read-only
file); unqualified names reach them through the search path. An overlay shows only the tables it
touches differently: each such table has a view ``overlay_<table>.<table>`` = ``base rows minus
changed rids UNION ALL patched rows`` (the patch is a tiny table), and selecting the overlay puts
those schemas first on the search path. Opening a pair's noisy database therefore costs
O(overlay), never a copy of the base, and a query pays for the overlay's anti-join only on the
tables the overlay touches (the clean base pays for none: about half the cost of a small query).
"""

from __future__ import annotations

import datetime as dt
import json
import os
from collections import defaultdict
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import pyarrow as pa

from pipeline.schema import ROW_ID, TABLES
from pipeline.sql import register_macros
from pipeline.staging import attach_database, attach_staged, configure


@dataclass(frozen=True)
class Change:
    """One overlay row: delete a row, insert a row (``new_value`` is the whole row), or update a cell."""

    table: str
    op: str
    rid: int
    column: str | None = None
    new_value: object = None

    def new_value_json(self) -> str | None:
        if self.op == "delete":
            return None
        return json.dumps(self.new_value, default=_json_default, ensure_ascii=False, sort_keys=True,
                          separators=(",", ":"))


def _json_default(value):
    if isinstance(value, (dt.datetime, dt.date)):
        return value.isoformat(sep=" ") if isinstance(value, dt.datetime) else value.isoformat()
    raise TypeError(f"cannot encode {type(value).__name__} in an overlay")


@dataclass
class Overlay:
    changes: list[Change] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.changes)

    @property
    def tables(self) -> list[str]:
        return sorted({c.table for c in self.changes})

    def by_table(self) -> dict[str, list[Change]]:
        grouped: dict[str, list[Change]] = defaultdict(list)
        for c in self.changes:
            grouped[c.table].append(c)
        return grouped


OVERLAY_PREFIX = "overlay_"
_REMOVED_SCHEMA = pa.schema([("overlay_id", pa.int64()), (ROW_ID, pa.int64())])


class Database:
    """The staged base, loaded once, plus any number of overlays selectable by id.

    A table an overlay touches is read through the view :meth:`overlaid` ``= base rows whose _rid
    is not removed by the active overlay UNION ALL the active overlay's patched rows``; the active
    overlay is a session variable and its tables' view schemas lead the search path, so switching
    between pairs is one statement and loading an overlay costs O(its rows). Overlay id -1 is the
    clean base.
    """

    CLEAN = -1
    PURGE_BATCH = 256
    MEMO_ROWS = 256  # larger results are asked again rather than held: a memo's memory stays small
    VALUES_ROWS = 16  # patch rows up to which an insert binds values rather than registering Arrow
    ROW_CACHE = 8192  # base rows kept by (table, _rid) for :meth:`base_rows` (a few MB)
    CLEAN_ROWS = 262_144  # rows of results on the clean base kept by SQL (tens of MB; a 16th at most each)

    def __init__(self, staged_dir: str | os.PathLike, tables: Iterable[str] | None = None,
                 staged_file: str | os.PathLike | None = None, processes: int = 1):
        """The base is loaded from ``staged_dir``'s Parquet, or, given ``staged_file`` (a
        :func:`~pipeline.staging.staged_database`), attached read-only from it: shared on disk by
        every process, cached within this one's memory limit (the budget split over ``processes``)."""
        self.staged_dir = Path(staged_dir)
        # Many small queries: one thread avoids scheduling overhead that dwarfs their work.
        self.con = duckdb.connect(config={"threads": 1})
        configure(self.con, processes)
        register_macros(self.con)
        self.con.execute("CREATE SCHEMA patch").fetchall()
        self.shared = staged_file is not None
        if staged_file is not None:
            wanted = set(tables or TABLES)
            self.tables = [t for t in attach_database(self.con, staged_file, "base") if t in wanted]
            self._base_path = "main,base.main"
        else:
            self.con.execute("CREATE SCHEMA base").fetchall()
            self.tables = attach_staged(self.con, self.staged_dir, kind="TABLE", schema="base", tables=tables or None)
            self._base_path = "main,base"
        self._overlaid: set[str] = set()
        self._overlay_of: dict[int, Overlay] = {}  # loaded overlays by id
        self._stale: set[int] = set()  # unloaded overlays whose patch rows are not deleted yet
        self._stale_tables: set[str] = set()  # the tables they touch
        self._names: set[str] = set()
        self._next_id = 0
        self._active: int | None = None
        self._path: str | None = None  # the search path set last
        self._memo: dict | None = None
        self._deferring: list[tuple[Overlay, str]] | None = None  # noisy queries put off (:meth:`deferring`)
        self._deferred: tuple[int, Overlay] | None = None  # a memoized noisy block's overlay, not loaded yet
        self._row_cache: dict[tuple[str, int], dict] = {}
        self._clean_results: dict[str, tuple[list[str], list[tuple]]] = {}
        self._clean_rows = 0  # rows (and results) held in _clean_results
        self._largest: dict[tuple[str, str], object] = {}
        self.use(self.CLEAN)

    def close(self) -> None:
        self.con.close()

    def has(self, name: str) -> bool:
        return name in self.tables

    def rows(self, sql: str) -> list[tuple]:
        return list(self._fetch(sql)[1])

    def records(self, sql: str) -> list[dict]:
        """Rows as dicts (plain fetch: for a handful of rows far cheaper than going through Arrow)."""
        names, rows = self._fetch(sql)
        return [dict(zip(names, row)) for row in rows]

    def _fetch(self, sql: str) -> tuple[list[str], list[tuple]]:
        """Column names and rows of ``sql``: from the memo when one is active and holds them."""
        if self._memo is None:
            return self._run(sql)
        key = (self._overlay_key(), sql)
        if key in self._memo:
            return self._memo[key]
        self._show_deferred()
        result = self._on_clean_base(sql) if self._active == self.CLEAN else self._run(sql)
        if len(result[1]) <= self.MEMO_ROWS:
            self._memo[key] = result
        return result

    def _run(self, sql: str) -> tuple[list[str], list[tuple]]:
        cursor = self.con.execute(sql)
        return [d[0] for d in cursor.description or ()], cursor.fetchall()

    def _on_clean_base(self, sql: str) -> tuple[list[str], list[tuple]]:
        """:meth:`_run` on the clean base, for a memoized block (whose queries read the staged
        tables, never the patch tables): the base never changes, so a query any block asked before
        is answered from :attr:`_clean_results` (operators trying one question ask its evidence
        and answers again)."""
        if (known := self._clean_results.get(sql)) is not None:
            return known
        result = self._run(sql)
        if len(result[1]) <= self.CLEAN_ROWS // 16:
            self._clean_rows += len(result[1]) + 1
            if self._clean_rows > self.CLEAN_ROWS:
                self._clean_results.clear()
                self._clean_rows = len(result[1]) + 1
            self._clean_results[sql] = result
        return result

    @contextmanager
    def memoized(self, memo: dict) -> Iterator[None]:
        """Within the block, :meth:`rows` and :meth:`records` answer a query asked before under
        the same overlay from ``memo`` and store new ones there (up to :attr:`MEMO_ROWS` rows).
        DuckDB on one thread gives an unchanged base's rows in the same order, so a replay is what
        re-running would return."""
        outer, self._memo = self._memo, memo
        try:
            yield
        finally:
            self._memo = outer

    def _show_deferred(self) -> None:
        """Load and select the overlay a memoized :meth:`noisy` block put off."""
        if self._deferred is not None:
            (oid, overlay), self._deferred = self._deferred, None
            self.load({oid: overlay})
            self.use(oid)

    def _overlay_key(self) -> tuple | None:
        """The active overlay's changes: the same noisy database under any overlay id."""
        if self._deferred is not None:
            overlay: Overlay | None = self._deferred[1]
        else:
            overlay = self._overlay_of.get(self._active) if self._active is not None else None
        return _memo_key(overlay)

    @staticmethod
    def remembers(memo: dict, overlay: Overlay, sql: str) -> bool:
        """Whether :meth:`memoized` with ``memo`` answers ``sql`` under ``overlay`` without asking DuckDB."""
        return (_memo_key(overlay if overlay else None), sql) in memo

    @classmethod
    def remember(cls, memo: dict, overlay: Overlay, sql: str, names: list[str], rows: list[tuple]) -> None:
        """Store what ``sql`` gives under ``overlay`` in ``memo``, as :meth:`memoized` would have
        (results over :attr:`MEMO_ROWS` rows are left to be asked)."""
        if len(rows) <= cls.MEMO_ROWS:
            memo[(_memo_key(overlay if overlay else None), sql)] = (names, rows)

    @contextmanager
    def deferring(self, requests: list[tuple[Overlay, str]]) -> Iterator[None]:
        """Within the block, :meth:`defers` puts noisy queries off into ``requests`` instead of
        running them (the operators' first, dry pass: their queries are then answered in bulk)."""
        outer, self._deferring = self._deferring, requests
        try:
            yield
        finally:
            self._deferring = outer

    def defers(self, overlay: Overlay, sql: str) -> bool:
        """Whether ``sql`` under ``overlay`` is put off (:meth:`deferring`; not when the active memo
        already answers it)."""
        if self._deferring is None or (self._memo is not None and self.remembers(self._memo, overlay, sql)):
            return False
        self._deferring.append((overlay, sql))
        return True

    def scalar(self, sql: str):
        rows = self.rows(sql)
        return rows[0][0] if rows else None

    def largest(self, table: str, column: str):
        """The largest ``column`` of the base ``table`` (None when it holds none). The base never
        changes, so each is read once: one scan of labevents costs over a second at 100,000 patients."""
        if (table, column) not in self._largest:
            self._largest[(table, column)] = self._run(f"SELECT max({column}) FROM base.{table}")[1][0][0]
        return self._largest[(table, column)]

    def next_rid(self, table: str) -> int:
        """The ``_rid`` an inserted row of ``table`` takes first: past every base row's."""
        largest = self.largest(table, ROW_ID)
        return 0 if largest is None else largest + 1

    def base_rows(self, table: str, rids: Iterable[int], subject: int | None = None) -> list[dict]:
        """Rows of the base ``table`` with these ``_rid``s, in ``_rid`` order (fresh dicts).

        Base rows never change, so rows read before come from a bounded cache: an overlay patches
        the rows its operator just read, and each operator of a question reads the same evidence.
        Tables are stored by patient (:func:`~pipeline.staging.stored_order`), so a lookup by
        ``_rid`` alone scans the table; ``subject``, the patient the rows should belong to, lets
        zone maps skip to them (rows not found under it are then looked up without)."""
        wanted = sorted(set(rids))
        found = {r: row for r in wanted if (row := self._row_cache.get((table, r))) is not None}
        missing = [r for r in wanted if r not in found]
        if missing and subject is not None and TABLES[table].has("subject_id"):
            found.update(self._read_base(table, missing, f"subject_id = {int(subject)}"))
            missing = [r for r in missing if r not in found]
        if missing:
            found.update(self._read_base(table, missing))
        return [dict(found[r]) for r in wanted if r in found]

    def _read_base(self, table: str, rids: list[int], where: str | None = None) -> dict[int, dict]:
        # the range lets zone maps skip where _rid follows the stored order (a shared base has no _rid index)
        rows = self.records(f"SELECT * FROM base.{table} WHERE {f'{where} AND ' if where else ''}"
                            f"{ROW_ID} IN ({', '.join(map(str, rids))}) AND {ROW_ID} BETWEEN {rids[0]} AND {rids[-1]}")
        if len(rows) <= self.MEMO_ROWS:  # a population's evidence would only flush the cache
            if len(self._row_cache) + len(rows) > self.ROW_CACHE:
                self._row_cache.clear()
            self._row_cache.update(((table, row[ROW_ID]), row) for row in rows)
        return {row[ROW_ID]: row for row in rows}

    def names(self, dictionary: str, column: str) -> str:
        """A table of the distinct names in ``dictionary.column`` (with lower case and length), built
        once: name look-ups and edit-distance searches then scan only names of similar length.
        Stored by length, so the zone maps of ``len`` skip the rest (the demo's ICD titles: 2x
        faster searches)."""
        name = f"names.{dictionary}__{column}"
        if name not in self._names:
            self.con.execute("CREATE SCHEMA IF NOT EXISTS names").fetchall()
            self.con.execute(f"CREATE TABLE {name} AS SELECT DISTINCT {column} AS name, lower({column}) AS lname, "
                             f"length({column}) AS len FROM base.{dictionary} WHERE {column} IS NOT NULL "
                             f"ORDER BY len, name").fetchall()
            self._names.add(name)
        return name

    def use(self, overlay_id: int) -> None:
        """Make unqualified table names show the base with overlay ``overlay_id`` applied."""
        if overlay_id == self._active:
            return
        # Each SET is a statement of its own (a quarter of a small query's cost) and switching happens
        # several times per pair: only what changes is set. The clean base's path reaches no view, so
        # the variable the views read is left as it was.
        path = self.search_path(overlay_id)
        sets = [f"SET VARIABLE overlay_id = {int(overlay_id)}"] if overlay_id != self.CLEAN else []
        if path != self._path:
            sets.append(f"SET search_path = '{path}'")
        if sets:
            self.con.execute("; ".join(sets)).fetchall()
        self._active, self._path = overlay_id, path

    def search_path(self, overlay_id: int) -> str:
        """The search path under which unqualified names show overlay ``overlay_id``: the view
        schemas of the tables it touches, then the base."""
        overlay = self._overlay_of.get(overlay_id, Overlay())
        return ",".join([*(OVERLAY_PREFIX + t for t in overlay.tables), self._base_path])

    @staticmethod
    def overlaid(table: str) -> str:
        """The qualified name of ``table`` as the active overlay shows it (once an overlay touching
        ``table`` has been loaded). Only while an overlay is active: :meth:`use` leaves the views'
        variable as it was when switching to the clean base, whose tables are ``base.<table>``."""
        return f"{OVERLAY_PREFIX}{table}.{table}"

    def load(self, overlays: dict[int, Overlay]) -> None:
        """Register overlays under their ids, in bulk: one insert per touched table."""
        removed: dict[str, list[tuple[int, int]]] = defaultdict(list)
        patched: dict[str, list[dict]] = defaultdict(list)
        if self._active in overlays:
            self._active = None  # its search path changes
        for oid, overlay in overlays.items():
            self._overlay_of[oid] = overlay
            for table, changes in overlay.by_table().items():
                removed[table] += [(oid, rid) for rid in sorted({c.rid for c in changes if c.op != "insert"})]
                patched[table] += [{**row, "overlay_id": oid} for row in self._patch_rows(table, changes)]
        for table in sorted(set(removed) | set(patched)):
            self._make_overlayable(table)
            if removed[table]:
                self._insert(f"patch.{table}_removed", _REMOVED_SCHEMA,
                             [{"overlay_id": oid, ROW_ID: rid} for oid, rid in removed[table]])
            if patched[table]:
                schema = TABLES[table].arrow_schema.append(pa.field("overlay_id", pa.int64()))
                self._insert(f"patch.{table}_rows", schema, [_coerce(r, schema) for r in patched[table]])

    @contextmanager
    def noisy(self, overlay: Overlay) -> Iterator[Database]:
        """Within the block, :meth:`rows`, :meth:`scalar` and :meth:`records` see the base with
        ``overlay`` applied (and so do unqualified names on :attr:`con`, unless memoized). While
        :meth:`memoized`, the overlay is loaded only when a query misses the memo: a replay
        usually asks DuckDB nothing."""
        oid = self.new_id()
        self._deferred = (oid, overlay)
        if self._memo is None:
            self._show_deferred()
        try:
            yield self
        finally:
            self._deferred = None
            self.unload(oid)

    def new_id(self) -> int:
        self._next_id += 1
        return self._next_id

    def unload(self, overlay_id: int) -> None:
        """Forget overlay ``overlay_id``. Its patch rows are deleted with the next batch of
        forgotten overlays (ids are never reused, so no view shows them meanwhile): one statement
        per table the batch touched instead of two per table and overlay. An overlay never loaded
        (a memoized block that asked DuckDB nothing) has no rows to delete."""
        overlay = self._overlay_of.pop(overlay_id, None)
        if overlay_id == self._active:
            self.use(self.CLEAN)
        if overlay is None:
            return
        self._stale.add(overlay_id)
        self._stale_tables.update(overlay.tables)
        if len(self._stale) >= self.PURGE_BATCH:
            stale = ", ".join(map(str, sorted(self._stale)))
            self.con.execute("; ".join(f"DELETE FROM patch.{table}_{part} WHERE overlay_id IN ({stale})"
                                       for table in sorted(self._stale_tables) for part in ("removed", "rows"))).fetchall()
            self._stale.clear()
            self._stale_tables.clear()

    def _insert(self, target: str, schema: pa.Schema, rows: list[dict]) -> None:
        """Append ``rows`` to ``target``: a handful (one pair's overlay) as one INSERT with bound
        values, which costs a quarter of registering an Arrow table; many (a shard's overlays at
        once) through Arrow."""
        if len(rows) <= self.VALUES_ROWS:
            columns = ", ".join(f'"{f.name}"' for f in schema)
            row = f"({', '.join('?' * len(schema))})"
            self.con.execute(f"INSERT INTO {target} ({columns}) VALUES {', '.join([row] * len(rows))}",
                             [r.get(f.name) for r in rows for f in schema]).fetchall()
            return
        self.con.register("__incoming", pa.Table.from_pylist(rows, schema=schema))
        try:
            self.con.execute(f"INSERT INTO {target} BY NAME SELECT * FROM __incoming").fetchall()
        finally:
            self.con.unregister("__incoming")

    def _make_overlayable(self, table: str) -> None:
        if table in self._overlaid:
            return
        # Patching fetches base rows by _rid: an index keeps one row's look-up from scanning the table
        # (a shared, read-only base can have none: the rows usually come from base_rows' cache, the
        # operator having just read them).
        if not self.shared:
            self.con.execute(f"CREATE INDEX {table}_by_rid ON base.{table} ({ROW_ID})").fetchall()
        self.con.execute(f"CREATE TABLE patch.{table}_removed (overlay_id BIGINT, {ROW_ID} BIGINT)").fetchall()
        self.con.execute(f"CREATE TABLE patch.{table}_rows AS SELECT *, 0::BIGINT AS overlay_id "
                         f"FROM base.{table} LIMIT 0").fetchall()
        self.con.execute(f"CREATE SCHEMA {OVERLAY_PREFIX}{table}").fetchall()
        rows = _overlaid_rows(table, "getvariable('overlay_id')")
        self.con.execute(f"CREATE VIEW {self.overlaid(table)} AS {rows}").fetchall()
        self._overlaid.add(table)

    def shadowed(self, sql: str, overlay_id: int) -> str:
        """``sql`` reading loaded overlay ``overlay_id`` whatever overlay is active: a CTE of each
        touched table's overlaid rows shadows its name. Queries of many overlays then run as one
        statement (a union), which costs less than switching overlays and asking them one by one."""
        return shadowed(sql, self._overlay_of[overlay_id].tables, str(int(overlay_id)))

    def _patch_rows(self, table: str, changes: list[Change]) -> list[dict]:
        """Updated and inserted rows of ``table`` as whole records."""
        updates: dict[int, dict] = defaultdict(dict)
        for c in changes:
            if c.op == "update":
                updates[c.rid][c.column] = c.new_value
        deleted = {c.rid for c in changes if c.op == "delete"}
        rows = [{**row, **updates[row[ROW_ID]]} for row in self.base_rows(table, updates)
                if row[ROW_ID] not in deleted]
        return rows + [{**c.new_value, ROW_ID: c.rid} for c in changes if c.op == "insert"]


def _memo_key(overlay: Overlay | None) -> tuple | None:
    if overlay is None:
        return None
    return tuple((c.table, c.op, c.rid, c.column, c.new_value_json()) for c in overlay.changes)


def shadowed(sql: str, tables: Iterable[str], overlay_id: str) -> str:
    """``sql`` reading each of ``tables`` as overlay ``overlay_id`` (an SQL expression: a number, or
    a column naming each candidate's overlay in a columnar query) shows it, through a CTE of its name."""
    ctes = ", ".join(f"{t} AS NOT MATERIALIZED ({_overlaid_rows(t, overlay_id)})" for t in tables)
    return f"WITH {ctes} SELECT * FROM ({sql}) AS shadowed" if ctes else sql


def _overlaid_rows(table: str, overlay_id: str) -> str:
    """The rows of ``table`` as overlay ``overlay_id`` (an SQL expression) shows them."""
    return (f"SELECT * FROM base.{table} WHERE {ROW_ID} NOT IN "
            f"(SELECT {ROW_ID} FROM patch.{table}_removed WHERE overlay_id = {overlay_id}) "
            f"UNION ALL SELECT * EXCLUDE (overlay_id) FROM patch.{table}_rows WHERE overlay_id = {overlay_id}")


def _coerce(row: dict, schema: pa.Schema) -> dict:
    """Values that arrived as JSON text (timestamps, dates) back to Python types for Arrow."""
    out = {}
    for f in schema:
        v = row.get(f.name)
        if isinstance(v, str) and pa.types.is_timestamp(f.type):
            v = dt.datetime.fromisoformat(v)
        elif isinstance(v, str) and pa.types.is_date(f.type):
            v = dt.date.fromisoformat(v)
        out[f.name] = v
    return out


def changes_from_records(records: Iterable[dict]) -> Overlay:
    """Rebuild an overlay from ``overlays.parquet`` rows (JSON ``new_value`` decoded)."""
    changes = []
    for r in records:
        value = json.loads(r["new_value"]) if r.get("new_value") is not None else None
        changes.append(Change(r["table_name"], r["op"], int(r["rid"]), r.get("column_name"), value))
    return Overlay(changes)
