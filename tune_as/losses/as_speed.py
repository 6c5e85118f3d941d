"""AS-Speed: AS-Softmax trained with adaptive gradient accumulation (AS-Softmax paper, Sections 3.2-3.3).

The loss is AS-Softmax (Eq. 5-7; multi-label inputs: Eq. 15-18, as the paper runs AS-Speed on Eurlex
and WOS); ``make_accumulator()`` returns the Eq. 19 schedule, steps = lambda N_all / (N_all - N_masked)
with the three restrictions (see ``tune_as.losses.accumulation``, which also owns the ranges of lam and
max_steps). A registry entry of its own, as in the paper's tables. delta in [0, 1].
Shapes: as ``as_softmax`` (multiclass, token) and ``multilabel_as_softmax`` (multilabel).
"""

from __future__ import annotations

from torch import Tensor

from ._base import LossOutput
from .accumulation import AdaptiveAccumulation, check_schedule
from .as_softmax import ASSoftmaxLoss, as_softmax_loss, as_softmax_masked
from .multilabel_as_softmax import multilabel_as_softmax_loss, multilabel_as_softmax_masked


class ASSpeedLoss(ASSoftmaxLoss):
    name = "as_speed"
    kinds = frozenset({"multiclass", "token", "multilabel"})

    def __init__(self, delta: float = 0.3, lam: float = 0.5, max_steps: int = 4) -> None:
        super().__init__(delta)
        self.lam, self.max_steps = check_schedule(lam, max_steps)

    def make_accumulator(self) -> AdaptiveAccumulation:
        return AdaptiveAccumulation(self.lam, self.max_steps)

    def compute(self, x: Tensor, target: Tensor, groups: int = 1) -> LossOutput:
        if target.dim() == 2:  # multi-hot
            return multilabel_as_softmax_loss(x, target, delta=self.delta, groups=groups)
        return as_softmax_loss(x, target, delta=self.delta, groups=groups)

    def masked_rows(self, x: Tensor, target: Tensor) -> Tensor:
        if target.dim() == 2:
            return multilabel_as_softmax_masked(x, target, delta=self.delta)
        return as_softmax_masked(x, target, delta=self.delta)
