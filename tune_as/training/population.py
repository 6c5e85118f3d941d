"""A population: P seeds of one setting trained as one program,
member i the same run as a solo trial of seed i.

The members' weights are stacked (tune_as.training.stacked) and the loop of `tune_as.training.trial.Trial`
runs once for all of them. Each member keeps its solo trial's init, data order, dropout draws, schedules,
clipping, AdamW step count and per-member rules (an all-masked cycle does not step it; its own AS-Speed
accumulator); a member whose loss is not finite fails alone; each evaluation is reported per member with a
solo trial's keys.

Stacks: frozen-feature heads (`StackedFrozen`) and the image CNNs without BatchNorm (`StackedCNN`). Where
populations do not apply (fine-tuned transformers, the cifar CNNs, token tasks, fp16 with a shared loss
scaler, row skipping), `problem` says so and the solo trial is the path. Tested member by member against solo
trials for every loss (tests/test_population*.py); benchmarks/bench_population.py measures the speed.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import Any, Protocol

import numpy as np
import torch
from torch import Tensor

from tune_as.losses import build_loss
from tune_as.settings import TrialSettings
from tune_as.training.stacked import Stacked, StackedAdamW, StackedFrozen, clip_members, column
from tune_as.training.stacked_cnn import STACKABLE, StackedCNN
from tune_as.training.tools import Batches, Counts, autocast_for, epoch_order, lr_factor, p_margin
from tune_as.training.trial import Evaluation

__all__ = ["KINDS", "Population", "PopulationReporter", "applies", "problem", "run_population"]

KINDS = ("multiclass", "multilabel")  # sentence tasks: one feature row per example (token tasks are ragged)
# the task kinds each model (its encoder: data.model_info["encoder"]) can stack for
APPLIES: dict[str, tuple[str, ...]] = {"frozen": KINDS, "cnn": ("multiclass",)}
STACKED: dict[str, Callable[[list[Any]], Stacked]] = {"frozen": StackedFrozen, "cnn": StackedCNN}


class PopulationReporter(Protocol):
    """Where a population's evaluations go: one call per evaluation point, with the report of every member
    that was due (member index -> a solo trial's report), `final` at the population's last one, and then each
    member's p_margin of its best test evaluation (None where it has none)."""

    def report(self, reports: dict[int, dict[str, Any]], final: bool,
               margins: Sequence[np.ndarray | None] = ()) -> None: ...


def applies(encoder: str | None, kind: str) -> bool:
    """Whether data of this encoder ("cnn" for an image task) and task kind can train as a population: a
    frozen encoder's sentence features, or an image CNN (the plan refuses --seeds-per-trial by it before the
    data is prepared; a CNN with BatchNorm is found by `problem`, once the data says which topology it is)."""
    return kind in APPLIES.get(encoder or "", ())


def problem(cfg: TrialSettings, data: Any, device: torch.device | None) -> str | None:
    """Why this setting and data cannot train as a population (one line), or None when they can (on `device`;
    None: the CPU)."""
    encoder = data.model_info.get("encoder")
    if not applies(encoder, data.kind):
        return (f"a population trains frozen-feature heads of sentence tasks and image CNNs, got encoder "
                f"{encoder!r} on a {data.kind} task (one model per trial: use solo trials)")
    if encoder == "cnn" and data.model_info["cnn"] not in STACKABLE:
        return (f"a population of CNNs stacks the topologies without BatchNorm or dropout on feature maps "
                f"{STACKABLE}, got {data.model_info['cnn']!r} (one model per trial: use solo trials)")
    if cfg.skip_masked_rows:
        return ("skip_masked_rows: expected false in a population (row skipping re-batches per example), "
                "got true")
    if autocast_for(cfg, device or torch.device("cpu"))[1]:
        return ("precision: expected fp32 or bf16 in a population (fp16's loss scaler would be shared), "
                "got fp16")
    return None


class Population:
    """P members of one setting (`config`, whose seed is replaced by each of `seeds`); `run()` trains them."""

    def __init__(self, config: dict[str, Any], seeds: Sequence[int], data: Any, task: Any,
                 reporter: PopulationReporter, device: torch.device | None = None) -> None:
        from tune_as.tasks import build_model

        if len(seeds) < 1 or len(set(seeds)) != len(seeds):
            raise ValueError(f"seeds: expected distinct seeds, at least one, got {list(seeds)}")
        self.device = device or torch.device("cuda" if torch.cuda.is_available() else "cpu")
        base = TrialSettings.from_dict(config)
        self.cfgs = [replace(base, seed=int(s)) for s in seeds]  # validated, one per member
        self.cfg = cfg = self.cfgs[0]
        why = problem(cfg, data, self.device)
        if why:
            raise ValueError(why)
        self.data, self.task, self.reporter = data, task, reporter
        self.loss_fn = build_loss(cfg.loss, **cfg.loss_params)
        head = "cosine" if self.loss_fn.needs_cosine_head else "linear"
        members: list[Any] = []
        self.generators: list[torch.Generator] = []
        for c in self.cfgs:  # as a solo trial: seeded, then built (the model seeds again), then dropout draws
            torch.manual_seed(c.seed)
            members.append(build_model(data, head=head, seed=c.seed))
            g = torch.Generator(self.device)
            if self.device.type == "cpu":
                g.set_state(torch.get_rng_state())
            else:  # a GPU's dropout is its own kernel: same distribution, not a solo trial's draws
                g.manual_seed(c.seed)
            self.generators.append(g)
        self.model = STACKED[data.model_info["encoder"]](members).to(self.device)
        named = list(self.model.named_parameters())
        self.params = [p for _, p in named]
        self.optimizer = StackedAdamW([([p for n, p in named if self.model.decays(n)], cfg.weight_decay),
                                       ([p for n, p in named if not self.model.decays(n)], 0.0)], lr=cfg.lr)
        self.autocast = autocast_for(cfg, self.device)[0]
        self.accumulators = [self.loss_fn.make_accumulator() for _ in self.cfgs]
        self.warmup = cfg.warmup_r > 0 and self.loss_fn.supports_warmup
        self.batches = Batches(data.train, self.device)
        self.n_train, self.size = len(data.train), len(self.cfgs)
        self.total_samples = max(1, int(round(cfg.epochs * self.n_train)))
        self.counts = [Counts() for _ in self.cfgs]  # samples, epochs, batches: the same in every member
        self.alive = [True] * self.size
        self.window = torch.zeros(self.size, 3, dtype=torch.float64, device=self.device)
        self.window_steps = [0] * self.size
        self.pmargin: list[np.ndarray | None] = [None] * self.size
        self._weights: tuple[list[int], Tensor] | None = None

    @property
    def progress(self) -> float:
        return self.counts[0].samples_seen / self.total_samples

    def training_order(self) -> Iterator[Tensor]:
        """(P * B,) row indices per micro-batch: member i's batch of its own epoch order,
        members concatenated."""
        shared, n, b = self.counts[0], self.n_train, self.cfg.batch_size
        while shared.samples_seen < self.total_samples:
            orders = [epoch_order(n, c.seed, shared.epoch) for c in self.cfgs]
            for start in range(shared.batch_in_epoch * b, n, b):
                if shared.samples_seen >= self.total_samples:
                    return
                yield torch.cat([o[start:start + b] for o in orders])
            for c in self.counts:
                c.epoch += 1
                c.batch_in_epoch = 0

    def run(self) -> None:
        """Train every member to the end; each member reports at its own evaluation points."""
        size, cfg = self.size, self.cfg
        steps = [a.steps if a else 1 for a in self.accumulators]
        micro, seen = [0] * size, np.zeros((size, 2), dtype=np.int64)
        tic = time.perf_counter()
        for idx in self.training_order():
            self.apply_schedules()
            rows = len(idx) // size
            self.window += self.micro_step(idx, steps)
            self.window_steps = [w + 1 for w in self.window_steps]
            micro = [m + 1 for m in micro]
            for c in self.counts:
                c.samples_seen += rows
                c.batch_in_epoch += 1
                c.backward_rows += rows
            shared = self.counts[0]
            end_of_data = shared.samples_seen >= self.total_samples
            epoch_done = shared.batch_in_epoch * cfg.batch_size >= self.n_train
            ending = [micro[i] >= steps[i] or end_of_data or epoch_done for i in range(size)]
            if not any(ending):
                continue
            cycles = np.tile(np.array([1, 0]), (size, 1))  # (counted, masked) rows per member's cycle
            if self.loss_fn.masks_rows:
                # one read for all members (trial.py's docstring: the algorithm's read)
                cumulative = self.window[:, 1:].round().long().cpu().numpy()
                cycles = cumulative - seen
                seen = np.where(np.array(ending)[:, None], cumulative, seen)
            self.close_cycles(ending, micro, steps)
            stepping = [ending[i] and self.alive[i] and cycles[i, 0] != cycles[i, 1] for i in range(size)]
            self.optimizer_step(stepping, ending)
            due = []
            for i in (int(j) for j in np.flatnonzero(ending)):
                accumulator = self.accumulators[i]
                if accumulator:
                    accumulator.observe(int(cycles[i, 0]), int(cycles[i, 1]))
                    steps[i] = accumulator.cycle_start()
                micro[i] = 0
                every, done = cfg.eval_every_steps, self.counts[i].optimizer_steps
                at_step = every is not None and stepping[i] and done % every == 0
                if self.alive[i] and (end_of_data or at_step or (every is None and epoch_done)):
                    due.append(i)
            if due:
                elapsed = time.perf_counter() - tic
                for i in due:  # the population's time, shared among the members it trained
                    self.counts[i].train_seconds += elapsed / size
                self.evaluate_and_report(due, steps)
                seen[due] = 0
                tic = time.perf_counter()
            if not any(self.alive):
                return

    def apply_schedules(self) -> None:
        if self.warmup:
            self.loss_fn.set_warmup(self.progress < self.cfg.warmup_r)
        self.optimizer.lr = self.cfg.lr * lr_factor(self.progress, self.cfg.lr_warmup)

    def micro_step(self, idx: Tensor, steps: Sequence[int]) -> Tensor:
        """Forward and backward of every member's micro-batch; (P, 3) [mean loss, counted rows,
        masked rows]."""
        batch = self.batches.get(idx)
        size = self.size
        labels = batch["labels"].reshape(size, -1, *batch["labels"].shape[1:])
        with self.autocast:
            logits = self.model.logits(batch, self.generators).float()
        # each member's loss is the loss module's own on its rows (a solo trial's numbers), all in one call
        out = self.loss_fn.forward_members(logits, labels)
        (out.loss * self.step_weights(steps)).sum().backward()
        return torch.stack([out.loss.detach().double(), out.n_rows.double(), out.n_masked.double()], dim=1)

    def step_weights(self, steps: Sequence[int]) -> Tensor:
        """(P,) 1 / each member's micro-batches per cycle: made anew only when a cycle length changed
        (AS-Speed, at a cycle's end), so that a step copies nothing from the host."""
        if self._weights is None or self._weights[0] != list(steps):
            self._weights = (list(steps), torch.tensor([1.0 / n for n in steps], device=self.device))
        return self._weights[1]

    def close_cycles(self, ending: Sequence[bool], micro: Sequence[int], steps: Sequence[int]) -> None:
        """A cycle cut short at an epoch's end: its gradient rescaled to the mean over the micro-batches it
        ran."""
        factors = [steps[i] / micro[i] if ending[i] and micro[i] < steps[i] else 1.0
                   for i in range(self.size)]
        if any(f != 1.0 for f in factors):
            f = torch.tensor(factors, device=self.device)
            for p in self.params:
                if p.grad is not None:
                    p.grad.mul_(column(f, p.grad))

    def optimizer_step(self, stepping: Sequence[bool], ending: Sequence[bool]) -> None:
        """Clip and step the members in `stepping`; clear the gradients of the members whose cycle ended."""
        members = [int(i) for i in np.flatnonzero(stepping)]
        if members:
            mask = torch.tensor(stepping, device=self.device) if len(members) < self.size else None
            clip_members(self.model, self.cfg.max_grad_norm, mask)
            self.optimizer.step(members)
            for i in members:
                self.counts[i].optimizer_steps += 1
        ended = [int(i) for i in np.flatnonzero(ending)]
        for p in self.params:
            if len(ended) == self.size:
                # as a solo trial's zero_grad(set_to_none=True): the next backward writes it anew
                p.grad = None
            elif p.grad is not None:
                p.grad[ended] = 0.0

    # -- evaluation and reports ------------------------------------------------------------------------
    @torch.no_grad()
    def evaluate(self, split: Any, members: Sequence[int], margins: bool = False) -> list[Evaluation]:
        """A solo trial's `evaluate`, for each of `members` at once (one forward of their stacked weights)."""
        if self.warmup:
            self.loss_fn.set_warmup(False)
        batches = Batches(split, self.device, resident_bytes=0)
        which = torch.tensor(list(members), device=self.device)
        k = len(members)
        preds: list[list[Tensor]] = [[] for _ in members]
        kept: list[list[Tensor]] = [[] for _ in members]
        loss_sum = torch.zeros(k, dtype=torch.float64, device=self.device)
        rows = torch.zeros(k, dtype=torch.float64, device=self.device)
        step = self.model.eval_rows(k)
        for start in range(0, len(split), step):
            batch = batches.get(torch.arange(start, min(start + step, len(split))))
            with self.autocast:
                logits = self.model.logits(batch, members=which).float()  # (k, n, C)
            labels = batch["labels"].expand(k, *batch["labels"].shape)
            out = self.loss_fn.forward_members(logits, labels)
            loss_sum += out.loss.double() * out.n_rows
            rows += out.n_rows
            for j in range(k):
                preds[j].append(self.task.predict(self.loss_fn.class_scores(logits[j])).cpu())
                if margins:
                    kept[j].append(p_margin(logits[j], batch["labels"]).cpu())
        means = (loss_sum / rows.clamp(min=1)).tolist()
        return [Evaluation(self.task.score(preds[j], split), means[j],
                           torch.cat(kept[j]).numpy() if margins else None) for j in range(k)]

    def evaluate_and_report(self, due: Sequence[int], steps: Sequence[int]) -> None:
        """Each due member's report, as a solo trial's `evaluate_and_report` writes it; a member whose
        training loss is not finite is reported as failed and ends (the others go on)."""
        sums = self.window[list(due)].tolist()
        self.window[list(due)] = 0.0
        reports: dict[int, dict[str, Any]] = {}
        finite = []
        for i, (loss_sum, _, _) in zip(due, sums, strict=True):
            n_steps = max(1, self.window_steps[i])
            if math.isfinite(loss_sum):
                finite.append(i)
                continue
            self.alive[i] = False
            reports[i] = {"error": f"non-finite training loss ({loss_sum / n_steps}) before optimizer step "
                                   f"{self.counts[i].optimizer_steps}; lower the lr or the loss's "
                                   "scale/margin",
                          **self.position(i)}
        final = self.counts[0].samples_seen >= self.total_samples
        if not finite:
            self.reporter.report(reports, final)
            return
        tic = time.perf_counter()
        val = dict(zip(finite, self.evaluate(self.data.validation, finite), strict=True))
        primary = self.task.metrics[0]
        better = [i for i in finite if val[i].scores[primary] > self.counts[i].best_val]
        for i in better:
            self.counts[i].best_val = val[i].scores[primary]
            self.counts[i].best = {f"best_val_{m}": v for m, v in val[i].scores.items()}
        if better and self.data.test is not None:
            for i, test in zip(better, self.evaluate(self.data.test, better, margins=True), strict=True):
                self.pmargin[i] = test.margins
                self.counts[i].best.update({f"test_{m}": v for m, v in test.scores.items()})
        seconds = time.perf_counter() - tic
        by_member = dict(zip(due, sums, strict=True))
        for i in finite:
            loss_sum, rows, masked = by_member[i]
            n_steps = max(1, self.window_steps[i])
            reports[i] = {**{f"val_{m}": v for m, v in val[i].scores.items()}, **self.counts[i].best,
                          "val_loss": val[i].loss, "train_loss": loss_sum / n_steps,
                          "masked_ratio": masked / max(1.0, rows), "accum_steps": steps[i],
                          "backward_rows": self.counts[i].backward_rows, **self.position(i),
                          "eval_seconds": seconds / len(finite)}
        for i in due:
            self.window_steps[i] = 0
        self.reporter.report(dict(sorted(reports.items())), final, self.pmargin if final else ())

    def position(self, member: int) -> dict[str, Any]:
        c = self.counts[member]
        return {"optimizer_steps": c.optimizer_steps, "samples_seen": c.samples_seen,
                "epoch": c.samples_seen / self.n_train, "train_seconds": c.train_seconds}


def run_population(config: dict[str, Any], seeds: Sequence[int], data: Any, task: Any,
                   reporter: PopulationReporter) -> None:
    Population(config, seeds, data, task, reporter).run()
