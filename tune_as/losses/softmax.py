"""Softmax cross-entropy (AS-Softmax paper, Eq. 1-2).

    L = -log p_t = log sum_j exp(o_j) - o_t

Shapes: x (M, C) float, t (M,) int64 -> (M,) per-row losses.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from ._base import Loss


def softmax_loss(logits: Tensor, target: Tensor) -> Tensor:
    return F.cross_entropy(logits, target, reduction="none")


class SoftmaxLoss(Loss):
    name = "softmax"
    kinds = frozenset({"multiclass", "token"})

    def rows(self, x: Tensor, t: Tensor) -> tuple[Tensor, None]:
        return softmax_loss(x, t), None
