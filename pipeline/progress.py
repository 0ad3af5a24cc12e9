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
    ``every`` seconds, and the last one always, with the success so far, the rate and the ETA. The
    clock starts at the first episode, so the workers' start-up does not drag the rate down."""
    started = last = 0.0

    def progress(done: int, succeeded: int) -> None:
        nonlocal started, last
        now = time.perf_counter()
        if done == 1:
            started = last = now
        if now - last < every and done < total:
            return
        last = now
        rate = (done - 1) / max(now - started, 1e-9)
        eta = f"ETA {(total - done) / rate:.0f} s" if rate > 0 else "ETA –"
        log(f"eval: {done:,}/{total:,} episodes, {succeeded / done:.1%} right, {rate:.1f} episodes/s, {eta}")
    return progress
