"""Multi-label Sparse-Softmax: the top-k idea of Sparse-Softmax (Sun et al. 2021, Eq. 4-5) applied to Eq. 14.

    L = log(1 + sum_{i in Omega_neg^k} exp(o_i)) + log(1 + sum_{t in Omega_pos} exp(-o_t))

Omega_neg^k: the k highest-scoring negative classes (all negatives when there are at most k). As in
Eq. 5, where only the strongest competitors stay in the normalizer, the top-k cut applies to the
competitors (negatives); every positive keeps its term. k is an int in [1, 100000]; k >= C is
``multilabel_softmax``. Shapes: x (N, C), y (N, C) multi-hot -> LossOutput. Kernel: ``_su`` (the negatives'
softmax runs over their top k only; backward scatters it back).
"""

from __future__ import annotations

from torch import Tensor

from ._base import Loss, LossOutput, check_int, zero_count
from ._su import su_loss


def multilabel_sparse_softmax_loss(logits: Tensor, target: Tensor, *, k: int, groups: int = 1) -> LossOutput:
    out = su_loss(logits, target, k=k, groups=groups)
    # masks_rows is not declared: the shared zero
    return out._replace(n_masked=zero_count(out.loss.device, groups))


class MultilabelSparseSoftmaxLoss(Loss):
    name = "multilabel_sparse_softmax"
    kinds = frozenset({"multilabel"})

    def __init__(self, k: int = 10) -> None:
        super().__init__()
        self.k = check_int("k", k, 1, 100_000)

    def compute(self, x: Tensor, target: Tensor, groups: int = 1) -> LossOutput:
        return multilabel_sparse_softmax_loss(x, target, k=self.k, groups=groups)
