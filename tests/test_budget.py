"""tune_as.results.budget: one --budget split between the search and the confirmation, decided before anything
runs; the race's last look fixed by what the budget left after the search pays."""

from __future__ import annotations

import pytest

from tune_as.results.budget import CONFIRM_SHARE, BudgetTooSmall, last_look, search_trials

# 13 losses of a multi-class task: 8 with parameters, 5 with nothing to tune, 5 epochs each
TUNABLE = [f"t{i}" for i in range(8)]
FIXED = [f"f{i}" for i in range(5)]
EPOCHS = dict.fromkeys(TUNABLE + FIXED, 5.0)


def test_the_first_round_and_one_trial_per_fixed_loss_are_paid_before_the_search() -> None:
    # reserve 3 seeds x 13 losses x 5 epochs = 195, fixed losses 5 x 5 = 25, a search trial of each tunable:
    # 40
    assert search_trials(1000, EPOCHS, TUNABLE, list(EPOCHS), 3) == 19  # (1000 - 220) / 40 = 19.5
    assert search_trials(800, EPOCHS, TUNABLE, list(EPOCHS), 3) == 14  # (800 - 220) / 40 = 14.5


def test_the_first_round_takes_at_most_a_quarter_of_the_budget() -> None:
    # 195 for every first round would be 75% of 260: a quarter of the budget (65) is reserved instead
    assert CONFIRM_SHARE == 0.25
    assert search_trials(260, EPOCHS, TUNABLE, list(EPOCHS), 3) == 4  # (260 - 65 - 25) / 40 = 4.25
    assert search_trials(390, EPOCHS, TUNABLE, list(EPOCHS), 3) == 6  # (390 - 97.5 - 25) / 40 = 6.7
    # digits at 15% of bench_efficiency's grid: 247.8 trial-epochs, 10 tunable and 3 fixed losses
    digits = dict.fromkeys([*TUNABLE, "t8", "t9", *FIXED[:3]], 5.0)
    # (247.8 - 61.95 - 15) / 50
    assert search_trials(247.8, digits, [*TUNABLE, "t8", "t9"], list(digits), 3) == 3
    # --confirm 3 --confirm-top 3: only 4 losses are confirmed, so the search gets more
    assert search_trials(500, EPOCHS, TUNABLE, TUNABLE[:4], 3) == 10  # (500 - 60 - 25) / 40 = 10.4
    # a loss with its own epochs costs its own epochs
    assert search_trials(300, {"a": 10.0, "b": 2.0}, ["a", "b"], ["a", "b"], 3) == 22  # (300 - 36) / 12


def test_without_confirmation_every_loss_shares_the_budget_in_search_trials() -> None:
    assert search_trials(130, EPOCHS, TUNABLE, [], 0) == 2  # 130 / 65


def test_a_budget_short_of_every_first_round_pays_one_trial_per_loss_and_the_least_round() -> None:
    # the least answer: 40 + 25 for the search, 3 seeds x 2 losses x 5 epochs = 30 for the first round
    assert search_trials(95, EPOCHS, TUNABLE, list(EPOCHS), 3) == 1
    with pytest.raises(BudgetTooSmall, match=r"--budget: expected at least 95 trial-epochs for one search "
                                             r"trial per loss and the first confirmation round of the "
                                             r"baseline and one other loss \(3 seeds each\), got 94"):
        search_trials(94, EPOCHS, TUNABLE, list(EPOCHS), 3)
    with pytest.raises(BudgetTooSmall,
                       match="expected at least 65 trial-epochs for one search trial per loss, got 64"):
        search_trials(64, EPOCHS, TUNABLE, [], 0)


@pytest.mark.parametrize(("left", "last"), [(None, 10), (13 * 5 * 2, 3), (13 * 5 * 3, 3), (13 * 5 * 4.9, 3),
                                            (13 * 5 * 5, 5), (13 * 5 * 8, 7), (13 * 5 * 9.99, 9),
                                            (13 * 5 * 10, 10), (13 * 5 * 50, 10)])
def test_the_race_looks_no_further_than_the_budget_pays_for_every_loss(left: float | None, last: int) -> None:
    budget = None if left is None else 100 + left
    assert last_look(10, budget, 100, 13, 5.0) == last


def test_trials_a_user_asked_for_are_kept_when_the_budget_pays_for_them_and_refused_when_not() -> None:
    assert search_trials(500, EPOCHS, TUNABLE, list(EPOCHS), 3, trials=4) == 4
    with pytest.raises(BudgetTooSmall, match=r"expected at least 540 trial-epochs for --trials-per-loss 8 "
                                             r"and the first confirmation round \(3 seeds x 13 losses\), "
                                             r"got 500"):
        search_trials(500, EPOCHS, TUNABLE, list(EPOCHS), 3, trials=8)
