"""One trial: fine-tune (or train a head) for a (task, loss) pair and report at every evaluation point.

A trial is the loop of tune_as.training.loop with one member: this module gives it the one model (any the
tasks build: a fine-tuned transformer, a frozen-feature head, a CNN with BatchNorm), its optimizer (fused
AdamW, clipping, fp16's loss scaler), row skipping, and its reports with checkpoints. Ray reaches it through
a `Reporter` (tune_as.engine adapts `ray.tune.report`), so it runs without Ray.

Row skipping (`skip_masked_rows`, the AS family): a gradient-free probe forward finds the fully masked
examples (loss and gradient exactly 0), and forward + backward run on the others only, their mean scaled by
kept / all rows, so the loss and every gradient are those of the full mean. No probe while the warm-up holds
delta at 1. The probe reads which examples to keep: the one host read a step makes beyond the loop's.

Checkpoints (`save`, `load`) hold tensors and plain values only, read back with `weights_only=True`.
"""

from __future__ import annotations

import pickle
import shutil
import tempfile
from collections.abc import Sequence
from contextlib import AbstractContextManager
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
from tune_as.training.loop import EVAL_ROWS, Evaluation, Loop
from tune_as.training.tools import (
    Counts,
    FusedAdamW,
    PhaseTimer,
    autocast_for,
    lr_factor,
    p_margin,
    seed_everything,
)

__all__ = ["EVAL_ROWS", "FINISHED_FILE", "PMARGIN_FILE", "STATE_FILE", "Counts", "Evaluation", "PhaseTimer",
           "Reporter", "StepStats", "Trial", "drop_weights", "lr_factor", "p_margin", "run_trial"]

STATE_FILE = "trial_state.pt"
FINISHED_FILE = "trial_finished"  # in a checkpoint whose weights `drop_weights` removed: the trial has ended


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
    # fused: one kernel for the whole update (faster than the foreach default on CPUs too:
    # benchmarks/bench_loop.py --plain-foreach), the same update up to float rounding
    optimizer = FusedAdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                            {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr)
    autocast, use_scaler = autocast_for(cfg, device)
    scaler = torch.amp.GradScaler(device.type) if use_scaler else None
    return Parts(model, optimizer, loss_fn, loss_fn.make_accumulator(), scaler, autocast)


class Trial(Loop):
    """One running trial: a population of one (tune_as.training.loop), whose model is any the tasks build;
    `run()` drives it to the end (or until ASHA stops the process)."""

    def __init__(self, config: dict[str, Any], data: Any, task: Any, reporter: Reporter,
                 restore_dir: Path | None = None) -> None:
        cfg = TrialSettings.from_dict(config)
        seed_everything(cfg.seed)
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.parts = parts = build_parts(cfg, data, device)
        super().__init__([cfg], data, task, device, parts.loss_fn, parts.model, [parts.accumulator],
                         parts.autocast)
        self.reporter = reporter
        if restore_dir is not None:
            self.load(restore_dir)

    @property
    def counts(self) -> Counts:
        return self.member_counts[0]

    # -- the one model's training step -----------------------------------------------------------------
    def train_step(self, idx: Tensor, steps: Sequence[int]) -> tuple[Tensor, Sequence[int]]:
        stats = self.micro_step(idx, steps[0])
        return stats.sums, (stats.backward_rows,)

    def micro_step(self, idx: Tensor, steps: int) -> StepStats:
        """Forward and backward of one micro-batch (its gradient / `steps` added to .grad), skipping the fully
        masked examples when asked (module docstring)."""
        batch = self.batches.get(idx)
        # all_rows: counted rows of the whole micro-batch, when probed
        labels, all_rows = batch["labels"], None
        if self.cfg.skip_masked_rows and not self.in_warmup:
            with self.phase("probe"), torch.no_grad():
                with self.autocast:
                    probe = self.model(batch).float()
                keep = ~self.loss_fn.masked_examples(probe, labels)  # (N,) bool
                all_rows = self.loss_fn(probe, labels).n_rows.double()
                n_keep = int(keep.sum())  # row skipping's read: which examples go on
            if n_keep == 0:  # nothing to learn from: no backward; the rows still count (all masked)
                return StepStats(torch.stack([torch.zeros_like(all_rows), all_rows, all_rows]), 0)
            if n_keep < len(idx):  # re-batched, so that padding is trimmed to the longest kept example
                batch = self.batches.get(idx[keep.to(idx.device)])
        with self.phase("forward"):
            with self.autocast:
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

    def close_cycles(self, ending: Sequence[bool], micro: Sequence[int], steps: Sequence[int]) -> None:
        self.close_cycle(micro[0], steps[0])

    def close_cycle(self, micro: int, steps: int) -> None:
        """`Loop.close_cycles` for the one model."""
        if micro < steps:  # a GradScaler's scale is one constant factor: the rescaling commutes with it
            for p in self.model.parameters():
                if p.grad is not None:
                    p.grad.mul_(steps / micro)

    def optimizer_steps(self, stepping: Sequence[bool], ending: Sequence[bool]) -> None:
        self.optimizer_step(skip=not stepping[0])

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

    def set_lr(self, lr: float) -> None:
        for group in self.parts.optimizer.param_groups:
            group["lr"] = lr

    # -- evaluation and reports ------------------------------------------------------------------------
    def evaluate(self, split: Any, margins: bool = False) -> Evaluation:
        """Task metrics, mean loss (at the searched delta) and, when asked, p_margin over `split`."""
        return self.evaluate_members(split, [0], margins)[0]

    def eval_rows(self, split: Any, members: int) -> int:
        return EVAL_ROWS if split.lengths is None and split.ragged is None else max(self.cfg.batch_size, 128)

    def eval_logits(self, batch: dict[str, Tensor], members: Tensor) -> Tensor:
        return self.model(batch).unsqueeze(0)

    def eval_losses(self, logits: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
        out = self.loss_fn(logits[0], labels)
        return out.loss.reshape(1), out.n_rows.reshape(1)

    def publish(self, reports: dict[int, dict[str, Any]], final: bool,
                margins: Sequence[np.ndarray | None]) -> None:
        """The report, with a checkpoint when the reporter wants one (never with a failure's); the checkpoint
        carries the p_margin."""
        metrics = reports[0]
        if "error" in metrics or not self.reporter.wants_checkpoint(final):
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
        if self.margins[0] is not None:
            np.save(path / PMARGIN_FILE, self.margins[0])

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
        self.member_counts[0] = Counts(**loop)
        torch.set_rng_state(saved["rng"])
        if saved.get("cuda_rng") is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(saved["cuda_rng"])
        if (path / PMARGIN_FILE).exists():
            self.margins[0] = np.load(path / PMARGIN_FILE)


def drop_weights(checkpoint_dir: Path) -> None:
    """Turn an ended trial's checkpoint into a marker (keeping its small pmargin.npy): nothing trains the
    trial again, so its model and optimizer state (megabytes for a CNN, gigabytes for a fine-tuned
    transformer) would only fill the disk. A trial restored from the marker has nothing left to train."""
    (checkpoint_dir / FINISHED_FILE).touch()  # first: a kill between the two steps leaves a whole checkpoint
    (checkpoint_dir / STATE_FILE).unlink(missing_ok=True)


def run_trial(config: dict[str, Any], data: Any, task: Any, reporter: Reporter,
              restore_dir: Path | None = None) -> None:
    Trial(config, data, task, reporter, restore_dir).run()
