"""The operator registry: every perturbation is a plain function with one signature,

    operator(db: Database, question: CleanQuestion, params: dict, rng: numpy Generator) -> Candidate | None

registered here with its level and discrepancy category. ``None`` means "does not apply to this
question" (counted, never an error). Operators only propose; :mod:`pipeline.noise.verify` decides.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

OperatorFn = Callable[..., object]


@dataclass(frozen=True)
class OperatorSpec:
    name: str
    level: str  # record | value | query
    discrepancy: str  # category an agent should name when it flags or abstains
    kahn: str  # Kahn et al. data-quality dimension it breaks
    fn: OperatorFn
    doc: str


OPERATORS: dict[str, OperatorSpec] = {}


def operator(name: str, level: str, discrepancy: str, kahn: str):
    def register(fn: OperatorFn) -> OperatorFn:
        if name in OPERATORS:
            raise ValueError(f"operator {name!r} registered twice")
        OPERATORS[name] = OperatorSpec(name, level, discrepancy, kahn, fn, (fn.__doc__ or "").strip())
        return fn
    return register


def _load() -> None:
    from pipeline.noise.operators import query, record, value  # noqa: F401  (registration)


_load()
