"""Multi-label AS-Softmax (AS-Softmax paper, Eq. 15-18), with p = softmax over the C logits.

    z_i = 0 for a negative i once p_t^min - p_i >= delta   (Eq. 15, 17; p_t^min: lowest positive p)
    z_t = 0 for a positive t once p_t - p_i^max >= delta   (Eq. 16, 17; p_i^max: highest negative p)
    L = log(1 + sum_{i in Omega_neg} z_i exp(o_i)) + log(1 + sum_{t in Omega_pos} z_t exp(-o_t))   (Eq. 18)

A row with no term left has loss exactly 0 and gradient exactly 0 (masked). Empty sets: a row without
positives keeps every negative (nothing to compare with, so its loss is Eq. 14); a row without negatives
takes p_i^max = 0, the probability of an absent class, so that a class padded with a -inf logit changes
nothing. delta in [0, 1]. Shapes: x (N, C), y (N, C) multi-hot -> LossOutput. The terms are those of
Eq. 14 (``multilabel_softmax``'s kernel) with the dropped ones removed before their log-sum-exp.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ._base import Loss, LossOutput, WarmupDelta
from .multilabel_softmax import Dropper, su_loss, su_terms


def as_dropper(delta: float) -> Dropper:
    """The drop rule of Eq. 15-17 for ``su_terms``: -inf for the exponents of the dropped terms."""

    def drop(z: Tensor, pos: Tensor, neg_terms: Tensor, pos_terms: Tensor) -> None:
        p = torch.softmax(z, dim=1)  # (N, C)
        # The highest negative / lowest positive p sit at the largest exponent of each term tensor.
        top_neg, i_neg = neg_terms.max(dim=1, keepdim=True)
        top_pos, i_pos = pos_terms.max(dim=1, keepdim=True)
        p_neg_max = torch.where(top_neg > -torch.inf, p.gather(1, i_neg), 0.0)  # 0: no negative
        neg_floor = torch.where(top_pos > -torch.inf, p.gather(1, i_pos) - delta, -1.0)  # -1: no positive
        neg_terms.masked_fill_(p <= neg_floor, -torch.inf)  # z_i = 0: p_t^min - p_i >= delta
        pos_terms.masked_fill_(p >= p_neg_max + delta, -torch.inf)  # z_t = 0: p_t - p_i^max >= delta

    return drop


def multilabel_as_softmax_loss(logits: Tensor, target: Tensor, *, delta: float) -> LossOutput:
    return su_loss(logits, target, drop=as_dropper(delta))


def multilabel_as_softmax_masked(logits: Tensor, target: Tensor, *, delta: float) -> Tensor:
    """(N,) bool: the rows ``multilabel_as_softmax_loss`` counts as masked (same kernel, no gradient kept)."""
    return su_terms(logits, target > 0.5, as_dropper(delta))[2]


class MultilabelASSoftmaxLoss(WarmupDelta, Loss):
    name = "multilabel_as_softmax"
    kinds = frozenset({"multilabel"})
    supports_row_skipping = True

    def __init__(self, delta: float = 0.3) -> None:
        super().__init__()
        self.delta = delta

    def compute(self, x: Tensor, target: Tensor) -> LossOutput:
        return multilabel_as_softmax_loss(x, target, delta=self.delta)

    def masked_rows(self, x: Tensor, target: Tensor) -> Tensor:
        return multilabel_as_softmax_masked(x, target, delta=self.delta)
