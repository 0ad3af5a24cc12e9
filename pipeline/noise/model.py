"""What the noise stage passes around: clean questions in, operator proposals, candidate pairs out."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from pipeline.noise.overlay import Overlay
from pipeline.questions.answers import AnswerError, normalise
from pipeline.questions.templates import NoiseSpec, Template, render

if TYPE_CHECKING:
    from pipeline.noise.registry import Operator

AMBIGUOUS = "<ambiguous>"
Behavior = Literal["answer", "abstain", "flag"]  # what a careful agent should do on the noisy side


@dataclass(frozen=True)
class CleanQuestion:
    """One row of ``clean_questions`` with its template, ready for perturbation."""

    question_id: str
    template: Template
    slots: dict
    variant: int
    question: str
    gold_sql: str
    answer: str  # normalised JSON text
    evidence: dict  # table -> sorted _rids

    @classmethod
    def from_row(cls, row: dict, templates: dict[str, Template]) -> CleanQuestion:
        return cls(row["question_id"], templates[row["template_id"]], json.loads(row["slots"]),
                   int(row["variant"]), row["question"], row["gold_sql"], row["answer"],
                   json.loads(row["evidence"]))

    @property
    def answer_type(self) -> str:
        return self.template.answer_type

    @property
    def noise(self) -> NoiseSpec:
        return self.template.noise

    @property
    def evidence_table(self) -> str:
        return self.template.noise.evidence_table

    def evidence_rids(self, table: str | None = None) -> list[int]:
        return list(self.evidence.get(table or self.evidence_table, []))

    def rerender(self, slots: dict) -> tuple[str, str, str]:
        """(question, gold_sql, evidence_sql) of this question's template and variant with ``slots``."""
        return render(self.template, slots, self.variant)


@dataclass(frozen=True)
class OperatorParams:
    """What an operator may use beyond its question: data-backed alternatives from the whole run."""

    entity_pool: tuple[str, ...] = ()  # the entity values of the template's clean questions


@dataclass(frozen=True)
class Detector:
    """How a careful agent could notice the noise from the data alone.

    ``reason``: an evidence-filter reason (``pipeline.questions.evidence``) that must fire on the
    noisy side within ``scope`` (table -> _rids) and not on the clean evidence. ``sql``/``clean_sql``:
    a query returning a violation count, run on the noisy and the clean database.
    """

    reason: str | None = None
    scope: dict = field(default_factory=dict)
    sql: str | None = None
    clean_sql: str | None = None


@dataclass(frozen=True)
class Proposal:
    """What an operator decided for one question; the registry stamps it into a :class:`Candidate`."""

    overlay: Overlay
    noisy_question: str
    naive_sql: str
    expected_behavior: Behavior
    expected_answer: str | None
    detector: Detector
    change_log: list[str]
    noisy_slots: dict
    # The SQL a careful analyst runs on the noisy database to reach ``expected_answer`` (None when
    # the expected behaviour carries no answer): the label is computed by it, and re-checked.
    recovery_sql: str | None = field(default=None, kw_only=True)


@dataclass(frozen=True)
class Candidate(Proposal):
    """A proposal stamped with the question it perturbs and the registered operator that made it
    (its name, noise level, discrepancy category and Kahn dimension)."""

    question: CleanQuestion
    operator: Operator
    # The results of the queries the operator ran (by overlay and SQL): the determinism check's
    # re-run replays them, so it re-tests the operator's own decisions without re-querying.
    queries: dict = field(default_factory=dict, kw_only=True, compare=False, repr=False)

    def fingerprint(self) -> str:
        """Everything the operator decided, as canonical text (the determinism check compares it)."""
        return json.dumps({
            "operator": self.operator.name, "question": self.noisy_question, "naive_sql": self.naive_sql,
            "behavior": self.expected_behavior, "answer": self.expected_answer, "slots": self.noisy_slots,
            "recovery_sql": self.recovery_sql,
            "changes": [[c.table, c.op, c.rid, c.column, c.new_value_json()] for c in self.overlay.changes],
            "detector": [self.detector.reason, self.detector.scope, self.detector.sql, self.detector.clean_sql],
        }, sort_keys=True, default=str)


def answer_of(rows: list[tuple], answer_type: str) -> str | None:
    """Normalised answer of query rows; None when empty, :data:`AMBIGUOUS` when several.

    Rows of two columns ``(reading, value)`` answer an ambiguous name once per reading, as
    ``[[reading, answer], ...]`` by reading (the form :mod:`pipeline.gym.scoring` grades); readings
    without an answer are left out."""
    if rows and len(rows[0]) == 2:
        by_reading: dict[str, list[tuple]] = {}
        for reading, value in rows:
            by_reading.setdefault(reading, []).append((value,))
        answers = [(r, answer_of(v, answer_type)) for r, v in sorted(by_reading.items())]
        readings = [[r, json.loads(a)] for r, a in answers if a is not None and a != AMBIGUOUS]
        return json.dumps(readings, ensure_ascii=False, separators=(",", ":")) if readings else None
    try:
        return normalise(rows, answer_type)
    except AnswerError as exc:
        return AMBIGUOUS if exc.reason == "ambiguous_answer" else None
