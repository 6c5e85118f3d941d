"""benchmarks/efficiency_scores.py: the measured noise floor (the gap a perfect search scores), how verdicts
are judged against the truth and shared over the decided ones, and the null simulation's draws (pure, no
training)."""

from __future__ import annotations

import importlib
import math
import sys
from pathlib import Path

import numpy as np
import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.fixture(scope="module")
def scores():
    sys.path.insert(0, str(BENCHMARKS))
    try:
        yield importlib.import_module("efficiency_scores")
    finally:
        sys.path.remove(str(BENCHMARKS))


def test_measured_floor_averages_every_subset_against_the_reference(scores) -> None:
    ref = {"softmax": {"test": 0.95}, "am_softmax": {"test": 0.90}}
    truth = {"softmax": {1000: 0.94, 1001: 0.96, 1002: 0.98},
             "am_softmax": {1000: 0.90, 1001: 0.90, 1002: 0.90}}
    # softmax: single runs miss by 1, 1, 3 points; pairs (0.95, 0.96, 0.97) by 0, 1, 2; all three (0.96) by 1
    # am_softmax: every subset is exactly the reference
    assert scores.measured_floor(ref, truth, 1) == pytest.approx((5 / 3 + 0) / 2)
    assert scores.measured_floor(ref, truth, 2) == pytest.approx((1 + 0) / 2)
    assert scores.measured_floor(ref, truth, 3) == pytest.approx((1 + 0) / 2)


def test_measured_floor_leaves_out_a_loss_with_too_few_runs(scores) -> None:
    ref = {"softmax": {"test": 0.95}, "as_speed": {"test": 0.90}}
    # as_speed: one run (others diverged)
    truth = {"softmax": {1000: 0.96, 1001: 0.96}, "as_speed": {1000: 0.50}}
    assert scores.measured_floor(ref, truth, 2) == pytest.approx(1.0)
    assert math.isnan(scores.measured_floor(ref, {"softmax": {}}, 1))


def test_gap_goal_names_the_floor_without_changing_its_verdict(scores) -> None:
    null = {"wrong": 1, "answers": 2000}
    record = {"arm": "race", "score": {"wrong": 0, "decided_share": 0.1, "gap": 0.39}}
    lines = scores.goal_lines([record], null, "digits", floor=0.38)
    gap = next(line for line in lines if "gap" in line)
    assert "0.39 -> MISSED (a perfect search scores 0.38 here)" in gap


# -- wrong verdicts: judged against the truth, shared over the decided ones ----------------------------------
def truth(diff: float, low: float, high: float) -> dict:
    return {"n": 10, "diff": diff, "low": low, "high": high, "test": 0.98}


ABOVE = truth(0.0078, 0.0025, 0.0131)  # digits' am_softmax: +0.78 [+0.25, +1.31] points
BELOW = truth(-0.0111, -0.0171, -0.0052)  # as_speed: -1.11 [-1.71, -0.52]
COVERS = truth(0.0031, -0.0019, 0.0080)  # sparsemax: +0.31 [-0.19, +0.80]
IDENTICAL = truth(0.0, 0.0, 0.0)  # sm_softmax at m=0 is softmax: +0.00 [+0.00, +0.00], zero spread
M = 0.005


def test_a_sign_claimed_on_a_null_truth_is_wrong(scores) -> None:
    # a truth interval containing 0 (zero-spread identical runs included) is a null at the truth's resolution:
    # a win or a loss claimed on it is wrong (the old rule only counted an interval on the other side)
    for null in (IDENTICAL, COVERS):
        assert scores.wrong("win", null, M) is True
        assert scores.wrong("loss", null, M) is True
        assert scores.wrong("equivalent", null, M) is False  # |mean| < margin
        assert scores.wrong("undecided (3 seeds)", null, M) is False
    # an interval with 0 at one end still contains it
    assert scores.wrong("win", truth(0.002, 0.0, 0.004), M) is True
    # a resolved truth: the claim on its side is right, the other is wrong (as before)
    assert (scores.wrong("win", ABOVE, M), scores.wrong("loss", ABOVE, M)) == (False, True)
    assert (scores.wrong("loss", BELOW, M), scores.wrong("win", BELOW, M)) == (False, True)
    assert scores.wrong("win", None, M) is None  # no truth: not judged


def answer_of(verdicts: dict[str, str]) -> dict:
    losses = {"softmax": {"test": 0.98, "verdict": "baseline", "best": True},
              **{n: {"test": 0.98, "verdict": v, "best": False} for n, v in verdicts.items()}}
    return {"losses": losses, "winner": "softmax", "compute": 15.0}


def test_wrong_share_is_over_decided_verdicts_not_every_comparison(scores) -> None:
    names = ["softmax", "a", "b", "c", "d", "e"]
    ref = {"ranking": names, "best": "softmax", "compute": 100.0, "floor_confirmed": 0.3, "floor_single": 0.4,
           "losses": {n: {"test": 0.98, "low": 0.97, "high": 0.99} for n in names}}
    tru = {"baseline": "softmax", "losses": {"a": ABOVE, "b": BELOW, "c": COVERS, "d": ABOVE, "e": None}}
    # seed 0: a right win, a wrong win (b's truth is below 0), two undecided, a win on a loss without a truth
    seed0 = scores.score(ref, tru, answer_of({"a": "win", "b": "win", "c": "undecided (3 seeds)",
                                              "d": "undecided (3 seeds)", "e": "win"}), M)
    assert (seed0["comparisons"], seed0["decided"], seed0["unjudged"], seed0["wrong"]) == (5, 3, 1, 1)
    # 1 wrong of the 2 decided verdicts the truth can judge, not 1 of the 5 comparisons (0.2)
    assert seed0["wrong_share"] == 0.5 and seed0["judged"] == 2
    # seed 1 decides nothing: no share of its own, and it adds nothing to the pooled one
    seed1 = scores.score(ref, tru, answer_of(dict.fromkeys("abcde", "undecided (3 seeds)")), M)
    assert seed1["wrong"] == 0 and math.isnan(seed1["wrong_share"])
    records = [{"arm": "race", "budget": 0.15, "seed": s, "compute": 15.0, "wall": 1.0, "score": sc}
               for s, sc in enumerate((seed0, seed1))]
    assert scores.wrong_of_decided(records) == (1, 2, 0.5)
    line = next(x for x in scores.summary_lines(records, ref, ["race"]) if x.startswith("wrong verdicts"))
    assert "1 of 10 comparisons; wrong 1 of 2 decided (share 0.500; per seed 1/2 0/0)" in line
    assert "[seed 0: b], 1 more decided without a truth" in line
    assert "| 1/2 (0.500) | 1 |" in scores.summary_table(records, ["race"])


# -- the null simulation: distinct draws, and an at-margin scenario on the metric's lattice ------------------
LOSSES = ("softmax", "a", "b", "c")


@pytest.fixture
def recorded(scores, monkeypatch):
    """Every `results` the null simulation hands the racing rule (through the real `decide`)."""
    import sim_racing

    from tune_as.results import racing

    seen, real = [], racing.decide

    def record(results, plan, *args, **kwargs):
        seen.append({loss: dict(by_seed) for loss, by_seed in results.items()})
        return real(results, plan, *args, **kwargs)

    monkeypatch.setattr(racing, "decide", record)
    monkeypatch.setattr(sim_racing, "decide", record)  # the draws through sim_racing.from_pools
    return seen


def test_null_simulation_draws_a_distinct_run_per_loss_per_seed(scores, recorded) -> None:
    # 10 runs, every one of another count; 4 losses: no two may share a run on a seed (drawn with replacement,
    # 4 losses share one on a seed with probability 1 - 10*9*8*7/10**4 = 0.5)
    pool = [((275 + i) / 288, (345 + i) / 359) for i in range(10)]
    scores.null_fwer(LOSSES, "softmax", pool, 0.5, 10, 20, seed=0)
    nulls = [r for r in recorded if all(t in {p[1] for p in pool} for by in r.values()
                                        for _, t in by.values())]
    assert len(nulls) == 20
    for results in nulls:
        for seed in range(10):
            assert len({results[loss][seed] for loss in LOSSES}) == len(LOSSES)


def test_distinct_runs_share_only_when_the_pool_forces_it(scores) -> None:
    idx = scores.distinct_runs(3, 5, 4, np.random.default_rng(0))  # 5 losses, a pool of 3 runs, 4 seeds
    assert idx.shape == (5, 4)
    for seed in range(4):  # every run once, then 2 of them a second time: counts 1, 2, 2
        assert sorted(np.bincount(idx[:, seed], minlength=3)) == [1, 2, 2]


def test_at_margin_shifts_are_whole_items_so_equal_counts_occur(scores, recorded) -> None:
    # margin 0.5 points on 359 test items is 1.795 items: the smallest difference at or beyond it is 2 items
    # (2 of 288 validation items); a shift of 0.005 (sim_racing's --from) leaves the lattice
    pool = [((275 + i) / 288, (345 + i) / 359) for i in range(10)]  # consecutive counts
    null = scores.null_fwer(LOSSES, "softmax", pool, 0.5, 10, 20, seed=0, items=(288, 359))
    counts = {345 + i for i in range(10)}
    assert len(recorded) == 40  # the null's 20 answers, then the at-margin scenario's 20
    shifted = recorded[20:]
    ties = 0
    for results in shifted:
        for loss, sign in (("softmax", 0), ("a", 1), ("b", -1), ("c", 1)):  # + and - in turn
            for v, t in results[loss].values():
                assert any(t == (c + 2 * sign) / 359 for c in counts)  # whole test items
                assert any(v == (c - 70 + 2 * sign) / 288 for c in counts)  # whole validation items
        ties += sum(results["a"][s][1] == results["softmax"][s][1] for s in range(10))
    assert ties > 0  # a shifted loss ties its baseline's count on some seed, as real runs do
    assert null["margin"]["answers"] == 20 and null["margin"]["items"] == 359
    assert "2 of 359 test items" in scores.null_lines(null)[1]
    assert scores.margin_step(0.005, 359) == 2 / 359 and scores.margin_step(0.005, 288) == 2 / 288
    assert scores.margin_step(0.005, 400) == 2 / 400 and scores.margin_step(0.005, None) == 0.005
    # a shifted count is the float a run with that count reports (350/359 + 2/359 need not be)
    assert scores.shifted(np.array([350 / 359]), 2 / 359, 359)[0] == 352 / 359
