"""AM-Softmax: additive margin softmax on cosine logits (Wang et al. 2018; AS-Softmax paper, Eq. 21).

    L = -log( exp(s (o_t - m)) / (exp(s (o_t - m)) + sum_{j != t} exp(s o_j)) )

o are cosine similarities in [-1, 1]: the loss declares ``needs_cosine_head`` so that the trainable
builds a normalized classifier head. s in (0, 128] (scale), m in [0, 1] (margin).
Shapes: x (M, C) cosines, t (M,) -> (M,).
"""

from __future__ import annotations

from torch import Tensor

from ._base import Loss, LossOutput, check_range, class_index, margin_cross_entropy, mean_over_rows


def am_softmax_loss(logits: Tensor, target: Tensor, *, s: float, m: float) -> Tensor:
    return margin_cross_entropy(logits, target, margin=m, scale=s)


class AMSoftmaxLoss(Loss):
    name = "am_softmax"
    kinds = frozenset({"multiclass", "token"})
    needs_cosine_head = True

    def __init__(self, s: float = 10.0, m: float = 0.3) -> None:
        super().__init__()
        self.s = check_range("s", s, 0.0, 128.0, lo_open=True)
        self.m = check_range("m", m, 0.0, 1.0)

    def compute(self, x: Tensor, target: Tensor, groups: int = 1) -> LossOutput:
        return mean_over_rows(am_softmax_loss(x, class_index(target), s=self.s, m=self.m), target,
                              groups=groups)
