"""Label smoothing (Szegedy et al. 2016), as the AS-Softmax paper defines it (Appendix A.3).

    L = -(1 - eps) log p_t - eps / (C - 1) * sum_{i != t} log p_i

The target keeps weight 1 - eps and each of the C - 1 other classes gets eps / (C - 1) (PyTorch's
``label_smoothing`` instead spreads eps / C over all C classes, the target included).
eps in [0, 1); eps = 0 is plain softmax. Shapes: x (M, C) with C >= 2, t (M,) -> (M,).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ._base import Loss, LossOutput, check_range, class_index, mean_over_rows


def label_smoothing_loss(logits: Tensor, target: Tensor, *, eps: float) -> Tensor:
    n_classes = logits.shape[-1]
    if n_classes < 2:
        raise ValueError(f"label_smoothing needs at least 2 classes, got {n_classes}")
    logp = torch.log_softmax(logits, dim=-1)  # (M, C)
    logp_t = logp.gather(1, target[:, None]).squeeze(1)  # (M,)
    others = logp.sum(dim=-1) - logp_t
    return -(1.0 - eps) * logp_t - (eps / (n_classes - 1)) * others


class LabelSmoothingLoss(Loss):
    name = "label_smoothing"
    kinds = frozenset({"multiclass", "token"})

    def __init__(self, eps: float = 0.1) -> None:
        super().__init__()
        self.eps = check_range("eps", eps, 0.0, 1.0, hi_open=True)

    def compute(self, x: Tensor, target: Tensor, groups: int = 1) -> LossOutput:
        return mean_over_rows(label_smoothing_loss(x, class_index(target), eps=self.eps), target,
                              groups=groups)
