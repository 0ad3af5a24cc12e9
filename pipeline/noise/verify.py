"""Mechanical verification of candidate pairs, by executing SQL (SPEC §4).

- clean: the gold SQL on the clean base reproduces the stored, non-empty answer;
- local: the noisy tables differ from the clean ones exactly by the overlay (checked cell by cell);
- effect: the naive SQL on the noisy database does not give the expected outcome (the expected
  answer, or — when the right behaviour carries none — the clean answer): the noise matters;
- expected: the expected answer is what the careful analyst's ``recovery_sql`` gives on the noisy
  database, and (for record and value noise) that same inference leaves the clean answer unchanged
  on the clean database; a pair whose behaviour carries no answer has no recovery SQL;
- detectable: the operator's detector fires on the noisy database and not on the clean evidence;
- deterministic: re-running the operator with the same seed proposes the same pair.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Hashable

import duckdb

from pipeline.noise.bulk import OnOverlay, overlaid_rows, repair_of, repairing
from pipeline.noise.model import Candidate, answer_of
from pipeline.noise.overlay import Database
from pipeline.profile import STATEMENTS, Profile
from pipeline.questions.evidence import evidence_violations, named_rows, rule_reads, violations_sql
from pipeline.questions.generate import gold_rows, template_rows, union_chunks, union_rows
from pipeline.schema import ROW_ID, TABLES

CHECKS = ("clean", "local", "effect", "expected", "detectable", "deterministic")  # in the order they run


def expected_outcome(c: Candidate) -> str | None:
    """What the naive reading must not match for the noise to matter."""
    if c.expected_behavior == "answer" or c.expected_answer is not None:
        return c.expected_answer
    return c.question.answer


def verify_candidates(db: Database, candidates: list[Candidate],
                      rerun: Callable[[Candidate], Candidate | None], profile: Profile | None = None) -> list[dict]:
    """One verification record per candidate: each check's outcome plus what was measured.

    Checks run in order (clean and local in bulk, then effect, expected, detectable, deterministic
    per candidate) and stop at the first failure: a rejected candidate records the check it failed.
    A check's SQL that the operator did not already run (naive SQL, a recovery SQL's clean half, SQL
    detectors) is run in bulk, one statement per template and operator, on the clean base or on each
    candidate's own noisy database (:meth:`Database.shadowed`), and only read if reached.
    ``profile`` gets each check's time (``open``: loading the overlays).
    """
    profile = profile or Profile()
    timed = profile.timed
    overlays = {i: c.overlay for i, c in enumerate(candidates) if c.overlay}
    ids = {i: db.new_id() for i in overlays}
    with timed("open", "load overlays", len(overlays)):
        db.load({ids[i]: o for i, o in overlays.items()})
    try:
        with timed("check", "clean", len(candidates)):
            clean = _clean_answers(db, candidates)
        with timed("check", "local", len(candidates)):
            local = _locality(db, candidates, ids)
        records = [{"clean": clean[c.question.question_id], "local": local[i]} for i, c in enumerate(candidates)]
        pending = [i for i, r in enumerate(records) if r["clean"] and r["local"]]
        with timed("check", "effect", 0):
            naive = _on_clean_base(db, {i: candidates[i] for i in pending if not candidates[i].overlay},
                                   lambda c: c.naive_sql, _shape, lambda c: c.noisy_slots)
            naive.update(_on_noisy(db, {i: candidates[i] for i in pending if candidates[i].overlay and not
                                        db.remembers(candidates[i].queries, candidates[i].overlay,
                                                     candidates[i].naive_sql)}, ids, lambda c: c.naive_sql,
                                   lambda c: c.noisy_slots, profile))
        with timed("check", "expected", 0):  # for every candidate that may get that far: one statement per shape
            recovered_clean = _on_clean_base(db, {i: candidates[i] for i in pending if _checked_on_clean(candidates[i])},
                                             lambda c: c.recovery_sql, _shape, lambda c: c.question.slots)
        for i in pending:
            c, rec = candidates[i], records[i]
            # a query the operator already ran on this very noisy (or clean) database is answered
            # from its recorded result (Candidate.queries) instead of being planned and run again
            with db.memoized(c.queries):
                with timed("check", "effect"):
                    if i in naive:
                        rows = naive[i]
                    else:
                        db.use(ids.get(i, Database.CLEAN))
                        rows = db.rows(c.naive_sql)
                    rec["naive_answer"] = answer_of(rows, c.question.answer_type)
                    rec["effect"] = rec["naive_answer"] != expected_outcome(c)
                if rec["effect"]:
                    with timed("check", "expected"):
                        rec["expected"] = _recovers(db, c, ids.get(i, Database.CLEAN), rec, recovered_clean.get(i))
        reached = [i for i in pending if records[i].get("expected")]
        with timed("check", "detectable (noisy)", 0):  # in bulk; evidence rules over many rows one by one
            in_bulk = _detections(db, {i: candidates[i] for i in reached}, ids, profile)
        for i in reached:
            with db.memoized(candidates[i].queries), timed("check", "detectable (noisy)"):
                if i in in_bulk:
                    records[i]["detector_noisy"] = in_bulk[i]
                else:
                    db.use(ids.get(i, Database.CLEAN))
                    records[i]["detector_noisy"] = _detect(db, candidates[i])
        db.use(Database.CLEAN)
        detected = [i for i in pending if records[i].get("detector_noisy")]
        with timed("check", "detectable (clean)", len(detected)):
            clean_hits = _clean_detections(db, [candidates[i] for i in detected])
        for i, hits in zip(detected, clean_hits):
            records[i]["detector_clean"] = hits
            records[i]["detectable"] = hits == 0
            if records[i]["detectable"]:
                with timed("check", "deterministic"):
                    again = rerun(candidates[i])
                records[i]["deterministic"] = again is not None and again.fingerprint() == candidates[i].fingerprint()
        return records
    finally:
        for oid in ids.values():
            db.unload(oid)


def failed_checks(record: dict) -> list[str]:
    """Checks not passed, in check order (checks after the first failure never ran)."""
    return [k for k in CHECKS if not record.get(k)]


def _shape(c: Candidate) -> tuple[str, str]:
    """Candidates whose SQL shares a shape (one template, one operator) run in one statement."""
    return c.question.template.id, c.operator.name


def _checked_on_clean(c: Candidate) -> bool:
    """Whether :func:`_recovers` runs ``c``'s recovery SQL on the clean database too."""
    return c.expected_answer is not None and c.recovery_sql is not None and c.operator.level != "query"


def _recovers(db: Database, c: Candidate, overlay_id: int, rec: dict, clean_rows: list[tuple] | None) -> bool:
    """The expected answer is recomputed by the recovery SQL on the noisy database (and, for
    record/value noise, the same SQL gives the clean answer on the clean database: ``clean_rows``,
    run in bulk beforehand)."""
    if c.expected_answer is None:
        return c.recovery_sql is None
    if c.recovery_sql is None:
        return False
    db.use(overlay_id)
    rec["recovered_answer"] = answer_of(db.rows(c.recovery_sql), c.question.answer_type)
    if rec["recovered_answer"] != c.expected_answer:
        return False
    if c.operator.level == "query":
        return True
    rec["recovered_clean"] = answer_of(clean_rows, c.question.answer_type)
    return rec["recovered_clean"] == c.question.answer


def _on_clean_base(db: Database, candidates: dict[int, Candidate], sql_of: Callable[[Candidate], str],
                   group_of: Callable[[Candidate], Hashable],
                   slots_of: Callable[[Candidate], dict] | None = None) -> dict[int, list[tuple]]:
    """Rows of each candidate's ``sql_of`` on the clean base, by the candidate's key; the queries of
    one group (of one template, and of one shape within it) in one statement, as generation runs
    a template's gold SQL, so each column keeps its type. With ``slots_of``, a query that is its
    template's gold SQL rendered with those slots is answered columnar
    (:func:`~pipeline.questions.generate.template_rows`): one scan for all of a group's."""
    return _in_bulk(db, {k: (group_of(c), c, sql_of(c)) for k, c in candidates.items()}, slots_of)


def _on_noisy(db: Database, candidates: dict[int, Candidate], ids: dict[int, int],
              sql_of: Callable[[Candidate], str], slots_of: Callable[[Candidate], dict] | None = None,
              profile: Profile | None = None) -> dict[int, list[tuple]]:
    """Rows of each candidate's ``sql_of`` on its own noisy database (overlay ``ids[k]``, loaded), in
    a few statements (:func:`~pipeline.noise.bulk.overlaid_rows`; with ``slots_of``, columnar where
    the query is its template's gold SQL rendered with those slots). Those it leaves are asked one
    by one, when reached."""
    return {k: rows for k, (_, rows) in overlaid_rows(db, {
        k: OnOverlay(c.question, sql_of(c), ids[k], tuple(c.overlay.tables), _shape(c),
                     slots_of(c) if slots_of is not None else None)
        for k, c in candidates.items()}, profile).items()}


def _in_bulk(db: Database, queries: dict[int, tuple[Hashable, Candidate, str]],
             slots_of: Callable[[Candidate], dict] | None = None) -> dict[int, list[tuple]]:
    """Rows of each (group, candidate, SQL) by key, a group's queries in one :func:`gold_rows`
    statement, or those that are their slots' gold SQL in one :func:`template_rows` statement."""
    db.use(Database.CLEAN)
    groups: dict[Hashable, dict[int, str]] = defaultdict(dict)
    columnar: dict[tuple[Hashable, str], dict[int, Candidate]] = defaultdict(dict)
    for k, (group, c, sql) in queries.items():
        repair = repair_of(c.question, sql, slots_of(c)) if slots_of is not None else None
        if repair is not None:
            columnar[(group, repair)][k] = c
        else:
            groups[group][k] = sql
    out: dict[int, list[tuple]] = {}
    for batch in groups.values():
        out.update(gold_rows(db.con, queries[next(iter(batch))][1].question.template, batch))
    for (_, repair), shape in columnar.items():
        q = next(iter(shape.values())).question
        out.update(template_rows(db.con, q.template, {k: slots_of(c) for k, c in shape.items()},
                                 {k: queries[k][2] for k in shape}, wrap=repairing(q, repair)))
    return out


def _clean_answers(db: Database, candidates: list[Candidate]) -> dict[str, bool]:
    """Each question's gold SQL on the clean base, a template's questions in one statement."""
    first: dict[str, int] = {}  # question id -> its first candidate
    for i, c in enumerate(candidates):
        first.setdefault(c.question.question_id, i)
    rows = _on_clean_base(db, {i: candidates[i] for i in first.values()}, lambda c: c.question.gold_sql,
                          lambda c: c.question.template.id, lambda c: c.question.slots)
    out: dict[str, bool] = {}
    for i, found in rows.items():
        q = candidates[i].question
        answer = answer_of(found, q.answer_type)
        out[q.question_id] = answer is not None and answer == q.answer
    return out


def _scope_rows(c: Candidate) -> list[tuple[str, int]]:
    return [(t, r) for t, rids in c.detector.scope.items() for r in rids]


def _clean_detections(db: Database, candidates: list[Candidate]) -> list[int]:
    """Detector hits on the clean database: all evidence-rule detectors in one batch."""
    db.use(Database.CLEAN)
    batch = {i: _scope_rows(c) for i, c in enumerate(candidates) if c.detector.reason}
    reasons = {c.detector.reason for c in candidates if c.detector.reason}
    found = evidence_violations(db.con, batch, set(db.tables), reasons) if batch else {}
    rows = _on_clean_base(db, {i: c for i, c in enumerate(candidates) if not c.detector.reason},
                          lambda c: c.detector.clean_sql, _shape)
    return [int(c.detector.reason in found.get(i, set())) if c.detector.reason else _hits(rows[i])
            for i, c in enumerate(candidates)]


def _detections(db: Database, candidates: dict[int, Candidate], ids: dict[int, int],
                profile: Profile | None = None) -> dict[int, int]:
    """Hits of the detectors on their noisy databases: SQL detectors one statement per shape;
    evidence rules over a few rows many candidates to a statement, each reading its own overlay
    (their rows checked together where the rule reads no table the overlay touches, else in unions
    of each one's check); a detector query the operator already ran on its noisy database, and an
    evidence rule over many rows, are left to :func:`_detect`. ``profile`` gets the time of the
    evidence rules' statements, by reason and table (part :data:`~pipeline.profile.STATEMENTS`)."""
    asked = {i: c for i, c in candidates.items()
             if not c.detector.reason and not db.remembers(c.queries, c.overlay, c.detector.sql)}
    rows = _on_clean_base(db, {i: c for i, c in asked.items() if not c.overlay}, lambda c: c.detector.sql, _shape)
    rows.update(_on_noisy(db, {i: c for i, c in asked.items() if c.overlay}, ids, lambda c: c.detector.sql,
                          profile=profile))
    found = {i: _hits(r) for i, r in rows.items()}
    apart: dict[tuple[str, str], dict[int, str]] = defaultdict(dict)  # (reason, table) -> each candidate's check
    together: dict[tuple[str, str], dict[int, str]] = defaultdict(dict)  # (reason, table) -> each candidate's rows
    present = set(db.tables)
    reads: dict[tuple[str, str], set[str]] = {}
    for i, c in candidates.items():
        reason = c.detector.reason
        if not reason or (named := named_rows(i, _scope_rows(c), present)) is None:
            continue
        table, rows_sql = named
        if (reason, table) not in reads:
            reads[(reason, table)] = rule_reads(table, present, {reason})
        if reads[(reason, table)] & set(c.overlay.tables):  # the check reads a table as this overlay shows it
            if (sql := violations_sql(table, rows_sql, present, {reason})) is not None:
                apart[(reason, table)][i] = db.shadowed(sql, ids[i])
        else:
            together[(reason, table)][i] = db.shadowed(rows_sql, ids[i]) if c.overlay else rows_sql
    db.use(Database.CLEAN)
    timed = (profile or Profile()).timed
    for (reason, table), queries in sorted(apart.items()):
        with timed(STATEMENTS, f"rule {reason} on {table}", len(queries)):
            for i, (_, hits) in union_rows(db.con, queries).items():
                found[i] = int(any(hit == reason for _, hit in hits))
    for (reason, table), rows in sorted(together.items()):
        with timed(STATEMENTS, f"rule {reason} on {table} (together)", len(rows)):
            found.update(_violating(db, table, rows, present, reason))
    return found


TOGETHER_CANDIDATES = 256  # candidates whose rows one evidence-rule statement checks together


def _violating(db: Database, table: str, rows: dict[int, str], present: set[str], reason: str) -> dict[int, int]:
    """Whether ``reason`` fires on each candidate's evidence ``rows`` (each SQL reading its own
    overlay), many candidates' rows checked in one statement: the checks read no table an overlay
    touches, so one pass over what they join (the demo's ICD dictionary: 110K codes) serves all.
    A statement DuckDB refuses leaves its candidates to :func:`_detect`."""
    out: dict[int, int] = {}
    for chunk in union_chunks(rows, TOGETHER_CANDIDATES):
        sql = violations_sql(table, "\nUNION ALL\n".join(f"({sql})" for sql in chunk.values()), present, {reason})
        if sql is None:  # no check of ``reason`` applies to ``table``
            return out
        try:
            hits = db.con.execute(sql).fetchall()
        except duckdb.Error:
            continue
        out.update(dict.fromkeys(chunk, 0))
        out.update({cand: 1 for cand, hit in hits if hit == reason})
    return out


def _hits(rows: list[tuple]) -> int:
    """A SQL detector's result as a hit count, read as :func:`_detect` reads ``db.scalar``."""
    return int((rows[0][0] if rows else None) or 0)


def _detect(db: Database, c: Candidate) -> int:
    """Detector hits on the noisy database (the active overlay)."""
    if c.detector.reason:
        found = evidence_violations(db.con, {0: _scope_rows(c)}, set(db.tables), {c.detector.reason})
        return int(c.detector.reason in found.get(0, set()))
    return int(db.scalar(c.detector.sql) or 0)


def _locality(db: Database, candidates: list[Candidate], ids: dict[int, int]) -> list[bool]:
    """Cell-by-cell comparison of every overlay's patched rows with the base, in SQL per table."""
    observed: dict[tuple[int, str], tuple] = {}
    for table in sorted({t for c in candidates for t in c.overlay.tables}):
        diff = " + ".join(f"(p.\"{col}\" IS DISTINCT FROM b.\"{col}\")::INT" for col in TABLES[table].column_names)
        for oid, cells, inserted in db.rows(
                f"SELECT p.overlay_id, sum(CASE WHEN b.{ROW_ID} IS NULL THEN 0 ELSE {diff} END), "
                f"count(*) FILTER (WHERE b.{ROW_ID} IS NULL) FROM patch.{table}_rows p "
                f"LEFT JOIN base.{table} b USING ({ROW_ID}) GROUP BY 1"):
            observed[(oid, table)] = (int(cells), int(inserted))
        for oid, missing, kept, total in db.rows(
                f"SELECT r.overlay_id, count(*) FILTER (WHERE b.{ROW_ID} IS NULL), "
                f"count(*) FILTER (WHERE p.{ROW_ID} IS NOT NULL), count(*) FROM patch.{table}_removed r "
                f"LEFT JOIN base.{table} b USING ({ROW_ID}) "
                f"LEFT JOIN patch.{table}_rows p ON p.overlay_id = r.overlay_id AND p.{ROW_ID} = r.{ROW_ID} "
                f"GROUP BY 1"):
            observed[(oid, f"{table}#removed")] = (int(missing), int(kept), int(total))
    result = []
    for i, c in enumerate(candidates):
        ok = True
        for table, changes in c.overlay.by_table().items():
            declared = defaultdict(int)
            for ch in changes:
                declared[ch.op] += 1
            updated_rids = {ch.rid for ch in changes if ch.op == "update"}
            cells, inserted = observed.get((ids[i], table), (0, 0))
            missing, kept, removed = observed.get((ids[i], f"{table}#removed"), (0, 0, 0))
            ok &= (cells == declared["update"] and inserted == declared["insert"] and missing == 0
                   and kept == len(updated_rids) and removed - kept == declared["delete"])
        result.append(ok)
    return result
