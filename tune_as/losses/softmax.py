"""Softmax cross-entropy (AS-Softmax paper, Eq. 1-2).

    L = -log p_t = log sum_j exp(o_j) - o_t

Shapes: x (M, C) float, t (M,) int64 (-100: ignored) -> LossOutput. The mean over counted rows is
nll_loss's own (fused, one autograd node), which also returns their count. By group (``groups`` > 1): per-row
cross-entropy, reduced by the one reducer.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ._base import IGNORE_INDEX, Loss, LossOutput, mean_over_rows, zero_count

_MEAN = 1  # at::Reduction::Mean
# nll_loss's forward also returns total_weight, the number of counted rows (no weights): n_rows for free.
_nll_loss_forward = torch.ops.aten.nll_loss_forward.default


def softmax_loss(logits: Tensor, target: Tensor, groups: int = 1) -> LossOutput:
    if groups > 1:
        return mean_over_rows(F.cross_entropy(logits, target, reduction="none"), target, groups=groups)
    loss, total = _nll_loss_forward(torch.log_softmax(logits, dim=1), target, None, _MEAN, IGNORE_INDEX)
    n_rows = total.long()
    # No row counted: nll_loss's mean is 0/0, with gradient 0. The mean over none is 0: set the value only
    # (through detach: no autograd node; nll_loss's backward does not read its output).
    loss.detach().masked_fill_(n_rows == 0, 0.0)
    return LossOutput(loss, n_rows, zero_count(logits.device))


class SoftmaxLoss(Loss):
    name = "softmax"
    kinds = frozenset({"multiclass", "token"})

    def compute(self, x: Tensor, target: Tensor, groups: int = 1) -> LossOutput:
        return softmax_loss(x, target, groups)
