"""What Tune runs in a worker: one trial (or one population of seeds) and its reporter over `ray.tune.report`.

A worker imports this module (Ray unpickles `trainable` by reference) at the start of every Tuner's first
trial, so it imports only what training needs: not MLflow, Optuna or the driver's plan (about 2 s per worker
on a 2-core machine; tests/test_imports.py keeps it so). The driver's side of a trial is
tune_as.engine.callbacks."""

from __future__ import annotations

import importlib
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from contextlib import nullcontext
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import ray
from ray import tune

from tune_as.engine import disk
from tune_as.engine.members import POPULATION, flat_report, settings_config
from tune_as.tracking import schema
from tune_as.training.trial import FINISHED_FILE, run_trial

# Names a test (or a user's instrumentation) may hook into every report of a trial: "module:function", called
# as function(metrics, loss) in the worker after each report. Unset in normal use.
HOOK_ENV = "TUNE_AS_TRIAL_HOOK"


class RayReporter:
    """`tune_as.training.trial.Reporter` over `ray.tune.report`. A trial checkpoints at an evaluation only
    when `interval_s` seconds have passed since its last checkpoint, and always at its last one: with a
    checkpoint at every epoch of a fast trial, Ray snapshots the whole experiment each time
    (CheckpointConfig(num_to_keep) forces a snapshot once a trial has checkpointed num_to_keep times since the
    last one)."""

    def __init__(self, loss: str, interval_s: float) -> None:
        self.loss, self.interval_s = loss, interval_s
        self.node_id = ray.get_runtime_context().get_node_id()
        self.last_checkpoint = time.monotonic()
        hook = os.environ.get(HOOK_ENV)
        self.hook: Callable[[dict[str, Any], str], None] | None = None
        if hook:
            module, _, func = hook.partition(":")
            self.hook = getattr(importlib.import_module(module), func)

    def wants_checkpoint(self, final: bool) -> bool:
        return final or time.monotonic() - self.last_checkpoint >= self.interval_s

    def report(self, metrics: dict[str, Any], checkpoint_dir: Path | None) -> None:
        metrics = {**metrics, "node_id": self.node_id}
        ckpt = None
        if checkpoint_dir is not None and any(checkpoint_dir.iterdir()):
            ckpt = tune.Checkpoint.from_directory(str(checkpoint_dir))
            self.last_checkpoint = time.monotonic()
        tune.report(metrics, checkpoint=ckpt)
        if self.hook is not None:
            self.hook(metrics, self.loss)


class PopulationReporter:
    """`tune_as.training.population.PopulationReporter` over `ray.tune.report`: each evaluation is one result
    with every member's latest report (tune_as.engine.members). A population checkpoints once, at its end: a
    marker that it finished and each member's p_margin (`seed_<seed>/pmargin.npy`); a population interrupted
    before its end trains again from its start on resume (the same runs: every member is seeded)."""

    def __init__(self, seeds: list[int]) -> None:
        self.seeds = seeds
        self.latest: dict[int, dict[str, Any]] = {}
        self.node_id = ray.get_runtime_context().get_node_id()

    def report(self, reports: dict[int, dict[str, Any]], final: bool, margins: Any = ()) -> None:
        for i, metrics in reports.items():
            self.latest[self.seeds[i]] = metrics
        result = {**flat_report(self.latest, {self.seeds[i] for i in reports}, len(self.seeds)),
                  "node_id": self.node_id}
        if not final:
            tune.report(result)
            return
        folder = Path(tempfile.mkdtemp(prefix="tune_as_ckpt_"))
        try:
            (folder / FINISHED_FILE).touch()
            for seed, margin in zip(self.seeds, margins, strict=False):
                if margin is not None:
                    (folder / f"seed_{seed}").mkdir()
                    np.save(folder / f"seed_{seed}" / schema.PMARGIN_FILE, margin)
            tune.report(result, checkpoint=tune.Checkpoint.from_directory(str(folder)))
        finally:
            shutil.rmtree(folder, ignore_errors=True)


def trainable(config: dict[str, Any], data: Any = None, task: Any = None,
              checkpoint_interval_s: float = 30.0) -> None:
    """What Tune runs in a worker: one trial (or one population of seeds), restored from Tune's checkpoint
    when there is one. A full disk under the storage path ends it with a result saying so
    (tune_as.engine.disk)."""
    disk.reported(partial(_train, config, data, task, checkpoint_interval_s))


def _train(config: dict[str, Any], data: Any, task: Any, checkpoint_interval_s: float) -> None:
    checkpoint = tune.get_checkpoint()
    with checkpoint.as_directory() if checkpoint else nullcontext(None) as restore_dir:
        seeds = config.get(POPULATION)
        if seeds:
            if restore_dir and (Path(restore_dir) / FINISHED_FILE).exists():
                return  # it finished before the driver stopped: nothing left to train
            from tune_as.training.population import run_population

            run_population(settings_config(config), seeds, data, task, PopulationReporter(list(seeds)))
            return
        reporter = RayReporter(str(config.get("loss")), checkpoint_interval_s)
        run_trial(config, data, task, reporter, Path(restore_dir) if restore_dir else None)


