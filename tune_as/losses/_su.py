"""The kernel of Eq. 14 (Su's multi-label softmax cross-entropy) and of its variants: Eq. 18's drop rule
(``multilabel_as_softmax``), the top-k negatives (``multilabel_sparse_softmax``) and a temperature
(``multilabel_t_softmax``). Shapes: logits and multi-hot targets (N, C); y > 0.5 marks a positive.

Each of Eq. 14's two terms is a softplus of a log-sum-exp: with z = o_i on the negatives and z = -o_t on
the positives, log(1 + sum_j e^{z_j}) = softplus(L), L = log sum_j e^{z_j}, and its gradient is
d softplus(L) / d z_j = softmax(z)_j * sigmoid(L). So a set costs one masked copy of the logits (the other
set's classes at a finite fill far below any logit, whose softmax weight is exactly 0), one softmax in place
(``lse_softmax``: ATen's fused kernel on long rows, which also gives L = max z - log max softmax(z);
elementwise passes on short ones) and two row maxima; backward is two passes over the saved softmaxes,
scaled by the per-row weights sigmoid(L). Why: an exp over a tensor of -inf (or underflowing) entries takes
the CPU's slow path (6-60x slower than over finite, in-range values, measured here on AVX-512 with torch
2.13), as the old positives' tensor (-inf but for ~5 of 4,271 classes) did at every call, and boolean masks
(``y > 0.5``, ``torch.where``) cost 3-6x an arithmetic pass; the softmax kernel's exp has no such path, and
the elementwise path clamps before its exp. Measured: docs/bench_losses.md.

A set whose sum e^L is below the dtype's smallest normal number (no term, every term dropped, or all of
them underflow) adds exactly 0 to the loss and to the gradient; a row whose two sets both do is masked.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from ._base import LossOutput, by_group

# A class outside a set sits at a value in [-2 FILL, -FILL]: finite, so that an empty set's softmax stays
# finite (its weight is 0), and far below any logit, so that its softmax weight is exactly 0.
FILL = 2.0**125

# Rows at least this long take the fused softmax kernel, shorter ones four elementwise passes: the crossover
# measured here (AVX-512, torch 2.13, one thread; at (4096, 9) the kernel took 660 us, the passes 70 us).
FUSED_MIN_K = 512

# (lse, top_neg, low_pos) (N, 1) each -> (neg_floor, pos_ceiling) (N, 1): the logit thresholds of a drop rule
# (Eq. 15-17): a negative o_i <= neg_floor and a positive o_t >= pos_ceiling lose their terms. top_neg is -inf
# for a row without negatives and low_pos +inf for a row without positives.
Thresholds = Callable[[Tensor, Tensor, Tensor], tuple[Tensor, Tensor]]


def split_sets(z: Tensor, y: Tensor, out: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """The exponents of Eq. 14's two sums, (N, C) each: z on the negatives (y <= 0.5) and -z on the positives,
    every other class in [-2 FILL, -FILL] (so is a -inf logit: inert). Four passes, two (N, C) buffers (the
    negatives' is ``out`` when given). Two buffers, not one (2, N, C): above 32 MiB (glibc's largest mmap
    threshold) every call would map and fault in a fresh one, and the freed map unsettles later
    allocations."""
    bound = torch.sub(z.new_full((), 0.5), y)  # > 0 on negatives (0.5 itself included), < 0 on positives
    torch.copysign(z.new_full((), FILL), bound, out=bound)  # +FILL on negatives, -FILL on positives
    neg = torch.clamp(z, min=z.new_full((), -2 * FILL), max=bound, out=out)
    pos = torch.clamp(z, min=bound, max=z.new_full((), 2 * FILL), out=bound).neg_()
    return neg, pos


def lse_softmax(z: Tensor, top: Tensor, out: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor | None]:
    """(L, e, inv) over each row of z (N, K), given top = max z (N, 1), written to ``out`` (default: z's own
    storage): L = log sum_j exp(z_j) (N, 1) and softmax(z) = e * inv (inv None: e is the softmax). Long rows
    (K >= FUSED_MIN_K): one fused softmax pass, into an existing buffer on CPU (a fresh one costs its page
    faults at every call: glibc returns freed buffers of this size to the system; ATen's CPU kernel reads each
    row before it writes it, so in place is safe), and L = top - log max softmax (the largest term's softmax
    is 1 / sum_j exp(z_j - top)). Short rows, where that kernel costs up to 10x the elementwise passes:
    e = exp(max(z - top, LOW)) with the floor's value then set to 0 (no exp below LOW: the CPU exp's slow
    path; such terms are under the dtype's smallest normal number beside the largest, e^0),
    inv = 1 / sum e."""
    out = z if out is None else out
    if z.shape[1] >= FUSED_MIN_K:
        # torch has no public softmax with out=: ATen's `_softmax.out`, where this torch has it,
        # else a new buffer
        in_place = getattr(torch, "_softmax", None) if z.device.type == "cpu" else None
        p = in_place(z, 1, False, out=out) if in_place is not None else torch.softmax(z, dim=1)
        return top - p.amax(dim=1, keepdim=True).log_(), p, None
    low = math.log(torch.finfo(z.dtype).tiny) + 1.0
    e = torch.threshold_(torch.sub(z, top, out=out).clamp_(min=low).exp_(), math.exp(low + 0.5), 0.0)
    total = e.sum(dim=1, keepdim=True).clamp_(min=1.0)  # >= 1 anyway (e^0, the largest term) unless Eq. 18
    # dropped every term: then the sum is 0, and the set's weight 0 (the clamp keeps 0 * inv finite)
    return total.log().add_(top), e, total.reciprocal_()


def softplus_weight(lse: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(log(1 + e^L), sigmoid(L), on), each of lse's shape: a set's loss term, its gradient weight, and
    on = e^L is a normal number; where it is not (no term, or none representable),
    the loss and the weight are 0."""
    on = ~(lse < math.log(torch.finfo(lse.dtype).tiny))  # a NaN stays on: it reaches the loss
    loss = lse.clamp(min=0.0).add_(torch.exp(-lse.abs()).log1p_())  # stable for any L
    return loss.mul_(on), torch.sigmoid(lse).mul_(on), on


def drop_terms(sets: tuple[Tensor, Tensor], top: Tensor, floor: Tensor) -> tuple[Tensor, Tensor]:
    """Eq. 18's drop, in place: the terms z <= floor (2, N, 1) of each set (N, C) leave it (exactly: a tie
    drops); the kept ones become z - floor, which their softmax does not see. A NaN or -inf floor drops none;
    a floor below top - SPAN is raised to it, which drops only terms under eps^2 times the largest (they add
    nothing the dtype can hold) and keeps z - floor <= SPAN, so that the shift costs at most an ulp of SPAN.
    Returns (kept, shift) (2, N, 1) each: the set keeps a term (its largest, top),
    and the floor subtracted."""
    span = -2.0 * math.log(torch.finfo(top.dtype).eps)  # 31.8 in fp32, 72.1 in fp64
    floor = torch.fmax(floor, top - span)
    for z, f in zip(sets, floor, strict=True):
        torch.threshold_(z.sub_(f), 0.0, -FILL)
    return top > floor, floor


def su_terms(
    z: Tensor, y: Tensor, thresholds: Thresholds | None = None, k: int | None = None
) -> tuple[Tensor, Tensor, tuple[Tensor, ...]]:
    """Eq. 14 per row of z (N, C) (Eq. 18 with ``thresholds``; only the k largest negatives with ``k``):
    (losses (N,), masked (N,) bool, what backward needs: the sets' gradient weights (2, N, 1), their softmaxes
    (N, C) each, or (N, k) for the negatives' top k, then with its indices)."""
    scratch = None
    if thresholds is not None:  # lse(o) of the rule's probabilities, in a buffer the negatives take next
        top_all = z.amax(dim=1, keepdim=True)
        lse, scratch, _ = lse_softmax(
            z, top_all, out=torch.empty_like(z, memory_format=torch.contiguous_format)
        )
    neg, pos = split_sets(z, y, out=scratch)
    # (2, N, 1); <= -FILL: empty
    top = torch.stack([neg.amax(dim=1, keepdim=True), pos.amax(dim=1, keepdim=True)])
    kept = shift = None
    if thresholds is not None:
        neg_floor, pos_ceiling = thresholds(
            lse, top[0].masked_fill(top[0] <= -FILL, -torch.inf),
            top[1].neg().masked_fill(top[1] <= -FILL, torch.inf),
        )
        kept, shift = drop_terms((neg, pos), top, torch.stack([neg_floor, pos_ceiling.neg()]))
        top = top - shift  # the kept terms are z - shift
    idx = None
    if k is not None and k < z.shape[1]:
        neg, idx = neg.topk(k, dim=1, sorted=False)  # (N, k); fills where a row has fewer than k negatives
    parts = lse_softmax(neg, top[0]), lse_softmax(pos, top[1])
    lse_sets = torch.stack([lse for lse, _, _ in parts])  # (2, N, 1)
    # a set that kept nothing: L = -inf (its softmax saw fills only)
    if kept is not None and shift is not None:
        lse_sets = lse_sets.add_(shift).masked_fill_(~kept, -torch.inf)
    loss, weight, on = softplus_weight(lse_sets)
    if parts[0][2] is not None or parts[1][2] is not None:
        weight = weight.mul_(
            torch.stack([torch.ones_like(lse) if inv is None else inv for lse, _, inv in parts])
        )
    saved = (weight, parts[0][1], parts[1][1]) + ((idx,) if idx is not None else ())
    return loss.sum(dim=0).squeeze(1), ~on.any(dim=0).squeeze(1), saved


class _SuFunction(torch.autograd.Function):
    """Mean over rows of Eq. 14 (and variants) on z = scale * x, with n_rows and n_masked, in one node (per
    group of N / groups consecutive rows: (groups,) tensors for groups > 1)."""

    @staticmethod
    def forward(
        ctx: Any, x: Tensor, y: Tensor, scale: float, thresholds: Thresholds | None, k: int | None,
        groups: int,
    ) -> tuple[Tensor, Tensor, Tensor]:
        rows, masked, saved = su_terms(x * scale if scale != 1.0 else x, y, thresholds, k)
        n = x.shape[0] // groups
        ctx.save_for_backward(*saved)
        ctx.coef, ctx.groups = scale / max(n, 1), groups  # dL/dx = dL/dz * scale, averaged over the rows
        n_masked = by_group(masked, groups)
        n_rows = torch.full(n_masked.shape, n, dtype=torch.int64, device=x.device)
        ctx.mark_non_differentiable(n_rows, n_masked)
        return by_group(rows, groups) / max(n, 1), n_rows, n_masked

    @staticmethod
    def backward(ctx: Any, grad: Tensor, *_: Tensor | None) -> tuple[Tensor, None, None, None, None, None]:
        weight, neg_p, pos_p, *idx = ctx.saved_tensors
        if ctx.groups > 1:  # each row its group's upstream gradient
            grad = grad.repeat_interleave(weight.shape[1] // ctx.groups)[:, None]  # (N, 1)
        w = weight * (grad * ctx.coef)  # (2, N, 1); the positives' exponents are -z
        if idx:  # negatives: the top-k softmax (N, k), scattered back to their classes
            dx = torch.mul(pos_p, w[1].neg()).scatter_add_(1, idx[0], neg_p * w[0])
        else:  # the two softmaxes have disjoint supports (an empty set's has weight 0)
            dx = torch.mul(neg_p, w[0]).addcmul_(pos_p, w[1], value=-1.0)
        return dx, None, None, None, None, None


def su_loss(
    logits: Tensor, target: Tensor, *, scale: float = 1.0, thresholds: Thresholds | None = None,
    k: int | None = None, groups: int = 1,
) -> LossOutput:
    """Mean Eq. 14 (Eq. 18 with ``thresholds``, top-k negatives with ``k``) of scale * logits (N, C) over
    multi-hot targets (N, C)."""
    y = target.to(logits.dtype)  # the tensor itself when the dtype matches
    return LossOutput(*_SuFunction.apply(logits, y, scale, thresholds, k, groups))


@torch.no_grad()
def su_masked(logits: Tensor, target: Tensor, thresholds: Thresholds | None = None) -> Tensor:
    """(N,) bool: the rows ``su_loss`` counts as masked (loss 0, gradient 0); same kernel, nothing kept."""
    return su_terms(logits, target.to(logits.dtype), thresholds)[1]
