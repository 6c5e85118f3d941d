"""One trial: fine-tune (or train a head) for a (task, loss) pair and report at every evaluation point.

The loop is plain torch; Ray reaches it through a `Reporter` (tune_as.engine adapts `ray.tune.report`), so it
can be run and tested without Ray. Schedules are functions of *training progress* = samples seen / samples
planned, so AS-Speed (fewer optimizer steps for the same samples) gets the same learning-rate curve and the
same AS warm-up as softmax: the optimizer-step counter only advances the schedules, it does not define them.

Row skipping (`skip_masked_rows`, AS-Softmax family only). A fully masked example has loss exactly 0 and gradient
exactly 0, but without skipping the whole backbone still runs its backward pass for it. With skipping, each
micro-batch first runs a gradient-free forward (the *probe*), asks the loss which examples are fully masked
(`Loss.masked_examples`), and then runs forward + backward on the other examples only. The kept examples' mean
loss is scaled by kept_rows / all_rows, so the loss and every gradient are those of the mean over all counted
rows, as without skipping; a micro-batch whose examples are all masked has no backward at all (its rows still
count, for AS-Speed's Eq. 19 and for the logged masked ratio).

Why a probe, and why in train mode. The alternative, reusing the mask an example had when it was last seen
(an epoch ago), is free but stale: the model moves a lot in an epoch of fine-tuning, and an example that turns
unmasked would lose its gradient for a whole epoch. The probe is current, and costs one forward without
activations kept (about 1/3 of forward + backward), paid only once delta < 1 (during the AS warm-up delta = 1
and no row can be masked, so there is no probe then). The probe runs in the model's training mode: with
dropout on, it draws its own dropout masks, independent of the gradient pass's (the two passes see different
batch shapes, so they could not share masks anyway). An example is then skipped with the same probability with
which the gradient pass, run on it, would have masked it, but not always on the same draw: some skipped
examples would have had a small non-zero loss in the gradient pass (their gradient is lost), and some kept
ones get loss 0 there (computed for nothing). Without dropout (eval mode, no dropout layers) both passes agree
and skipping is exact; benchmarks/bench_finetune.py measures the disagreement with dropout
(docs/bench_finetune.md). `backward_rows` (examples that went through a backward pass) is logged for every trial.
"""

from __future__ import annotations

import math
import pickle
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from tune_as.losses import build_loss
from tune_as.settings import TrialSettings
from tune_as.tracking.schema import PMARGIN_FILE
from tune_as.training.tools import PhaseTimer, autocast_for, lr_factor, p_margin, seed_everything

__all__ = ["FINISHED_FILE", "PMARGIN_FILE", "STATE_FILE", "LoopState", "PhaseTimer", "Reporter", "Trial",
           "drop_weights", "lr_factor", "p_margin", "run_trial"]

STATE_FILE = "trial_state.pt"
FINISHED_FILE = "trial_finished"  # in a checkpoint whose weights `drop_weights` removed: the trial has ended


class Reporter(Protocol):
    """Where a trial's evaluations go (tune_as.engine.callbacks adapts `ray.tune.report`; tests collect them)."""

    def wants_checkpoint(self, final: bool) -> bool:
        """Whether to save a checkpoint with this report (`final`: the trial's last report)."""
        ...

    def report(self, metrics: dict[str, Any], checkpoint_dir: Path | None) -> None: ...


def _empty_window() -> dict[str, float]:
    return {"loss": 0.0, "batches": 0, "rows": 0, "masked": 0}


@dataclass
class LoopState:
    """Everything needed to resume exactly where a checkpoint was taken."""

    epoch: int = 0
    batch_in_epoch: int = 0
    samples_seen: int = 0
    backward_rows: int = 0  # examples that went through a backward pass (== samples_seen unless rows are skipped)
    optimizer_steps: int = 0
    train_seconds: float = 0.0
    best_val: float = -math.inf
    best: dict[str, float] = field(default_factory=dict)  # test_<m> and best_val_<m> of the best-val model
    window: dict[str, float] = field(default_factory=_empty_window)  # since the last report


class Trial:
    """The state of one running trial; `run()` drives it to the end (or until ASHA stops the process)."""

    def __init__(self, config: dict[str, Any], data: Any, task: Any, reporter: Reporter,
                 restore_dir: Path | None = None) -> None:
        from tune_as.tasks import build_model

        self.cfg = cfg = TrialSettings.from_dict(config)
        self.data, self.task, self.reporter = data, task, reporter
        seed_everything(cfg.seed)
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.loss_fn: Any = build_loss(cfg.loss, **cfg.loss_params)  # delta is settable on the AS family
        if cfg.skip_masked_rows and not self.loss_fn.supports_row_skipping:
            from tune_as.losses import LOSSES

            able = sorted(name for name, cls in LOSSES.items() if cls.supports_row_skipping)
            raise ValueError(f"skip_masked_rows: expected one of the losses {able} (they mask rows), "
                             f"got loss {cfg.loss!r}; set skip_masked_rows=false")
        # AS warm-up (delta = 1 for the first r of training) only where the loss declares it and r > 0
        self.warmup = cfg.warmup_r > 0 and self.loss_fn.supports_warmup
        head = "cosine" if self.loss_fn.needs_cosine_head else "linear"
        self.model = build_model(data, head=head, seed=cfg.seed).to(self.device)
        self.optimizer = torch.optim.AdamW(self._param_groups(), lr=cfg.lr)
        self.autocast, use_scaler = autocast_for(cfg, self.device)
        self.scaler = torch.amp.GradScaler(self.device.type) if use_scaler else None
        self.accumulator: Any = self.loss_fn.make_accumulator()
        self.n_train = len(data.train)
        self.total_samples = max(1, int(round(cfg.epochs * self.n_train)))
        self.eval_batch = max(cfg.batch_size, 64)
        self.state = LoopState()
        self.pmargin: np.ndarray | None = None
        self.timer: PhaseTimer | None = None  # set one to time the loop's phases (benchmarks)
        if restore_dir is not None:
            self._load(restore_dir)

    def _param_groups(self) -> list[dict[str, Any]]:
        decay: list[torch.nn.Parameter] = []
        no_decay: list[torch.nn.Parameter] = []
        for name, p in self.model.named_parameters():
            if p.requires_grad:
                (no_decay if p.ndim < 2 or "norm" in name.lower() else decay).append(p)
        return [{"params": decay, "weight_decay": self.cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]

    # -- schedules -------------------------------------------------------------------------------------
    @property
    def progress(self) -> float:
        return self.state.samples_seen / self.total_samples

    def _apply_schedules(self) -> None:
        if self.warmup:  # AS warm-up: delta = 1 (plain cross-entropy) for the first r
            self.loss_fn.set_warmup(self.progress < self.cfg.warmup_r)
        factor = lr_factor(self.progress, self.cfg.lr_warmup)
        for group in self.optimizer.param_groups:
            group["lr"] = self.cfg.lr * factor

    # -- training --------------------------------------------------------------------------------------
    def _batches(self) -> Iterator[torch.Tensor]:
        """Micro-batch indices from the current position; the epoch's order depends on (seed, epoch) only."""
        while self.state.samples_seen < self.total_samples:
            gen = torch.Generator().manual_seed(self.cfg.seed * 1_000_003 + self.state.epoch)
            order = torch.randperm(self.n_train, generator=gen)
            starts = range(self.state.batch_in_epoch * self.cfg.batch_size, self.n_train, self.cfg.batch_size)
            for start in starts:
                if self.state.samples_seen >= self.total_samples:
                    return
                yield order[start:start + self.cfg.batch_size]
            self.state.epoch += 1
            self.state.batch_in_epoch = 0

    def _to_device(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}

    def run(self) -> None:
        every = self.cfg.eval_every_steps
        micro, cycle_rows, cycle_masked = 0, 0, 0
        steps = self.accumulator.steps if self.accumulator else 1
        self.model.train()
        tic = time.perf_counter()
        for idx in self._batches():
            self._apply_schedules()
            loss_value, n_rows, n_masked = self._forward_backward(idx, steps)
            if not math.isfinite(loss_value):
                self.state.train_seconds += time.perf_counter() - tic
                return self._fail(f"non-finite training loss ({loss_value}) at optimizer step "
                                  f"{self.state.optimizer_steps}; lower the lr or the loss's scale/margin")
            if self.accumulator:
                self.accumulator.observe(n_rows, n_masked)
            micro, cycle_rows, cycle_masked = micro + 1, cycle_rows + n_rows, cycle_masked + n_masked
            window = self.state.window
            window["loss"] += loss_value
            window["batches"] += 1
            window["rows"] += n_rows
            window["masked"] += n_masked
            self.state.samples_seen += len(idx)
            self.state.batch_in_epoch += 1
            end_of_data = self.state.samples_seen >= self.total_samples
            epoch_done = self.state.batch_in_epoch * self.cfg.batch_size >= self.n_train
            if not (micro >= steps or end_of_data or epoch_done):
                continue
            # a cycle never spans an epoch boundary, so every evaluation sees a settled model
            stepped = self._optimizer_step(skip=cycle_rows == cycle_masked)
            micro, cycle_rows, cycle_masked = 0, 0, 0
            if self.accumulator:
                self.accumulator.cycle_start()
                steps = self.accumulator.steps
            at_step = every is not None and stepped and self.state.optimizer_steps % every == 0
            if end_of_data or (every is None and epoch_done) or at_step:
                self.state.train_seconds += time.perf_counter() - tic
                self._evaluate_and_report(steps)
                self.model.train()
                tic = time.perf_counter()

    def _phase(self, name: str) -> AbstractContextManager[None]:
        return self.timer.phase(name) if self.timer else nullcontext()

    def _forward_backward(self, idx: torch.Tensor, steps: int) -> tuple[float, int, int]:
        """Forward and backward of one micro-batch (its gradient / `steps` added to .grad), skipping the fully
        masked examples when asked (module docstring). Returns the mean loss over the micro-batch's counted
        rows, those rows and the masked ones; a non-finite loss returns before any backward."""
        batch = self._to_device(self.data.train.batch(idx))
        all_rows: torch.Tensor | None = None  # counted rows of the whole micro-batch, when probed
        if self.cfg.skip_masked_rows and self.loss_fn.delta < 1.0:  # delta = 1 (warm-up) masks no row
            with self._phase("probe"), torch.no_grad():
                with self.autocast:
                    probe = self.model(batch).float()
                keep = ~self.loss_fn.masked_examples(probe, batch["labels"])  # (N,) bool
                all_rows = self.loss_fn(probe, batch["labels"]).n_rows
                n_keep = int(keep.sum())
            if n_keep == 0:  # nothing to learn from: no backward; the rows still count (all masked)
                rows = int(all_rows)
                return 0.0, rows, rows
            if n_keep < len(idx):
                # re-batched from the split so that padding is trimmed to the longest kept example
                batch = self._to_device(self.data.train.batch(idx[keep.cpu()]))
        with self._phase("forward"):
            with self.autocast:
                logits = self.model(batch)
            out = self.loss_fn(logits.float(), batch["labels"])
            loss = out.loss
            counts = [out.n_rows.double(), out.n_masked.double()]
            if all_rows is not None:  # the kept rows' mean -> the mean over all counted rows of the micro-batch
                loss = loss * out.n_rows / all_rows.clamp(min=1)
                skipped = (all_rows - out.n_rows).double()  # rows of skipped examples: counted, and masked
                counts = [c + skipped for c in counts]
            # one host sync per micro-batch for the three numbers the loop needs
            loss_value, rows_f, masked_f = torch.stack([loss.detach().double(), *counts]).tolist()
        if math.isfinite(loss_value):
            with self._phase("backward"):
                scaled = loss / steps
                (self.scaler.scale(scaled) if self.scaler else scaled).backward()
            self.state.backward_rows += len(batch["labels"])
        return loss_value, int(rows_f), int(masked_f)

    def _optimizer_step(self, skip: bool) -> bool:
        """Skip the update when every row of the cycle was masked: the accumulated gradient is exactly zero
        and AdamW would still move the weights through its momentum and weight decay. True if it stepped."""
        if not skip:
            with self._phase("step"):
                self._step()
        self.optimizer.zero_grad(set_to_none=True)
        return not skip

    def _step(self) -> None:
        if self.scaler:
            self.scaler.unscale_(self.optimizer)
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.max_grad_norm)
        if self.scaler:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.state.optimizer_steps += 1

    # -- evaluation ------------------------------------------------------------------------------------
    @torch.no_grad()
    def evaluate(self, split: Any) -> tuple[dict[str, float], float, np.ndarray]:
        """Task metrics, mean loss (the trial's own loss at its searched delta) and p_margin over `split`."""
        self.model.eval()
        if self.warmup:
            self.loss_fn.set_warmup(False)
        preds, margins, loss_sum, rows = [], [], 0.0, 0
        for start in range(0, len(split), self.eval_batch):
            batch = self._to_device(split.batch(torch.arange(start, min(start + self.eval_batch, len(split)))))
            with self.autocast:
                logits = self.model(batch).float()
            out = self.loss_fn(logits, batch["labels"])
            n = int(out.n_rows)
            loss_sum += float(out.loss) * n
            rows += n
            preds.append(self.task.predict(self.loss_fn.class_scores(logits)).cpu())
            margins.append(p_margin(logits, batch["labels"]).cpu())
        scores = self.task.score(preds, split)
        return scores, loss_sum / max(1, rows), torch.cat(margins).numpy()

    def _evaluate_and_report(self, steps: int) -> None:
        tic = time.perf_counter()
        val, val_loss, _ = self.evaluate(self.data.validation)
        primary = self.task.metrics[0]
        if val[primary] > self.state.best_val:  # test only ever follows the validation choice
            self.state.best_val = val[primary]
            self.state.best = {f"best_val_{m}": v for m, v in val.items()}
            if self.data.test is not None:
                test, _, self.pmargin = self.evaluate(self.data.test)
                self.state.best.update({f"test_{m}": v for m, v in test.items()})
        w = self.state.window
        metrics: dict[str, Any] = {
            **{f"val_{m}": v for m, v in val.items()},
            **self.state.best,
            "val_loss": val_loss,
            "train_loss": w["loss"] / max(1, w["batches"]),
            "masked_ratio": w["masked"] / max(1, w["rows"]),
            "accum_steps": steps,
            "optimizer_steps": self.state.optimizer_steps,
            "samples_seen": self.state.samples_seen,
            "backward_rows": self.state.backward_rows,
            "epoch": self.state.samples_seen / self.n_train,
            "train_seconds": self.state.train_seconds,
            "eval_seconds": time.perf_counter() - tic,
        }
        self.state.window = _empty_window()
        self._report(metrics)

    def _fail(self, error: str) -> None:
        """A diverged trial ends with an error result instead of raising: a retry from the last checkpoint
        would diverge again, so the searcher is told the trial failed and the search goes on."""
        self._report({"error": error, "optimizer_steps": self.state.optimizer_steps,
                      "samples_seen": self.state.samples_seen, "epoch": self.state.samples_seen / self.n_train,
                      "train_seconds": self.state.train_seconds}, checkpoint=False)

    def _report(self, metrics: dict[str, Any], checkpoint: bool = True) -> None:
        final = self.state.samples_seen >= self.total_samples
        if not (checkpoint and self.reporter.wants_checkpoint(final)):
            self.reporter.report(metrics, None)
            return
        ckpt = Path(tempfile.mkdtemp(prefix="tune_as_ckpt_"))
        try:
            self._save(ckpt)
            self.reporter.report(metrics, ckpt)
        finally:
            shutil.rmtree(ckpt, ignore_errors=True)

    # -- checkpoints -----------------------------------------------------------------------------------
    def _save(self, path: Path) -> None:
        torch.save({
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scaler": self.scaler.state_dict() if self.scaler else None,
            "accumulator": self.accumulator.state_dict() if self.accumulator else None,
            "loop": self.state.__dict__,
            "rng": torch.get_rng_state(),
        }, path / STATE_FILE)
        if self.pmargin is not None:
            np.save(path / PMARGIN_FILE, self.pmargin)

    def _load(self, path: Path) -> None:
        if (path / FINISHED_FILE).exists():  # an ended trial restored (its driver died before Ray noted the end)
            self.state.samples_seen = self.total_samples  # nothing left to train: run() reports nothing
            return
        try:  # weights_only: a checkpoint holds tensors and plain values; unpickling anything else could run code
            saved = torch.load(path / STATE_FILE, map_location=self.device, weights_only=True)
        except pickle.UnpicklingError:
            raise ValueError(f"{path / STATE_FILE}: expected a tune_as trial checkpoint (tensors and plain values), "
                             "got a pickle of other objects (not loaded: unpickling them could run code)") from None
        self.model.load_state_dict(saved["model"])
        self.optimizer.load_state_dict(saved["optimizer"])
        if self.scaler and saved["scaler"]:
            self.scaler.load_state_dict(saved["scaler"])
        if self.accumulator and saved["accumulator"]:
            self.accumulator.load_state_dict(saved["accumulator"])
        self.state = LoopState(**saved["loop"])
        torch.set_rng_state(saved["rng"])
        if (path / PMARGIN_FILE).exists():
            self.pmargin = np.load(path / PMARGIN_FILE)


def drop_weights(checkpoint_dir: Path) -> None:
    """Turn an ended trial's checkpoint into a marker (keeping its small pmargin.npy): nothing trains the trial
    again, so its model and optimizer state (1.9 MB for digits' CNN, gigabytes for a fine-tuned BERT) would only
    fill the disk. A trial restored from the marker has nothing left to train."""
    (checkpoint_dir / FINISHED_FILE).touch()  # first: a kill between the two steps leaves a whole checkpoint
    (checkpoint_dir / STATE_FILE).unlink(missing_ok=True)


def run_trial(config: dict[str, Any], data: Any, task: Any, reporter: Reporter, restore_dir: Path | None = None) -> None:
    Trial(config, data, task, reporter, restore_dir).run()
