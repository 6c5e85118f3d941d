"""AS-Softmax: adaptive sparse softmax (AS-Softmax paper, Section 3.2, Eq. 5-7).

With p = softmax(o) over all C classes, a competitor i != t is dropped (z_i = 0) once it trails the
target by the margin, p_t - p_i >= delta (Eq. 5-6); the target is never dropped. Then (Eq. 7)

    L = -log( exp(o_t) / sum_j z_j exp(o_j) ) = log sum_{j: z_j = 1} exp(o_j) - o_t

A row whose competitors are all dropped has loss exactly 0 and no gradient: it is "masked".
delta in [0, 1]; delta = 1 is cross-entropy (up to competitors with p_i < 2^-64, whose terms are below
fp32 resolution). Shapes: x (M, C) float, t (M,) int64 (-100: ignored) -> the mean over counted rows,
n_rows, n_masked (the reduction is fused into the autograd Function: one node, few small kernels).

Speed: one softmax (one exp pass) in forward, kept for backward, which is then a single multiply:
dL/do_i = z_i p_i / sum_j z_j p_j - [i = t]. ``F.cross_entropy`` computes exp in forward and again in
backward. The per-row threshold is turned into the scalar 1 by dividing each row by
d = p_t - delta, so that one in-place ``torch.threshold_`` drops the competitors.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ._base import IGNORE_INDEX, DeltaMixin, Loss, LossOutput, softmax_rows


class _ASSoftmaxFunction(torch.autograd.Function):
    """Mean AS-Softmax loss over the rows whose target is not -100, with n_rows and n_masked, in one node."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, t: Tensor, delta: float) -> tuple[Tensor, Tensor, Tensor]:
        valid = t[:, None] != IGNORE_INDEX  # (M, 1)
        t1 = t[:, None].clamp(min=0)  # ignored rows: any class, zeroed below
        m = x.amax(dim=1, keepdim=True)  # (M, 1)
        p = softmax_rows(x, m)  # (M, C)
        p_t = p.gather(1, t1)  # (M, 1)
        # d > 0 always: rows with p_t <= delta drop nothing; the floor keeps r = p / d finite.
        floor = 2.0 ** (-64 if x.dtype != torch.float64 else -500)
        d = (p_t - delta).clamp_(min=floor)
        r = p.div_(d)  # (M, C): competitor i is kept iff r_i > 1, i.e. p_t - p_i < delta
        torch.threshold_(r, 1.0, 0.0)
        r_t = p_t / d
        r.scatter_(1, t1, r_t)  # the target is never dropped
        s = r.sum(dim=1, keepdim=True)  # kept probability mass / d
        # log(sum_kept p / p_t) without underflow: the argmax is always kept and max(p) = exp(max o - lse(o)),
        # so sum_kept p / p_t = (s / max r) exp(max o - o_t).
        rows = torch.log(s / r.amax(dim=1, keepdim=True)) - (x.gather(1, t1) - m)
        # Only the target left. (d at the floor: nothing could be dropped; s == r_t is then fp32 rounding.)
        masked = (s == r_t) & (d > floor) & valid
        n_rows = valid.sum()
        weight = valid.to(x.dtype) / n_rows.clamp(min=1)  # (M, 1): 1 / n_rows, 0 on ignored rows
        loss = torch.where(masked | ~valid, 0.0, rows).sum() / n_rows.clamp(min=1)
        ctx.save_for_backward(r, s, t1, weight)
        ctx.mark_non_differentiable(n_rows, masked)
        return loss, n_rows, masked.sum()

    @staticmethod
    def backward(ctx: Any, grad: Tensor, *_: Tensor | None) -> tuple[Tensor, None, None]:
        r, s, t1, weight = ctx.saved_tensors
        g = (grad * weight) / s  # (M, 1)
        out = r * g  # z_i p_i / sum_j z_j p_j, times the upstream gradient
        # Target: (p_t - sum_kept p) / sum_kept p, written so that a masked row (s == r_t) gets exactly 0.
        out.scatter_(1, t1, (r.gather(1, t1) - s) * g)
        return out, None, None


def as_softmax_loss(logits: Tensor, target: Tensor, *, delta: float) -> LossOutput:
    """Mean AS-Softmax loss of logits (M, C) over targets (M,) (-100: ignored), with n_rows and n_masked."""
    return LossOutput(*_ASSoftmaxFunction.apply(logits, target, delta))


class ASSoftmaxLoss(DeltaMixin, Loss):
    name = "as_softmax"
    kinds = frozenset({"multiclass", "token"})

    def __init__(self, delta: float = 0.3) -> None:
        super().__init__()
        self.delta = delta

    def mean_over_rows(self, x: Tensor, t: Tensor) -> LossOutput:
        return as_softmax_loss(x, t, delta=self.delta)
