"""AS-Speed: AS-Softmax trained with adaptive gradient accumulation (AS-Softmax paper, Sections 3.2-3.3).

The loss is AS-Softmax (Eq. 5-7; multi-label inputs: Eq. 15-18, as the paper runs AS-Speed on Eurlex
and WOS); ``make_accumulator()`` returns the Eq. 19 schedule, steps = lambda N_all / (N_all - N_masked)
with the three restrictions (see ``tune_as.accumulation``). A registry entry of its own, as in the
paper's tables. delta in [0, 1]; lam in (0, 16]; max_steps an int in [1, 64].
Shapes: as ``as_softmax`` (multiclass, token) and ``multilabel_as_softmax`` (multilabel).
"""

from __future__ import annotations

from torch import Tensor

from ..accumulation import AdaptiveAccumulation
from ._base import check_int, check_range
from .as_softmax import ASSoftmaxLoss
from .multilabel_as_softmax import multilabel_as_softmax_loss


class ASSpeedLoss(ASSoftmaxLoss):
    name = "as_speed"
    kinds = frozenset({"multiclass", "token", "multilabel"})

    def __init__(self, delta: float = 0.3, lam: float = 0.5, max_steps: int = 4) -> None:
        super().__init__(delta)
        self.lam = check_range("lam", lam, 0.0, 16.0, lo_open=True)
        self.max_steps = check_int("max_steps", max_steps, 1, 64)

    def make_accumulator(self) -> AdaptiveAccumulation:
        return AdaptiveAccumulation(self.lam, self.max_steps)

    def multilabel_rows(self, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        return multilabel_as_softmax_loss(x, y, delta=self.delta)
