"""Sparsemax loss (Martins & Astudillo 2016, Eq. 18), via the ``entmax`` package.

    p* = sparsemax(z) = argmin_{p in simplex} ||p - z||^2
    L  = -z_t + 1/2 sum_{j: p*_j > 0} (z_j^2 - tau(z)^2) + 1/2,   the Fenchel-Young loss of p*

``entmax`` never sees -100 (the base class gives ignored rows a valid target, then zeroes them) nor a
-inf logit (0 * -inf is NaN there): -inf becomes max(z) - 2, below the support of sparsemax
(z_j > max(z) - 1) and of 1.5-entmax (z_j > max(z) - 2), so padded classes stay inert. Computed in fp32
(entmax gives NaN in bf16). Shapes: x (M, C), t (M,) -> (M,).
"""

from __future__ import annotations

import torch
from entmax import sparsemax_loss as _entmax_sparsemax_loss
from torch import Tensor

from ._base import Loss, LossOutput, class_index, mean_over_rows


def finite_padding(logits: Tensor) -> Tensor:
    """-inf logits replaced by a finite value outside the support (see the module docstring): (M, C)."""
    low = logits.amax(dim=1, keepdim=True) - 2.0
    return torch.where(logits == -torch.inf, low, logits)


def sparsemax_loss(logits: Tensor, target: Tensor) -> Tensor:
    return _entmax_sparsemax_loss(finite_padding(logits), target)


class SparsemaxLoss(Loss):
    name = "sparsemax"
    kinds = frozenset({"multiclass", "token"})

    def compute(self, x: Tensor, target: Tensor, groups: int = 1) -> LossOutput:
        return mean_over_rows(sparsemax_loss(x, class_index(target)), target, groups=groups)
