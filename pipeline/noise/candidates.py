"""Propose candidate pairs: per clean question, admitted operators from distinct noise levels,
each with its own RNG."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field, replace

import numpy as np
import pyarrow as pa

from pipeline.files import stable_int
from pipeline.noise.model import Candidate, CleanQuestion, OperatorParams
from pipeline.noise.operators import OPERATORS
from pipeline.noise.overlay import Database
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
                 replay: dict | None = None) -> Candidate | None:
    """Operator ``name`` on ``q`` with its own RNG. Its query results are kept on the candidate;
    given an earlier run's (``replay``), the run answers from them instead of querying again."""
    params = OperatorParams(tuple(pools.get(q.template.id, ())))
    queries = dict(replay or {})
    with db.memoized(queries):
        candidate = OPERATORS[name].run(db, q, params, operator_rng(seed, q.question_id, name))
    return None if candidate is None else replace(candidate, queries=queries)


def propose(db: Database, questions: list[CleanQuestion], seed: int,
            per_question: int = DEFAULT_OPERATORS_PER_QUESTION,
            vetoed_families: frozenset[tuple[str, str]] = frozenset(),
            profile: Profile | None = None) -> tuple[list[Candidate], CandidateReport]:
    """Up to ``per_question`` candidates per question, each from a different noise level.

    Value-level noise applies to the fewest questions, so it is tried first; the other levels
    follow in a seeded order, and within a level the admitted operators are tried in a seeded
    order until one applies. A reviewer's vetoed (template, operator) families are never tried,
    so the question's next admitted operator takes their place. ``profile`` gets each operator's time."""
    started = time.perf_counter()
    profile = profile or Profile()
    report = CandidateReport()
    pools = entity_pools(questions)
    out: list[Candidate] = []
    for q in questions:
        rng = np.random.default_rng([seed, stable_int(q.question_id)])
        admitted = [o for o in q.noise.operators if (q.template.id, o) not in vetoed_families]
        order = [SCARCEST_LEVEL] + [OTHER_LEVELS[i] for i in rng.permutation(len(OTHER_LEVELS))]
        taken = 0
        for level in order:
            ops = [o for o in admitted if OPERATORS[o].level == level]
            for k in rng.permutation(len(ops)) if ops else []:
                if taken >= per_question:
                    break
                name = ops[k]
                with profile.timed("operator", name):
                    cand = run_operator(db, q, name, seed, pools)
                if cand is None:
                    report.not_applicable[name] += 1
                    continue
                report.proposed[name] += 1
                out.append(cand)
                taken += 1
                break
    report.seconds = time.perf_counter() - started
    return out, report
