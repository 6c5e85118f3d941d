"""Multi-label AS-Softmax (AS-Softmax paper, Eq. 15-18), with p = softmax over the C logits.

    z_i = 0 for a negative i once p_t^min - p_i >= delta   (Eq. 15, 17; p_t^min: lowest positive p)
    z_t = 0 for a positive t once p_t - p_i^max >= delta   (Eq. 16, 17; p_i^max: highest negative p)
    L = log(1 + sum_{i in Omega_neg} z_i exp(o_i)) + log(1 + sum_{t in Omega_pos} z_t exp(-o_t))   (Eq. 18)

A row with every z = 0 has loss exactly 0 (masked). Empty sets: a row without positives keeps every
negative (nothing to compare with, so its loss is Eq. 14); a row without negatives takes p_i^max = 0,
the probability of an absent class, so that a class padded with a -inf logit changes nothing.
delta in [0, 1]. Shapes: x (N, C), y (N, C) multi-hot -> losses (N,), masked (N,) bool.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ._base import DeltaMixin, Loss, softmax_rows
from .multilabel_softmax import su_terms


def multilabel_as_softmax_loss(logits: Tensor, target: Tensor, *, delta: float) -> tuple[Tensor, Tensor]:
    pos = target > 0.5  # (N, C)
    p = softmax_rows(logits.detach())  # the factors z are constants, as in Eq. 7
    p_pos_min = torch.where(pos, p, 2.0).amin(dim=1, keepdim=True)  # 2: no positive
    p_neg_max = torch.where(pos, 0.0, p).amax(dim=1, keepdim=True)  # 0: no negative
    neg_floor = torch.where(p_pos_min > 1.0, -1.0, p_pos_min - delta)  # no positive: keep every negative
    neg_on = (p > neg_floor) & ~pos  # z_i = 1: p_t^min - p_i < delta
    pos_on = (p < p_neg_max + delta) & pos  # z_t = 1: p_t - p_i^max < delta
    return su_terms(logits, neg_on, pos_on), ~(neg_on | pos_on).any(dim=1)


class MultilabelASSoftmaxLoss(DeltaMixin, Loss):
    name = "multilabel_as_softmax"
    kinds = frozenset({"multilabel"})

    def __init__(self, delta: float = 0.3) -> None:
        super().__init__()
        self.delta = delta

    def multilabel_rows(self, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        return multilabel_as_softmax_loss(x, y, delta=self.delta)
