"""tune_as.results.verdicts: the paired one-sided t-tests, TOST, Holm over every claim, Hsu's best set."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats
from statsmodels.stats.multitest import multipletests

from tune_as.results import ranking
from tune_as.results.verdicts import (
    STEP_DOWN_MARK,
    Comparison,
    best_set,
    compare_with_baseline,
    holm,
    interval_shows,
    paired_differences,
    points,
    simultaneous_interval,
    verdict_word,
)

M = points(0.5)  # the default margin, 0.005


def by_seed(values: list[float] | np.ndarray, first_seed: int = 0) -> dict[int, float]:
    return {first_seed + i: float(v) for i, v in enumerate(values)}


def smallest_raw_p(base: np.ndarray, other: np.ndarray, margin: float) -> float:
    """The smallest raw p of one loss's three nulls: Holm over a family of 3 multiplies it by 3."""
    row = compare_with_baseline({"softmax": by_seed(base), "x": by_seed(other)}, "softmax", margin, 0.05)[0]
    assert row.p_adjusted < 1.0
    return row.p_adjusted / 3


def test_the_directional_tests_are_scipys_paired_t_tests() -> None:
    rng = np.random.default_rng(7)
    a = rng.normal(0.80, 0.01, 8)
    better = a + rng.normal(0.004, 0.003, 8)
    worse = a - rng.normal(0.004, 0.003, 8)
    # margin 0: no equivalence claim can compete, so the smallest p is the directional one
    for b, alternative in ((better, "greater"), (worse, "less")):
        assert smallest_raw_p(a, b, 0.0) == pytest.approx(
            stats.ttest_rel(b, a, alternative=alternative).pvalue, rel=1e-12)


def test_holm_hand_computed_and_equal_to_statsmodels() -> None:
    # sorted: 0.005*4 = 0.02, 0.01*3 = 0.03, 0.03*2 = 0.06, 0.04*1 -> running max 0.06;
    # steps: 0.005 <= 0.05/4 reject, 0.01 <= 0.05/3 reject, 0.03 > 0.05/2 stop
    reject, adjusted = holm([0.01, 0.04, 0.03, 0.005], 0.05)
    assert reject.tolist() == [True, False, False, True]
    assert adjusted == pytest.approx([0.03, 0.06, 0.06, 0.02])
    rng = np.random.default_rng(0)
    for size in (1, 2, 7, 39):
        for alpha in (0.05, 0.005):
            p = np.round(rng.uniform(0, 0.02, size), 3)  # rounding makes ties
            p[rng.uniform(size=size) < 0.2] = 1.0
            ref_reject, ref_adjusted, _, _ = multipletests(p, alpha, method="holm")
            reject, adjusted = holm(p, alpha)
            assert reject.tolist() == ref_reject.tolist()
            assert adjusted == pytest.approx(ref_adjusted, abs=1e-15)


def test_verdicts_follow_holm_over_all_three_m_hypotheses() -> None:
    """Raw p's from scipy, Holm's thresholds by hand, the verdicts read off."""
    rng = np.random.default_rng(3)
    base = rng.normal(0.80, 0.01, 6)
    values = {"softmax": by_seed(base),
              "up": by_seed(base + 0.02 + rng.normal(0, 0.002, 6)),  # clearly better
              "flat": by_seed(base + rng.normal(0, 0.0005, 6)),  # within the margin, tightly
              "noisy": by_seed(base + rng.normal(0, 0.02, 6))}  # nothing to say
    alpha = 0.05
    raw = []
    for loss in ("up", "flat", "noisy"):
        d = np.array(list(values[loss].values())) - base
        tost = max(stats.ttest_1samp(d, -M, alternative="greater").pvalue,
                   stats.ttest_1samp(d, M, alternative="less").pvalue)
        raw += [(loss, "win", stats.ttest_1samp(d, 0, alternative="greater").pvalue),
                (loss, "loss", stats.ttest_1samp(d, 0, alternative="less").pvalue),
                (loss, "equivalent", tost)]
    rejected: set[tuple[str, str]] = set()
    for step, (loss, h, p) in enumerate(sorted(raw, key=lambda x: x[2])):
        if p > alpha / (len(raw) - step):
            break
        rejected.add((loss, h))
    rows = {r.loss: r for r in compare_with_baseline(values, "softmax", M, alpha)}
    assert rejected == {("up", "win"), ("flat", "equivalent")}  # the example is what it says
    assert rows["up"].verdict == "win"
    assert rows["flat"].verdict == "equivalent"
    assert rows["noisy"].verdict == "undecided"
    smallest = min(p for _, _, p in raw)
    assert min(r.p_adjusted for r in rows.values()) == pytest.approx(smallest * 9)
    assert all(r.decided_at == 1 for r in rows.values() if r.verdict != "undecided")


def test_tost_equivalence_is_the_larger_one_sided_p() -> None:
    rng = np.random.default_rng(11)
    d = rng.normal(0.001, 0.001, 7)
    base = rng.normal(0.8, 0.01, 7)
    expected = max(stats.ttest_1samp(d, -M, alternative="greater").pvalue,
                   stats.ttest_1samp(d, M, alternative="less").pvalue)
    assert expected < stats.ttest_1samp(d, 0.0, alternative="greater").pvalue  # so TOST's p is the smallest
    assert smallest_raw_p(base, base + d, M) == pytest.approx(expected, rel=1e-9)
    tight = {"softmax": by_seed(base), "x": by_seed(base + d)}
    assert compare_with_baseline(tight, "softmax", M, 0.05)[0].verdict == "equivalent"
    loose = {"softmax": by_seed(base), "x": by_seed(base + rng.normal(0, 0.01, 7))}
    assert compare_with_baseline(loose, "softmax", M, 0.05)[0].verdict == "undecided"
    # a margin of 0 never gives "equivalent"
    assert compare_with_baseline(tight, "softmax", 0.0, 0.05)[0].verdict != "equivalent"


def test_equal_counts_and_a_constant_difference_are_no_evidence() -> None:
    base = by_seed([0.80, 0.81, 0.79])
    # the same value on every seed (equal counts on a finite split) is not proof of equivalence: no spread, no
    # test
    same = compare_with_baseline({"softmax": base, "copy": dict(base)}, "softmax", M, 0.05)[0]
    assert (same.verdict, same.p_adjusted, same.mean_diff) == ("undecided", 1.0, 0.0)
    # and its interval is never of zero width: at least one item of the split (here 1 of 359 items) each side
    step = 1 / 359
    wide = compare_with_baseline({"softmax": base, "copy": dict(base)}, "softmax", M, 0.05,
                                 resolution=step)[0]
    assert wide.interval == pytest.approx((-step, step))
    # the same step on every seed (a metric on a finite split moves in steps): no spread to test, so no claim
    up = {s: v + 0.02 for s, v in base.items()}  # +2 points on every seed
    down = {s: v - 0.02 for s, v in base.items()}
    inside = {s: v + 0.002 for s, v in base.items()}  # +0.2 points on every seed
    rows = {r.loss: r for r in compare_with_baseline(
        {"softmax": base, "up": up, "down": down, "inside": inside}, "softmax", M, 0.05)}
    assert {loss: r.verdict for loss, r in rows.items()} == \
        dict.fromkeys(("up", "down", "inside"), "undecided")
    assert all(r.rejected == set() for r in rows.values())
    for r in rows.values():
        assert r.interval is not None and r.mean_diff is not None
        assert not any(math.isnan(x) for x in (r.p_adjusted, r.mean_diff, *r.interval))
    # one seed that differs by another step gives the spread a test needs
    up[1] += 0.001
    assert compare_with_baseline({"softmax": base, "up": up}, "softmax", M, 0.05)[0].verdict == "win"
    assert compare_with_baseline({"softmax": base, "copy": dict(base)}, "softmax", 0.0, 0.05)[0].verdict == \
        "undecided"


def test_fewer_than_two_paired_seeds_is_undecided() -> None:
    values = {"softmax": {1: 0.80, 2: 0.81}, "one": {1: 0.95}, "none": {3: 0.95},
              "other_seed": {2: 0.9, 5: 0.9}}
    rows = {r.loss: r for r in compare_with_baseline(values, "softmax", M, 0.05)}
    assert [(r.verdict, r.n, r.interval, r.p_adjusted) for r in rows.values()] == [
        ("undecided", 1, None, 1.0), ("undecided", 0, None, 1.0), ("undecided", 1, None, 1.0)]
    assert rows["none"].mean_diff is None
    assert rows["one"].mean_diff == pytest.approx(0.15)


def test_pairs_only_shared_seeds() -> None:
    assert paired_differences({1: 0.5, 2: 0.7, 3: 0.9}, {2: 0.6, 3: 0.6, 4: 0.1}) == pytest.approx([0.1, 0.3])


def test_interval_is_bonferroni_over_the_three_m_hypotheses() -> None:
    rng = np.random.default_rng(5)
    base = rng.normal(0.8, 0.01, 9)
    values = {"softmax": by_seed(base),
              **{f"l{i}": by_seed(base + rng.normal(0.001, 0.004, 9)) for i in range(4)}}
    alpha = 0.05
    rows = compare_with_baseline(values, "softmax", M, alpha)
    for r in rows:
        d = np.array(list(values[r.loss].values())) - base
        ci = stats.ttest_1samp(d, 0.0).confidence_interval(confidence_level=1 - 2 * alpha / (3 * 4))
        assert r.interval == pytest.approx((ci.low, ci.high), rel=1e-10)
    assert simultaneous_interval([0.1], 0.01) is None


def test_a_step_down_claim_the_interval_does_not_show_is_marked() -> None:
    """Three clear losses are rejected first, so x's H_loss is tested at alpha / 9, looser than the
    interval's alpha / 12 per side: Holm calls x a loss while its interval still reaches past 0. The printed
    word carries the mark and the ranking table explains it; a claim its interval shows carries none."""
    values = {"softmax": by_seed([0.80] * 5),
              **{name: by_seed([0.70 + 0.001 * ((s * 7 + i) % 3) for s in range(5)])
                 for i, name in enumerate("abc")},
              "x": by_seed(0.80 + np.array([-0.01, -0.0036, -0.0148, -0.0076, -0.014]))}
    rows = {r.loss: r for r in compare_with_baseline(values, "softmax", M, 0.05)}
    x = rows["x"]
    assert x.verdict == "loss" and x.interval is not None and x.interval[1] > 0
    assert not interval_shows(x, M) and verdict_word(x, M) == "loss" + STEP_DOWN_MARK
    assert interval_shows(rows["a"], M) and verdict_word(rows["a"], M) == "loss"
    undecided = Comparison("y", 3, 0.001, (-0.01, 0.012), 0.4, "undecided")
    assert interval_shows(undecided, M) and verdict_word(undecided, M) == "undecided (3 seeds)"
    equivalent = Comparison("z", 5, 0.001, (-0.006, 0.004), 0.01, "equivalent")
    assert not interval_shows(equivalent, M) and interval_shows(equivalent, points(0.6))



def test_earlier_claims_are_kept_and_leave_the_family() -> None:
    rng = np.random.default_rng(9)
    base = rng.normal(0.8, 0.01, 5)
    values = {"softmax": by_seed(base), "a": by_seed(base - 0.03 + rng.normal(0, 0.01, 5)),
              "b": by_seed(base + rng.normal(0.01, 0.004, 5))}
    earlier = {"a": Comparison("a", 3, 0.02, None, 0.001, "win", 1, frozenset({"win"}))}
    rows = {r.loss: r for r in compare_with_baseline(values, "softmax", M, 0.05, earlier=earlier, look=2)}
    # sticky: "a" keeps its claim, its p and its look, with today's data
    assert (rows["a"].verdict, rows["a"].p_adjusted, rows["a"].decided_at, rows["a"].n) == \
        ("win", 0.001, 1, 5)
    # the family: a's two open nulls (p = 1, they keep their place) and b's three -> 5 hypotheses
    smallest = smallest_raw_p(base, np.array(list(values["b"].values())), M)
    assert rows["b"].p_adjusted == pytest.approx(min(1.0, smallest * 5))
    # a loss not tested at this look keeps its place with p = 1 (a, 3 points worse, is tested: a loss)
    untested = compare_with_baseline(values, "softmax", M, 0.05, testable={"a"})
    assert [(r.verdict, r.p_adjusted) for r in untested][1] == ("undecided", 1.0)
    assert untested[0].verdict == "loss"


def test_best_set_keeps_identical_losses_and_drops_a_clearly_worse_one() -> None:
    rng = np.random.default_rng(2)
    seed_effect = rng.normal(0.0, 0.004, 10)
    values = {f"same{i}": by_seed(0.85 + seed_effect + rng.normal(0, 0.002, 10)) for i in range(4)}
    values["worse"] = by_seed(0.82 + seed_effect + rng.normal(0, 0.002, 10))
    best = best_set(values, 0.025)
    assert set(best.members) == {"same0", "same1", "same2", "same3"}
    assert best.excluded_by["worse"] in best.members
    assert best.leader == max(best.members, key=lambda loss: best.means[loss])
    assert [best.means[m] for m in best.members] == \
        sorted((best.means[m] for m in best.members), reverse=True)


def test_best_set_level_is_alpha_over_k_minus_one() -> None:
    rng = np.random.default_rng(4)
    a = rng.normal(0.8, 0.01, 6)
    b = a - 0.004 + rng.normal(0, 0.003, 6)
    p = stats.ttest_rel(a, b, alternative="greater").pvalue
    values = {"a": by_seed(a), "b": by_seed(b), "c": by_seed(a - 0.5)}  # c: far worse, excluded anyway
    # k = 3: b is excluded iff p <= alpha / 2
    assert "b" not in best_set(values, 2 * p * 1.001).members
    assert "b" in best_set(values, 2 * p * 0.999).members
    # earlier exclusions are kept; a pair outside `testable` is not tested
    assert "b" not in best_set(values, 0.5 * p, excluded={"b": "a"}).members
    assert "b" in best_set(values, 0.9, testable={"a", "c"}).members


def test_best_set_holm_rule_steps_down_over_the_losses() -> None:
    """rule="holm": q_i = (k - 1) * min_j p(j better than i), Holm over the open losses. c is exactly 50
    points below a (q = 0, out at the first step, alpha / 3); then b needs q_b = 2p <= alpha / 2."""
    rng = np.random.default_rng(4)
    a = rng.normal(0.8, 0.01, 6)
    b = a - 0.004 + rng.normal(0, 0.003, 6)
    p = stats.ttest_rel(a, b, alternative="greater").pvalue
    values = {"a": by_seed(a), "b": by_seed(b), "c": by_seed(a - 0.5)}
    assert best_set(values, 4 * p * 1.001, rule="holm").members == ("a",)
    assert best_set(values, 4 * p * 0.999, rule="holm").members == ("a", "b")
    assert best_set(values, 4 * p * 0.999, rule="hsu").members == ("a",)  # hsu: p <= alpha / 2
    with pytest.raises(ValueError, match="rule"):
        best_set(values, 0.05, rule="nope")  # type: ignore[arg-type]


def test_bad_input_is_an_error() -> None:
    with pytest.raises(ValueError, match="finite"):
        compare_with_baseline({"softmax": {1: 0.8, 2: math.nan}, "x": {1: 0.8, 2: 0.8}}, "softmax", M, 0.05)
    with pytest.raises(ValueError, match="margin"):
        compare_with_baseline({"softmax": {1: 0.8}, "x": {1: 0.8}}, "softmax", -0.1, 0.05)
    with pytest.raises(ValueError, match="baseline"):
        compare_with_baseline({"x": {1: 0.8}}, "softmax", M, 0.05)
    with pytest.raises(ValueError, match="alpha"):
        best_set({"x": {1: 0.8}}, 0.0)


def test_the_answer_prints_a_selected_setting_as_it_reproduces_the_run() -> None:
    row = ranking.Row("sm_softmax", {"loss.m": "0.8963863270334698", "loss.n": "6", "loss.backward": "inf"},
                      2, 2, [0.8, 0.81], [0.79, 0.8], True)
    assert ranking.table_rows([row])[0][2] == "backward=inf, m=0.8963863270334698, n=6"
