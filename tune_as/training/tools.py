"""Pieces of the training loop (tune_as.training.trial uses them): seeding, the learning-rate schedule, mixed
precision, the p_margin measure of the paper's Section 4.5, an optional phase timer, the loop's counts and the
micro-batches of a split."""

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
from torch import Tensor

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
        precision = "fp32" if device.type != "cuda" else ("bf16" if torch.cuda.is_bf16_supported() else "fp16")
    if precision == "fp32":
        return nullcontext(), False
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device.type, dtype=dtype), precision == "fp16"


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
    """The loop's one record of counts: with the model, optimizer and RNG, all a checkpoint needs to resume."""

    epoch: int = 0
    batch_in_epoch: int = 0
    samples_seen: int = 0
    backward_rows: int = 0  # examples that went through a backward pass (== samples_seen unless rows are skipped)
    optimizer_steps: int = 0
    train_seconds: float = 0.0
    best_val: float = -math.inf
    best: dict[str, float] = field(default_factory=dict)  # test_<m> and best_val_<m> of the best-val model


def epoch_order(n: int, seed: int, epoch: int) -> Tensor:
    """The order of the training rows in epoch `epoch` of the run with seed `seed` (its own generator: the same
    order whatever else draws random numbers)."""
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed * 1_000_003 + epoch))


class Batches:
    """Micro-batches of a split. The training order of an epoch depends on (seed, epoch) only, drawn once per
    epoch; inputs are widened once and kept on the device when they fit (`Split.widened`), else per batch."""

    def __init__(self, split: Any, device: torch.device, resident_bytes: int = RESIDENT_BYTES) -> None:
        self.split, self.device = split, device
        self.resident = split.widened(device, resident_bytes)

    def get(self, idx: Tensor) -> dict[str, Tensor]:
        if self.resident is not None:
            return self.resident.batch(idx.to(self.device))
        return {k: v.to(self.device, non_blocking=True) for k, v in self.split.batch(idx.cpu()).items()}

    def training_order(self, counts: Counts, batch_size: int, seed: int, total: int) -> Iterator[Tensor]:
        """Micro-batch indices from the position in `counts` to `total` samples; moves `counts.epoch`."""
        n = len(self.split)
        while counts.samples_seen < total:
            order = epoch_order(n, seed, counts.epoch)
            for start in range(counts.batch_in_epoch * batch_size, n, batch_size):
                if counts.samples_seen >= total:
                    return
                yield order[start:start + batch_size]
            counts.epoch += 1
            counts.batch_in_epoch = 0
