"""The training loop, once: P members of one setting (one model and seed each) trained side by side, each
reporting at its own evaluation points. A solo trial is a population of one (tune_as.training.trial: one model
of any kind, P = 1); a population stacks P seeds of one small model into one program
(tune_as.training.population).

`Loop.run` is the loop, top to bottom: a micro-step per batch (several per optimizer step under AS-Speed's
accumulation; each member's cycle its own), an optimizer step for the members whose cycle ended, an
evaluation and report for the members that are due. The schedules are functions of *training progress* =
samples seen / samples planned, the same for every member, so AS-Speed (fewer optimizer steps for the same
samples) gets the same learning-rate curve and the same AS warm-up as softmax. Where the work depends on what
is trained (forward and backward, clipping and AdamW, the evaluation forward, where reports go), the loop asks
its subclass: the abstract methods below are that interface.

No host sync per step: the training statistics stay on the device (`window`, (P, 3)) and are read when a
report is due (a member whose loss is not finite fails there, the others go on). A loss that masks rows reads
its cycles' row counts once per optimizer step, for all members at once (an all-masked cycle must not step;
AS-Speed's Eq. 19 needs the masked ratio).
"""

from __future__ import annotations

import math
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import Tensor, nn

from tune_as.losses import Loss
from tune_as.losses.accumulation import AdaptiveAccumulation
from tune_as.settings import TrialSettings
from tune_as.training.tools import Batches, Counts, PhaseTimer, epoch_order, lr_factor, p_margin

# evaluation batch where batches are plain indexes (frozen features, pixels): no gradients kept
EVAL_ROWS = 2048


class Evaluation(NamedTuple):
    scores: dict[str, float]
    loss: float  # the member's own loss (at its searched delta), mean over counted rows
    margins: np.ndarray | None  # p_margin per counted row (Section 4.5), when asked for


class Loop(ABC):
    """The loop's state, shared by all members: where they are (`member_counts`: one `Counts` per member,
    whose position in the data is the same in every member), the statistics since each one's last report,
    which are still alive, and their best test p_margins. A subclass builds the model and calls `__init__`
    with it."""

    def __init__(self, cfgs: Sequence[TrialSettings], data: Any, task: Any, device: torch.device,
                 loss_fn: Loss, model: nn.Module, accumulators: Sequence[AdaptiveAccumulation | None],
                 autocast: AbstractContextManager[Any]) -> None:
        self.cfgs, self.cfg = list(cfgs), cfgs[0]  # the members' settings differ in their seeds only
        self.data, self.task, self.device = data, task, device
        self.loss_fn, self.model, self.autocast = loss_fn, model, autocast
        self.accumulators = list(accumulators)
        self.size = len(self.cfgs)
        # AS warm-up (delta = 1 for the first r of training) only where the loss declares it and r > 0
        self.warmup = self.cfg.warmup_r > 0 and loss_fn.supports_warmup
        self.batches = Batches(data.train, device)
        self.n_train = len(data.train)
        self.total_samples = max(1, int(round(self.cfg.epochs * self.n_train)))
        self.member_counts = [Counts() for _ in self.cfgs]
        self.alive = [True] * self.size
        # per member: [sum of micro-step mean losses, counted rows, masked rows] since its report
        self.window = torch.zeros(self.size, 3, dtype=torch.float64, device=device)
        self.window_steps = [0] * self.size  # micro-steps since each member's report
        self.margins: list[np.ndarray | None] = [None] * self.size  # p_margin of each one's best test
        self.timer: PhaseTimer | None = None  # set one to time the loop's phases (benchmarks)

    # -- what a subclass does for the model it trains ---------------------------------------------------
    @abstractmethod
    def train_step(self, idx: Tensor, steps: Sequence[int]) -> tuple[Tensor, Sequence[int]]:
        """Forward and backward of one micro-batch per member (`idx`: the members' rows, member after member),
        each member's gradient / its `steps` added to .grad: ((P, 3) [mean loss, counted rows, masked rows] on
        the device, not read; the examples of each member that went through backward)."""

    @abstractmethod
    def close_cycles(self, ending: Sequence[bool], micro: Sequence[int], steps: Sequence[int]) -> None:
        """A member's cycle cut short at an epoch's end ran `micro` of its planned `steps` micro-batches, each
        of whose gradients was divided by `steps`: rescaled, the accumulated gradient is their mean, as in a
        full cycle."""

    @abstractmethod
    def optimizer_steps(self, stepping: Sequence[bool], ending: Sequence[bool]) -> None:
        """Clip and step the members in `stepping` (counting their optimizer steps); clear the gradients of
        the members whose cycle ended."""

    @abstractmethod
    def set_lr(self, lr: float) -> None: ...

    @abstractmethod
    def eval_rows(self, split: Any, members: int) -> int:
        """Rows per evaluation batch of `split` for `members` members at once."""

    @abstractmethod
    def eval_logits(self, batch: dict[str, Tensor], members: Tensor) -> Tensor:
        """Logits of the evaluation batch (shared by every member) for `members`: (k, ...), member by
        member."""

    @abstractmethod
    def eval_losses(self, logits: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
        """(k,) mean loss and (k,) counted rows of each member's logits on the shared labels."""

    @abstractmethod
    def publish(self, reports: dict[int, dict[str, Any]], final: bool,
                margins: Sequence[np.ndarray | None]) -> None:
        """Send one evaluation point's reports (member -> a solo trial's report; `final`: the last one; then
        each member's p_margin of its best test, at the last one where a member is alive)."""

    # -- the loop --------------------------------------------------------------------------------------
    @property
    def progress(self) -> float:
        return self.member_counts[0].samples_seen / self.total_samples

    @property
    def in_warmup(self) -> bool:
        return self.warmup and self.progress < self.cfg.warmup_r

    def phase(self, name: str) -> AbstractContextManager[None]:
        return self.timer.phase(name) if self.timer else nullcontext()

    def training_order(self) -> Iterator[Tensor]:
        """Row indices per micro-batch from the members' position on: member i's batch of its own epoch order
        (`epoch_order` of its seed), members concatenated; moves their epoch."""
        shared, n, b = self.member_counts[0], self.n_train, self.cfg.batch_size
        while shared.samples_seen < self.total_samples:
            orders = [epoch_order(n, c.seed, shared.epoch) for c in self.cfgs]
            for start in range(shared.batch_in_epoch * b, n, b):
                if shared.samples_seen >= self.total_samples:
                    return
                if self.size == 1:
                    yield orders[0][start:start + b]
                else:
                    yield torch.cat([o[start:start + b] for o in orders])
            for c in self.member_counts:
                c.epoch += 1
                c.batch_in_epoch = 0

    def run(self) -> None:
        """Train every member to the end (or until ASHA stops the process); each one reports at its own
        evaluation points."""
        size, cfg, counts, alive = self.size, self.cfg, self.member_counts, self.alive
        shared, every = counts[0], cfg.eval_every_steps
        steps = [a.steps if a else 1 for a in self.accumulators]
        micro, seen = [0] * size, [(0, 0)] * size  # micro-steps of each one's cycle; its rows read so far
        self.model.train()
        tic = time.perf_counter()
        for idx in self.training_order():
            self.apply_schedules()
            sums, backward = self.train_step(idx, steps)
            self.window += sums
            rows = len(idx) // size
            for i in range(size):
                c = counts[i]
                c.samples_seen += rows
                c.batch_in_epoch += 1
                c.backward_rows += backward[i]
                micro[i] += 1
                self.window_steps[i] += 1
            end_of_data = shared.samples_seen >= self.total_samples
            epoch_done = shared.batch_in_epoch * cfg.batch_size >= self.n_train
            # a cycle never spans an epoch boundary, so evaluations see a settled model
            ending = [end_of_data or epoch_done or micro[i] >= steps[i] for i in range(size)]
            if not any(ending):
                continue  # accumulate
            # (counted, masked) rows of each member's cycle: read only for a loss that can mask (module
            # docstring), once for all members
            cycles = [(1, 0)] * size
            if self.loss_fn.masks_rows:
                read = [(int(w[1]), int(w[2])) for w in self.window.tolist()]
                cycles = [(r[0] - s[0], r[1] - s[1]) for r, s in zip(read, seen, strict=True)]
                seen = [r if e else s for r, s, e in zip(read, seen, ending, strict=True)]
            self.close_cycles(ending, micro, steps)
            stepping = [ending[i] and alive[i] and cycles[i][0] != cycles[i][1] for i in range(size)]
            self.optimizer_steps(stepping, ending)
            due = []
            for i in range(size):
                if not ending[i]:
                    continue
                accumulator = self.accumulators[i]
                if accumulator:
                    accumulator.observe(*cycles[i])
                    steps[i] = accumulator.cycle_start()
                micro[i] = 0
                at_step = every is not None and stepping[i] and counts[i].optimizer_steps % every == 0
                if alive[i] and (end_of_data or at_step or (every is None and epoch_done)):
                    due.append(i)
            if due:
                elapsed = time.perf_counter() - tic
                for i in due:  # the loop's time, shared among the members it trained
                    counts[i].train_seconds += elapsed / size
                self.evaluate_and_report(due, steps)
                for i in due:
                    seen[i] = (0, 0)
                if not any(alive):
                    return  # diverged: reported as failed
                self.model.train()
                tic = time.perf_counter()

    def apply_schedules(self) -> None:
        """The learning rate (linear warm-up, then decay) and the AS warm-up, at the current progress."""
        if self.warmup:  # AS warm-up: delta = 1 (plain cross-entropy) for the first r
            self.loss_fn.set_warmup(self.in_warmup)
        self.set_lr(self.cfg.lr * lr_factor(self.progress, self.cfg.lr_warmup))

    # -- evaluation and reports ------------------------------------------------------------------------
    @torch.no_grad()
    def evaluate_members(self, split: Any, members: Sequence[int], margins: bool = False) -> list[Evaluation]:
        """Task metrics, mean loss (at the searched delta) and, when asked, p_margin over `split`, for each of
        `members` (one forward of their models per batch)."""
        self.model.eval()
        if self.warmup:
            self.loss_fn.set_warmup(False)
        # evaluation splits are read once: never widened
        batches = Batches(split, self.device, resident_bytes=0)
        which = torch.tensor(list(members), device=self.device)
        k = len(members)
        preds: list[list[Tensor]] = [[] for _ in members]
        kept: list[list[Tensor]] = [[] for _ in members]
        loss_sum = torch.zeros(k, dtype=torch.float64, device=self.device)
        rows = torch.zeros(k, dtype=torch.float64, device=self.device)
        size = self.eval_rows(split, k)
        for start in range(0, len(split), size):
            batch = batches.get(torch.arange(start, min(start + size, len(split))))
            with self.autocast:
                logits = self.eval_logits(batch, which).float()  # (k, ...)
            loss, n_rows = self.eval_losses(logits, batch["labels"])
            loss_sum += loss.double() * n_rows
            rows += n_rows
            for j in range(k):
                preds[j].append(self.task.predict(self.loss_fn.class_scores(logits[j])).cpu())
                if margins:
                    kept[j].append(p_margin(logits[j], batch["labels"]).cpu())
        means = (loss_sum / rows.clamp(min=1)).tolist()
        return [Evaluation(self.task.score(preds[j], split), means[j],
                           torch.cat(kept[j]).numpy() if margins else None) for j in range(k)]

    def evaluate_and_report(self, due: Sequence[int], steps: Sequence[int]) -> None:
        """Each due member's report (test only for a new best validation); a member whose training loss is not
        finite is reported as failed and ends (the others go on)."""
        sums = self.window[list(due)].tolist()
        self.window[list(due)] = 0.0
        reports: dict[int, dict[str, Any]] = {}
        finite = []
        for i, (loss_sum, _, _) in zip(due, sums, strict=True):
            if math.isfinite(loss_sum):
                finite.append(i)
                continue
            self.alive[i] = False
            steps_done, mean = self.member_counts[i].optimizer_steps, loss_sum / max(1, self.window_steps[i])
            reports[i] = {"error": f"non-finite training loss ({mean}) before optimizer step {steps_done}; "
                                   "lower the lr or the loss's scale/margin", **self.position(i)}
        final = self.member_counts[0].samples_seen >= self.total_samples
        if not finite:
            self.publish(reports, final, ())
            return
        tic = time.perf_counter()
        val = dict(zip(finite, self.evaluate_members(self.data.validation, finite), strict=True))
        primary = self.task.metrics[0]
        better = [i for i in finite if val[i].scores[primary] > self.member_counts[i].best_val]
        for i in better:  # test only ever follows the validation choice; plain floats: checkpoints hold them
            self.member_counts[i].best_val = float(val[i].scores[primary])
            self.member_counts[i].best = {f"best_val_{m}": float(v) for m, v in val[i].scores.items()}
        if better and self.data.test is not None:
            tests = self.evaluate_members(self.data.test, better, margins=True)
            for i, test in zip(better, tests, strict=True):
                self.margins[i] = test.margins
                self.member_counts[i].best.update({f"test_{m}": float(v) for m, v in test.scores.items()})
        seconds = time.perf_counter() - tic
        by_member = dict(zip(due, sums, strict=True))
        for i in finite:
            loss_sum, rows, masked = by_member[i]
            c = self.member_counts[i]
            reports[i] = {**{f"val_{m}": v for m, v in val[i].scores.items()}, **c.best,
                          "val_loss": val[i].loss, "train_loss": loss_sum / max(1, self.window_steps[i]),
                          "masked_ratio": masked / max(1.0, rows), "accum_steps": steps[i],
                          "backward_rows": c.backward_rows, **self.position(i),
                          "eval_seconds": seconds / len(finite)}
        for i in due:
            self.window_steps[i] = 0
        self.publish(dict(sorted(reports.items())), final, self.margins if final else ())

    def position(self, member: int) -> dict[str, Any]:
        c = self.member_counts[member]
        return {"optimizer_steps": c.optimizer_steps, "samples_seen": c.samples_seen,
                "epoch": c.samples_seen / self.n_train, "train_seconds": c.train_seconds}
