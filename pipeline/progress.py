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
