"""Early stopping that compares a trial only with trials of its own loss.

One ASHA for the whole search would rank every loss's trials together: in their first epochs several losses
are numerically identical to softmax (AS-Softmax masks nothing yet, a 6th-order Taylor exp equals exp for small
logits), and a loss that learns slower early is cut by other losses' trials, so the final comparison mixes
1-epoch runs with full runs. `PerLossASHA` keeps one set of Ray's own ASHA brackets per loss and delegates each
trial's events to its loss's scheduler; nothing here decides by itself.

Ray Tune does not save a scheduler's state with the experiment (only the searcher's and the callbacks'), so
the brackets are written to `state_path` after every decision and read back when a resumed search first
calls the scheduler: a resumed trial is judged against the same rung values as before the interruption.
The file is JSON (a pickle would run whatever a planted file names): per loss, `null` for a FIFO loss, else
each bracket's rungs as [milestone, {trial id: recorded value}] and the bracket of each live trial. That is all
an `ASHAScheduler` decides from (the cutoff of a rung is a percentile of its recorded values); Ray keeps it in
private attributes (`_brackets[i]._rungs`, `_trial_info`), read and written only by `_asha_state` and
`_restore_asha`, whose round trip tests/test_engine.py checks.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ray.tune.schedulers import ASHAScheduler, FIFOScheduler, TrialScheduler

from tune_as.engine.state import read_json, write_json
from tune_as.errors import UserError

STATE_WHAT = "the early-stopping state"


def default_grace_period(epochs: float, reduction_factor: float) -> float:
    """A third of the epochs at the default reduction factor (epochs / reduction_factor), at least one epoch:
    with ASHA's geometric rungs that leaves one rung before the end, so a trial is judged once, after a fair
    part of its budget, never on a first epoch in which most losses still look alike."""
    return min(epochs, max(1.0, epochs / reduction_factor))


class PerLossASHA(TrialScheduler):
    """One `ASHAScheduler` per loss (keyed by the trial config's "loss"), each with its loss's own max_t (a loss
    may train other epochs than the rest); a loss with fewer trials than the reduction factor gets a
    `FIFOScheduler` (there is nothing to compare a trial with)."""

    def __init__(self, time_attr: str, max_t: dict[str, float] | float, grace_period: float, reduction_factor: float,
                 trials_per_loss: int, state_path: Path | None = None) -> None:
        super().__init__()
        self.time_attr, self.max_t, self.grace_period = time_attr, max_t, grace_period
        self.reduction_factor, self.trials_per_loss = reduction_factor, trials_per_loss
        self.state_path = state_path
        self.by_loss: dict[str, TrialScheduler] = {}
        self._loaded = False
        self._fifo = FIFOScheduler()
        self._metric: str | None = None
        self._mode: str | None = None

    @property
    def stops_early(self) -> bool:
        return self.trials_per_loss >= self.reduction_factor

    def set_search_properties(self, metric: str | None, mode: str | None, **spec: Any) -> bool:
        """Tune passes the TuneConfig's metric (None in tune_as: the engine sets ours when it builds us)."""
        self._metric, self._mode = metric or self._metric, mode or self._mode
        for scheduler in self.by_loss.values():
            scheduler.set_search_properties(self._metric, self._mode, **spec)
        return True

    def _for(self, trial: Any) -> TrialScheduler:
        self._load()
        loss = str(trial.config["loss"])
        if loss not in self.by_loss:
            self.by_loss[loss] = self._new(loss)
        return self.by_loss[loss]

    def _new(self, loss: str) -> TrialScheduler:
        scheduler: TrialScheduler
        if self.stops_early:
            # ASHA compares `epoch` (fractional) against float rungs: its int annotations are narrower
            scheduler = ASHAScheduler(time_attr=self.time_attr, max_t=self._max_t(loss),  # type: ignore[arg-type]
                                      grace_period=self.grace_period,  # type: ignore[arg-type]
                                      reduction_factor=self.reduction_factor)
        else:
            scheduler = FIFOScheduler()
        scheduler.set_search_properties(self._metric, self._mode)
        return scheduler

    def _max_t(self, loss: str) -> float:
        return self.max_t[loss] if isinstance(self.max_t, dict) else self.max_t

    def on_trial_add(self, tune_controller: Any, trial: Any) -> None:
        self._for(trial).on_trial_add(tune_controller, trial)

    def on_trial_error(self, tune_controller: Any, trial: Any) -> None:
        self._for(trial).on_trial_error(tune_controller, trial)
        self._save()

    def on_trial_result(self, tune_controller: Any, trial: Any, result: dict[str, Any]) -> str:
        decision = self._for(trial).on_trial_result(tune_controller, trial, result)
        self._save()
        return str(decision)

    def on_trial_complete(self, tune_controller: Any, trial: Any, result: dict[str, Any]) -> None:
        self._for(trial).on_trial_complete(tune_controller, trial, result)
        self._save()

    def on_trial_remove(self, tune_controller: Any, trial: Any) -> None:
        self._for(trial).on_trial_remove(tune_controller, trial)
        self._save()

    def choose_trial_to_run(self, tune_controller: Any) -> Any:
        return self._fifo.choose_trial_to_run(tune_controller)  # every loss's scheduler runs FIFO

    def debug_string(self) -> str:
        kind = "ASHA" if self.stops_early else "no early stopping"
        return f"Per-loss early stopping ({kind}) for {sorted(self.by_loss)}"

    # -- persistence ------------------------------------------------------------------------------------
    def _save(self) -> None:
        if self.state_path is None:
            return
        losses = {loss: _asha_state(s) if isinstance(s, ASHAScheduler) else None for loss, s in self.by_loss.items()}
        write_json(self.state_path, {"losses": losses})

    def _load(self) -> None:
        if self._loaded:
            return
        self._loaded = True
        if self.state_path is None or not self.state_path.is_file():
            return
        saved = read_json(self.state_path, STATE_WHAT)
        try:
            for loss, state in dict(saved["losses"]).items():
                scheduler = self._new(str(loss))
                if state is not None:
                    if not isinstance(scheduler, ASHAScheduler):
                        raise ValueError(f"brackets saved for {loss}, which has no early stopping")
                    _restore_asha(scheduler, state)
                self.by_loss[str(loss)] = scheduler
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise UserError(f"{self.state_path}: expected {STATE_WHAT} tune_as writes (JSON: per loss, the "
                            f"rungs of its brackets), got a file it cannot rebuild them from ({type(exc).__name__}: "
                            f"{str(exc)[:120]})") from None


def _asha_state(scheduler: ASHAScheduler) -> dict[str, Any]:
    brackets = scheduler._brackets  # private in Ray: see the module docstring
    return {"brackets": [[[float(milestone), {str(t): float(v) for t, v in recorded.items()}]
                          for milestone, recorded in bracket._rungs] for bracket in brackets],
            "trials": {str(t): brackets.index(b) for t, b in scheduler._trial_info.items()}}


def _restore_asha(scheduler: ASHAScheduler, state: dict[str, Any]) -> None:
    """Fill a new scheduler (built with the saved search's settings, so with the same rungs) with saved values."""
    brackets = scheduler._brackets
    saved = state["brackets"]
    if len(saved) != len(brackets):
        raise ValueError(f"{len(saved)} brackets saved, {len(brackets)} built")
    for bracket, rungs in zip(brackets, saved, strict=True):
        milestones = [float(m) for m, _ in bracket._rungs]
        if [float(m) for m, _ in rungs] != milestones:
            raise ValueError(f"rungs at {[m for m, _ in rungs]} saved, at {milestones} built")
        for (_, recorded), (_, values) in zip(bracket._rungs, rungs, strict=True):
            recorded.update({str(t): float(v) for t, v in dict(values).items()})
    scheduler._trial_info.update({str(t): brackets[int(i)] for t, i in dict(state["trials"]).items()})
