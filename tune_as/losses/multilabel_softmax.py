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

# (z, pos, neg_terms, pos_terms) -> None: sets the exponents of dropped terms to -inf, in place (Eq. 15-17)
Dropper = Callable[[Tensor, Tensor, Tensor, Tensor], None]


def log1p_sum_exp_(u: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """log(1 + sum_j exp(u_j)) over dim 1 of u (N, K), -inf entries being absent terms; u is overwritten
    with exp(u - shift). Returns the term (N, 1), 1 / (exp(-shift) + sum) (N, 1), so that the term's
    gradient is u * that, and the sum (N, 1), which is 0 iff no term is left (in the working precision)."""
    shift = u.amax(dim=1, keepdim=True).clamp_(min=0.0)  # max(0, max u): no overflow; 1 = e^0 is a term
    s = u.sub_(shift).exp_().sum(dim=1, keepdim=True)
    d = torch.exp(-shift) + s  # e^-shift (1 + sum_j e^u_j) > 0: the largest of 1 and e^u_j is e^0 after the shift
    return shift + torch.log(d), d.reciprocal(), s


def su_terms(z: Tensor, pos: Tensor, drop: Dropper | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """Eq. 14 (Eq. 18 with ``drop``) per row of z (N, C): losses (N,), their gradient dL/dz (N, C),
    and masked (N,) bool (no term left: loss exactly 0, gradient exactly 0)."""
    neg_terms = z.masked_fill(pos, -torch.inf)  # (N, C): o_i on negatives
    pos_terms = z.masked_fill(~pos, torch.inf).neg_()  # (N, C): -o_t on positives
    if drop is not None:
        drop(z, pos, neg_terms, pos_terms)
    neg_loss, neg_scale, neg_sum = log1p_sum_exp_(neg_terms)
    pos_loss, pos_scale, pos_sum = log1p_sum_exp_(pos_terms)
    grad = neg_terms.mul_(neg_scale).sub_(pos_terms.mul_(pos_scale))  # (N, C)
    masked = ((neg_sum == 0) & (pos_sum == 0)).squeeze(1)
    return (neg_loss + pos_loss).squeeze(1), grad, masked


class _SuFunction(torch.autograd.Function):
    """Mean over rows of Eq. 14 / Eq. 18 on z = scale * x, with n_rows and n_masked, in one node."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, y: Tensor, scale: float, drop: Dropper | None) -> tuple[Tensor, Tensor, Tensor]:
        z = x * scale if scale != 1.0 else x
        rows, grad, masked = su_terms(z, y > 0.5, drop)
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


def su_loss(logits: Tensor, target: Tensor, *, scale: float = 1.0, drop: Dropper | None = None) -> LossOutput:
    """Mean Eq. 14 (Eq. 18 with ``drop``) of scale * logits (N, C) over multi-hot targets (N, C)."""
    return LossOutput(*_SuFunction.apply(logits, target, scale, drop))


def multilabel_softmax_loss(logits: Tensor, target: Tensor) -> LossOutput:
    return su_loss(logits, target)


class MultilabelSoftmaxLoss(Loss):
    name = "multilabel_softmax"
    kinds = frozenset({"multilabel"})

    def compute(self, x: Tensor, target: Tensor) -> LossOutput:
        return multilabel_softmax_loss(x, target)
