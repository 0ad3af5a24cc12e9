"""The operators' noisy answers for many candidates at once.

An operator reads its noisy database mostly through the question's gold SQL: as it stands (what
a naive agent gets) or restricted to the rows a careful analyst keeps or repairs (the recovery
SQL, :func:`~pipeline.noise.operators.common.restricted`). For the candidates of one template,
one repair and one set of touched tables, that is the same query up to the slot values and the
overlay: one columnar statement (:func:`~pipeline.questions.generate.run_columnar`) answers them
all, each candidate's overlay id a column of the slot table its tables' CTEs read
(:func:`~pipeline.noise.overlay.shadowed`). Asked one by one, each such query cost several
milliseconds of planning and a full scan of the repaired table. What cannot run columnar (a
large table, a repair that ranks rows, a table read twice) runs as written, many candidates'
queries in one UNION ALL, each reading its own overlay: that saves the per-query overhead.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable, Hashable
from dataclasses import dataclass

from pipeline.noise.model import CleanQuestion
from pipeline.noise.operators.common import restricted, restriction
from pipeline.noise.overlay import Database, Overlay, shadowed
from pipeline.profile import STATEMENTS, Profile
from pipeline.questions.generate import near_rounding, run_columnar, union_rows
from pipeline.questions.templates import SLOT_TABLE

# A repair that ranks rows (de-duplication keeps the first of each event) runs its window over the
# whole table for every candidate: columnar, it costs ten times more than asking one by one.
_RANKS = re.compile(r"\bOVER\s*\(", re.IGNORECASE)

Asked = tuple[CleanQuestion, str, Overlay, str, dict]  # question, operator, overlay, SQL, the memo its answer goes to

@dataclass(frozen=True)
class OnOverlay:
    """A query to answer on a loaded overlay (its id, and the tables it touches)."""
    question: CleanQuestion
    sql: str
    overlay_id: int
    tables: tuple[str, ...]
    shape: Hashable  # queries of one shape (a template and an operator) give columns of the same types
    slots: dict | None = None  # where ``sql`` may be the question's gold SQL rendered with these slots


def overlaid_rows(db: Database, queries: dict[int, OnOverlay],
                  profile: Profile | None = None) -> dict[int, tuple[list[str], list[tuple]]]:
    """Column names and rows of each query on its own noisy database, by key.

    A query that is its question's gold SQL (or a :func:`repair_of` it) over small enough tables
    is answered columnar, one statement per template, repair and set of touched tables
    (:func:`overlay_batches`; not for a list answer: a join keeps no row order; nor for a template
    that :func:`reads_twice` a touched table); the others, and a float at a rounding edge (see
    :func:`~pipeline.questions.generate.template_rows`), as written, each reading its overlay
    through :func:`~pipeline.noise.overlay.shadowed`, a shape's queries in
    :func:`~pipeline.questions.generate.union_rows` statements: what one statement saves is the
    per-query overhead of planning and switching overlays, not the scan. A statement DuckDB refuses
    leaves its queries unanswered. ``profile`` gets the time of each template's columnar statements
    and of each shape's unions (part :data:`~pipeline.profile.STATEMENTS`)."""
    timed = (profile or Profile()).timed
    db.use(Database.CLEAN)
    columnar: dict[tuple[str, str, tuple[str, ...]], dict[int, OnOverlay]] = defaultdict(dict)
    as_written: dict[Hashable, dict[int, OnOverlay]] = defaultdict(dict)
    for k, a in queries.items():
        repair = repair_of(a.question, a.sql, a.slots) if a.slots is not None else None
        if repair is None or reads_twice(a.question.template.gold_sql, a.tables):
            as_written[a.shape][k] = a
        else:
            columnar[(a.question.template.id, repair, a.tables)][k] = a
    out: dict[int, tuple[list[str], list[tuple]]] = {}
    for (_, repair, tables), group in columnar.items():
        q = next(iter(group.values())).question
        for batch in overlay_batches(db, tables, list(group)):
            with timed(STATEMENTS, f"{q.template.id} (columnar)", len(batch)):
                found = run_columnar(db.con, q.template, {k: group[k].slots for k in batch}, 0, "q.*",
                                     {"overlay_id": {k: group[k].overlay_id for k in batch}},
                                     on_overlays(q, repair, tables), _described)
            if found is None:
                continue
            rows: dict[int, list[tuple]] = {k: [] for k in batch}
            for _, part in found:  # one part per set of literal slot values, all of the template's columns
                for cand, *row in part:
                    rows[cand].append(tuple(row))
            out.update({k: (found[0][0], found_rows) for k, found_rows in rows.items()})
        for k, a in group.items():
            if k not in out or near_rounding(out[k][1]):
                out.pop(k, None)
                as_written[a.shape][k] = a
    for shape, group in as_written.items():
        with timed(STATEMENTS, " / ".join(map(str, shape)) if isinstance(shape, tuple) else str(shape), len(group)):
            out.update(union_rows(db.con, {k: shadowed(a.sql, a.tables, str(int(a.overlay_id)))
                                           for k, a in group.items()}))
    return out


def noisy_answers(db: Database, asked: list[Asked], profile: Profile | None = None) -> None:
    """Store in each memo what its SQL gives on its question's noisy database (as
    :meth:`Database.remember`), all in a few statements (:func:`overlaid_rows`, timed in ``profile``)."""
    ids = {k: db.new_id() for k in range(len(asked))}
    db.load({ids[k]: overlay for k, (_, _, overlay, _, _) in enumerate(asked)})
    try:
        found = overlaid_rows(db, {k: OnOverlay(q, sql, ids[k], tuple(overlay.tables), (q.template.id, name), q.slots)
                                   for k, (q, name, overlay, sql, _) in enumerate(asked)}, profile)
        for k, (columns, rows) in found.items():
            _, _, overlay, sql, memo = asked[k]
            Database.remember(memo, overlay, sql, columns, rows)
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


def reads_twice(sql: str, tables: tuple[str, ...]) -> bool:
    """Whether ``sql`` reads one of ``tables`` more than once (a self-join, a subquery). Columnar
    over overlays, each such read is every candidate's copy of the table, and DuckDB joins the
    copies of all candidates to each other before a candidate's own overlay id applies. On the demo
    (diagnoses_icd: 4,500 rows) dx_pair_same_admission took 50-60 ms per candidate, and the two
    noise shards holding it and icu_patients_input_after_input_hours 55-63 s, 44 s with these as
    written."""
    return any(len(re.findall(rf"\b(?:FROM|JOIN)\s+{t}\b", sql)) > 1 for t in tables)


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
