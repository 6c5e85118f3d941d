"""One trial: fine-tune (or train a head) for a (task, loss) pair and report at every evaluation point.

`Trial.run` is the loop, top to bottom: micro-steps (several per optimizer step under AS-Speed's
accumulation), an optimizer step at the end of each cycle, an evaluation (and a checkpoint, when the reporter
wants one) when due. Ray reaches it through a `Reporter` (tune_as.engine adapts `ray.tune.report`),
so it runs without Ray.

Schedules are functions of *training progress* = samples seen / samples planned, so AS-Speed (fewer optimizer
steps for the same samples) gets the same learning-rate curve and the same AS warm-up as softmax.

No host sync per step: the training statistics stay on the device and are read when a report is due (a
non-finite loss ends the trial there). The reads the algorithms need happen only where they apply: a loss that
masks rows reads its cycle's row counts once per optimizer step (an all-masked cycle must not step; AS-Speed's
Eq. 19 needs the masked ratio), and row skipping's probe reads which examples to keep.

Row skipping (`skip_masked_rows`, the AS family): a gradient-free probe forward finds the fully masked
examples (loss and gradient exactly 0), and forward + backward run on the others only, their mean scaled by
kept / all rows, so the loss and every gradient are those of the full mean. No probe while the warm-up holds
delta at 1.
"""

from __future__ import annotations

import math
import pickle
import shutil
import tempfile
import time
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, NamedTuple, Protocol, cast

import numpy as np
import torch
from torch import Tensor, nn

from tune_as.losses import Loss, build_loss, row_skipping_problem
from tune_as.losses.accumulation import AdaptiveAccumulation
from tune_as.settings import TrialSettings
from tune_as.tracking.schema import PMARGIN_FILE
from tune_as.training.tools import (
    Batches,
    Counts,
    FusedAdamW,
    PhaseTimer,
    autocast_for,
    lr_factor,
    p_margin,
    seed_everything,
)

__all__ = ["FINISHED_FILE", "PMARGIN_FILE", "STATE_FILE", "Counts", "PhaseTimer", "Reporter", "StepStats",
           "Trial", "drop_weights", "lr_factor", "p_margin", "run_trial"]

STATE_FILE = "trial_state.pt"
FINISHED_FILE = "trial_finished"  # in a checkpoint whose weights `drop_weights` removed: the trial has ended
# evaluation batch where batches are plain indexes (frozen features, pixels): no gradients kept
EVAL_ROWS = 2048


class Reporter(Protocol):
    """Where a trial's evaluations go (tune_as.engine.callbacks adapts `ray.tune.report`; tests collect
    them)."""

    def wants_checkpoint(self, final: bool) -> bool:
        """Whether to save a checkpoint with this report (`final`: the trial's last report)."""
        ...

    def report(self, metrics: dict[str, Any], checkpoint_dir: Path | None) -> None: ...


class StepStats(NamedTuple):
    """One micro-step: [mean loss over its counted rows, counted rows, masked rows] as one float64 tensor on
    the device (not read), and the examples that went through backward (known on the host)."""

    sums: Tensor
    backward_rows: int


class Evaluation(NamedTuple):
    scores: dict[str, float]
    loss: float  # the trial's own loss (at its searched delta), mean over counted rows
    margins: np.ndarray | None  # p_margin per counted row (Section 4.5), when asked for


@dataclass
class Parts:
    """What a trial trains, built once from its settings; a checkpoint saves and restores their states."""

    model: nn.Module
    optimizer: FusedAdamW
    loss_fn: Loss
    accumulator: AdaptiveAccumulation | None
    scaler: torch.amp.GradScaler | None
    autocast: AbstractContextManager[Any]


def build_parts(cfg: TrialSettings, data: Any, device: torch.device) -> Parts:
    from tune_as.tasks import build_model

    loss_fn = build_loss(cfg.loss, **cfg.loss_params)
    problem = row_skipping_problem(cfg.loss) if cfg.skip_masked_rows else None
    if problem:
        raise ValueError(problem)
    model = build_model(data, head="cosine" if loss_fn.needs_cosine_head else "linear",
                        seed=cfg.seed).to(device)
    decay: list[nn.Parameter] = []  # weight decay on matrices; none on biases and norms
    no_decay: list[nn.Parameter] = []
    for name, p in model.named_parameters():
        if p.requires_grad:
            (no_decay if p.ndim < 2 or "norm" in name.lower() else decay).append(p)
    # fused: one kernel for the whole update (on this CPU 0.9 ms instead of 2.6 ms per step for a
    # 275k-parameter head: benchmarks/bench_loop.py), the same update up to float rounding;
    # on GPUs it is the usual choice too
    optimizer = FusedAdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                            {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr)
    autocast, use_scaler = autocast_for(cfg, device)
    scaler = torch.amp.GradScaler(device.type) if use_scaler else None
    return Parts(model, optimizer, loss_fn, loss_fn.make_accumulator(), scaler, autocast)


class Trial:
    """The state of one running trial; `run()` drives it to the end (or until ASHA stops the process)."""

    def __init__(self, config: dict[str, Any], data: Any, task: Any, reporter: Reporter,
                 restore_dir: Path | None = None) -> None:
        self.cfg = cfg = TrialSettings.from_dict(config)
        self.data, self.task, self.reporter = data, task, reporter
        seed_everything(cfg.seed)
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.parts = build_parts(cfg, data, self.device)
        self.loss_fn = self.parts.loss_fn
        self.model = self.parts.model
        # AS warm-up (delta = 1 for the first r of training) only where the loss declares it and r > 0
        self.warmup = cfg.warmup_r > 0 and self.loss_fn.supports_warmup
        self.train_batches = Batches(data.train, self.device)
        self.n_train = len(data.train)
        self.total_samples = max(1, int(round(cfg.epochs * self.n_train)))
        self.counts = Counts()
        # StepStats sums since the report
        self.window = torch.zeros(3, dtype=torch.float64, device=self.device)
        self.window_steps = 0  # micro-steps since the report
        self.pmargin: np.ndarray | None = None
        self.timer: PhaseTimer | None = None  # set one to time the loop's phases (benchmarks)
        if restore_dir is not None:
            self.load(restore_dir)

    @property
    def progress(self) -> float:
        return self.counts.samples_seen / self.total_samples

    def run(self) -> None:
        """Train to the end: micro-steps, an optimizer step per cycle, evaluations and checkpoints when
        due."""
        counts, cfg, accumulator = self.counts, self.cfg, self.parts.accumulator
        steps, micro, seen = (accumulator.steps if accumulator else 1), 0, (0, 0)
        self.model.train()
        tic = time.perf_counter()
        for idx in self.train_batches.training_order(counts, cfg.batch_size, cfg.seed, self.total_samples):
            self.apply_schedules()
            stats = self.micro_step(idx, steps)
            self.window += stats.sums
            self.window_steps += 1
            micro += 1
            counts.samples_seen += len(idx)
            counts.batch_in_epoch += 1
            counts.backward_rows += stats.backward_rows
            end_of_data = counts.samples_seen >= self.total_samples
            epoch_done = counts.batch_in_epoch * cfg.batch_size >= self.n_train
            if micro < steps and not (end_of_data or epoch_done):
                # accumulate; a cycle never spans an epoch boundary, so evaluations see a settled model
                continue
            # (counted, masked) rows of the cycle: read only for a loss that can mask (docstring)
            cycle = (1, 0)
            if self.loss_fn.masks_rows:
                rows, masked = (int(v) for v in self.window[1:].tolist())
                cycle, seen = (rows - seen[0], masked - seen[1]), (rows, masked)
            self.close_cycle(micro, steps)
            stepped = self.optimizer_step(skip=cycle[0] == cycle[1])
            if accumulator:
                accumulator.observe(*cycle)
                steps = accumulator.cycle_start()
            micro = 0
            every = cfg.eval_every_steps
            at_step = every is not None and stepped and counts.optimizer_steps % every == 0
            if end_of_data or at_step or (every is None and epoch_done):
                counts.train_seconds += time.perf_counter() - tic
                if not self.evaluate_and_report(steps):
                    return  # diverged: reported as failed
                seen = (0, 0)
                self.model.train()
                tic = time.perf_counter()

    def apply_schedules(self) -> None:
        """The learning rate (linear warm-up, then decay) and the AS warm-up, at the current progress."""
        if self.warmup:  # AS warm-up: delta = 1 (plain cross-entropy) for the first r
            self.loss_fn.set_warmup(self.in_warmup)
        lr = self.cfg.lr * lr_factor(self.progress, self.cfg.lr_warmup)
        for group in self.parts.optimizer.param_groups:
            group["lr"] = lr

    @property
    def in_warmup(self) -> bool:
        return self.warmup and self.progress < self.cfg.warmup_r

    def micro_step(self, idx: Tensor, steps: int) -> StepStats:
        """Forward and backward of one micro-batch (its gradient / `steps` added to .grad), skipping the fully
        masked examples when asked (module docstring)."""
        batch = self.train_batches.get(idx)
        # all_rows: counted rows of the whole micro-batch, when probed
        labels, all_rows = batch["labels"], None
        if self.cfg.skip_masked_rows and not self.in_warmup:
            with self.phase("probe"), torch.no_grad():
                with self.parts.autocast:
                    probe = self.model(batch).float()
                keep = ~self.loss_fn.masked_examples(probe, labels)  # (N,) bool
                all_rows = self.loss_fn(probe, labels).n_rows.double()
                n_keep = int(keep.sum())  # row skipping's read: which examples go on
            if n_keep == 0:  # nothing to learn from: no backward; the rows still count (all masked)
                return StepStats(torch.stack([torch.zeros_like(all_rows), all_rows, all_rows]), 0)
            if n_keep < len(idx):  # re-batched, so that padding is trimmed to the longest kept example
                batch = self.train_batches.get(idx[keep.to(idx.device)])
        with self.phase("forward"):
            with self.parts.autocast:
                logits = self.model(batch)
            out = self.loss_fn(logits.float(), batch["labels"])
            loss, rows, masked = out.loss, out.n_rows.double(), out.n_masked.double()
            if all_rows is not None:
                # the kept rows' mean -> the mean over all counted rows of the micro-batch
                loss = loss * rows / all_rows.clamp(min=1)
                masked = masked + (all_rows - rows)  # skipped examples' rows: counted, and masked
                rows = all_rows
        with self.phase("backward"):
            scaled = loss / steps
            (self.parts.scaler.scale(scaled) if self.parts.scaler else scaled).backward()
        return StepStats(torch.stack([loss.detach().double(), rows, masked]), len(batch["labels"]))

    def close_cycle(self, micro: int, steps: int) -> None:
        """A cycle cut short at an epoch's end ran `micro` of its planned `steps` micro-batches, each of whose
        gradients was divided by `steps`: rescaled, the accumulated gradient is their mean,
        as in a full cycle."""
        if micro < steps:  # a GradScaler's scale is one constant factor: the rescaling commutes with it
            for p in self.model.parameters():
                if p.grad is not None:
                    p.grad.mul_(steps / micro)

    def optimizer_step(self, skip: bool) -> bool:
        """Clip and step, unless every row of the cycle was masked: the accumulated gradient is then exactly
        zero and AdamW would still move the weights through its momentum and weight decay. True if it
        stepped."""
        # GradScaler reads an optimizer's param_groups and its AMP attributes only: FusedAdamW has both
        optimizer, scaler = cast(torch.optim.Optimizer, self.parts.optimizer), self.parts.scaler
        if not skip:
            with self.phase("step"):
                if scaler:
                    scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.max_grad_norm)
                if scaler:
                    scaler.step(optimizer)
                    scaler.update()
                else:
                    optimizer.step()
            self.counts.optimizer_steps += 1
        optimizer.zero_grad(set_to_none=True)
        return not skip

    def phase(self, name: str) -> AbstractContextManager[None]:
        return self.timer.phase(name) if self.timer else nullcontext()

    # -- evaluation and reports ------------------------------------------------------------------------
    @torch.no_grad()
    def evaluate(self, split: Any, margins: bool = False) -> Evaluation:
        """Task metrics, mean loss (at the searched delta) and, when asked, p_margin over `split`."""
        self.model.eval()
        if self.warmup:
            self.loss_fn.set_warmup(False)
        # evaluation splits are read once: never widened
        batches = Batches(split, self.device, resident_bytes=0)
        size = EVAL_ROWS if split.lengths is None and split.ragged is None else max(self.cfg.batch_size, 128)
        preds, kept, loss_sum, rows = [], [], torch.zeros((), dtype=torch.float64, device=self.device), 0
        for start in range(0, len(split), size):
            batch = batches.get(torch.arange(start, min(start + size, len(split))))
            with self.parts.autocast:
                logits = self.model(batch).float()
            out = self.loss_fn(logits, batch["labels"])
            loss_sum += out.loss.double() * out.n_rows
            rows += out.n_rows
            preds.append(self.task.predict(self.loss_fn.class_scores(logits)).cpu())
            if margins:
                kept.append(p_margin(logits, batch["labels"]).cpu())
        scores = self.task.score(preds, split)
        return Evaluation(scores, float(loss_sum / max(1, int(rows))),
                          torch.cat(kept).numpy() if margins else None)

    def evaluate_and_report(self, steps: int) -> bool:
        """Report the evaluation (test only for a new best validation). False when training diverged."""
        loss_sum, rows, masked = self.window.tolist()
        n_steps = max(1, self.window_steps)
        self.window.zero_()
        self.window_steps = 0
        if not math.isfinite(loss_sum):
            self.report({"error": f"non-finite training loss ({loss_sum / n_steps}) before optimizer step "
                                  f"{self.counts.optimizer_steps}; lower the lr or the loss's scale/margin",
                         **self.position()}, checkpoint=False)
            return False
        tic = time.perf_counter()
        val = self.evaluate(self.data.validation)
        primary, counts = self.task.metrics[0], self.counts
        if val.scores[primary] > counts.best_val:  # test only ever follows the validation choice
            counts.best_val = val.scores[primary]
            counts.best = {f"best_val_{m}": v for m, v in val.scores.items()}
            if self.data.test is not None:
                test = self.evaluate(self.data.test, margins=True)
                self.pmargin = test.margins
                counts.best.update({f"test_{m}": v for m, v in test.scores.items()})
        self.report({**{f"val_{m}": v for m, v in val.scores.items()}, **counts.best, "val_loss": val.loss,
                     "train_loss": loss_sum / n_steps, "masked_ratio": masked / max(1.0, rows),
                     "accum_steps": steps, "backward_rows": counts.backward_rows, **self.position(),
                     "eval_seconds": time.perf_counter() - tic})
        return True

    def position(self) -> dict[str, Any]:
        c = self.counts
        return {"optimizer_steps": c.optimizer_steps, "samples_seen": c.samples_seen,
                "epoch": c.samples_seen / self.n_train, "train_seconds": c.train_seconds}

    def report(self, metrics: dict[str, Any], checkpoint: bool = True) -> None:
        final = self.counts.samples_seen >= self.total_samples
        if not (checkpoint and self.reporter.wants_checkpoint(final)):
            self.reporter.report(metrics, None)
            return
        folder = Path(tempfile.mkdtemp(prefix="tune_as_ckpt_"))
        try:
            self.save(folder)
            self.reporter.report(metrics, folder)
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    # -- checkpoints: tensors and plain values only, read back with weights_only ------------------------
    def save(self, path: Path) -> None:
        parts = self.parts
        torch.save({"model": self.model.state_dict(), "optimizer": parts.optimizer.state_dict(),
                    "scaler": parts.scaler.state_dict() if parts.scaler else None,
                    "accumulator": parts.accumulator.state_dict() if parts.accumulator else None,
                    "loop": asdict(self.counts), "rng": torch.get_rng_state(),
                    # dropout on a GPU draws from the CUDA generators: saved too,
                    # so a resume continues exactly
                    "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None},
                   path / STATE_FILE)
        if self.pmargin is not None:
            np.save(path / PMARGIN_FILE, self.pmargin)

    def load(self, path: Path) -> None:
        if (path / FINISHED_FILE).exists():
            # an ended trial restored (its driver died before Ray noted the end)
            self.counts.samples_seen = self.total_samples  # nothing left to train: run() reports nothing
            return
        try:
            # weights_only: a checkpoint holds tensors and plain values;
            # unpickling anything else could run code
            saved = torch.load(path / STATE_FILE, map_location=self.device, weights_only=True)
        except pickle.UnpicklingError:
            raise ValueError(f"{path / STATE_FILE}: expected a tune_as trial checkpoint "
                             "(tensors and plain values), got a pickle of other objects "
                             "(not loaded: unpickling them could run code)") from None
        parts = self.parts
        self.model.load_state_dict(saved["model"])
        parts.optimizer.load_state_dict(saved["optimizer"])
        if parts.scaler and saved["scaler"]:
            parts.scaler.load_state_dict(saved["scaler"])
        if parts.accumulator and saved["accumulator"]:
            parts.accumulator.load_state_dict(saved["accumulator"])
        # "window": checkpoints before issue 21
        loop = {k: v for k, v in saved["loop"].items() if k != "window"}
        self.counts = Counts(**loop)
        torch.set_rng_state(saved["rng"])
        if saved.get("cuda_rng") is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(saved["cuda_rng"])
        if (path / PMARGIN_FILE).exists():
            self.pmargin = np.load(path / PMARGIN_FILE)


def drop_weights(checkpoint_dir: Path) -> None:
    """Turn an ended trial's checkpoint into a marker (keeping its small pmargin.npy): nothing trains the
    trial again, so its model and optimizer state (1.9 MB for digits' CNN, gigabytes for a fine-tuned BERT)
    would only fill the disk. A trial restored from the marker has nothing left to train."""
    (checkpoint_dir / FINISHED_FILE).touch()  # first: a kill between the two steps leaves a whole checkpoint
    (checkpoint_dir / STATE_FILE).unlink(missing_ok=True)


def run_trial(config: dict[str, Any], data: Any, task: Any, reporter: Reporter,
              restore_dir: Path | None = None) -> None:
    Trial(config, data, task, reporter, restore_dir).run()
