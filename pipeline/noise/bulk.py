"""The operators' noisy answers for many candidates at once.

An operator reads its noisy database mostly through the question's gold SQL: as it stands (what
a naive agent gets) or restricted to the rows a careful analyst keeps or repairs (the recovery
SQL, :func:`~pipeline.noise.operators.common.restricted`). For the candidates of one template,
one repair and one set of touched tables, that is the same query up to the slot values and the
overlay: one columnar statement (:func:`~pipeline.questions.generate.run_columnar`) answers them
all, each candidate's overlay id a column of the slot table its tables' CTEs read
(:func:`~pipeline.noise.overlay.shadowed`). Asked one by one, each such query cost several
milliseconds of planning and a full scan of the repaired table.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable

from pipeline.noise.model import CleanQuestion
from pipeline.noise.operators.common import restricted, restriction
from pipeline.noise.overlay import Database, Overlay, shadowed
from pipeline.questions.generate import near_rounding, run_columnar
from pipeline.questions.templates import SLOT_TABLE

# A repair that ranks rows (de-duplication keeps the first of each event) runs its window over the
# whole table for every candidate: columnar, it costs ten times more than asking one by one.
_RANKS = re.compile(r"\bOVER\s*\(", re.IGNORECASE)

Asked = tuple[CleanQuestion, Overlay, str, dict]  # question, overlay, SQL, the memo its answer goes to


def noisy_answers(db: Database, asked: list[Asked]) -> None:
    """Store in each memo what its SQL gives on its question's noisy database (as
    :meth:`Database.remember`), for those that are the gold SQL or a restriction of it, share
    their shape with another candidate and whose row order does not matter; the rest stay unasked.
    A float at a rounding edge is left to be asked as written (see
    :func:`~pipeline.questions.generate.template_rows`)."""
    groups: dict[tuple[str, str, tuple[str, ...]], dict[int, Asked]] = defaultdict(dict)
    for k, (q, overlay, sql, _) in enumerate(asked):
        repair = repair_of(q, sql, q.slots)
        if repair is not None:
            groups[(q.template.id, repair, tuple(overlay.tables))][k] = asked[k]
    batches = [({k: batch[k] for k in chunk}, repair, tables) for (_, repair, tables), batch in groups.items()
               for chunk in overlay_batches(db, tables, list(batch))]
    ids = {k: db.new_id() for batch, _, _ in batches for k in batch}
    db.load({ids[k]: asked[k][1] for k in ids})
    try:
        db.use(Database.CLEAN)
        for batch, repair, tables in batches:
            q0 = next(iter(batch.values()))[0]
            found = run_columnar(db.con, q0.template, {k: a[0].slots for k, a in batch.items()}, 0, "q.*",
                                 {"overlay_id": ids}, on_overlays(q0, repair, tables), _described)
            if found is None:
                continue
            rows: dict[int, list[tuple]] = {k: [] for k in batch}
            names: dict[int, list[str]] = {}
            for columns, part in found:  # one part per set of literal slot values
                for cand, *row in part:
                    rows[cand].append(tuple(row))
                names.update(dict.fromkeys((cand for cand, *_ in part), columns))
            for k, (_, overlay, sql, memo) in batch.items():
                if not near_rounding(rows[k]):
                    Database.remember(memo, overlay, sql, names.get(k, found[0][0]), rows[k])
    finally:
        for oid in ids.values():
            db.unload(oid)


OVERLAID_TABLE_ROWS = 250_000
"""Base rows of a touched table up to which its candidates' noisy queries run columnar. Each
candidate's overlay id is correlated, so DuckDB joins the whole base table to the candidates
before a candidate's own filter applies: each candidate costs in proportion to the table. For the
demo's tables (labevents: 108K rows) a 5-10x gain over one query each; at 10,000 patients
(prescriptions: 764K rows, 13 candidates at once) 10 ms per candidate, more than asking alone."""
OVERLAID_ROWS = 10_000_000  # base rows times candidates in one statement: bounds what it holds at once


def overlay_batches(db: Database, tables: tuple[str, ...], keys: list[int]) -> list[list[int]]:
    """``keys`` in batches of at least two that one columnar statement over overlays of ``tables``
    may answer (:data:`OVERLAID_TABLE_ROWS`, :data:`OVERLAID_ROWS`); none for larger tables."""
    rows = max(db.next_rid(t) for t in tables)  # staged _rids number the rows from 0
    if rows > OVERLAID_TABLE_ROWS:
        return []
    size = OVERLAID_ROWS // max(rows, 1)
    return [keys[i:i + size] for i in range(0, len(keys), size) if len(keys[i:i + size]) > 1] if size > 1 else []


def repair_of(q: CleanQuestion, sql: str, slots: dict) -> str | None:
    """How ``sql`` reads as ``q``'s gold SQL rendered with ``slots``, for a columnar statement: ""
    for that gold SQL itself, the rows SQL for it restricted to repaired rows that are not ranked
    (:func:`~pipeline.noise.operators.common.restricted`), None for anything else and for a list
    answer (a columnar statement does not keep row order)."""
    if q.answer_type == "list":
        return None
    gold = q.rerender(slots)[1]
    if sql == gold:
        return ""
    repair = restriction(sql, gold, q.evidence_table)
    return repair if repair is not None and not _RANKS.search(repair) else None


def repairing(q: CleanQuestion, repair: str) -> Callable[[str], str]:
    """The gold SQL (as rendered, or columnar) to the query :func:`repair_of` read as ``repair``."""
    return lambda gold: restricted(gold, q.evidence_table, repair) if repair else gold


def on_overlays(q: CleanQuestion, repair: str, tables: tuple[str, ...]) -> Callable[[str], str]:
    """:func:`repairing`, on each candidate's noisy database: ``tables`` read as the overlay the
    slot table's ``overlay_id`` column names."""
    repaired = repairing(q, repair)
    return lambda gold: shadowed(repaired(gold), tables, f"{SLOT_TABLE}.overlay_id")


def _described(con, sql: str) -> tuple[list[str], list[tuple]]:
    """Column names (without the candidate key) and rows, as :meth:`Database.rows` fetches them."""
    cursor = con.execute(sql)
    return [d[0] for d in cursor.description][1:], cursor.fetchall()
