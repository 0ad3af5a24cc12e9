"""Reviewer vetoes: pairs, or whole template × operator families, an auditor rejected, with why.

``audit/vetoes.yaml`` (in the project; ``ehr-robustgym build --vetoes PATH`` or the Dagster
resource's ``vetoes`` choose another file) holds a list of entries::

    - pair_id: 3f9c0a1b2d4e5f60
      reason: the duplicated row differs only in a column the question ignores
    - template_id: lab_last_value
      operator: unit_scale
      reason: the scaled value is still clinically plausible for this lab

A vetoed family is never proposed (each question affected tries its next admitted operator
instead); selection drops vetoed pairs before it ranks and balances, so a vetoed pair is never
shipped and its slot is filled by the next pair in the seeded order. A pair veto acts after the
expensive stage, so editing it re-runs only selection; a family veto re-runs the noise stage.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml

from pipeline.noise.operators import OPERATORS

VETOES_FILE = Path("audit") / "vetoes.yaml"


class VetoError(ValueError):
    """A malformed vetoes file; the message names the file and the entry."""


@dataclass(frozen=True)
class Veto:
    reason: str
    pair_id: str | None = None
    template_id: str | None = None
    operator: str | None = None

    def matches(self, pair: dict) -> bool:
        if self.pair_id is not None:
            return pair["pair_id"] == self.pair_id
        return pair["template_id"] == self.template_id and pair["operator"] == self.operator

    def as_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None}


@dataclass(frozen=True)
class Vetoes:
    entries: tuple[Veto, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.entries)

    def families(self) -> frozenset[tuple[str, str]]:
        """The vetoed (template_id, operator) families: the noise stage never proposes them."""
        return frozenset((v.template_id, v.operator) for v in self.entries
                         if v.template_id is not None and v.operator is not None)

    def veto_of(self, pair: dict) -> Veto | None:
        """The first entry that vetoes ``pair``, or None."""
        return next((v for v in self.entries if v.matches(pair)), None)

    def report(self, candidates: list[dict]) -> list[dict]:
        """Every entry with where it acts and the verified candidates it removed at selection
        (manifest and audit); a family acts at proposal, so it leaves none to remove."""
        verified = [c for c in candidates if c["verified"]]
        return [{**v.as_dict(), "acts_at": "selection" if v.pair_id else "proposal",
                 "removed": sum(v.matches(c) for c in verified)} for v in self.entries]


NO_VETOES = Vetoes()


def load_vetoes(path: str | os.PathLike | None) -> Vetoes:
    """The vetoes in ``path``; no file (or None) means no vetoes."""
    if path is None or not Path(path).is_file():
        return NO_VETOES
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise VetoError(f"{path}: not valid YAML: {exc}") from exc
    if data is None:
        return NO_VETOES
    if not isinstance(data, list):
        raise VetoError(f"{path}: expected a list of vetoes, found {type(data).__name__}")
    return Vetoes(tuple(_entry(path, i, e) for i, e in enumerate(data, 1)))


def _entry(path, number: int, entry) -> Veto:
    where = f"{path}: veto {number}"
    if not isinstance(entry, dict):
        raise VetoError(f"{where}: expected a mapping, found {entry!r}")
    unknown = set(entry) - {"pair_id", "template_id", "operator", "reason"}
    if unknown:
        raise VetoError(f"{where}: unknown keys {sorted(unknown)}")
    if not str(entry.get("reason") or "").strip():
        raise VetoError(f"{where}: a veto needs a reason")
    family = entry.get("template_id") is not None or entry.get("operator") is not None
    if (entry.get("pair_id") is not None) == family:
        raise VetoError(f"{where}: give either pair_id, or template_id and operator")
    if family and (entry.get("template_id") is None or entry.get("operator") is None):
        raise VetoError(f"{where}: a family veto needs both template_id and operator")
    if family and entry["operator"] not in OPERATORS:
        raise VetoError(f"{where}: unknown operator {entry['operator']!r}")
    return Veto(reason=str(entry["reason"]).strip(),
                pair_id=None if entry.get("pair_id") is None else str(entry["pair_id"]),
                template_id=None if entry.get("template_id") is None else str(entry["template_id"]),
                operator=entry.get("operator"))
