"""AS-Softmax: adaptive sparse softmax (AS-Softmax paper, Section 3.2, Eq. 5-7).

With p = softmax(o) over all C classes, a competitor i != t is dropped (z_i = 0) once it trails the
target by the margin, p_t - p_i >= delta (Eq. 5-6); the target is never dropped. Then (Eq. 7)

    L = -log( exp(o_t) / sum_j z_j exp(o_j) ) = log sum_{j: z_j = 1} exp(o_j) - o_t

A row whose kept mass is the target's alone (in the working precision) has loss exactly 0 and gradient
exactly 0: it is "masked". delta in [0, 1]; delta = 1 is cross-entropy. Shapes: x (M, C) float,
t (M,) int64 (-100: ignored) -> LossOutput (the mean over counted rows is fused into the autograd
Function: one node, no per-row autograd graph).

Speed: one exp pass, e = exp(o - max o), kept for backward, which is then a single multiply:
dL/do_i = z_i e_i / sum_j z_j e_j - [i = t]. ``F.cross_entropy`` takes exp in forward and again in
backward. The rule is applied to e, the probabilities times their row sum: p_t - p_i >= delta iff
e_i <= e_t - delta * sum_j e_j, so no normalized p is ever built.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ._base import IGNORE_INDEX, Loss, LossOutput, WarmupDelta


def kept_exp(x: Tensor, t1: Tensor, delta: float) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """e = exp(x - max x) with the dropped competitors set to 0 (M, C), its row sums (M, 1), e_t and max x (M, 1).
    The row is masked iff sum == e_t. t1 (M, 1) valid class indices."""
    m = x.amax(dim=1, keepdim=True)
    e = torch.sub(x, m).exp_()  # (M, C): p * sum_j e_j
    e_t = e.gather(1, t1)
    # p_t - p_i >= delta  <=>  e_i <= e_t - delta * sum_j e_j; ties with the target drop at delta = 0
    e.masked_fill_(e <= torch.sub(e_t, e.sum(dim=1, keepdim=True), alpha=delta), 0.0)
    e.scatter_(1, t1, e_t)  # the target is never dropped
    return e, e.sum(dim=1, keepdim=True), e_t, m


class _ASSoftmaxFunction(torch.autograd.Function):
    """Mean AS-Softmax loss over the rows whose target is not -100, with n_rows and n_masked, in one node."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, t: Tensor, delta: float) -> tuple[Tensor, Tensor, Tensor]:
        t1 = t.clamp(min=0)[:, None]  # (M, 1); ignored rows: class 0, weight 0
        e, s, e_t, m = kept_exp(x, t1, delta)
        valid = (t != IGNORE_INDEX)[:, None]
        live = valid & (s != e_t)  # (M, 1): counted and not masked
        n_rows, n_live = valid.sum(), live.sum()
        weight = live.to(x.dtype) / n_rows.clamp(min=1)  # (M, 1): 1 / n_rows, 0 on ignored and masked rows
        # log sum_kept exp(o) - o_t, exact whatever p_t (no log p_t, which underflows)
        rows = torch.log(s) - (x.gather(1, t1) - m)
        loss = torch.where(live, rows, 0.0).sum() / n_rows.clamp(min=1)
        ctx.save_for_backward(e, t1, weight / s, -weight)
        n_masked = n_rows - n_live
        ctx.mark_non_differentiable(n_rows, n_masked)
        return loss, n_rows, n_masked

    @staticmethod
    def backward(ctx: Any, grad: Tensor, *_: Tensor | None) -> tuple[Tensor, None, None]:
        e, t1, weight_s, neg_weight = ctx.saved_tensors
        out = e * (weight_s * grad)  # z_i p_i / sum_j z_j p_j, times the row's weight and the upstream gradient
        return out.scatter_add_(1, t1, neg_weight * grad), None, None  # - [i = t]; masked rows: 0 - 0


def as_softmax_loss(logits: Tensor, target: Tensor, *, delta: float) -> LossOutput:
    """Mean AS-Softmax loss of logits (M, C) over targets (M,) (-100: ignored), with n_rows and n_masked."""
    return LossOutput(*_ASSoftmaxFunction.apply(logits, target, delta))


def as_softmax_masked(logits: Tensor, target: Tensor, *, delta: float) -> Tensor:
    """(M,) bool: the rows ``as_softmax_loss`` counts as masked, and the ignored ones."""
    e, s, e_t, _ = kept_exp(logits, target.clamp(min=0)[:, None], delta)
    return ((s == e_t) | (target == IGNORE_INDEX)[:, None]).squeeze(1)


class ASSoftmaxLoss(WarmupDelta, Loss):
    name = "as_softmax"
    kinds = frozenset({"multiclass", "token"})
    supports_row_skipping = True

    def __init__(self, delta: float = 0.3) -> None:
        super().__init__()
        self.delta = delta

    def compute(self, x: Tensor, target: Tensor) -> LossOutput:
        return as_softmax_loss(x, target, delta=self.delta)

    def masked_rows(self, x: Tensor, target: Tensor) -> Tensor:
        return as_softmax_masked(x, target, delta=self.delta)
