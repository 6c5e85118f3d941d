"""`--budget E`: how one budget of trial-epochs is split between the search and the confirmation (issue 20).

Pure functions of the request's shape (losses, their epochs, which have parameters), so the split is decided
before anything runs and can be tested without Ray:

- `search_trials`: trials per loss with parameters. The first confirmation round (3 seeds per loss, or
  `--confirm N` for the losses it confirms) is reserved first, but never more than CONFIRM_SHARE of the
  budget; a loss with nothing to tune gets its one search trial, and the search's trials take the rest. Trials
  early stopping cuts short leave their epochs to the confirmation. When the reserve is short of every loss's
  first round, the race confirms the losses best on the search's validation first (`engine.run`), and the
  others stay undecided. A budget that pays less still gets one search trial per loss when it pays the first
  round of the baseline and one other loss.
- `last_look`: the race's last look, fixed once the search has ended (before the first confirmation seed, so
  the error control holds): --max-seeds, or the last look the budget left can pay for every loss. The alpha of
  looks the budget could never reach is not set aside for them: all of it goes to the first look when only
  that one is paid, which is then the fixed design over every loss.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from tune_as.results.racing import FIRST_LOOK, LOOK_STEP, look_schedule

# At most this share of a --budget is reserved for the first confirmation round: the rest buys search trials,
# which closed more of the gap to a grid's best setting than first-round seeds bought decisions
# (docs/bench_efficiency.md).
CONFIRM_SHARE = 0.25


class BudgetTooSmall(ValueError):
    """The budget cannot pay one search trial per loss and the first confirmation round."""


def search_trials(budget: float, epochs: Mapping[str, float], tunable: Sequence[str],
                  confirmed: Sequence[str], first_seeds: int, trials: int | None = None) -> int:
    """Search trials per tunable loss that `budget` pays after the first confirmation round (`first_seeds`
    runs of each loss in `confirmed`, at most CONFIRM_SHARE of the budget; 0 when the answer is not confirmed:
    every loss then has search trials) and one trial of each loss without parameters. `trials`: what the user
    asked for, kept if the budget pays it. BudgetTooSmall when even the least answer does not fit."""
    fixed_cost = sum(epochs[loss] for loss in epochs if loss not in tunable) if first_seeds else 0.0
    per_trial = sum(epochs[loss] for loss in (tunable if first_seeds else epochs))
    full_round = first_seeds * sum(epochs[loss] for loss in confirmed)
    if trials is not None:
        need = full_round + fixed_cost + per_trial * trials
        what = f"--trials-per-loss {trials}" + (
            f" and the first confirmation round ({first_seeds} seeds x {len(confirmed)} losses)"
            if first_seeds else "")
    else:
        # the least answer: one search trial per loss, the first round of the baseline and one other loss
        least_round = min(full_round,
                          first_seeds * 2 * max((epochs[loss] for loss in confirmed), default=0.0))
        reserve = max(least_round, min(full_round, CONFIRM_SHARE * budget))
        if per_trial and budget - reserve - fixed_cost >= per_trial - 1e-9:
            return math.floor((budget - reserve - fixed_cost) / per_trial + 1e-9)
        need = least_round + fixed_cost + per_trial
        what = "one search trial per loss" + (
            f" and the first confirmation round of the baseline and one other loss ({first_seeds} seeds each)"
            if first_seeds else "")
    if budget < need - 1e-9:
        raise BudgetTooSmall(f"--budget: expected at least {need:g} trial-epochs for {what}, got {budget:g}")
    return 1 if trials is None else trials


def last_look(max_seeds: int, budget: float | None, spent: float, losses: int, epochs_per_run: float,
              first: int = FIRST_LOOK, step: int = LOOK_STEP) -> int:
    """The race's last look (seeds per loss): the largest of its looks (first, first + step, ..., max_seeds)
    that the budget left after `spent` pays for all `losses`, or the first look when none is paid in full."""
    looks = look_schedule(first, step, max_seeds)
    if budget is None:
        return looks[-1]
    affordable = (budget - spent) / (losses * epochs_per_run)
    return max((n for n in looks if n <= affordable + 1e-9), default=looks[0])
