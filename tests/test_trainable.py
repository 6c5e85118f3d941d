"""The training loop without Ray (through its Reporter protocol), on the real digits data."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tune_as.tasks import DataSpec, build_task
from tune_as.trainable import PMARGIN_FILE, STATE_FILE, Trial, lr_factor, p_margin, run_trial


class Recorder:
    """Keeps every report and copies every checkpoint (the loop deletes its temporary folder afterwards)."""

    def __init__(self, root: Path) -> None:
        self.root, self.reports, self.checkpoints = root, [], []

    def wants_checkpoint(self, final: bool) -> bool:
        return True

    def report(self, metrics: dict[str, Any], checkpoint_dir: Path | None) -> None:
        assert checkpoint_dir is not None, "this recorder asks for a checkpoint at every report"
        self.reports.append(metrics)
        target = self.root / f"ckpt_{len(self.reports)}"
        shutil.copytree(checkpoint_dir, target)
        self.checkpoints.append(target)


@pytest.fixture(scope="module")
def digits(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any]:
    task = build_task("digits")
    return task, task.prepare(DataSpec(task="digits", cache_dir=tmp_path_factory.mktemp("cache")))


def config(**over: Any) -> dict[str, Any]:
    return {"task": "digits", "loss": "softmax", "epochs": 2.0, "batch_size": 64, "lr": 3e-3, "max_length": 8,
            "backbone": "cnn", **over}


def test_reports_every_epoch_with_the_documented_metrics(digits, tmp_path: Path) -> None:
    task, data = digits
    rec = Recorder(tmp_path)
    run_trial(config(), data, task, rec)
    assert [r["epoch"] for r in rec.reports] == [1.0, 2.0]
    last = rec.reports[-1]
    for key in ("val_accuracy", "val_loss", "train_loss", "masked_ratio", "accum_steps", "optimizer_steps",
                "samples_seen", "train_seconds", "test_accuracy", "best_val_accuracy"):
        assert key in last
    assert last["optimizer_steps"] == 2 * -(-len(data.train) // 64)
    assert last["samples_seen"] == 2 * len(data.train)
    assert last["masked_ratio"] == 0.0 and last["accum_steps"] == 1
    assert last["best_val_accuracy"] > 0.5
    assert (rec.checkpoints[-1] / STATE_FILE).is_file() and (rec.checkpoints[-1] / PMARGIN_FILE).is_file()
    assert np.load(rec.checkpoints[-1] / PMARGIN_FILE).shape == (len(data.test),)


def test_same_seed_same_numbers_other_seed_other_numbers(digits, tmp_path: Path) -> None:
    task, data = digits
    runs = []
    for seed in (0, 0, 1):
        rec = Recorder(tmp_path / f"s{seed}_{len(runs)}")
        run_trial(config(seed=seed, epochs=1.0), data, task, rec)
        runs.append((rec.reports[-1]["val_loss"], rec.reports[-1]["train_loss"]))
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]


def test_resume_from_mid_training_checkpoint_is_exact(digits, tmp_path: Path) -> None:
    task, data = digits
    cfg = config(epochs=2.0, eval_every_steps=7, loss="as_speed", **{"loss.delta": 0.3, "loss.lam": 1.0,
                                                                     "loss.max_steps": 3})
    full = Recorder(tmp_path / "full")
    run_trial(cfg, data, task, full)
    resumed = Recorder(tmp_path / "resumed")
    run_trial(cfg, data, task, resumed, restore_dir=full.checkpoints[1])
    keys = ("val_loss", "optimizer_steps", "samples_seen", "accum_steps", "test_accuracy")
    assert [{k: r[k] for k in keys} for r in resumed.reports] == [{k: r[k] for k in keys} for r in full.reports[2:]]


def test_as_warmup_keeps_delta_at_one_for_the_first_r(digits, tmp_path: Path) -> None:
    task, data = digits
    trial = Trial(config(loss="as_softmax", warmup_r=0.5, **{"loss.delta": 0.2}), data, task, Recorder(tmp_path))
    seen = []
    for progress in (0.0, 0.49, 0.5, 0.9):
        trial.state.samples_seen = int(progress * trial.total_samples)
        trial._apply_schedules()
        seen.append(trial.loss_fn.delta)
    assert seen == [1.0, 1.0, 0.2, 0.2]


def test_as_speed_takes_fewer_optimizer_steps_for_the_same_samples(digits, tmp_path: Path) -> None:
    task, data = digits
    plain, speed = Recorder(tmp_path / "p"), Recorder(tmp_path / "s")
    run_trial(config(loss="as_softmax", epochs=4.0, **{"loss.delta": 0.5}), data, task, plain)
    run_trial(config(loss="as_speed", epochs=4.0, **{"loss.delta": 0.5, "loss.lam": 1.5, "loss.max_steps": 4}),
              data, task, speed)
    assert speed.reports[-1]["samples_seen"] == plain.reports[-1]["samples_seen"]
    assert speed.reports[-1]["optimizer_steps"] < plain.reports[-1]["optimizer_steps"]
    steps = [r["accum_steps"] for r in speed.reports]
    assert steps == sorted(steps) and steps[-1] > 1 and max(steps) <= 4


def test_diverging_trial_reports_an_error_instead_of_a_score(digits, tmp_path: Path) -> None:
    task, data = digits
    rec = Recorder(tmp_path)
    run_trial(config(lr=1e6), data, task, rec)
    assert len(rec.reports) == 1 and rec.reports[0]["error"].startswith("non-finite training loss")
    assert "val_accuracy" not in rec.reports[0]


def test_lr_schedule_warms_up_then_decays_to_zero() -> None:
    assert [lr_factor(p, 0.1) for p in (0.0, 0.05, 0.1, 0.55, 1.0)] == pytest.approx([0.0, 0.5, 1.0, 0.5, 0.0])


def test_p_margin_by_hand() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2], [0.1, 0.6, 0.3], [0.2, 0.2, 0.6]]))
    margins = p_margin(logits, torch.tensor([0, 0, -100]))
    assert margins.tolist() == pytest.approx([0.5 - 0.3, 0.1 - 0.6])
    multi = p_margin(logits[:2], torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]]))
    assert multi.tolist() == pytest.approx([0.3 - 0.2])  # min positive - max negative; no-positive rows skipped


def test_bf16_autocast_path_trains_with_finite_fp32_losses(digits, tmp_path: Path) -> None:
    """The mixed-precision path GPUs take (bf16 autocast, fp32 loss), exercised on CPU."""
    task, data = digits
    rec = Recorder(tmp_path)
    run_trial(config(precision="bf16", epochs=1.0, loss="as_softmax", **{"loss.delta": 0.3}), data, task, rec)
    (last,) = rec.reports
    assert "error" not in last and np.isfinite(last["val_loss"]) and np.isfinite(last["train_loss"])
    assert last["best_val_accuracy"] > 0.3
