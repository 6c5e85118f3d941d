"""Multi-label softmax cross-entropy (Su 2020; AS-Softmax paper, Eq. 14).

    L = log(1 + sum_{i in Omega_neg} exp(o_i)) + log(1 + sum_{t in Omega_pos} exp(-o_t))

Positive scores are pushed above 0 and negative ones below 0 (predict o > 0). Excluded classes are
masked with -inf rather than Su's 1e12, so the loss is exact in fp32 and fp64.
Shapes: x (N, C) float, y (N, C) multi-hot -> (N,).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ._base import Loss


def log1p_sum_exp(z: Tensor) -> Tensor:
    """log(1 + sum_j exp(z_j)) over the last dim of (N, K); -inf entries are absent terms."""
    return torch.logsumexp(torch.cat([torch.zeros_like(z[:, :1]), z], dim=1), dim=1)


def su_terms(logits: Tensor, neg_on: Tensor, pos_on: Tensor) -> Tensor:
    """log(1 + sum_{neg_on} exp(o_i)) + log(1 + sum_{pos_on} exp(-o_t)) per row; (N, C) bool masks."""
    return log1p_sum_exp(torch.where(neg_on, logits, -torch.inf)) + log1p_sum_exp(torch.where(pos_on, -logits, -torch.inf))


def multilabel_softmax_loss(logits: Tensor, target: Tensor) -> Tensor:
    pos = target > 0.5  # (N, C)
    return su_terms(logits, ~pos, pos)


class MultilabelSoftmaxLoss(Loss):
    name = "multilabel_softmax"
    kinds = frozenset({"multilabel"})

    def multilabel_rows(self, x: Tensor, y: Tensor) -> tuple[Tensor, None]:
        return multilabel_softmax_loss(x, y), None
