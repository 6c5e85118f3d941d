"""A population: P seeds of one setting trained as one program,
member i the same run as a solo trial of seed i.

The members' weights are stacked (tune_as.training.stacked) and the loop (tune_as.training.loop, a solo
trial's too) drives all of them at once; this module gives it the stacked model's step, clipping, AdamW and
evaluation forward. Each member keeps its solo trial's init, data order, dropout draws, schedules,
clipping, AdamW step count and per-member rules (an all-masked cycle does not step it; its own AS-Speed
accumulator); a member whose loss is not finite fails alone; each evaluation is reported per member with a
solo trial's keys.

Stacks: frozen-feature heads (`StackedFrozen`) and the image CNNs without BatchNorm (`StackedCNN`). Where
populations do not apply (fine-tuned transformers, the cifar CNNs, token tasks, fp16 with a shared loss
scaler, row skipping), `problem` says so and the solo trial is the path. Tested member by member against solo
trials for every loss (tests/test_population*.py); benchmarks/bench_population.py measures the speed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, Protocol

import numpy as np
import torch
from torch import Tensor

from tune_as.losses import build_loss
from tune_as.settings import TrialSettings
from tune_as.training.loop import Loop
from tune_as.training.stacked import Stacked, StackedAdamW, StackedFrozen, clip_members, column
from tune_as.training.stacked_cnn import STACKABLE, StackedCNN
from tune_as.training.tools import autocast_for

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


class Population(Loop):
    """P members of one setting (`config`, whose seed is replaced by each of `seeds`) as one stacked model
    (tune_as.training.loop drives them); `run()` trains them."""

    def __init__(self, config: dict[str, Any], seeds: Sequence[int], data: Any, task: Any,
                 reporter: PopulationReporter, device: torch.device | None = None) -> None:
        from tune_as.tasks import build_model

        if len(seeds) < 1 or len(set(seeds)) != len(seeds):
            raise ValueError(f"seeds: expected distinct seeds, at least one, got {list(seeds)}")
        device = device or torch.device("cuda" if torch.cuda.is_available() else "cpu")
        base = TrialSettings.from_dict(config)
        cfgs = [replace(base, seed=int(s)) for s in seeds]  # validated, one per member
        why = problem(cfgs[0], data, device)
        if why:
            raise ValueError(why)
        loss_fn = build_loss(base.loss, **base.loss_params)
        head = "cosine" if loss_fn.needs_cosine_head else "linear"
        members: list[Any] = []
        self.generators: list[torch.Generator] = []
        for c in cfgs:  # as a solo trial: seeded, then built (the model seeds again), then dropout draws
            torch.manual_seed(c.seed)
            members.append(build_model(data, head=head, seed=c.seed))
            g = torch.Generator(device)
            if device.type == "cpu":
                g.set_state(torch.get_rng_state())
            else:  # a GPU's dropout is its own kernel: same distribution, not a solo trial's draws
                g.manual_seed(c.seed)
            self.generators.append(g)
        self.model: Stacked = STACKED[data.model_info["encoder"]](members).to(device)
        super().__init__(cfgs, data, task, device, loss_fn, self.model,
                         [loss_fn.make_accumulator() for _ in cfgs], autocast_for(base, device)[0])
        self.reporter = reporter
        named = list(self.model.named_parameters())
        self.params = [p for _, p in named]
        self.optimizer = StackedAdamW([([p for n, p in named if self.model.decays(n)], base.weight_decay),
                                       ([p for n, p in named if not self.model.decays(n)], 0.0)], lr=base.lr)
        self._weights: tuple[list[int], Tensor] | None = None

    # -- the stack's training step ---------------------------------------------------------------------
    def train_step(self, idx: Tensor, steps: Sequence[int]) -> tuple[Tensor, Sequence[int]]:
        """Every member's micro-batch in one forward and backward; each member's rows all go through it."""
        batch = self.batches.get(idx)
        size = self.size
        labels = batch["labels"].reshape(size, -1, *batch["labels"].shape[1:])
        with self.autocast:
            logits = self.model.logits(batch, self.generators).float()
        # each member's loss is the loss module's own on its rows (a solo trial's numbers), all in one call
        out = self.loss_fn.forward_members(logits, labels)
        (out.loss * self.step_weights(steps)).sum().backward()
        sums = torch.stack([out.loss.detach().double(), out.n_rows.double(), out.n_masked.double()], dim=1)
        return sums, [len(idx) // size] * size

    def step_weights(self, steps: Sequence[int]) -> Tensor:
        """(P,) 1 / each member's micro-batches per cycle: made anew only when a cycle length changed
        (AS-Speed, at a cycle's end), so that a step copies nothing from the host."""
        if self._weights is None or self._weights[0] != list(steps):
            self._weights = (list(steps), torch.tensor([1.0 / n for n in steps], device=self.device))
        return self._weights[1]

    def close_cycles(self, ending: Sequence[bool], micro: Sequence[int], steps: Sequence[int]) -> None:
        factors = [steps[i] / micro[i] if ending[i] and micro[i] < steps[i] else 1.0
                   for i in range(self.size)]
        if any(f != 1.0 for f in factors):
            f = torch.tensor(factors, device=self.device)
            for p in self.params:
                if p.grad is not None:
                    p.grad.mul_(column(f, p.grad))

    def optimizer_steps(self, stepping: Sequence[bool], ending: Sequence[bool]) -> None:
        members = [i for i in range(self.size) if stepping[i]]
        if members:
            mask = torch.tensor(stepping, device=self.device) if len(members) < self.size else None
            clip_members(self.model, self.cfg.max_grad_norm, mask)
            self.optimizer.step(members)
            for i in members:
                self.member_counts[i].optimizer_steps += 1
        ended = [i for i in range(self.size) if ending[i]]
        for p in self.params:
            if len(ended) == self.size:
                # as a solo trial's zero_grad(set_to_none=True): the next backward writes it anew
                p.grad = None
            elif p.grad is not None:
                p.grad[ended] = 0.0

    def set_lr(self, lr: float) -> None:
        self.optimizer.lr = lr

    # -- evaluation and reports ------------------------------------------------------------------------
    def eval_rows(self, split: Any, members: int) -> int:
        return self.model.eval_rows(members)

    def eval_logits(self, batch: dict[str, Tensor], members: Tensor) -> Tensor:
        return self.model.logits(batch, members=members)  # (k, n, C): one forward of their stacked weights

    def eval_losses(self, logits: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
        out = self.loss_fn.forward_members(logits, labels.expand(logits.shape[0], *labels.shape))
        return out.loss, out.n_rows

    def publish(self, reports: dict[int, dict[str, Any]], final: bool,
                margins: Sequence[np.ndarray | None]) -> None:
        self.reporter.report(reports, final, margins)


def run_population(config: dict[str, Any], seeds: Sequence[int], data: Any, task: Any,
                   reporter: PopulationReporter) -> None:
    Population(config, seeds, data, task, reporter).run()
