"""The build's profile: time by (part, name), merged over workers."""

from __future__ import annotations

import time

import pytest

from pipeline.profile import Profile


def test_timed_counts_calls_and_time_even_when_the_block_raises():
    p = Profile()
    with p.timed("operator", "drop_evidence"):
        time.sleep(0.01)
    with pytest.raises(KeyError), p.timed("operator", "drop_evidence"):
        raise KeyError("x")
    with p.timed("check", "clean", calls=40):
        pass
    assert p.calls == {("operator", "drop_evidence"): 2, ("check", "clean"): 40}
    assert p.seconds[("operator", "drop_evidence")] >= 0.01


def test_merge_adds_workers_and_rows_keep_parts_together_slowest_first():
    a, b = Profile(), Profile()
    a.seconds.update({("operator", "x"): 1.0, ("check", "effect"): 3.0})
    a.calls.update({("operator", "x"): 2, ("check", "effect"): 3})
    b.seconds.update({("operator", "y"): 4.0, ("operator", "x"): 1.0})
    b.calls.update({("operator", "y"): 1, ("operator", "x"): 2})
    rows = a.merge(b).rows()
    assert [(r["part"], r["name"]) for r in rows] == [("operator", "y"), ("operator", "x"), ("check", "effect")]
    x = rows[1]
    assert (x["seconds"], x["calls"], x["ms_per_call"]) == (2.0, 4, 500.0)
    assert sum(r["share"] for r in rows) == pytest.approx(1.0)
    assert len(a.lines()) == 4 and "ms/call" in a.lines()[0]
