"""Multi-label Sparse-Softmax: the top-k idea of Sparse-Softmax (Sun et al. 2021, Eq. 4-5) applied to Eq. 14.

    L = log(1 + sum_{i in Omega_neg^k} exp(o_i)) + log(1 + sum_{t in Omega_pos} exp(-o_t))

Omega_neg^k: the k highest-scoring negative classes (all negatives when there are at most k). As in
Eq. 5, where only the strongest competitors stay in the normalizer, the top-k cut applies to the
competitors (negatives); every positive keeps its term. k is an int in [1, 100000]; k >= C is
``multilabel_softmax``. Shapes: x (N, C), y (N, C) multi-hot -> (N,).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ._base import Loss, LossOutput, check_int, mean_over_rows


def log1p_sum_exp(z: Tensor) -> Tensor:
    """log(1 + sum_j exp(z_j)) over the last dim of (N, K); -inf entries are absent terms."""
    return torch.logsumexp(torch.cat([torch.zeros_like(z[:, :1]), z], dim=1), dim=1)


def multilabel_sparse_softmax_loss(logits: Tensor, target: Tensor, *, k: int) -> Tensor:
    pos = target > 0.5  # (N, C)
    neg = torch.where(pos, -torch.inf, logits)
    if k < logits.shape[1]:
        neg = neg.topk(k, dim=1, sorted=False).values  # (N, k); -inf where fewer than k negatives
    return log1p_sum_exp(neg) + log1p_sum_exp(torch.where(pos, -logits, -torch.inf))


class MultilabelSparseSoftmaxLoss(Loss):
    name = "multilabel_sparse_softmax"
    kinds = frozenset({"multilabel"})

    def __init__(self, k: int = 10) -> None:
        super().__init__()
        self.k = check_int("k", k, 1, 100_000)

    def compute(self, x: Tensor, target: Tensor) -> LossOutput:
        return mean_over_rows(multilabel_sparse_softmax_loss(x, target, k=self.k), target)
