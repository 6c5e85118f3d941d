"""The training loop exists once (tune_as.training.loop): a solo trial and a population are its two kinds of
members, neither with a loop of its own; a trial's checkpoint keeps the layout earlier versions wrote and
resumes exactly (fast, on synthetic frozen features; tests/test_trainable.py does the same on real digits)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch
from test_population import SKIP, config, frozen
from test_trainable import Recorder

from tune_as.training.loop import Loop
from tune_as.training.population import Population
from tune_as.training.tools import Counts
from tune_as.training.trial import STATE_FILE, Trial, run_trial

SHARED = ("run", "training_order", "apply_schedules", "evaluate_members", "evaluate_and_report", "position")
# a trial checkpoint's keys since issue 21: a checkpoint written by an earlier version must still load
LAYOUT = {"model", "optimizer", "scaler", "accumulator", "loop", "rng", "cuda_rng"}


def _kept(reports: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Reports without their timings."""
    return [{k: v for k, v in r.items() if k not in SKIP} for r in reports]


@pytest.mark.parametrize("kind", [Trial, Population])
def test_the_loop_exists_once(kind: type[Loop]) -> None:
    assert issubclass(kind, Loop)
    for name in SHARED:
        assert getattr(kind, name) is getattr(Loop, name), f"{kind.__name__}.{name}: a loop of its own"


def test_a_trial_checkpoint_keeps_its_layout_and_resumes_exactly(tmp_path: Path) -> None:
    data, task = frozen("multiclass")
    cfg = {**config("as_speed", eval_every_steps=2, warmup_r=0.2), "seed": 3}
    full = Recorder(tmp_path / "full")
    run_trial(cfg, data, task, full)
    assert len(full.checkpoints) > 3
    saved = torch.load(full.checkpoints[1] / STATE_FILE, weights_only=True)
    assert set(saved) == LAYOUT
    assert set(saved["loop"]) == {f.name for f in dataclasses.fields(Counts)}
    resumed = Recorder(tmp_path / "resumed")
    run_trial(cfg, data, task, resumed, restore_dir=full.checkpoints[1])
    assert _kept(resumed.reports) == _kept(full.reports[2:])


def test_a_multilabel_trial_resumes_from_its_checkpoint(tmp_path: Path) -> None:
    """A multi-label task's scores were numpy scalars, kept in the checkpoint's best scores, which the safe
    load (weights_only) refuses: a multi-label trial could not resume. Its scores are plain floats now."""
    data, task = frozen("multilabel")
    cfg = {**config("multilabel_softmax", eval_every_steps=2), "seed": 3}
    full = Recorder(tmp_path / "full")
    run_trial(cfg, data, task, full)
    resumed = Recorder(tmp_path / "resumed")
    run_trial(cfg, data, task, resumed, restore_dir=full.checkpoints[1])
    assert _kept(resumed.reports) == _kept(full.reports[2:])
