"""The driver side of a trial: trial names and the Tune callbacks that turn Tune's trial events into MLflow runs
(tune_as.tracking.tracker), drop ended trials' weights and notice an interruption. What Tune runs in a worker is
tune_as.engine.worker, which imports none of this."""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from typing import Any

from ray import tune

from tune_as.engine import interrupt
from tune_as.engine.members import POPULATION, members
from tune_as.engine.plan import git_commit
from tune_as.tracking import schema
from tune_as.tracking import tracker as tracking
from tune_as.training.trial import drop_weights


def trial_name(trial: Any) -> str:
    """`as_softmax_0003`: the loss and the trial's number in the search (Tune's experiment tag starts with it),
    in the progress table, the trial folders and the MLflow run names."""
    number = str(getattr(trial, "experiment_tag", "") or "").split("_", 1)[0]
    suffix = f"{int(number):04d}" if number.isdigit() else str(trial.trial_id)
    return f"{trial.config.get('loss', 'trial')}_{suffix}"


class MlflowCallback(tune.Callback):
    """Driver-side bridge from Tune's trial events to `tracking.MlflowTracker`.

    Ray pickles a run's callbacks with the experiment and brings that copy back on `Tuner.restore`, in a new
    driver process: the tracker (a live client with a queue) cannot travel in the pickle. So the callback names
    its search and finds the tracker that the driver registered for it (`register`) before running."""

    _trackers: dict[str, tracking.MlflowTracker] = {}

    def __init__(self, tracker: tracking.MlflowTracker, metric: str, role: str, data_params: dict[str, Any]) -> None:
        self.search_id, self.metric, self.role = tracker.search_id, metric, role
        self.data_params = data_params  # the search's DataSettings, logged beside each trial's own settings
        self.register(tracker)

    @classmethod
    def register(cls, tracker: tracking.MlflowTracker) -> None:
        cls._trackers[tracker.search_id] = tracker

    @property
    def tracker(self) -> tracking.MlflowTracker:
        return self._trackers[self.search_id]

    def setup(self, stop: Any = None, num_samples: int | None = None, total_num_samples: int | None = None,
              **info: Any) -> None:
        # MLflow's writes leave Tune's event loop: a slow or absent server must not hold every trial's next result
        self.tracker.start_writer()

    def on_trial_start(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        # each member of a population is a run of its own (tune_as.engine.members), with a solo trial's params
        for member in members(trial.trial_id, trial.config, {}):
            config = {**self.data_params, **member.config, "git_commit": git_commit()}
            # a search trial is `<loss>_<number>`; a confirmation run says which seed it confirms: `<loss>_seed<seed>`
            name = trial_name(trial) if self.role != schema.ROLE_CONFIRMATION else \
                f"{member.config.get('loss', 'trial')}_seed{member.config.get('seed')}"
            self.tracker.trial_started(member.run_id, config, name=name, tags={
                schema.ROLE: self.role, schema.TASK: str(self.data_params["task"]),
                schema.LOSS: str(member.config["loss"]), schema.METRIC: f"val_{self.metric}"})

    def on_trial_result(self, iteration: int, trials: list[Any], trial: Any, result: dict[str, Any], **info: Any) -> None:
        for member in members(trial.trial_id, trial.config, result):
            if member.fresh:
                self.tracker.trial_result(member.run_id, member.metrics)

    def on_trial_complete(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        population = POPULATION in trial.config
        for member in members(trial.trial_id, trial.config, trial.last_result or {}):
            error = member.metrics.get("error")
            tags = {}
            if not error and not completed(member.metrics, float(trial.config["epochs"])):
                tags[schema.STOPPED_EARLY] = "true"
            margin = f"seed_{member.config['seed']}/{schema.PMARGIN_FILE}" if population else schema.PMARGIN_FILE
            self.tracker.trial_ended(member.run_id, "FAILED" if error else "FINISHED", error=error,
                                     artifacts=checkpoint_files(trial, margin), tags=tags)

    def on_trial_error(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        for member in members(trial.trial_id, trial.config, {}):
            self.tracker.trial_ended(member.run_id, "FAILED", error=trial_error(trial),
                                     artifacts=checkpoint_files(trial, schema.PMARGIN_FILE))


class DropFinishedWeights(tune.Callback):
    """Once a trial has ended (completed, stopped early, diverged), nothing trains it again: its checkpoint keeps a
    marker and pmargin.npy, not its weights (`training.trial.drop_weights`). Until Ray's next experiment snapshot a
    killed driver may still restore the trial; restored from the marker, it ends at once with its last result. An
    errored trial keeps its weights: a resume retries it from them. Checkpoints on a remote file system (not a
    local or mounted folder) are left alone."""

    def on_trial_complete(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        checkpoint = trial.checkpoint
        if checkpoint is not None and Path(checkpoint.path).is_dir():
            drop_weights(Path(checkpoint.path))


class NoticeInterrupt(tune.Callback):
    """Notes that Ray Tune's run was interrupted (Ctrl-C, or SIGTERM turned into it) in `interrupt.noticed`. Tune
    stops on the first SIGINT and returns its results as if done, and the trials its workers lost to the same
    signal look failed, so the count of ended trials cannot tell. Tune installs its SIGINT handler as a run starts
    (before `setup`), so this chains one in front of it. The flag is the module's, not this object's: a restored
    Tuner brings its own unpickled copy of the callbacks."""

    def setup(self, stop: Any = None, num_samples: int | None = None, total_num_samples: int | None = None,
              **info: Any) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        tunes = signal.getsignal(signal.SIGINT)

        def noted(signum: int, frame: Any) -> None:
            interrupt.noticed.set()
            if callable(tunes):
                tunes(signum, frame)
            else:
                raise KeyboardInterrupt
        signal.signal(signal.SIGINT, noted)


def completed(result: dict[str, Any], epochs: float) -> bool:
    """The trial trained all its `epochs` (its own setting: not stopped early, not failed)."""
    return not result.get("error") and result.get("epoch", 0.0) >= epochs - 1e-6


def trial_error(trial: Any) -> str:
    path = getattr(trial, "error_file", None) or ""
    try:
        lines = [ln for ln in Path(path).read_text().splitlines() if ln.strip()]
        return lines[-1] if lines else "trial failed"
    except OSError:
        return "trial failed (no error file)"


def checkpoint_files(trial: Any, name: str) -> list[Path]:
    checkpoint = getattr(trial, "checkpoint", None)
    if checkpoint is None:
        return []
    path = Path(checkpoint.path) / name
    return [path] if path.is_file() else []
