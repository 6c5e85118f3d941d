"""Multi-label softmax cross-entropy (Su 2020; AS-Softmax paper, Eq. 14).

    L = log(1 + sum_{i in Omega_neg} exp(o_i)) + log(1 + sum_{t in Omega_pos} exp(-o_t))

Positive scores are pushed above 0 and negative ones below 0 (predict o > 0). Excluded classes are
-inf terms rather than Su's 1e12, so the loss is exact in fp32 and fp64.
Shapes: x (N, C) float, y (N, C) multi-hot -> LossOutput (mean over the N rows).

Speed: one autograd node (``_SuFunction``, shared with ``multilabel_as_softmax`` and
``multilabel_t_softmax``). Each term is a log-sum-exp over one (N, C) tensor that holds the terms'
exponents and -inf elsewhere, shifted by max(0, its max), exponentiated in place; forward also
builds the gradient, (e^{o_i} on negatives, -e^{-o_t} on positives) / (1 + their sum), so backward is
one multiply. No concatenated copy, no masked copies beyond the two term tensors.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from ._base import Loss, LossOutput

# (lse, top_neg, low_pos) (N, 1) each -> (neg_floor, pos_ceiling) (N, 1): the logit thresholds of a drop rule
# (Eq. 15-17): a negative o_i <= neg_floor and a positive o_t >= pos_ceiling lose their terms.
Thresholds = Callable[[Tensor, Tensor, Tensor], tuple[Tensor, Tensor]]


def log1p_sum_exp_(u: Tensor, floor: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """log(1 + sum_j exp(u_j)) over dim 1 of u (N, K), -inf entries being absent terms, and without the terms
    with u_j <= floor (N, 1) when given (a NaN or -inf floor drops none). u is overwritten with the terms'
    gradient up to a per-row factor: returns the log (N, 1), that factor (N, 1), and the sum of the terms
    left (N, 1), which is 0 iff none is left (in the working precision: the log is then exactly 0)."""
    shift = u.amax(dim=1, keepdim=True).clamp_(min=0.0)  # max(0, max u): no overflow; 1 = e^0 is a term
    e = u.sub_(shift).exp_()  # (N, K)
    if floor is None:
        s = e.sum(dim=1, keepdim=True)
        d = torch.exp(-shift) + s  # e^-shift (1 + sum): >= 1, as e^0 (the shift's own term) is in it
        return shift + torch.log(d), d.reciprocal(), s
    # Drop e_j <= c = exp(floor - shift) with one in-place threshold at 1 after dividing by c. p is monotone
    # in the logits, so the largest term goes last; c is floored so that e / c and its sum stay finite (terms
    # below the floor are below the working precision beside the largest one, e^0).
    tiny = 2.0 ** (-100 if u.dtype != torch.float64 else -900)
    c = torch.exp(floor - shift).nan_to_num_(nan=tiny).clamp_(min=tiny)
    torch.threshold_(e.div_(c), 1.0, 0.0)
    s = e.sum(dim=1, keepdim=True).mul_(c)
    d = torch.exp(-shift) + s
    log = torch.where(s > 0, shift + torch.log(d), 0.0)  # nothing left: exactly 0 (shift may be a dropped term's)
    return log, c / d, s


def su_terms(z: Tensor, pos: Tensor, thresholds: Thresholds | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """Eq. 14 (Eq. 18 with ``thresholds``) per row of z (N, C): losses (N,), their gradient dL/dz (N, C),
    and masked (N,) bool (no term left: loss exactly 0, gradient exactly 0)."""
    neg_terms = torch.where(pos, -torch.inf, z)  # (N, C): o_i on negatives
    neg_floor = pos_floor = None
    if thresholds is None:
        pos_terms = torch.where(pos, z, torch.inf).neg_()  # (N, C): -o_t on positives
    else:
        # lse(o) for the rule's probabilities; its scratch (N, C) then holds the positives' terms (one allocation less).
        row_max = z.amax(dim=1, keepdim=True)
        scratch = torch.sub(z, row_max).exp_()
        lse = scratch.sum(dim=1, keepdim=True).log_().add_(row_max)
        pos_terms = torch.where(pos, z, z.new_full((), torch.inf), out=scratch).neg_()
        top_neg, low_pos = neg_terms.amax(dim=1, keepdim=True), pos_terms.amax(dim=1, keepdim=True).neg_()
        neg_floor, pos_ceiling = thresholds(lse, top_neg, low_pos)
        pos_floor = pos_ceiling.neg()  # o_t >= ceiling  <=>  -o_t <= -ceiling
    neg_loss, neg_scale, neg_sum = log1p_sum_exp_(neg_terms, neg_floor)
    pos_loss, pos_scale, pos_sum = log1p_sum_exp_(pos_terms, pos_floor)
    grad = neg_terms.mul_(neg_scale).addcmul_(pos_terms, pos_scale, value=-1.0)  # (N, C); the sets are disjoint
    masked = ((neg_sum == 0) & (pos_sum == 0)).squeeze(1)
    return (neg_loss + pos_loss).squeeze(1), grad, masked


class _SuFunction(torch.autograd.Function):
    """Mean over rows of Eq. 14 / Eq. 18 on z = scale * x, with n_rows and n_masked, in one node."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, y: Tensor, scale: float, thresholds: Thresholds | None) -> tuple[Tensor, Tensor, Tensor]:
        z = x * scale if scale != 1.0 else x
        rows, grad, masked = su_terms(z, y > 0.5, thresholds)
        n = x.shape[0]
        ctx.save_for_backward(grad)
        ctx.coef = scale / max(n, 1)  # dL/dx = dL/dz * scale, averaged over the rows
        n_rows, n_masked = torch.full((), n, dtype=torch.int64, device=x.device), masked.sum()
        ctx.mark_non_differentiable(n_rows, n_masked)
        return rows.sum() / max(n, 1), n_rows, n_masked

    @staticmethod
    def backward(ctx: Any, grad: Tensor, *_: Tensor | None) -> tuple[Tensor, None, None, None]:
        (g,) = ctx.saved_tensors
        return g * (grad * ctx.coef), None, None, None


def su_loss(logits: Tensor, target: Tensor, *, scale: float = 1.0, thresholds: Thresholds | None = None) -> LossOutput:
    """Mean Eq. 14 (Eq. 18 with ``thresholds``) of scale * logits (N, C) over multi-hot targets (N, C)."""
    return LossOutput(*_SuFunction.apply(logits, target, scale, thresholds))


def multilabel_softmax_loss(logits: Tensor, target: Tensor) -> LossOutput:
    return su_loss(logits, target)


class MultilabelSoftmaxLoss(Loss):
    name = "multilabel_softmax"
    kinds = frozenset({"multilabel"})
    masks_rows = True

    def compute(self, x: Tensor, target: Tensor) -> LossOutput:
        return multilabel_softmax_loss(x, target)
