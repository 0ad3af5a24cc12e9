"""Progress lines for long runs, the same in the CLI's output and in Dagster's run log."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable

Log = Callable[[str], None]


def verification_progress(log: Log) -> Callable[[int, int, list[dict]], None]:
    """A ``candidate_records`` progress callback: candidates verified so far, and the rate."""
    started, seen = time.perf_counter(), Counter()

    def progress(done: int, shards: int, records: list[dict]) -> None:
        seen["candidates"] += len(records)
        seen["verified"] += sum(r["verified"] for r in records)
        elapsed = max(time.perf_counter() - started, 1e-9)
        eta = elapsed / done * (shards - done)
        log(f"verification: shard {done}/{shards}, {seen['candidates']:,} candidates verified "
            f"({seen['verified']:,} passed all checks), {seen['candidates'] / elapsed:.1f} candidates/s, "
            f"ETA {eta:.0f} s")
    return progress


def episode_progress(log: Log, total: int, every: float = 2.0) -> Callable[[int, int], None]:
    """An evaluation progress callback ``(episodes done, of which right)``: one line at most every
    ``every`` seconds, and the last one always, with the success so far, the rate and the ETA."""
    started = time.perf_counter()
    last = started - every

    def progress(done: int, succeeded: int) -> None:
        nonlocal last
        now = time.perf_counter()
        if now - last < every and done < total:
            return
        last = now
        rate = done / max(now - started, 1e-9)
        log(f"eval: {done:,}/{total:,} episodes, {succeeded / done:.1%} right, {rate:.1f} episodes/s, "
            f"ETA {(total - done) / rate:.0f} s")
    return progress
