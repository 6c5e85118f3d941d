"""Binary cross-entropy on sigmoid outputs: the multi-label baseline.

    L = -(1/C) sum_c [ y_c log sigmoid(o_c) + (1 - y_c) log sigmoid(-o_c) ]

The mean over the C labels (as ``BCEWithLogitsLoss``), so one row's loss does not grow with C.
Shapes: x (N, C), y (N, C) multi-hot -> (N,).
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from ._base import Loss, LossOutput, mean_over_rows


def bce_loss(logits: Tensor, target: Tensor) -> Tensor:
    return F.binary_cross_entropy_with_logits(logits, target, reduction="none").mean(dim=1)


class BCELoss(Loss):
    name = "bce"
    kinds = frozenset({"multilabel"})

    def compute(self, x: Tensor, target: Tensor, groups: int = 1) -> LossOutput:
        return mean_over_rows(bce_loss(x, target), target, groups=groups)
