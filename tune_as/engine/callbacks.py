"""The driver side of a trial: trial names and the Tune callbacks that turn Tune's trial events into MLflow
runs (tune_as.tracking.tracker), drop ended trials' weights and notice an interruption. What Tune runs in a
worker is tune_as.engine.worker, which imports none of this."""

from __future__ import annotations

import json
import signal
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any

from ray import tune
from ray.tune.logger import JsonLoggerCallback

from tune_as.engine import interrupt
from tune_as.engine.links import OptunaLinks
from tune_as.engine.members import POPULATION, members
from tune_as.engine.plan import git_commit
from tune_as.results.render import one_setting
from tune_as.settings import unused
from tune_as.tracking import schema
from tune_as.tracking import tracker as tracking
from tune_as.training.trial import drop_weights

RESULT_FILE = "result.json"  # Ray Tune's JSON logger's file (ray.tune.result.EXPR_RESULT_FILE)


def common() -> list[tune.Callback]:
    """Every Tuner's callbacks besides its MLflow one: the one Tune logger a search reads, JSON
    (`result.json`, persisted_results), then DropFinishedWeights and NoticeInterrupt. Tune's other default
    loggers, CSV and TensorBoard, are turned off for a new search (cluster.tune_environment; a resume keeps
    them, for a search started before this list had its own logger): no code or user reads them (MLflow has
    every result), and the TensorBoard writer's thread took ~10% of a local search driver's samples
    (py-spy)."""
    return [JsonLoggerCallback(), DropFinishedWeights(), NoticeInterrupt()]


def trial_name(trial: Any) -> str:
    """`as_softmax_0003`: the loss and the trial's number in the search (Tune's experiment tag starts with
    it), in the progress table, the trial folders and the MLflow run names."""
    number = str(getattr(trial, "experiment_tag", "") or "").split("_", 1)[0]
    suffix = f"{int(number):04d}" if number.isdigit() else str(trial.trial_id)
    return f"{trial.config.get('loss', 'trial')}_{suffix}"


class Settles(tune.Callback):
    """A callback with work to do once per driver process, for the trials that ended under an earlier driver:
    Tune sends no event for them again. It is done before Tune's first step, or as the experiment ends when
    there is no step (every trial had ended: a round finished before the kill). Ray pickles callbacks with the
    experiment; the copy that `Tuner.restore` brings back runs in a new driver, so it settles again."""

    settled = False

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "settled"}

    def settle(self, trials: list[Any]) -> None:
        """Called once with the ended trials (TERMINATED or ERROR)."""

    def on_step_begin(self, iteration: int, trials: list[Any], **info: Any) -> None:
        if not self.settled:
            self.settled = True
            self.settle([t for t in trials if t.status in ("TERMINATED", "ERROR")])

    def on_experiment_end(self, trials: list[Any], **info: Any) -> None:
        self.on_step_begin(0, trials)


class MlflowCallback(Settles):
    """Driver-side bridge from Tune's trial events to `tracking.MlflowTracker`.

    Ray pickles a run's callbacks with the experiment and brings that copy back on `Tuner.restore`, in a new
    driver process: the tracker (a live client with a queue) cannot travel in the pickle. So the callback
    names its search and finds the tracker that the driver registered for it (`register`) before running."""

    _trackers: dict[str, tracking.MlflowTracker] = {}
    # what a callback pickled by an older search lacks (Ray restores that copy on --resume)
    uses_backbone = True
    searched: Mapping[str, Sequence[str]] = MappingProxyType({})
    optuna: OptunaLinks | None = None

    def __init__(self, tracker: tracking.MlflowTracker, metric: str, role: str, data_params: dict[str, Any],
                 uses_backbone: bool = True, searched: Mapping[str, Sequence[str]] | None = None,
                 optuna: OptunaLinks | None = None) -> None:
        self.search_id, self.metric, self.role = tracker.search_id, metric, role
        self.data_params = data_params  # the search's DataSettings, logged beside each trial's own settings
        self.uses_backbone = uses_backbone  # the task's (settings.unused: what it ignores is not logged)
        self.searched = dict(searched or {})  # per loss, the config keys its trials differ by
        self.optuna = optuna  # a search's studies: each trial's run names its Optuna trial
        self.register(tracker)

    @classmethod
    def register(cls, tracker: tracking.MlflowTracker) -> None:
        cls._trackers[tracker.search_id] = tracker

    @property
    def tracker(self) -> tracking.MlflowTracker:
        return self._trackers[self.search_id]

    def setup(self, stop: Any = None, num_samples: int | None = None, total_num_samples: int | None = None,
              **info: Any) -> None:
        # MLflow's writes leave Tune's event loop: a slow or
        # absent server must not hold every trial's next result
        self.tracker.start_writer()

    def settle(self, trials: list[Any]) -> None:
        """A trial that ended under an earlier, killed driver gets no event from Tune again, though Ray's
        snapshot counts it; what that driver had not yet delivered to MLflow (its queue died with it: a start,
        results, the end) is delivered now, from Ray's own record of the trial (its status, config,
        `result.json`). A run MLflow already has closed is left as it is."""
        for trial in trials:
            if all(m.run_id in self.tracker.trials for m in members(trial.trial_id, trial.config, {})):
                continue  # seen by this driver (or in the journal it delivered first)
            self.on_trial_start(0, trials, trial, settle=True)
            ended = self.on_trial_complete if trial.status == "TERMINATED" else self.on_trial_error
            ended(0, trials, trial, settle=True)

    def setting(self, config: dict[str, Any]) -> str:
        """A run's searched setting as the answer prints it ("delta=0.3, warmup_r=0.1")."""
        return one_setting(config, self.searched.get(str(config["loss"]), ())) or "none searched"

    def on_trial_start(self, iteration: int, trials: list[Any], trial: Any, settle: bool = False,
                       **info: Any) -> None:
        # each member of a population is a run of its own (tune_as.engine.members), with a solo trial's params
        for member in members(trial.trial_id, trial.config, {}):
            config = {**self.data_params, **member.config, "git_commit": git_commit()}
            ignored = unused(config, self.uses_backbone)
            loss = str(member.config["loss"])
            # a search trial is `<loss>_<number>`; a confirmation
            # run says which seed it confirms: `<loss>_seed<seed>`
            name = trial_name(trial) if self.role != schema.ROLE_CONFIRMATION else \
                f"{loss}_seed{member.config.get('seed')}"
            tags = {schema.ROLE: self.role, schema.TASK: str(self.data_params["task"]), schema.LOSS: loss,
                    schema.METRIC: f"val_{self.metric}", schema.SETTING: self.setting(member.config)}
            if self.optuna is not None:
                tags.update(self.optuna.tags(trial.trial_id, loss, name))
            self.tracker.trial_started(member.run_id, {k: v for k, v in config.items() if k not in ignored},
                                       name=name, settle=settle, tags=tags)
        if (trial.last_result or {}).get("training_iteration"):
            # Restored after a driver restart (or retried): what it reported before may never have reached
            # MLflow (a killed driver's queue dies with it), though Ray's snapshot counts it. Ray's own record
            # of those results is replayed; steps MLflow already has are skipped (tracking.tracker:
            # idempotent by step).
            for result in persisted_results(trial):
                self.on_trial_result(iteration, trials, trial, result)

    def on_trial_result(self, iteration: int, trials: list[Any], trial: Any, result: dict[str, Any],
                        **info: Any) -> None:
        for member in members(trial.trial_id, trial.config, result):
            if member.fresh:
                # the headline metrics again in percent, for a person reading MLflow (schema.with_percent)
                self.tracker.trial_result(member.run_id, schema.with_percent(member.metrics))

    def on_trial_complete(self, iteration: int, trials: list[Any], trial: Any, settle: bool = False,
                          **info: Any) -> None:
        population = POPULATION in trial.config
        for member in members(trial.trial_id, trial.config, trial.last_result or {}):
            error = member.metrics.get("error")
            tags = {}
            if not error and not completed(member.metrics, float(trial.config["epochs"])):
                tags[schema.STOPPED_EARLY] = "true"
            if not error:  # the run's page opens on its description: what it scored, with what
                tags[schema.NOTE] = run_note(member.config, member.metrics, self.metric,
                                             self.setting(member.config))
            margin = (f"seed_{member.config['seed']}/{schema.PMARGIN_FILE}" if population
                      else schema.PMARGIN_FILE)
            self.tracker.trial_ended(member.run_id, "FAILED" if error else "FINISHED", error=error,
                                     artifacts=checkpoint_files(trial, margin), tags=tags, settle=settle)

    def on_trial_error(self, iteration: int, trials: list[Any], trial: Any, settle: bool = False,
                       **info: Any) -> None:
        for member in members(trial.trial_id, trial.config, {}):
            self.tracker.trial_ended(member.run_id, "FAILED", error=trial_error(trial),
                                     artifacts=checkpoint_files(trial, schema.PMARGIN_FILE), settle=settle)


class DropFinishedWeights(Settles):
    """Once a trial has ended (completed, stopped early, diverged), nothing trains it again: its checkpoint
    keeps a marker and pmargin.npy, not its weights (`training.trial.drop_weights`). Until Ray's next
    experiment snapshot a killed driver may still restore the trial; restored from the marker, it ends at once
    with its last result. An errored trial keeps its weights: a resume retries it from them. Checkpoints on a
    remote file system (not a local or mounted folder) are left alone. A trial that completed under a killed
    driver is dropped by the next."""

    def settle(self, trials: list[Any]) -> None:
        for trial in trials:
            if trial.status == "TERMINATED":
                self.on_trial_complete(0, trials, trial)

    def on_trial_complete(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        checkpoint = trial.checkpoint
        if checkpoint is not None and Path(checkpoint.path).is_dir():
            drop_weights(Path(checkpoint.path))


class NoticeInterrupt(tune.Callback):
    """Notes that Ray Tune's run was interrupted (Ctrl-C, or SIGTERM turned into it) in `interrupt.noticed`.
    Tune stops on the first SIGINT and returns its results as if done, and the trials its workers lost to the
    same signal look failed, so the count of ended trials cannot tell. Tune installs its SIGINT handler as a
    run starts (before `setup`), so this chains one in front of it. The flag is the module's, not this
    object's: a restored Tuner brings its own unpickled copy of the callbacks."""

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


def run_note(config: dict[str, Any], result: dict[str, Any], metric: str, setting: str) -> str:
    """A finished run's description, in the answer's words: its loss, validation and test metric in percent
    (of the best-validation checkpoint), the epochs it trained and its searched setting."""
    scores = []
    for split, key in (("validation", f"best_val_{metric}"), ("test", f"test_{metric}")):
        value = result.get(key)
        if isinstance(value, (int, float)):
            scores.append(f"{split} {metric} {100 * float(value):.2f} %")
    epochs = f"{float(result.get('epoch', 0.0)):g} of {float(config['epochs']):g} epochs"
    return f"**{config['loss']}**: {', '.join(scores) or 'no score'} ({epochs}); setting: {setting}"


def completed(result: dict[str, Any], epochs: float) -> bool:
    """The trial trained all its `epochs` (its own setting: not stopped early, not failed)."""
    return not result.get("error") and result.get("epoch", 0.0) >= epochs - 1e-6


def persisted_results(trial: Any) -> list[dict[str, Any]]:
    """The results Ray recorded for a trial, oldest first: its `result.json` (one JSON object per line,
    written by the driver as each result arrives) in the trial's driver-side folder, else in its folder in the
    storage path when that is a local one. A line cut short by a killed driver ends the list; no file, no
    results."""
    for folder in (getattr(trial, "local_path", None), getattr(trial, "path", None)):
        path = Path(folder) / RESULT_FILE if folder else None
        if path is None or not path.is_file():
            continue
        results = []
        for line in path.read_text().splitlines():
            try:
                results.append(json.loads(line))
            except ValueError:
                break
        return results
    return []


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
