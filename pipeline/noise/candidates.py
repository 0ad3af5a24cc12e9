"""Propose candidate pairs: per clean question, admitted operators from distinct noise levels,
each with its own RNG."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np
import pyarrow as pa

from pipeline.files import stable_int
from pipeline.noise.bulk import Asked, noisy_answers
from pipeline.noise.model import Candidate, CleanQuestion, OperatorParams
from pipeline.noise.operators import OPERATORS
from pipeline.noise.overlay import Database, Overlay
from pipeline.noise.registry import NOISE_LEVELS
from pipeline.profile import Profile
from pipeline.questions.templates import Template

DEFAULT_OPERATORS_PER_QUESTION = 2
SCARCEST_LEVEL = "value"  # applies to the fewest templates, so it is tried first
OTHER_LEVELS = tuple(level for level in NOISE_LEVELS if level != SCARCEST_LEVEL)


def operator_rng(seed: int, question_id: str, operator: str) -> np.random.Generator:
    """The RNG of one (question, operator): independent of everything else in the run."""
    return np.random.default_rng([seed, stable_int(question_id, operator)])


@dataclass
class CandidateReport:
    proposed: Counter = field(default_factory=Counter)  # operator -> candidates
    not_applicable: Counter = field(default_factory=Counter)  # operator -> questions it declined
    seconds: float = 0.0


def entity_pools(questions: list[CleanQuestion]) -> dict[str, list]:
    """Per template, the entity values its clean questions use: real, data-backed alternatives."""
    pools: dict[str, set] = {}
    for q in questions:
        entity = q.noise.entity_slot
        if entity and isinstance(q.slots.get(entity.slot), str):
            pools.setdefault(q.template.id, set()).add(q.slots[entity.slot])
    return {t: sorted(v) for t, v in pools.items()}


def load_questions(table: pa.Table, templates: list[Template]) -> list[CleanQuestion]:
    by_id = {t.id: t for t in templates}
    return [CleanQuestion.from_row(r, by_id) for r in table.to_pylist() if r["template_id"] in by_id]


def run_operator(db: Database, q: CleanQuestion, name: str, seed: int, pools: dict,
                 replay: dict | None = None, queries: dict | None = None) -> Candidate | None:
    """Operator ``name`` on ``q`` with its own RNG. Its query results are kept on the candidate;
    given an earlier run's (``replay``), the run answers from them instead of querying again.
    ``queries`` (default: a copy of ``replay``) is the dict the results are collected in."""
    params = OperatorParams(tuple(pools.get(q.template.id, ())))
    queries = dict(replay or {}) if queries is None else queries
    with db.memoized(queries):
        candidate = OPERATORS[name].run(db, q, params, operator_rng(seed, q.question_id, name))
    return None if candidate is None else replace(candidate, queries=queries)


def _tried(q: CleanQuestion, seed: int, per_question: int, vetoed_families: frozenset[tuple[str, str]],
           run: Callable[[str], Candidate | None]) -> list[tuple[str, Candidate | None]]:
    """The operators tried on ``q`` in order, with what ``run(name)`` gave (None: not applicable)."""
    rng = np.random.default_rng([seed, stable_int(q.question_id)])
    admitted = [o for o in q.noise.operators if (q.template.id, o) not in vetoed_families]
    order = [SCARCEST_LEVEL] + [OTHER_LEVELS[i] for i in rng.permutation(len(OTHER_LEVELS))]
    tried: list[tuple[str, Candidate | None]] = []
    taken = 0
    for level in order:
        ops = [o for o in admitted if OPERATORS[o].level == level]
        for k in rng.permutation(len(ops)) if ops else []:
            if taken >= per_question:
                break
            cand = run(ops[k])
            tried.append((ops[k], cand))
            if cand is not None:
                taken += 1
                break
    return tried


def propose(db: Database, questions: list[CleanQuestion], seed: int,
            per_question: int = DEFAULT_OPERATORS_PER_QUESTION,
            vetoed_families: frozenset[tuple[str, str]] = frozenset(),
            profile: Profile | None = None) -> tuple[list[Candidate], CandidateReport]:
    """Up to ``per_question`` candidates per question, each from a different noise level.

    Value-level noise applies to the fewest questions, so it is tried first; the other levels
    follow in a seeded order, and within a level the admitted operators are tried in a seeded
    order until one applies. A reviewer's vetoed (template, operator) families are never tried,
    so the question's next admitted operator takes their place. The operators' noisy queries are
    answered beforehand in bulk (:func:`_answered_in_bulk`); each run replays them, so what it
    decides is what it would decide alone. ``profile`` gets each operator's time."""
    started = time.perf_counter()
    profile = profile or Profile()
    report = CandidateReport()
    pools = entity_pools(questions)
    memos = _answered_in_bulk(db, questions, seed, per_question, vetoed_families, pools, profile)
    out: list[Candidate] = []
    for q in questions:
        def run(name: str, q: CleanQuestion = q) -> Candidate | None:
            with profile.timed("operator", name):
                return run_operator(db, q, name, seed, pools, replay=memos.get((q.question_id, name)))
        for name, cand in _tried(q, seed, per_question, vetoed_families, run):
            if cand is None:
                report.not_applicable[name] += 1
            else:
                report.proposed[name] += 1
                out.append(cand)
    report.seconds = time.perf_counter() - started
    return out, report


def _answered_in_bulk(db: Database, questions: list[CleanQuestion], seed: int, per_question: int,
                      vetoed_families: frozenset[tuple[str, str]], pools: dict,
                      profile: Profile) -> dict[tuple[str, str], dict]:
    """Each (question, operator)'s query results, its noisy answers computed in bulk.

    A dry pass runs the operators with their noisy queries put off (:meth:`Database.deferring`:
    they read :data:`~pipeline.noise.operators.common.PENDING`), keeping everything else they ask;
    then those of a question's gold SQL, or of it restricted to repaired rows, are answered for all
    candidates of a template at once (:func:`~pipeline.noise.bulk.noisy_answers`). Where an answer
    would have changed the dry pass's course, the real run asks what it still needs itself."""
    memos: dict[tuple[str, str], dict] = {}
    asked: list[Asked] = []
    for q in questions:
        def dry(name: str, q: CleanQuestion = q) -> Candidate | None:
            memo: dict = {}
            deferred: list[tuple[Overlay, str]] = []
            with profile.timed("operator", name, calls=0), db.deferring(deferred):  # the real run counts the call
                cand = run_operator(db, q, name, seed, pools, queries=memo)
            memos[(q.question_id, name)] = memo
            asked.extend((q, name, overlay, sql, memo) for overlay, sql in deferred)
            return cand
        _tried(q, seed, per_question, vetoed_families, dry)
    with profile.timed("operator", "noisy answers in bulk", len(asked)):
        noisy_answers(db, asked, profile)
    return memos
