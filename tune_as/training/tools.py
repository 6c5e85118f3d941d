"""Pieces of the training loop that hold no trial state: seeding, the learning-rate schedule, mixed precision,
the p_margin measure of the paper's Section 4.5, and an optional phase timer (tune_as.training.trial uses them)."""

from __future__ import annotations

import math
import random
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import numpy as np
import torch

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
