"""`--budget E`: how one budget of trial-epochs is split between the search and the confirmation (issue 20).

Pure functions of the request's shape (losses, their epochs, which have parameters), so the split is decided
before anything runs and can be tested without Ray:

- `search_trials`: trials per loss with parameters. The first confirmation round (3 seeds per loss, or `--confirm
  N` for the losses it confirms) is reserved first, a loss with nothing to tune gets its one search trial, and
  the search's trials take the rest. Trials early stopping cuts short leave their epochs to the confirmation.
- `last_look`: the race's last look, fixed once the search has ended (before the first confirmation seed, so
  the error control holds): --max-seeds, or the last look the budget left can pay for every loss. The alpha of
  looks the budget could never reach is not set aside for them: all of it goes to the first look when only that
  one is paid, which is then the fixed design over every loss.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from tune_as.results.racing import look_schedule


class BudgetTooSmall(ValueError):
    """The budget cannot pay one search trial per loss and the first confirmation round."""


def search_trials(budget: float, epochs: Mapping[str, float], tunable: Sequence[str],
                  confirmed: Sequence[str], first_seeds: int, trials: int | None = None) -> int:
    """Search trials per tunable loss that `budget` pays after the first confirmation round (`first_seeds` runs
    of each loss in `confirmed`, 0 when the answer is not confirmed) and one trial of each loss without
    parameters (every loss's trials when nothing is confirmed). BudgetTooSmall when not even one fits, or when
    the `trials` a user asked for do not fit."""
    reserve = first_seeds * sum(epochs[loss] for loss in confirmed)
    fixed = [loss for loss in epochs if loss not in tunable]
    searched = list(tunable) if first_seeds else list(epochs)
    fixed_cost = sum(epochs[loss] for loss in fixed) if first_seeds else 0.0
    per_trial = sum(epochs[loss] for loss in searched)
    left = budget - reserve - fixed_cost
    n = math.floor(left / per_trial + 1e-9) if per_trial else 1
    asked = 1 if trials is None else trials
    if n < asked or left < 0:
        need = reserve + fixed_cost + per_trial * asked
        search = "one search trial per loss" if trials is None else f"--trials-per-loss {trials}"
        what = f"{search} and the first confirmation round ({first_seeds} seeds x {len(confirmed)} losses)"
        raise BudgetTooSmall(f"--budget: expected at least {need:g} trial-epochs for "
                             f"{what if first_seeds else search}, got {budget:g}")
    return n if trials is None else trials


def last_look(max_seeds: int, budget: float | None, spent: float, losses: int, epochs_per_run: float,
              first: int = 3, step: int = 2) -> int:
    """The race's last look (seeds per loss): the largest of its looks (first, first + step, ..., max_seeds)
    that the budget left after `spent` pays for all `losses`, or the first look when none is paid in full."""
    looks = look_schedule(first, step, max_seeds)
    if budget is None:
        return looks[-1]
    affordable = (budget - spent) / (losses * epochs_per_run)
    return max((n for n in looks if n <= affordable + 1e-9), default=looks[0])
