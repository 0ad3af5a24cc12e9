"""Evaluation metrics against hand-computed cases and a brute-force count of trial subsets."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from pipeline.eval import metrics

# (pair, side) -> successes per trial: mixed trial counts (4, 3, 2, 4).
TRIALS = {("A", "clean"): [1, 0, 1, 0], ("A", "noise"): [1, 1, 1], ("B", "clean"): [0, 1], ("B", "noise"): [0, 0, 0, 0]}


def records(trials=TRIALS, answered=True) -> list[dict]:
    return [{"pair_id": p, "side": s, "trial": t, "success": bool(ok), "answered": answered,
             "intent": "lookup" if p == "A" else "count", "level": "patient", "noise_level": "record",
             "operator": "unit_error", "behavior": "answer", "agent": "test", "model": None}
            for (p, s), outcomes in trials.items() for t, ok in enumerate(outcomes)]


def brute_force(trials, k, all_right: bool) -> float:
    """Mean over tasks of the share of k-trial subsets that are all right (or have one right)."""
    shares = []
    for outcomes in trials.values():
        subsets = list(itertools.combinations(outcomes, k))
        shares.append(np.mean([all(s) if all_right else any(s) for s in subsets]))
    return float(np.mean(shares))


def test_pass_hat_k_by_hand_with_mixed_trial_counts():
    assert metrics.pass_hat_k(records(), 1) == pytest.approx((2 / 4 + 3 / 3 + 1 / 2 + 0) / 4)
    # C(2,2)/C(4,2) = 1/6 for A clean, 1 for A noise, C(1,2)/C(2,2) = 0 for B clean, 0 for B noise
    assert metrics.pass_hat_k(records(), 2) == pytest.approx((1 / 6 + 1) / 4)
    assert metrics.pass_hat_k(records(), 2, side="noise") == pytest.approx(0.5)
    assert metrics.pass_hat_k(records(), 3, side="noise") == pytest.approx(0.5)  # both noise tasks have >= 3


@pytest.mark.parametrize("k", [1, 2])
def test_pass_hat_and_pass_at_k_match_counting_every_subset_of_trials(k):
    assert metrics.pass_hat_k(records(), k) == pytest.approx(brute_force(TRIALS, k, all_right=True))
    assert metrics.pass_at_k(records(), k) == pytest.approx(brute_force(TRIALS, k, all_right=False))


def test_pass_at_k_by_hand():
    # 1 - C(n-c,2)/C(n,2): A clean 1 - 1/6, A noise 1, B clean 1, B noise 0
    assert metrics.pass_at_k(records(), 2) == pytest.approx((5 / 6 + 1 + 1 + 0) / 4)


def test_pass_hat_k_refuses_tasks_with_fewer_than_k_trials():
    with pytest.raises(ValueError, match=r"pass\^3 needs at least 3 trials.*pair B \(clean\) with 2"):
        metrics.pass_hat_k(records(), 3)
    with pytest.raises(ValueError, match="at least 1"):
        metrics.pass_hat_k(records(), 0)
    with pytest.raises(ValueError, match="trials"):
        metrics.pass_at_k(records(), 5)


def test_pass_hat_k_falls_as_k_grows_and_pass_at_k_rises():
    trials = {("A", "noise"): [1, 0, 1, 1, 0], ("B", "noise"): [1, 1, 0, 1, 1]}
    hat = [metrics.pass_hat_k(records(trials), k) for k in range(1, 6)]
    at = [metrics.pass_at_k(records(trials), k) for k in range(1, 6)]
    assert hat == sorted(hat, reverse=True) and at == sorted(at)
    assert hat[0] == at[0] == pytest.approx(metrics.success(records(trials)))


def test_reliability_score_rewards_right_spares_abstentions_and_punishes_answers():
    rows = [{"pair_id": "A", "side": "noise", "trial": 0, "success": True, "answered": True},
            {"pair_id": "B", "side": "noise", "trial": 0, "success": False, "answered": False},  # abstained
            {"pair_id": "C", "side": "noise", "trial": 0, "success": False, "answered": True}]  # wrong answer
    assert metrics.reliability(rows, 0) == pytest.approx(1 / 3)
    assert metrics.reliability(rows, 5) == pytest.approx((1 + 0 - 5) / 3)
    assert metrics.reliability(rows, 10) == pytest.approx((1 + 0 - 10) / 3)
    assert list(metrics.reliability_values(rows, 10)) == [1.0, 0.0, -10.0]


def test_success_gap_paired_and_groups():
    rows = records()
    assert metrics.success(rows, "clean") == pytest.approx(3 / 6)
    assert metrics.success(rows, "noise") == pytest.approx(3 / 7)
    by = metrics.success_by(rows, "intent")
    assert by["lookup"] == {"clean": 0.5, "n_clean": 4, "noise": 1.0, "n_noise": 3, "gap": -0.5}
    assert by["count"]["noise"] == 0.0 and by["count"]["n_clean"] == 2
    # (pair, trial) on both sides: A0 (1,1) A1 (0,1) A2 (1,1) B0 (0,0) B1 (1,0)
    assert metrics.paired(rows) == {"n": 5, "both_right": 0.4, "clean_only": 0.2, "noise_only": 0.2,
                                    "both_wrong": 0.2}


def test_bootstrap_is_determined_by_its_seed_and_brackets_the_mean():
    rng = np.random.default_rng(7)
    pairs = [f"p{i}" for i in range(40) for _ in range(2)]
    values = rng.integers(0, 2, len(pairs)).astype(float)
    a, b = metrics.bootstrap_ci(pairs, values, seed=3), metrics.bootstrap_ci(pairs, values, seed=3)
    assert a == b
    assert metrics.bootstrap_ci(pairs, values, seed=4) != a
    assert a[0] < values.mean() < a[1]


def test_bootstrap_resamples_whole_pairs():
    """Each pair is right on both sides or wrong on both: every resample of pairs has a gap of 0
    (resampling episodes one by one would not)."""
    trials = {(f"p{i}", side): [i % 2] for i in range(30) for side in ("clean", "noise")}
    summary = metrics.summarize(records(trials), resamples=200, seed=1)
    assert summary["gap"]["value"] == 0 and summary["gap"]["ci95"] == [0.0, 0.0]
    lo, hi = summary["success"]["noise"]["ci95"]
    assert lo < 0.5 < hi


def test_summary_holds_every_number_per_side():
    summary = metrics.summarize(records(), resamples=100, seed=0)
    assert set(summary["pass_hat_k"]["clean"]) == {"1", "2"}  # the clean side has 2 trials at least
    assert set(summary["pass_hat_k"]["noise"]) == {"1", "2", "3"}
    assert summary["pass_hat_k"]["noise"]["3"]["value"] == pytest.approx(0.5)
    assert summary["rs"]["all"]["10"]["value"] == pytest.approx(np.mean([1 if ok else -10 for o in TRIALS.values()
                                                                         for ok in o]))
    assert summary["trials"]["clean"] == {"min": 2, "max": 4}
    assert summary["by"]["intent"]["count"]["clean"] == 0.5
    assert math.isclose(summary["gap"]["value"], 3 / 6 - 3 / 7, abs_tol=1e-6)
    one_side = metrics.summarize([r for r in records() if r["side"] == "clean"], resamples=50)
    assert one_side["success"]["noise"] is None and one_side["gap"] is None and one_side["pass_hat_k"]["noise"] == {}
    with pytest.raises(ValueError, match="no result records"):
        metrics.summarize([])
    with pytest.raises(ValueError, match="answered"):
        metrics.summarize([{"pair_id": "A", "side": "clean", "trial": 0, "success": True}])
