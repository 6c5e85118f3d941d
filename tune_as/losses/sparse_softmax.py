"""Sparse-Softmax: cross-entropy restricted to the top-k logits (Sun et al. 2021, Eq. 4-5).

    L = log sum_{i in Omega_k} exp(z_i) - z_t,   Omega_k = indices of the k largest logits

Eq. 5 taken literally: a target outside Omega_k is not added to it (its loss is then >= log k).
k is an int in [1, 100000]; k >= C uses every class, i.e. plain softmax.
Shapes: x (M, C), t (M,) -> (M,).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ._base import Loss, LossOutput, check_int, class_index, mean_over_rows


def sparse_softmax_loss(logits: Tensor, target: Tensor, *, k: int) -> Tensor:
    top = logits if k >= logits.shape[1] else logits.topk(k, dim=1, sorted=False).values  # (M, k)
    return torch.logsumexp(top, dim=1) - logits.gather(1, target[:, None]).squeeze(1)


class SparseSoftmaxLoss(Loss):
    name = "sparse_softmax"
    kinds = frozenset({"multiclass", "token"})

    def __init__(self, k: int = 10) -> None:
        super().__init__()
        self.k = check_int("k", k, 1, 100_000)

    def compute(self, x: Tensor, target: Tensor, groups: int = 1) -> LossOutput:
        return mean_over_rows(sparse_softmax_loss(x, class_index(target), k=self.k), target, groups=groups)
