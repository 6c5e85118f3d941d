"""The kernel of Eq. 14 (Su's multi-label softmax cross-entropy) and of its variants: Eq. 18's drop rule
(``multilabel_as_softmax``), the top-k negatives (``multilabel_sparse_softmax``) and a temperature
(``multilabel_t_softmax``). Shapes: logits and multi-hot targets (N, C); y > 0.5 marks a positive.

Each of Eq. 14's two terms is a softplus of a log-sum-exp: with z = o_i on the negatives and z = -o_t on
the positives, log(1 + sum_j e^{z_j}) = softplus(L), L = log sum_j e^{z_j}, and its gradient is
d softplus(L) / d z_j = softmax(z)_j * sigmoid(L). So a set costs one masked copy of the logits (the other
set's classes at a finite fill far below any logit, whose softmax weight is exactly 0), one fused softmax
pass, which also gives L = max z - log max softmax(z), and two row maxima; backward is two passes over the
saved softmaxes, scaled by the per-row weights sigmoid(L). Why: an exp over a tensor of -inf (or
underflowing) entries takes the CPU's slow path (6-60x slower than over finite, in-range values, measured
here on AVX-512 with torch 2.13), and boolean masks (``y > 0.5``, ``torch.where``) cost 3-6x an
arithmetic pass; the softmax kernel's exp has no such path. Measured: docs/bench_losses.md.

A set whose sum e^L is below the dtype's smallest normal number (no term, every term dropped, or all of
them underflow) adds exactly 0 to the loss and to the gradient; a row whose two sets both do is masked.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from ._base import LossOutput

# A class outside a set sits at a value in [-2 FILL, -FILL]: finite, so that an empty set's softmax stays
# finite (its weight is 0), and far below any logit, so that its softmax weight is exactly 0.
FILL = 2.0**125

# (lse, top_neg, low_pos) (N, 1) each -> (neg_floor, pos_ceiling) (N, 1): the logit thresholds of a drop rule
# (Eq. 15-17): a negative o_i <= neg_floor and a positive o_t >= pos_ceiling lose their terms. top_neg is -inf
# for a row without negatives and low_pos +inf for a row without positives.
Thresholds = Callable[[Tensor, Tensor, Tensor], tuple[Tensor, Tensor]]


def split_sets(z: Tensor, y: Tensor, out: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """The exponents of Eq. 14's two sums, (N, C) each: z on the negatives (y <= 0.5) and -z on the positives,
    every other class in [-2 FILL, -FILL] (so is a -inf logit: inert). Three passes and two (N, C) buffers
    (the negatives' is ``out`` when given)."""
    bound = torch.rsub(y, 0.5)  # (N, C): > 0 on negatives (0.5 itself included), < 0 on positives
    torch.copysign(z.new_full((), FILL), bound, out=bound)  # +FILL on negatives, -FILL on positives
    neg = torch.clamp(z, min=z.new_full((), -2 * FILL), max=bound, out=out)
    pos = torch.clamp(z, min=bound, max=z.new_full((), 2 * FILL), out=bound).neg_()
    return neg, pos


def softmax_(z: Tensor) -> Tensor:
    """softmax over dim 1, in z's storage on CPU (a fresh (N, C) buffer costs its page faults at every call:
    glibc returns freed buffers of this size to the system). ATen's CPU kernel reads each row before it
    writes it; elsewhere a new tensor."""
    return torch._softmax(z, 1, False, out=z) if z.device.type == "cpu" else torch.softmax(z, dim=1)


def lse_softmax_(z: Tensor, top: Tensor) -> tuple[Tensor, Tensor]:
    """(log sum_j exp(z_j) (N, 1), softmax(z) (N, C), in z's storage) over each row of z, given top = max z
    (N, 1); one softmax pass: the softmax of the largest term is 1 / sum_j exp(z_j - top)."""
    p = softmax_(z)
    return top - p.amax(dim=1, keepdim=True).log_(), p


def softplus_weight(lse: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(log(1 + e^L), sigmoid(L), on) (N, 1) each: the set's loss term, its gradient weight, and on = e^L is a
    normal number; where it is not (no term, or none representable), the loss and the weight are exactly 0."""
    on = ~(lse < math.log(torch.finfo(lse.dtype).tiny))  # a NaN stays on: it reaches the loss
    loss = lse.clamp(min=0.0).add_(torch.exp(-lse.abs()).log1p_())  # stable for any L
    return loss.mul_(on), torch.sigmoid(lse).mul_(on), on


def drop_terms(z: Tensor, top: Tensor, floor: Tensor) -> Tensor:
    """Eq. 18's drop, in place: the terms of z (N, C) with z <= floor (N, 1) leave the set (exactly: a tie drops);
    the kept ones become z - floor, which their softmax does not see. A NaN or -inf floor drops none; a floor
    below top - SPAN is raised to it, which drops only terms under eps^2 times the largest (they add nothing
    the dtype can hold) and keeps z - floor <= SPAN, so that the shift costs at most an ulp of SPAN.
    Returns (N, 1) bool: the set keeps a term (its largest, top)."""
    span = -2.0 * math.log(torch.finfo(z.dtype).eps)  # 31.8 in fp32, 72.1 in fp64
    floor = torch.fmax(floor, top - span)
    torch.threshold_(z.sub_(floor), 0.0, -FILL)
    return top > floor


def su_terms(
    z: Tensor, y: Tensor, thresholds: Thresholds | None = None, k: int | None = None
) -> tuple[Tensor, Tensor, tuple[Tensor, ...]]:
    """Eq. 14 per row of z (N, C) (Eq. 18 with ``thresholds``; only the k largest negatives with ``k``):
    (losses (N,), masked (N,) bool, what backward needs: the negatives' and positives' softmaxes and gradient
    weights, and the top-k indices when ``k``)."""
    scratch, neg_kept, pos_kept = None, None, None
    if thresholds is not None:  # lse(o) of the rule's probabilities, in the buffer the negatives take next
        scratch = torch.softmax(z, dim=1)
        lse = z.amax(dim=1, keepdim=True) - scratch.amax(dim=1, keepdim=True).log_()
    neg, pos = split_sets(z, y, out=scratch)
    top_neg, top_pos = neg.amax(dim=1, keepdim=True), pos.amax(dim=1, keepdim=True)  # <= -FILL: empty set
    if thresholds is not None:
        neg_floor, pos_ceiling = thresholds(
            lse, top_neg.masked_fill(top_neg <= -FILL, -torch.inf), top_pos.neg().masked_fill(top_pos <= -FILL, torch.inf)
        )
        neg_kept, pos_kept = drop_terms(neg, top_neg, neg_floor), drop_terms(pos, top_pos, pos_ceiling.neg())
    idx = None
    if k is not None and k < z.shape[1]:
        neg, idx = neg.topk(k, dim=1, sorted=False)  # (N, k); fills where a row has fewer than k negatives
    neg_lse, neg_p = lse_softmax_(neg, top_neg)
    pos_lse, pos_p = lse_softmax_(pos, top_pos)
    if neg_kept is not None and pos_kept is not None:  # a set that kept nothing: L = -inf (its softmax saw fills)
        neg_lse, pos_lse = neg_lse.masked_fill(~neg_kept, -torch.inf), pos_lse.masked_fill(~pos_kept, -torch.inf)
    neg_loss, neg_w, neg_on = softplus_weight(neg_lse)
    pos_loss, pos_w, pos_on = softplus_weight(pos_lse)
    rows, masked = (neg_loss + pos_loss).squeeze(1), ~(neg_on | pos_on).squeeze(1)
    return rows, masked, (neg_p, pos_p, neg_w, pos_w) if idx is None else (neg_p, pos_p, neg_w, pos_w, idx)


class _SuFunction(torch.autograd.Function):
    """Mean over rows of Eq. 14 (and variants) on z = scale * x, with n_rows and n_masked, in one node."""

    @staticmethod
    def forward(
        ctx: Any, x: Tensor, y: Tensor, scale: float, thresholds: Thresholds | None, k: int | None
    ) -> tuple[Tensor, Tensor, Tensor]:
        rows, masked, saved = su_terms(x * scale if scale != 1.0 else x, y, thresholds, k)
        n = x.shape[0]
        ctx.save_for_backward(*saved)
        ctx.coef = scale / max(n, 1)  # dL/dx = dL/dz * scale, averaged over the rows
        n_rows, n_masked = torch.full((), n, dtype=torch.int64, device=x.device), masked.sum()
        ctx.mark_non_differentiable(n_rows, n_masked)
        return rows.sum() / max(n, 1), n_rows, n_masked

    @staticmethod
    def backward(ctx: Any, grad: Tensor, *_: Tensor | None) -> tuple[Tensor, None, None, None, None]:
        neg_p, pos_p, neg_w, pos_w, *idx = ctx.saved_tensors
        g = grad * ctx.coef
        if idx:  # negatives: the top-k softmax, scattered back to their classes
            dx = torch.mul(pos_p, pos_w * -g).scatter_add_(1, idx[0], neg_p * (neg_w * g))
        else:  # the two softmaxes have disjoint supports (an empty set's has weight 0)
            dx = torch.mul(neg_p, neg_w * g).addcmul_(pos_p, pos_w * -g)
        return dx, None, None, None, None


def su_loss(
    logits: Tensor, target: Tensor, *, scale: float = 1.0, thresholds: Thresholds | None = None, k: int | None = None
) -> LossOutput:
    """Mean Eq. 14 (Eq. 18 with ``thresholds``, top-k negatives with ``k``) of scale * logits (N, C) over
    multi-hot targets (N, C)."""
    y = target if target.dtype == logits.dtype else target.to(logits.dtype)
    return LossOutput(*_SuFunction.apply(logits, y, scale, thresholds, k))


@torch.no_grad()
def su_masked(logits: Tensor, target: Tensor, thresholds: Thresholds | None = None) -> Tensor:
    """(N,) bool: the rows ``su_loss`` counts as masked (loss 0, gradient 0); same kernel, nothing kept."""
    return su_terms(logits, target if target.dtype == logits.dtype else target.to(logits.dtype), thresholds)[1]
