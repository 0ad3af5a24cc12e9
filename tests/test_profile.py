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


def test_bulk_statements_are_listed_apart_and_left_out_of_the_shares():
    from pipeline.profile import STATEMENTS

    p = Profile()
    p.seconds.update({("operator", "noisy answers in bulk"): 4.0, ("check", "effect"): 4.0,
                      (STATEMENTS, "lab_avg / drop_evidence"): 3.0, (STATEMENTS, "lab_avg (columnar)"): 1.0})
    p.calls.update({("operator", "noisy answers in bulk"): 10, ("check", "effect"): 10,
                    (STATEMENTS, "lab_avg / drop_evidence"): 30, (STATEMENTS, "lab_avg (columnar)"): 4})
    assert [r["part"] for r in p.rows()] == ["operator", "check"]
    assert sum(r["share"] for r in p.rows()) == pytest.approx(1.0)
    slowest = p.slowest()
    assert [(r["name"], r["share"], r["ms_per_call"]) for r in slowest] == [
        ("lab_avg / drop_evidence", 3.0 / 8.0, 100.0), ("lab_avg (columnar)", 1.0 / 8.0, 250.0)]
    lines = p.lines()
    assert lines[3].startswith("slowest bulk statements") and "lab_avg / drop_evidence" in lines[4]
    assert len(Profile().lines()) == 1

