"""The training loop without Ray (through its Reporter protocol), on the real digits data."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tune_as.losses import LOSSES
from tune_as.tasks import DataSettings, build_task, prepare
from tune_as.training.trial import PMARGIN_FILE, STATE_FILE, PhaseTimer, Trial, lr_factor, p_margin, run_trial


class Recorder:
    """Keeps every report and copies every checkpoint (the loop deletes its temporary folder afterwards)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.reports: list[dict[str, Any]] = []
        self.checkpoints: list[Path] = []

    def wants_checkpoint(self, final: bool) -> bool:
        return True

    def report(self, metrics: dict[str, Any], checkpoint_dir: Path | None) -> None:
        self.reports.append(metrics)
        if checkpoint_dir is None:  # a failed trial's last report carries no checkpoint
            assert "error" in metrics, "this recorder asks for a checkpoint at every successful report"
            return
        target = self.root / f"ckpt_{len(self.reports)}"
        shutil.copytree(checkpoint_dir, target)
        self.checkpoints.append(target)


# Every test here trains a model (a CNN on digits, a few epochs): the slow tier.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def digits(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any]:
    task = build_task("digits")
    return task, prepare(task, DataSettings(task="digits", cache_dir=tmp_path_factory.mktemp("cache")))


def config(**over: Any) -> dict[str, Any]:
    return {"loss": "softmax", "epochs": 2.0, "batch_size": 64, "lr": 3e-3, **over}


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
    runs: list[tuple[float, float]] = []
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
    keys = ("val_loss", "optimizer_steps", "samples_seen", "backward_rows", "accum_steps", "test_accuracy")
    assert [{k: r[k] for k in keys} for r in resumed.reports] == \
        [{k: r[k] for k in keys} for r in full.reports[2:]]


def test_resume_with_row_skipping_is_exact(digits, tmp_path: Path) -> None:
    """The probe draws dropout masks from the global RNG: the checkpoint's RNG state must cover it."""
    task, data = digits
    cfg = config(epochs=3.0, eval_every_steps=9, loss="as_speed", skip_masked_rows=True,
                 **{"loss.delta": 0.3, "loss.lam": 1.0, "loss.max_steps": 3})
    full = Recorder(tmp_path / "full")
    run_trial(cfg, data, task, full)
    resumed = Recorder(tmp_path / "resumed")
    run_trial(cfg, data, task, resumed, restore_dir=full.checkpoints[2])
    keys = ("val_loss", "train_loss", "optimizer_steps", "samples_seen", "backward_rows", "masked_ratio")
    assert [{k: r[k] for k in keys} for r in resumed.reports] == \
        [{k: r[k] for k in keys} for r in full.reports[3:]]
    assert full.reports[-1]["backward_rows"] < full.reports[-1]["samples_seen"]


def test_as_warmup_keeps_delta_at_one_for_the_first_r(digits, tmp_path: Path) -> None:
    task, data = digits
    trial = Trial(config(loss="as_softmax", warmup_r=0.5, **{"loss.delta": 0.2}), data, task,
                  Recorder(tmp_path))
    seen = []
    for progress in (0.0, 0.49, 0.5, 0.9):
        trial.counts.samples_seen = int(progress * trial.total_samples)
        trial.apply_schedules()
        seen.append(trial.loss_fn.delta)
    assert seen == [1.0, 1.0, 0.2, 0.2]


def test_as_speed_takes_fewer_optimizer_steps_for_the_same_samples(digits, tmp_path: Path) -> None:
    task, data = digits
    plain, speed = Recorder(tmp_path / "p"), Recorder(tmp_path / "s")
    run_trial(config(loss="as_softmax", epochs=4.0, **{"loss.delta": 0.5}), data, task, plain)
    run_trial(config(loss="as_speed", epochs=4.0,
                     **{"loss.delta": 0.5, "loss.lam": 1.5, "loss.max_steps": 4}),
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
    assert [lr_factor(p, 0.1) for p in (0.0, 0.05, 0.1, 0.55, 1.0)] == \
        pytest.approx([0.0, 0.5, 1.0, 0.5, 0.0])


def test_p_margin_by_hand() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2], [0.1, 0.6, 0.3], [0.2, 0.2, 0.6]]))
    margins = p_margin(logits, torch.tensor([0, 0, -100]))
    assert margins.tolist() == pytest.approx([0.5 - 0.3, 0.1 - 0.6])
    multi = p_margin(logits[:2], torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]]))
    # min positive - max negative; no-positive rows skipped
    assert multi.tolist() == pytest.approx([0.3 - 0.2])


def test_bf16_autocast_path_trains_with_finite_fp32_losses(digits, tmp_path: Path) -> None:
    """The mixed-precision path GPUs take (bf16 autocast, fp32 loss), exercised on CPU."""
    task, data = digits
    rec = Recorder(tmp_path)
    run_trial(config(precision="bf16", epochs=1.0, loss="as_softmax", **{"loss.delta": 0.3}), data, task, rec)
    (last,) = rec.reports
    assert "error" not in last and np.isfinite(last["val_loss"]) and np.isfinite(last["train_loss"])
    assert last["best_val_accuracy"] > 0.3


SKIPPING = sorted(name for name, cls in LOSSES.items()
                  if cls.supports_row_skipping and "multiclass" in cls.kinds)


def masked_and_unmasked_rows(trial: Trial, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`n` training rows the eval-mode model classifies correctly and `n` it gets wrong: at delta = 0 with
    the head scaled up, exactly the first are fully masked (p_t is the unique largest probability)."""
    idx = torch.arange(len(trial.data.train))
    with torch.no_grad():
        batch = trial.data.train.batch(idx)
        right = trial.model(batch).argmax(1) == batch["labels"]
    assert right.sum() >= n and (~right).sum() >= n, "the fixture's model needs both kinds of rows"
    return idx[right][:n], idx[~right][:n]


def eval_mode_trial(digits: tuple[Any, Any], tmp_path: Path, loss: str, skip: bool) -> Trial:
    task, data = digits
    trial = Trial(config(loss=loss, skip_masked_rows=skip, **{"loss.delta": 0.0}), data, task,
                  Recorder(tmp_path))
    with torch.no_grad():
        # confident logits: correct rows get p_t far above every competitor
        trial.model.get_submodule("head").get_parameter("weight").mul_(30.0)
    trial.model.eval()  # no dropout: the probe and the gradient pass see the same logits
    trial.apply_schedules()
    return trial


@pytest.mark.parametrize("loss", SKIPPING)
def test_skipping_masked_rows_gives_the_same_loss_and_gradients(digits, tmp_path: Path, loss: str) -> None:
    right, wrong = masked_and_unmasked_rows(eval_mode_trial(digits, tmp_path, loss, False), 12)
    idx = torch.cat([right, wrong])[torch.randperm(24, generator=torch.Generator().manual_seed(0))]
    results = {}
    for skip in (False, True):
        trial = eval_mode_trial(digits, tmp_path, loss, skip)
        stats = trial.micro_step(idx, steps=2)
        loss_value, rows, masked = stats.sums.tolist()
        grads = {name: p.grad.clone() for name, p in trial.model.named_parameters() if p.grad is not None}
        results[skip] = (loss_value, rows, masked, grads, stats.backward_rows)
    plain, skipped = results[False], results[True]
    assert plain[1:3] == skipped[1:3] == (24, 12)  # every row counted, the correct ones masked, either way
    assert plain[4] == 24 and skipped[4] == 12  # only the unmasked examples went through backward
    assert skipped[0] == pytest.approx(plain[0], rel=1e-6) and plain[0] > 0
    assert plain[3].keys() == skipped[3].keys()
    for name, grad in plain[3].items():
        assert grad.abs().sum() > 0, name
        torch.testing.assert_close(skipped[3][name], grad, rtol=1e-5, atol=1e-7, msg=name)


def test_a_micro_batch_with_every_example_masked_has_no_backward(digits, tmp_path: Path) -> None:
    trial = eval_mode_trial(digits, tmp_path, "as_speed", True)
    right, _ = masked_and_unmasked_rows(trial, 10)
    stats = trial.micro_step(right, steps=1)
    assert stats.sums.tolist() == [0.0, 10.0, 10.0] and stats.backward_rows == 0
    assert all(p.grad is None for p in trial.model.parameters())


def test_a_cycle_with_every_row_masked_takes_no_optimizer_step(digits, tmp_path: Path) -> None:
    """The gradient of an all-masked cycle is zero, but AdamW would still move the weights (its momentum):
    Trial.optimizer_step(skip=True), which the loop asks for when a cycle's counted rows all were masked,
    leaves every weight and the step count as they were; the same call without skip moves them."""
    trial = eval_mode_trial(digits, tmp_path, "as_speed", True)
    right, _ = masked_and_unmasked_rows(trial, 10)
    assert trial.micro_step(right, steps=1).sums.tolist()[1:] == [10.0, 10.0]  # every row masked
    for group in trial.parts.optimizer.param_groups:
        group["lr"] = 1e-3  # past the warm-up, whose first step has lr 0
    gen = torch.Generator().manual_seed(0)
    for p in trial.model.parameters():  # an earlier cycle: AdamW now holds momentum
        p.grad = torch.randn(p.shape, generator=gen)
    assert trial.optimizer_step(skip=False) is True and trial.counts.optimizer_steps == 1
    for p in trial.model.parameters():
        p.grad = torch.zeros_like(p)  # the all-masked cycle's gradient
    before = {name: p.detach().clone() for name, p in trial.model.named_parameters()}
    assert trial.optimizer_step(skip=True) is False and trial.counts.optimizer_steps == 1
    assert all(torch.equal(p, before[name]) for name, p in trial.model.named_parameters())
    for p in trial.model.parameters():
        p.grad = torch.zeros_like(p)  # (a step, taken or skipped, ends the cycle: its gradients are let go)
    assert trial.optimizer_step(skip=False) is True and trial.counts.optimizer_steps == 2
    assert any(not torch.equal(p, before[name]) for name, p in trial.model.named_parameters())


def test_backward_rows_equals_samples_seen_without_skipping(digits, tmp_path: Path) -> None:
    task, data = digits
    rec = Recorder(tmp_path)
    run_trial(config(loss="as_softmax", **{"loss.delta": 0.3}), data, task, rec)
    assert [r["backward_rows"] for r in rec.reports] == [r["samples_seen"] for r in rec.reports]
    assert rec.reports[-1]["masked_ratio"] > 0.1  # rows were masked, yet every one went through backward


def test_skipping_saves_backward_rows_and_still_learns(digits, tmp_path: Path) -> None:
    task, data = digits
    rec = Recorder(tmp_path)
    trial = Trial(config(loss="as_softmax", epochs=3.0, skip_masked_rows=True, warmup_r=0.34,
                         **{"loss.delta": 0.3}),
                  data, task, rec)
    trial.timer = PhaseTimer(trial.device)
    trial.run()
    first, last = rec.reports[0], rec.reports[-1]
    # epoch 1 lies inside the warm-up: delta = 1, no probe
    assert first["backward_rows"] == first["samples_seen"]
    assert last["backward_rows"] < 0.8 * last["samples_seen"]
    assert last["best_val_accuracy"] > 0.8
    assert set(trial.timer.seconds) == {"probe", "forward", "backward", "step"}
    assert sum(trial.timer.seconds.values()) <= last["train_seconds"]


@pytest.mark.parametrize("loss", ["softmax", "label_smoothing", "as_variant"])
def test_row_skipping_with_a_loss_that_cannot_skip_is_a_clear_error(digits, tmp_path: Path,
                                                                    loss: str) -> None:
    task, data = digits
    with pytest.raises(ValueError,
                       match=rf"skip_masked_rows: expected false for {loss} \(only \[.*'as_softmax'.*\] can "
                             r"skip masked rows\), got true"):
        Trial(config(loss=loss, skip_masked_rows=True), data, task, Recorder(tmp_path))


def test_checkpoints_hold_only_tensors_and_plain_values(digits, tmp_path: Path) -> None:
    task, data = digits
    rec = Recorder(tmp_path)
    run_trial(config(loss="as_speed", epochs=1.0,
                     **{"loss.delta": 0.3, "loss.lam": 1.0, "loss.max_steps": 3}),
              data, task, rec)
    saved = torch.load(rec.checkpoints[-1] / STATE_FILE, weights_only=True)  # no pickle of arbitrary objects
    assert saved["loop"]["samples_seen"] == rec.reports[-1]["samples_seen"]


def test_a_planted_pickle_as_the_trial_checkpoint_is_refused_and_never_run(digits, tmp_path: Path) -> None:
    from test_engine import Payload

    task, data = digits
    planted = tmp_path / "ckpt"
    planted.mkdir()
    torch.save({"model": Payload(tmp_path / "ran")}, planted / STATE_FILE)
    with pytest.raises(ValueError, match=rf"ckpt/{STATE_FILE}: expected a tune_as trial checkpoint "
                                         r"\(tensors and plain values\), got .*"):
        Trial(config(), data, task, Recorder(tmp_path), restore_dir=planted)
    assert not (tmp_path / "ran").exists(), "the planted payload ran"


def test_a_finished_trials_checkpoint_keeps_no_weights_and_restores_to_nothing_left(
        digits, tmp_path: Path) -> None:
    from tune_as.training.trial import drop_weights

    task, data = digits
    rec = Recorder(tmp_path)
    run_trial(config(), data, task, rec)
    final = rec.checkpoints[-1]
    drop_weights(final)  # what the driver does once Ray says the trial ended
    assert not (final / STATE_FILE).exists() and (final / PMARGIN_FILE).is_file()
    assert sum(p.stat().st_size for p in final.iterdir()) < 10_000
    # its driver killed before Ray noted the end, a resumed search restores the trial: nothing is left to
    # train
    again = Recorder(tmp_path / "again")
    run_trial(config(), data, task, again, restore_dir=final)
    assert again.reports == []


def test_a_cycle_cut_at_an_epoch_end_steps_on_the_mean_gradient(digits, tmp_path: Path) -> None:
    """AS-Speed plans 4 micro-batches a cycle; an epoch that ends after 2 closes the cycle there. Its gradient
    must be the mean of those 2 (as a 2-step cycle gives), not their sum divided by the planned 4."""
    idx = torch.arange(64)
    grads = []
    for steps, close in ((4, True), (2, False)):
        trial = eval_mode_trial(digits, tmp_path, "as_speed", False)
        trial.micro_step(idx[:32], steps)
        trial.micro_step(idx[32:], steps)
        if close:
            trial.close_cycle(2, steps)
        grads.append({name: p.grad.clone() for name, p in trial.model.named_parameters()
                      if p.grad is not None})
    cut, full = grads
    assert cut.keys() == full.keys() and cut
    for name, grad in full.items():
        torch.testing.assert_close(cut[name], grad, rtol=1e-6, atol=1e-8, msg=name)
