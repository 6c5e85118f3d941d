"""Early stopping that compares a trial only with trials of its own loss.

One ASHA for the whole search would rank every loss's trials together: in their first epochs several losses
are numerically identical to softmax (AS-Softmax masks nothing yet, a 6th-order Taylor exp equals exp for
small logits), and a loss that learns slower early is cut by other losses' trials, so the final comparison
mixes 1-epoch runs with full runs. `PerLossASHA` keeps one set of rungs per loss (`scope="loss"`), or one for
every loss (`scope="search"`, the ablation that shows the harm).

Why the rungs are kept here and not in Ray's `ASHAScheduler`: Ray Tune saves the searcher's and the callbacks'
state with an experiment, not the scheduler's, and `ASHAScheduler` keeps its rungs in private attributes (and
pickles them in `save`). A resumed search must judge a trial against the rung values recorded before the
interruption, so the rungs are ours: `Rungs` is asynchronous successive halving with one bracket (Li et al.,
2020, Alg. 2; what `ASHAScheduler(brackets=1)` decides, which tests/test_engine.py checks decision by decision
against Ray's own scheduler), and its state is a JSON file (`state_path`, written after every decision, read
when a resumed search first calls the scheduler): per loss, `null` for a loss without early stopping, else its
rungs as [milestone, {trial id: recorded value}]. JSON, never a pickle (a planted pickle would run whatever it
names).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from ray.tune.schedulers import FIFOScheduler, TrialScheduler

from tune_as.engine.state import SCHEDULER_WHAT, read_json, write_json
from tune_as.errors import UserError

EVERY_LOSS = "*"  # the rungs' key when every loss shares them (scope "search")


def default_grace_period(epochs: float, reduction_factor: float) -> float:
    """A third of the epochs at the default reduction factor (epochs / reduction_factor), at least one epoch:
    with ASHA's geometric rungs that leaves one rung before the end, so a trial is judged once, after a fair
    part of its budget, never on a first epoch in which most losses still look alike."""
    return min(epochs, max(1.0, epochs / reduction_factor))


@dataclass
class Rungs:
    """One bracket of asynchronous successive halving: rungs at grace * rf^k epochs below max_t. A trial that
    reaches a rung for the first time records its value there and is stopped when the value is below the
    rung's (1 - 1/rf) quantile of the values recorded before it; a trial reaching max_t is stopped (it is
    done)."""

    max_t: float
    grace_period: float
    reduction_factor: float
    recorded: list[tuple[float, dict[str, float]]] = field(default_factory=list)  # highest milestone first

    def __post_init__(self) -> None:
        if not self.recorded:
            count = int(math.log(self.max_t / self.grace_period) / math.log(self.reduction_factor) + 1)
            self.recorded = [(self.grace_period * self.reduction_factor ** k, {})
                             for k in reversed(range(count))]

    def cutoff(self, values: dict[str, float]) -> float | None:
        if not values:
            return None
        return float(np.nanpercentile(list(values.values()), (1 - 1 / self.reduction_factor) * 100))

    def record(self, trial_id: str, t: float, value: float) -> bool:
        """Records `value` at the highest rung `t` has reached and this trial has not; True: stop the
        trial."""
        for milestone, values in self.recorded:
            if t < milestone or trial_id in values:
                continue
            cutoff = self.cutoff(values)
            values[trial_id] = value
            return cutoff is not None and value < cutoff
        return False

    def on_result(self, trial_id: str, t: float, value: float) -> bool:
        return t >= self.max_t or self.record(trial_id, t, value)

    def to_json(self) -> list[list[Any]]:
        return [[m, dict(values)] for m, values in self.recorded]

    @classmethod
    def from_json(cls, saved: Any, max_t: float, grace_period: float, reduction_factor: float) -> Rungs:
        """Rungs of a search built with the same settings (the same milestones), filled with the saved
        values."""
        built = cls(max_t, grace_period, reduction_factor)
        milestones = [m for m, _ in built.recorded]
        if not isinstance(saved, list) or [float(m) for m, _ in saved] != milestones:
            raise ValueError(f"rungs at {milestones} built, other rungs saved")
        return cls(max_t, grace_period, reduction_factor,
                   [(m, {str(t): float(v) for t, v in dict(values).items()}) for m, (_, values) in
                    zip(milestones, saved, strict=True)])


class PerLossASHA(TrialScheduler):
    """Rungs per loss (keyed by the trial config's "loss"), each with its loss's own max_t (a loss may train
    other epochs than the rest); a loss with fewer trials than the reduction factor is never stopped early
    (there is nothing to compare a trial with). Trials run in the order they were added (Ray's FIFO)."""

    def __init__(self, time_attr: str, max_t: dict[str, float] | float, grace_period: float,
                 reduction_factor: float, trials_per_loss: int, state_path: Path | None = None,
                 scope: str = "loss") -> None:
        super().__init__()
        self.time_attr, self.max_t, self.grace_period = time_attr, max_t, grace_period
        self.reduction_factor, self.trials_per_loss = reduction_factor, trials_per_loss
        self.state_path, self.scope = state_path, scope
        self.by_loss: dict[str, Rungs | None] = {}
        self._loaded = False
        self._fifo = FIFOScheduler()
        self._metric: str | None = None
        self._sign = 1.0

    @property
    def stops_early(self) -> bool:
        return self.trials_per_loss >= self.reduction_factor

    def set_search_properties(self, metric: str | None, mode: str | None, **spec: Any) -> bool:
        """Tune passes the TuneConfig's metric (None in tune_as: the engine sets ours when it builds us)."""
        self._metric = metric or self._metric
        if mode:
            self._sign = 1.0 if mode == "max" else -1.0
        return True

    def _key(self, trial: Any) -> str:
        return EVERY_LOSS if self.scope == "search" else str(trial.config["loss"])

    def _max_t(self, key: str) -> float:
        if not isinstance(self.max_t, dict):
            return self.max_t
        return max(self.max_t.values()) if key == EVERY_LOSS else self.max_t[key]

    def _rungs(self, trial: Any) -> Rungs | None:
        self._load()
        key = self._key(trial)
        if key not in self.by_loss:
            self.by_loss[key] = (Rungs(self._max_t(key), self.grace_period, self.reduction_factor)
                                 if self.stops_early else None)
        return self.by_loss[key]

    def _observed(self, result: dict[str, Any]) -> tuple[float, float] | None:
        if self._metric is None or self.time_attr not in result or self._metric not in result:
            return None
        return float(result[self.time_attr]), self._sign * float(result[self._metric])

    def on_trial_add(self, tune_controller: Any, trial: Any) -> None:
        self._rungs(trial)

    def on_trial_error(self, tune_controller: Any, trial: Any) -> None:
        pass  # its recorded values stay: other trials were judged against them

    def on_trial_result(self, tune_controller: Any, trial: Any, result: dict[str, Any]) -> str:
        rungs, observed = self._rungs(trial), self._observed(result)
        if rungs is None or observed is None:
            return TrialScheduler.CONTINUE
        stop = rungs.on_result(trial.trial_id, *observed)
        self._save()
        return TrialScheduler.STOP if stop else TrialScheduler.CONTINUE

    def on_trial_complete(self, tune_controller: Any, trial: Any, result: dict[str, Any]) -> None:
        rungs, observed = self._rungs(trial), self._observed(result)
        if rungs is not None and observed is not None:
            rungs.record(trial.trial_id, *observed)
            self._save()

    def on_trial_remove(self, tune_controller: Any, trial: Any) -> None:
        pass

    def choose_trial_to_run(self, tune_controller: Any) -> Any:
        return self._fifo.choose_trial_to_run(tune_controller)

    def debug_string(self) -> str:
        kind = "ASHA" if self.stops_early else "no early stopping"
        return f"Per-loss early stopping ({kind}) for {sorted(self.by_loss)}"

    # -- persistence ------------------------------------------------------------------------------------
    def _save(self) -> None:
        if self.state_path is not None:
            write_json(self.state_path, {"losses": {key: None if rungs is None else rungs.to_json()
                                                    for key, rungs in self.by_loss.items()}})

    def _load(self) -> None:
        if self._loaded:
            return
        self._loaded = True
        if self.state_path is None or not self.state_path.is_file():
            return
        saved = read_json(self.state_path, SCHEDULER_WHAT)
        try:
            for key, state in dict(saved["losses"]).items():
                if (state is None) == self.stops_early:
                    raise ValueError(f"{key}: {'no ' if state is None else ''}rungs saved, "
                                     f"{'rungs' if self.stops_early else 'none'} expected")
                self.by_loss[str(key)] = None if state is None else Rungs.from_json(
                    state, self._max_t(str(key)), self.grace_period, self.reduction_factor)
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise UserError(f"{self.state_path}: expected {SCHEDULER_WHAT} tune_as writes (JSON: per loss, "
                            f"the rungs of its early stopping), got a file it cannot rebuild them from "
                            f"({type(exc).__name__}: {str(exc)[:120]})") from None
