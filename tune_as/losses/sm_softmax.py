"""SM-Softmax: soft-margin softmax (Liang et al. 2017; softmax-alternatives paper, Eq. 8).

    SMsm(z)_t = exp(z_t - m) / (sum_{j != t} exp(z_j) + exp(z_t - m)),   L = -log SMsm(z)_t

m in [0, 10] (the paper searches 0 to 0.9); m = 0 is plain softmax. Shapes: x (M, C), t (M,) -> (M,).
"""

from __future__ import annotations

from torch import Tensor

from ._base import Loss, LossOutput, check_range, class_index, margin_cross_entropy, mean_over_rows


def sm_softmax_loss(logits: Tensor, target: Tensor, *, m: float) -> Tensor:
    return margin_cross_entropy(logits, target, margin=m)


class SMSoftmaxLoss(Loss):
    name = "sm_softmax"
    kinds = frozenset({"multiclass", "token"})

    def __init__(self, m: float = 0.6) -> None:
        super().__init__()
        self.m = check_range("m", m, 0.0, 10.0)

    def compute(self, x: Tensor, target: Tensor, groups: int = 1) -> LossOutput:
        return mean_over_rows(sm_softmax_loss(x, class_index(target), m=self.m), target, groups=groups)
