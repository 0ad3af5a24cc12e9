"""The operator registry: what each perturbation operator is, said once, where it is defined.

An operator is a plain function with one signature (:class:`OperatorFunction`), registered under
its function name by :func:`operator` with its noise level, discrepancy category and Kahn et al.
data-quality dimension; its docstring says what it does. It only proposes (:class:`Proposal`,
or ``None`` when it does not apply: counted, never an error); :meth:`Operator.run` stamps the
proposal into a :class:`Candidate` and :mod:`pipeline.noise.verify` decides.

This module imports no operator. :data:`OPERATORS` fills as operator modules are imported:
read it through :mod:`pipeline.noise.operators`, which imports them all.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Protocol

import numpy as np

from pipeline.noise.model import Candidate, CleanQuestion, OperatorParams, Proposal
from pipeline.noise.overlay import Database

NOISE_LEVELS = ("record", "value", "query")  # what the noise touches; a question's level: QUESTION_LEVELS


class OperatorFunction(Protocol):
    """The one signature of every operator; ``None`` means it does not apply to the question."""

    __name__: str

    def __call__(self, db: Database, question: CleanQuestion, params: OperatorParams,
                 rng: np.random.Generator, /) -> Proposal | None: ...


@dataclass(frozen=True)
class Operator:
    """A registered operator: its function and what the registry stamps on its proposals."""

    name: str
    level: str  # one of NOISE_LEVELS
    discrepancy: str  # the category an agent should name when it flags or abstains
    kahn: str  # the Kahn et al. data-quality dimension the noise breaks
    function: OperatorFunction

    @property
    def doc(self) -> str:
        """What the operator does, from its docstring, on one line."""
        return " ".join((self.function.__doc__ or "").split())

    def run(self, db: Database, question: CleanQuestion, params: OperatorParams,
            rng: np.random.Generator) -> Candidate | None:
        proposal = self.function(db, question, params, rng)
        return None if proposal is None else self.stamp(question, proposal)

    def stamp(self, question: CleanQuestion, proposal: Proposal) -> Candidate:
        return Candidate(**vars(proposal), question=question, operator=self)


_registered: dict[str, Operator] = {}
OPERATORS: Mapping[str, Operator] = MappingProxyType(_registered)


def operator(*, level: str, discrepancy: str, kahn: str) -> Callable[[OperatorFunction], OperatorFunction]:
    """Register the decorated function as the operator named like it."""
    if level not in NOISE_LEVELS:
        raise ValueError(f"noise level {level!r} is not one of {', '.join(NOISE_LEVELS)}")

    def register(function: OperatorFunction) -> OperatorFunction:
        name = function.__name__
        if name in _registered:
            raise ValueError(f"operator {name!r} registered twice")
        _registered[name] = Operator(name, level, discrepancy, kahn, function)
        return function
    return register
