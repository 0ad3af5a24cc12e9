"""Where the noise stage's time goes: seconds and calls by (part, name), summed over workers.

A :class:`Profile` is filled while candidates are proposed (part ``operator``, one entry per
operator) and verified (part ``check``, one entry per check; ``open`` for the per-shard database
and overlay loading), travels back from each worker, and is merged. Its numbers are CPU-side wall
seconds inside workers, so with N workers they add up to about N times the stage's wall time.
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field


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
        """One row per (part, name), parts in first-seen order, slowest first within a part."""
        parts = list(dict.fromkeys(part for part, _ in self.seconds))
        total = sum(self.seconds.values()) or 1.0
        return [{"part": part, "name": name, "seconds": s, "share": s / total, "calls": self.calls[(part, name)],
                 "ms_per_call": 1000 * s / max(self.calls[(part, name)], 1)}
                for part in parts
                for (p, name), s in sorted(self.seconds.items(), key=lambda kv: -kv[1]) if p == part]

    def lines(self) -> list[str]:
        out = [f"{'part':<9}{'name':<26}{'seconds':>9}{'share':>8}{'calls':>9}{'ms/call':>9}"]
        out += [f"{r['part']:<9}{r['name']:<26}{r['seconds']:>9.1f}{r['share']:>8.1%}{r['calls']:>9,}"
                f"{r['ms_per_call']:>9.1f}" for r in self.rows()]
        return out
