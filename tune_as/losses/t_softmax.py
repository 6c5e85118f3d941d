"""T-Softmax: cross-entropy on temperature-scaled logits (AS-Softmax paper, Appendix A.3, Eq. 20).

    p_i = exp(o_i / tau) / sum_j exp(o_j / tau),   L = -log p_t

tau in (0, 100]; tau = 1 is plain softmax. Shapes: x (M, C), t (M,) (-100: ignored) -> LossOutput.
"""

from __future__ import annotations

from torch import Tensor

from ._base import Loss, LossOutput, check_range
from .softmax import softmax_loss


def t_softmax_loss(logits: Tensor, target: Tensor, *, tau: float, groups: int = 1) -> LossOutput:
    return softmax_loss(logits / tau if tau != 1.0 else logits, target, groups)


class TSoftmaxLoss(Loss):
    name = "t_softmax"
    kinds = frozenset({"multiclass", "token"})

    def __init__(self, tau: float = 1.0) -> None:
        super().__init__()
        self.tau = check_range("tau", tau, 0.0, 100.0, lo_open=True)

    def compute(self, x: Tensor, target: Tensor, groups: int = 1) -> LossOutput:
        return t_softmax_loss(x, target, tau=self.tau, groups=groups)
