"""Softmax cross-entropy (AS-Softmax paper, Eq. 1-2).

    L = -log p_t = log sum_j exp(o_j) - o_t

Shapes: x (M, C) float, t (M,) int64 (-100: ignored) -> LossOutput. The mean over counted rows is
nll_loss's own (fused, one autograd node), which also returns their count.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ._base import IGNORE_INDEX, Loss, LossOutput

_MEAN = 1  # at::Reduction::Mean
# nll_loss's forward also returns total_weight, the number of counted rows (no weights): n_rows for free.
_nll_loss_forward = torch.ops.aten.nll_loss_forward.default


def softmax_loss(logits: Tensor, target: Tensor) -> LossOutput:
    loss, total = _nll_loss_forward(torch.log_softmax(logits, dim=1), target, None, _MEAN, IGNORE_INDEX)
    n_rows = total.long()
    with torch.no_grad():  # no row counted: nll_loss gives 0/0 with gradient 0; the mean over none is 0
        loss.masked_fill_(n_rows == 0, 0.0)
    return LossOutput(loss, n_rows, torch.zeros((), dtype=torch.int64, device=logits.device))


class SoftmaxLoss(Loss):
    name = "softmax"
    kinds = frozenset({"multiclass", "token"})

    def compute(self, x: Tensor, target: Tensor) -> LossOutput:
        return softmax_loss(x, target)
