"""Pieces of the training loop (tune_as.training.loop, trial and population use them): seeding, the
learning-rate schedule, mixed precision, the optimizer, the p_margin measure of the paper's Section 4.5, an
optional phase timer, the loop's counts, each epoch's order of the training rows and the micro-batches of a
split."""

from __future__ import annotations

import math
import random
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.optim.adamw import adamw

from tune_as.settings import TrialSettings


class PhaseTimer:
    """Optional wall-clock split of the training loop (probe, forward, backward, step), summed in seconds.
    Off by default: on a GPU each phase boundary has to synchronize, which slows a real run down."""

    def __init__(self, device: torch.device) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.sync = device.type == "cuda"

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if self.sync:
            torch.cuda.synchronize()
        tic = time.perf_counter()
        try:
            yield
        finally:
            if self.sync:
                torch.cuda.synchronize()
            self.seconds[name] += time.perf_counter() - tic


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def lr_factor(progress: float, warmup: float) -> float:
    """Linear warm-up to 1 over the first `warmup` fraction of training, then linear decay to 0."""
    if warmup > 0 and progress < warmup:
        return progress / warmup
    return max(0.0, (1.0 - progress) / max(1e-12, 1.0 - warmup))


def autocast_for(cfg: TrialSettings, device: torch.device) -> tuple[Any, bool]:
    """(autocast context, needs grad scaler). Mixed precision on GPU; fp32 on CPU unless asked."""
    precision = cfg.precision
    if precision == "auto":
        precision = ("fp32" if device.type != "cuda"
                     else ("bf16" if torch.cuda.is_bf16_supported() else "fp16"))
    if precision == "fp32":
        return nullcontext(), False
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device.type, dtype=dtype), precision == "fp16"


# The flags of an AdamW(fused=True) group, in each of ours (step reads none of them): torch's load_state_dict
# takes a saved group whole, and AdamW's __setstate__ fills a missing flag with its default ("fused": None,
# the foreach kernel, whose rounding differs from the fused one on some CPUs), so a checkpoint of ours loaded
# into torch's must say fused itself.
TORCH_GROUP_FLAGS = {"amsgrad": False, "maximize": False, "foreach": None, "capturable": False,
                     "differentiable": False, "fused": True, "decoupled_weight_decay": True}


class FusedAdamW:
    """`torch.optim.AdamW(fused=True)`: the same update by the same kernel (torch's functional `adamw`, fused;
    equal bit for bit, tests/test_optimizer.py), the same `param_groups` (the schedules set their "lr";
    GradScaler reads them), `zero_grad` and `state_dict` (torch's layout: a checkpoint of either loads into
    either). Not torch.optim.AdamW itself because every torch.optim optimizer imports torch._dynamo when it is
    built and at its first step (its `_disable_dynamo` and `_use_grad` wrappers): 1.5-1.7 CPU s in each fresh
    Ray worker, the first trial's and every Tune experiment's, on a 2-core machine (docs/benchmarks.md); the
    functional API does not import it."""

    # as torch's fused AdamW: GradScaler sets these before `step` and the kernel skips a step with an inf or
    # NaN gradient itself (no host read of found_inf per step)
    _step_supports_amp_scaling = True
    grad_scale: Tensor | None = None
    found_inf: Tensor | None = None

    def __init__(self, groups: list[dict[str, Any]], lr: float, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8) -> None:
        self.param_groups: list[dict[str, Any]] = [
            {"params": list(g["params"]), "lr": lr, "betas": betas, "eps": eps,
             "weight_decay": float(g["weight_decay"]), **TORCH_GROUP_FLAGS} for g in groups]
        self.state: dict[nn.Parameter, dict[str, Tensor]] = {}

    def _state(self, p: nn.Parameter) -> dict[str, Tensor]:
        if p not in self.state:
            # as AdamW(fused=True) starts it: a float32 step count on the parameter's device
            self.state[p] = {"step": torch.zeros((), dtype=torch.float32, device=p.device),
                             "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
                             "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format)}
        return self.state[p]

    @torch.no_grad()
    def step(self) -> None:
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            states = [self._state(p) for p in params]
            beta1, beta2 = group["betas"]
            adamw(params, [p.grad for p in params], [s["exp_avg"] for s in states],
                  [s["exp_avg_sq"] for s in states], [], [s["step"] for s in states], fused=True,
                  amsgrad=False, beta1=beta1, beta2=beta2, lr=group["lr"], weight_decay=group["weight_decay"],
                  eps=group["eps"], maximize=False, grad_scale=self.grad_scale, found_inf=self.found_inf)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                if set_to_none:
                    p.grad = None
                elif p.grad is not None:
                    p.grad.zero_()

    def state_dict(self) -> dict[str, Any]:
        index = {p: i for i, p in enumerate(p for g in self.param_groups for p in g["params"])}
        return {"state": {index[p]: dict(s) for p, s in self.state.items()},
                "param_groups": [{**{k: v for k, v in g.items() if k != "params"},
                                  "params": [index[p] for p in g["params"]]} for g in self.param_groups]}

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        params = [p for g in self.param_groups for p in g["params"]]
        mine, theirs = ([len(g["params"]) for g in self.param_groups],
                        [len(g["params"]) for g in saved["param_groups"]])
        if theirs != mine:
            raise ValueError(f"optimizer state: expected the parameter groups of this model "
                             f"({mine} parameters per group), got {theirs}")
        for group, kept in zip(self.param_groups, saved["param_groups"], strict=True):
            group["lr"] = kept["lr"]
        self.state = {params[int(i)]: {k: v.to(params[int(i)].device) for k, v in s.items()}
                      for i, s in saved["state"].items()}


def p_margin(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """p_t - max non-target p per counted row (Section 4.5); multi-label: min positive p - max negative p."""
    probs = torch.softmax(logits.float(), dim=-1).reshape(-1, logits.shape[-1])  # (R, C)
    if labels.shape == logits.shape:  # multi-hot
        pos = labels.reshape(probs.shape).bool()
        keep = pos.any(1)
        lo = probs.masked_fill(~pos, math.inf).amin(1)
        hi = probs.masked_fill(pos, -math.inf).amax(1)
        return (lo - hi)[keep]
    flat = labels.reshape(-1)
    keep = flat != -100
    probs, flat = probs[keep], flat[keep]
    p_t = probs.gather(1, flat[:, None]).squeeze(1)
    return p_t - probs.scatter(1, flat[:, None], -math.inf).amax(1)


RESIDENT_BYTES = 1 << 30  # training inputs up to 1 GiB are widened once per trial and kept on the device


@dataclass
class Counts:
    """The loop's one record of counts: with the model, optimizer and RNG, all a checkpoint needs to
    resume."""

    epoch: int = 0
    batch_in_epoch: int = 0
    samples_seen: int = 0
    # examples that went through a backward pass (== samples_seen unless rows are skipped)
    backward_rows: int = 0
    optimizer_steps: int = 0
    train_seconds: float = 0.0
    best_val: float = -math.inf
    best: dict[str, float] = field(default_factory=dict)  # test_<m> and best_val_<m> of the best-val model


def epoch_order(n: int, seed: int, epoch: int) -> Tensor:
    """The order of the training rows in epoch `epoch` of the run with seed `seed` (its own generator: the
    same order whatever else draws random numbers)."""
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed * 1_000_003 + epoch))


class Batches:
    """Micro-batches of a split: inputs widened once and kept on the device when they fit (`Split.widened`),
    else per batch."""

    def __init__(self, split: Any, device: torch.device, resident_bytes: int = RESIDENT_BYTES) -> None:
        self.split, self.device = split, device
        self.resident = split.widened(device, resident_bytes)

    def get(self, idx: Tensor) -> dict[str, Tensor]:
        if self.resident is not None:
            return self.resident.batch(idx.to(self.device))
        return {k: v.to(self.device, non_blocking=True) for k, v in self.split.batch(idx.cpu()).items()}
