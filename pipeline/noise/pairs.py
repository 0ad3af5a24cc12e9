"""Candidates → pair records with their verification, sharded over worker processes.

Each worker opens its own :class:`Database` over the staged tables (DuckDB connections do not
cross processes), proposes candidates for its share of the clean questions and verifies them.
Every RNG is keyed by (seed, question, operator), so the result does not depend on sharding.
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import as_completed
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field

import pyarrow as pa

from pipeline.files import stable_int
from pipeline.noise.candidates import (
    DEFAULT_OPERATORS_PER_QUESTION,
    entity_pools,
    load_questions,
    propose,
    run_operator,
)
from pipeline.noise.export import PairRecord
from pipeline.noise.model import Candidate
from pipeline.noise.operators import OPERATORS
from pipeline.noise.overlay import Database
from pipeline.noise.verify import CHECKS, failed_checks, verify_candidates
from pipeline.plausibility import bounds_table, register_bounds
from pipeline.profile import Profile
from pipeline.questions.generate import open_staged
from pipeline.questions.templates import load_templates
from pipeline.staging import staged_database
from pipeline.workers import worker_pool

GUIDED = 2  # each shard takes 1 / (GUIDED * workers) of the templates still unassigned
MIN_SHARD_TEMPLATES = 2  # below this, opening a shard's database costs more than the balance gains


def shard_templates(template_ids: list[str], workers: int) -> list[list[str]]:
    """Whole templates in shards of decreasing size, the largest first (guided scheduling): the
    first few keep the per-shard overhead low, the small last ones leave no worker idle for long
    while another finishes. Templates go in hash order, so each shard mixes kinds and costs."""
    todo = sorted(set(template_ids), key=lambda t: (stable_int(t), t))
    shards = []
    while todo:
        size = max(MIN_SHARD_TEMPLATES, -(-len(todo) // (GUIDED * workers)))
        shards.append(todo[:size])
        todo = todo[size:]
    return shards


@dataclass
class NoiseReport:
    proposed: Counter = field(default_factory=Counter)  # operator -> candidates
    not_applicable: Counter = field(default_factory=Counter)  # operator -> questions declined
    verified: Counter = field(default_factory=Counter)  # operator -> verified
    rejected: Counter = field(default_factory=Counter)  # (operator, first failed check) -> candidates
    seconds: float = 0.0
    profile: Profile = field(default_factory=Profile)  # worker time by operator and by check

    @classmethod
    def from_records(cls, records: list[dict], not_applicable: Counter | None = None) -> NoiseReport:
        report = cls(not_applicable=Counter(not_applicable or {}))
        for r in records:
            report.proposed[r["operator"]] += 1
            if r["verified"]:
                report.verified[r["operator"]] += 1
            else:
                report.rejected[(r["operator"], r["failed_check"])] += 1
        return report

    def by_operator(self) -> list[dict]:
        rows = []
        for op in sorted(OPERATORS):
            row = {"operator": op, "level": OPERATORS[op].level, "candidates": self.proposed[op],
                   "verified": self.verified[op], "not_applicable": self.not_applicable[op]}
            row.update({f"rejected_{c}": self.rejected[(op, c)] for c in CHECKS})
            rows.append(row)
        return rows


def pair_record(c: Candidate, verification: dict, seed: int) -> dict:
    """A candidate and its verification as one :class:`PairRecord`, in the dict form the build and
    the Dagster assets pass around (and read back from Parquet)."""
    q, op = c.question, c.operator
    failed = failed_checks(verification)
    return asdict(PairRecord(
        pair_id=f"{stable_int(seed, q.question_id, op.name):016x}",
        seed=seed,
        question_id=q.question_id,
        template_id=q.template.id,
        intent=q.template.intent,
        level=q.template.level,
        noise_level=op.level,
        operator=op.name,
        clean_question=q.question,
        noisy_question=c.noisy_question,
        gold_sql=q.gold_sql,
        answer_type=q.answer_type,
        clean_answer=q.answer,
        naive_sql=c.naive_sql,
        expected_behavior=c.expected_behavior,
        expected_answer=c.expected_answer,
        recovery_sql=c.recovery_sql,
        discrepancy=op.discrepancy,
        evidence=json.dumps(q.evidence, sort_keys=True, separators=(",", ":")),
        verification=json.dumps(verification, sort_keys=True, separators=(",", ":"), default=str),
        change_log=json.dumps(c.change_log, ensure_ascii=False),
        noisy_slots=json.dumps(c.noisy_slots, sort_keys=True, ensure_ascii=False, default=str),
        verified=not failed,
        failed_check=failed[0] if failed else None,
        changes=json.dumps([[ch.table, ch.op, ch.rid, ch.column, ch.new_value_json()]
                            for ch in c.overlay.changes], ensure_ascii=False),
    ))


def _shard(staged_dir: str, rows: list[dict], seed: int, per_question: int,
           vetoed_families: frozenset[tuple[str, str]], staged_file: str | None = None,
           processes: int = 1, bounds: pa.Table | None = None) -> tuple[list[dict], Counter, Profile]:
    profile = Profile()
    with profile.timed("open", "staged tables"):
        templates = load_templates()
        db = Database(staged_dir, staged_file=staged_file, processes=processes)
    try:
        register_bounds(db.con, db.tables, bounds)
        questions = load_questions(pa.Table.from_pylist(rows), templates)
        pools = entity_pools(questions)
        candidates, proposal = propose(db, questions, seed, per_question, vetoed_families, profile)
        records = verify_candidates(
            db, candidates, lambda c: run_operator(db, c.question, c.operator.name, seed, pools, replay=c.queries),
            profile)
    finally:
        db.close()
    return [pair_record(c, rec, seed) for c, rec in zip(candidates, records)], proposal.not_applicable, profile


def _measured_bounds(staged_dir: str | os.PathLike, staged_file: str | os.PathLike) -> pa.Table:
    """The plausibility bounds of the staged tables, measured once for all shards: each derived
    bound aggregates a whole event table (labevents: tens of millions of rows at full size)."""
    con, present = open_staged(staged_dir, staged_file)
    try:
        return bounds_table(con, present)
    finally:
        con.close()


def candidate_records(staged_dir: str | os.PathLike, questions: pa.Table, seed: int,
                      per_question: int = DEFAULT_OPERATORS_PER_QUESTION,
                      workers: int | None = None,
                      progress: Callable[[int, int, list[dict]], None] | None = None,
                      vetoed_families: frozenset[tuple[str, str]] = frozenset(),
                      staged_file: str | os.PathLike | None = None) -> tuple[list[dict], NoiseReport]:
    """Every candidate pair for the clean ``questions`` with its verification, sorted by pair_id.

    ``progress(shards_done, shards, records)`` is called as each shard finishes, with its records;
    ``vetoed_families`` (template_id, operator) are never proposed; ``staged_file`` (a
    :func:`~pipeline.staging.staged_database` of ``staged_dir``) is read instead of a database of
    this call's own."""
    started = time.perf_counter()
    rows = questions.to_pylist()
    workers = max(1, min(workers or os.cpu_count() or 1, len(rows) or 1))
    # Whole templates per shard keep each worker's entity pools complete.
    ids = [r["template_id"] for r in rows]
    groups = shard_templates(ids, workers) if workers > 1 else [sorted(set(ids))]
    shard_of = {t: i for i, group in enumerate(groups) for t in group}
    shards: list[list[dict]] = [[] for _ in groups]
    for r in rows:
        shards[shard_of[r["template_id"]]].append(r)
    if workers == 1:
        results = [_shard(str(staged_dir), shards[0], seed, per_question, vetoed_families,
                          str(staged_file) if staged_file else None)]
        if progress:
            progress(1, 1, results[0][0])
    else:
        with nullcontext(staged_file) if staged_file else staged_database(staged_dir) as shared, \
                worker_pool(workers) as pool:
            bounds = _measured_bounds(staged_dir, shared)
            futures = [pool.submit(_shard, str(staged_dir), s, seed, per_question, vetoed_families,
                                   str(shared), workers, bounds) for s in shards if s]
            for done, future in enumerate(as_completed(futures), 1):
                if progress:
                    progress(done, len(futures), future.result()[0])
            results = [f.result() for f in futures]
    records = sorted((r for shard, _, _ in results for r in shard), key=lambda r: r["pair_id"])
    not_applicable: Counter = Counter()
    for _, counts, _ in results:
        not_applicable.update(counts)
    report = NoiseReport.from_records(records, not_applicable)
    for _, _, profile in results:
        report.profile.merge(profile)
    report.seconds = time.perf_counter() - started
    return records, report
