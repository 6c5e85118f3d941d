"""Multi-label softmax cross-entropy (Su 2020; AS-Softmax paper, Eq. 14).

    L = log(1 + sum_{i in Omega_neg} exp(o_i)) + log(1 + sum_{t in Omega_pos} exp(-o_t))

Positive scores are pushed above 0 and negative ones below 0 (predict o > 0). Classes outside a sum are
absent terms (a finite fill whose softmax weight is exactly 0) rather than Su's 1e12, so the loss is exact
in fp32 and fp64. Shapes: x (N, C) float, y (N, C) multi-hot (y > 0.5 is a positive) -> LossOutput (mean
over the N rows). The kernel (``_su``: each sum as softplus of a log-sum-exp, one fused softmax pass per
sum, a hand-derived backward) is shared with ``multilabel_as_softmax``, ``multilabel_t_softmax`` and
``multilabel_sparse_softmax``.
"""

from __future__ import annotations

from torch import Tensor

from ._base import Loss, LossOutput
from ._su import su_loss


def multilabel_softmax_loss(logits: Tensor, target: Tensor, groups: int = 1) -> LossOutput:
    return su_loss(logits, target, groups=groups)


class MultilabelSoftmaxLoss(Loss):
    name = "multilabel_softmax"
    kinds = frozenset({"multilabel"})
    masks_rows = True

    def compute(self, x: Tensor, target: Tensor, groups: int = 1) -> LossOutput:
        return multilabel_softmax_loss(x, target, groups)
