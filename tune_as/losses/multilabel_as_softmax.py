"""Multi-label AS-Softmax (AS-Softmax paper, Eq. 15-18), with p = softmax over the C logits.

    z_i = 0 for a negative i once p_t^min - p_i >= delta   (Eq. 15, 17; p_t^min: lowest positive p)
    z_t = 0 for a positive t once p_t - p_i^max >= delta   (Eq. 16, 17; p_i^max: highest negative p)
    L = log(1 + sum_{i in Omega_neg} z_i exp(o_i)) + log(1 + sum_{t in Omega_pos} z_t exp(-o_t))   (Eq. 18)

A row with no term left has loss exactly 0 and gradient exactly 0 (masked). Empty sets: a row without
positives keeps every negative (nothing to compare with, so its loss is Eq. 14); a row without negatives
takes p_i^max = 0, the probability of an absent class, so that a class padded with a -inf logit changes
nothing. delta in [0, 1]. Shapes: x (N, C), y (N, C) multi-hot -> LossOutput. The terms are those of
Eq. 14 (the ``_su`` kernel) with the dropped ones removed before their log-sum-exp.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ._base import Loss, LossOutput, WarmupDelta
from ._su import Thresholds, su_loss, su_masked


def as_thresholds(delta: float) -> Thresholds:
    """Eq. 15-17 as logit thresholds per row, from lse(o), the highest negative and the lowest positive logit.
    p is monotone in o, so p_t^min - p_i >= delta iff o_i <= lse + log(p_t^min - delta), and
    p_t - p_i^max >= delta iff o_t >= lse + log(p_i^max + delta); at delta = 0 the thresholds are the logits
    themselves (ties drop exactly)."""

    def thresholds(lse: Tensor, top_neg: Tensor, low_pos: Tensor) -> tuple[Tensor, Tensor]:
        if delta == 0.0:
            neg_floor, pos_ceiling = low_pos, top_neg
        else:
            # log of a non-positive p_t^min - delta: NaN or -inf, which drops nothing (o <= NaN is False)
            neg_floor = torch.exp(low_pos - lse).sub_(delta).log_().add_(lse)
            pos_ceiling = torch.exp(top_neg - lse).add_(delta).log_().add_(lse)  # no negative: p_i^max = 0
        no_positive = low_pos == torch.inf  # nothing to compare with: keep every negative
        return neg_floor.masked_fill(no_positive, -torch.inf), pos_ceiling

    return thresholds


def multilabel_as_softmax_loss(
    logits: Tensor, target: Tensor, *, delta: float, groups: int = 1
) -> LossOutput:
    return su_loss(logits, target, thresholds=as_thresholds(delta), groups=groups)


def multilabel_as_softmax_masked(logits: Tensor, target: Tensor, *, delta: float) -> Tensor:
    """(N,) bool: the rows ``multilabel_as_softmax_loss`` counts as masked (same kernel, no gradient kept)."""
    return su_masked(logits, target, as_thresholds(delta))


class MultilabelASSoftmaxLoss(WarmupDelta, Loss):
    name = "multilabel_as_softmax"
    kinds = frozenset({"multilabel"})
    masks_rows = True
    supports_row_skipping = True

    def __init__(self, delta: float = 0.3) -> None:
        super().__init__()
        self.delta = delta

    def compute(self, x: Tensor, target: Tensor, groups: int = 1) -> LossOutput:
        return multilabel_as_softmax_loss(x, target, delta=self.delta, groups=groups)

    def masked_rows(self, x: Tensor, target: Tensor) -> Tensor:
        return multilabel_as_softmax_masked(x, target, delta=self.delta)
