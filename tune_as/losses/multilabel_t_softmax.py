"""Multi-label T-Softmax: Eq. 14 (Su's multi-label softmax cross-entropy) on temperature-scaled logits.

    L = log(1 + sum_{i in Omega_neg} exp(o_i / tau)) + log(1 + sum_{t in Omega_pos} exp(-o_t / tau))

The AS-Softmax paper runs T-Softmax on Eurlex (tau = 1) and WOS-46985 (tau = 0.5) (Tables 2 and 6) but
defines it only for one target (Eq. 20: softmax of o / tau); this is that temperature applied to the
multi-label loss the paper uses for softmax there (Eq. 14). The decision rule o > 0 is unchanged by tau.
tau in (0, 100]; tau = 1 is ``multilabel_softmax``. Shapes: x (N, C), y (N, C) multi-hot -> LossOutput.
"""

from __future__ import annotations

from torch import Tensor

from ._base import Loss, LossOutput, check_range
from ._su import su_loss


def multilabel_t_softmax_loss(logits: Tensor, target: Tensor, *, tau: float, groups: int = 1) -> LossOutput:
    return su_loss(logits, target, scale=1.0 / tau, groups=groups)


class MultilabelTSoftmaxLoss(Loss):
    name = "multilabel_t_softmax"
    kinds = frozenset({"multilabel"})
    masks_rows = True

    def __init__(self, tau: float = 1.0) -> None:
        super().__init__()
        self.tau = check_range("tau", tau, 0.0, 100.0, lo_open=True)

    def compute(self, x: Tensor, target: Tensor, groups: int = 1) -> LossOutput:
        return multilabel_t_softmax_loss(x, target, tau=self.tau, groups=groups)
