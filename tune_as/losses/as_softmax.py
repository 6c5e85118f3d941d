"""AS-Softmax: adaptive sparse softmax (AS-Softmax paper, Section 3.2, Eq. 5-7).

With p = softmax(o) over all C classes, a competitor i != t is dropped (z_i = 0) once it trails the
target by the margin, p_t - p_i >= delta (Eq. 5-6); the target is never dropped. Then (Eq. 7)

    L = -log( exp(o_t) / sum_j z_j exp(o_j) ) = log sum_{j: z_j = 1} exp(o_j) - o_t

A row whose kept mass is the target's alone (in the working precision) has loss exactly 0 and gradient
exactly 0: it is "masked". delta in [0, 1]; delta = 1 is cross-entropy (up to competitors with
p_i < 2^-64, whose terms are below fp32 resolution). Shapes: x (M, C) float, t (M,) int64 (-100:
ignored) -> LossOutput (the mean over counted rows is fused into the autograd Function: one node).

Speed: one softmax (one exp pass) in forward, kept for backward, which is then a single multiply:
dL/do_i = z_i p_i / sum_j z_j p_j - [i = t]. ``F.cross_entropy`` takes exp in forward and again in
backward. The per-row threshold is turned into the scalar 1 by dividing each row by d = p_t - delta,
so that one in-place ``torch.threshold_`` drops the competitors.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ._base import IGNORE_INDEX, Loss, LossOutput, WarmupDelta, by_group


def softmax_rows(x: Tensor, row_max: Tensor) -> Tensor:
    """softmax(x) over dim 1, in a new tensor. PyTorch's fused CPU kernel is fast except for short rows
    (C < 16: 6x slower than these three passes at (4096, 9)); ``row_max`` (M, 1) is max x."""
    if x.shape[1] >= 16:
        return torch.softmax(x, dim=1)
    e = torch.sub(x, row_max).exp_()
    return e.div_(e.sum(dim=1, keepdim=True))


def kept_mass(x: Tensor, t1: Tensor, delta: float) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """r = z * p / d (M, C) with d = p_t - delta (floored): the kept probabilities, scaled; their row sums s,
    r_t and max x (M, 1). The row is masked iff s == r_t. t1 (M, 1) valid class indices."""
    m = x.amax(dim=1, keepdim=True)
    p = softmax_rows(x, m)
    p_t = p.gather(1, t1)
    # d > 0 always: rows with p_t <= delta drop nothing (but p_i < floor); the floor keeps r = p / d finite.
    d = (p_t - delta).clamp_(min=2.0 ** (-64 if x.dtype != torch.float64 else -500))
    r = torch.threshold_(p.div_(d), 1.0, 0.0)  # competitor i is kept iff p_i / d > 1, i.e. p_t - p_i < delta
    r_t = p_t / d
    r.scatter_(1, t1, r_t)  # the target is never dropped
    return r, r.sum(dim=1, keepdim=True), r_t, m


class _ASSoftmaxFunction(torch.autograd.Function):
    """Mean AS-Softmax loss over the rows whose target is not -100, with n_rows and n_masked, in one node (per
    group of M / groups consecutive rows: (groups,) tensors for groups > 1)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, t: Tensor, delta: float, groups: int) -> tuple[Tensor, Tensor, Tensor]:
        valid = t != IGNORE_INDEX  # (M,)
        t1 = t.clamp(min=0)[:, None]  # (M, 1); ignored rows: class 0, weight 0
        r, s, r_t, m = kept_mass(x, t1, delta)
        live = valid[:, None] > (s == r_t)  # (M, 1): counted and not masked
        n_rows = by_group(valid, groups)
        scale = n_rows.clamp(min=1).to(x.dtype).reciprocal_()
        # (M, 1): 1 / its group's n_rows, 0 on ignored and masked rows
        weight = live.to(x.dtype).view(groups, -1).mul_(scale.view(-1, 1)).view(-1, 1)
        # log(sum_kept p / p_t) without log p_t, which underflows: the argmax is kept and
        # max p = exp(max o - lse(o)), so sum_kept p / p_t = (s / max r) exp(max o - o_t).
        rows = torch.log(s / r.amax(dim=1, keepdim=True)).sub_(x.gather(1, t1)).add_(m)
        loss = by_group(torch.where(live, rows, 0.0), groups).mul_(scale)
        ctx.save_for_backward(r, t1, weight / s, weight.neg())
        ctx.groups = groups
        n_masked = n_rows - by_group(live, groups)
        ctx.mark_non_differentiable(n_rows, n_masked)
        return loss, n_rows, n_masked

    @staticmethod
    def backward(ctx: Any, grad: Tensor, *_: Tensor | None) -> tuple[Tensor, None, None, None]:
        r, t1, weight_s, neg_weight = ctx.saved_tensors
        if ctx.groups > 1:  # each row its group's upstream gradient
            grad = grad.repeat_interleave(r.shape[0] // ctx.groups)[:, None]  # (M, 1)
        # z_i p_i / sum_j z_j p_j, times the row's weight and the upstream gradient
        out = r * (weight_s * grad)
        return out.scatter_add_(1, t1, neg_weight * grad), None, None, None  # - [i = t]; masked rows: 0 - 0


def as_softmax_loss(logits: Tensor, target: Tensor, *, delta: float, groups: int = 1) -> LossOutput:
    """Mean AS-Softmax loss of logits (M, C) over targets (M,) (-100: ignored), with n_rows and n_masked."""
    return LossOutput(*_ASSoftmaxFunction.apply(logits, target, delta, groups))


def as_softmax_masked(logits: Tensor, target: Tensor, *, delta: float) -> Tensor:
    """(M,) bool: the rows ``as_softmax_loss`` counts as masked, and the ignored ones."""
    _, s, r_t, _ = kept_mass(logits, target.clamp(min=0)[:, None], delta)
    return ((s == r_t) | (target == IGNORE_INDEX)[:, None]).squeeze(1)


class ASSoftmaxLoss(WarmupDelta, Loss):
    name = "as_softmax"
    kinds = frozenset({"multiclass", "token"})
    masks_rows = True
    supports_row_skipping = True

    def __init__(self, delta: float = 0.3) -> None:
        super().__init__()
        self.delta = delta

    def compute(self, x: Tensor, target: Tensor, groups: int = 1) -> LossOutput:
        return as_softmax_loss(x, target, delta=self.delta, groups=groups)

    def masked_rows(self, x: Tensor, target: Tensor) -> Tensor:
        return as_softmax_masked(x, target, delta=self.delta)
