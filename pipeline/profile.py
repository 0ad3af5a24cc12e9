"""Where the noise stage's time goes: seconds and calls by (part, name), summed over workers.

A :class:`Profile` is filled while candidates are proposed (part ``operator``, one entry per
operator) and verified (part ``check``, one entry per check; ``open`` for the per-shard database
and overlay loading), travels back from each worker, and is merged. Its numbers are CPU-side wall
seconds inside workers, so with N workers they add up to about N times the stage's wall time.
Part :data:`STATEMENTS` breaks the bulk statements on overlays down by template and operator: time
already counted under an operator or a check, listed apart (:meth:`Profile.slowest`).
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

STATEMENTS = "statements"


@dataclass
class Profile:
    """Seconds and calls by (part, name)."""

    seconds: defaultdict[tuple[str, str], float] = field(default_factory=lambda: defaultdict(float))
    calls: Counter[tuple[str, str]] = field(default_factory=Counter)

    @contextmanager
    def timed(self, part: str, name: str, calls: int = 1) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[(part, name)] += time.perf_counter() - started
            self.calls[(part, name)] += calls

    def merge(self, other: Profile) -> Profile:
        for key, seconds in other.seconds.items():
            self.seconds[key] += seconds
        self.calls.update(other.calls)
        return self

    def rows(self) -> list[dict]:
        """One row per (part, name) but :data:`STATEMENTS`, parts in first-seen order, slowest first
        within a part; shares of their total."""
        parts = [part for part in dict.fromkeys(part for part, _ in self.seconds) if part != STATEMENTS]
        total = self._total()
        return [self._row(part, name, s, total) for part in parts
                for (p, name), s in sorted(self.seconds.items(), key=lambda kv: -kv[1]) if p == part]

    def slowest(self, n: int = 15) -> list[dict]:
        """The ``n`` slowest entries of :data:`STATEMENTS`, shares of the profile's total."""
        total = self._total()
        return [self._row(STATEMENTS, name, s, total) for (part, name), s in
                sorted(self.seconds.items(), key=lambda kv: (-kv[1], kv[0])) if part == STATEMENTS][:n]

    def _total(self) -> float:
        """The seconds outside :data:`STATEMENTS` (which that time contains): what shares are of."""
        return sum(s for (part, _), s in self.seconds.items() if part != STATEMENTS) or 1.0

    def _row(self, part: str, name: str, seconds: float, total: float) -> dict:
        calls = self.calls[(part, name)]
        return {"part": part, "name": name, "seconds": seconds, "share": seconds / total, "calls": calls,
                "ms_per_call": 1000 * seconds / max(calls, 1)}

    def lines(self) -> list[str]:
        """The table of :meth:`rows`, then, if any, the slowest bulk statements by template and operator."""
        out = [f"{'part':<9}{'name':<26}{'seconds':>9}{'share':>8}{'calls':>9}{'ms/call':>9}"]
        out += [_line(f"{r['part']:<9}{r['name']:<26}", r) for r in self.rows()]
        slowest = self.slowest()
        if slowest:
            out.append("slowest bulk statements on overlays, by template and operator (within the rows above;"
                       " calls: queries):")
            out += [_line(f"  {r['name'] if len(r['name']) <= 50 else r['name'][:49] + '…':<50}", r) for r in slowest]
        return out


def _line(label: str, r: dict) -> str:
    return f"{label}{r['seconds']:>9.1f}{r['share']:>8.1%}{r['calls']:>9,}{r['ms_per_call']:>9.1f}"
