"""SM-Taylor softmax: soft margin with the Taylor exponential (softmax-alternatives paper, Sec. 2.4,
Eq. 3 + 8).

    p_t = f^n(z_t - m) / (sum_{j != t} f^n(z_j) + f^n(z_t - m)),   L = -log p_t

f^n is the order-n Taylor expansion of exp (Eq. 3). Exact gradient (autograd). m in [0, 10],
n an even int in [2, 16]; m = 0 is ``taylor_softmax`` with ``backward="finite"``.
Shapes: x (M, C), t (M,) -> (M,).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ._base import Loss, LossOutput, check_int, check_range, class_index, mean_over_rows
from .taylor_softmax import taylor_class_scores, taylor_probs


def sm_taylor_softmax_loss(logits: Tensor, target: Tensor, *, m: float, n: int) -> Tensor:
    return -torch.log(taylor_probs(logits, target, n, margin=m).gather(1, target[:, None])).squeeze(1)


class SMTaylorSoftmaxLoss(Loss):
    name = "sm_taylor_softmax"
    kinds = frozenset({"multiclass", "token"})

    def __init__(self, m: float = 0.6, n: int = 2) -> None:
        super().__init__()
        self.m = check_range("m", m, 0.0, 10.0)
        self.n = check_int("n", n, 2, 16, even=True)

    def compute(self, x: Tensor, target: Tensor, groups: int = 1) -> LossOutput:
        return mean_over_rows(sm_taylor_softmax_loss(x, class_index(target), m=self.m, n=self.n), target,
                              groups=groups)

    def class_scores(self, logits: Tensor) -> Tensor:
        """The margin applies to the target in training only: a prediction compares f^n(z) of every class."""
        return taylor_class_scores(logits, self.n)
