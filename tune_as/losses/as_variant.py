"""AS-variant: the AS-Softmax rule on logits instead of probabilities (AS-Softmax paper, Eq. 8, Appendix A.1).

A competitor i != t is dropped once o_t - o_i >= delta' (Eq. 8); then, as in Eq. 7,

    L = log sum_{j: z_j = 1} exp(o_j) - o_t

A row with every competitor dropped has loss exactly 0 (masked, counted in n_masked). delta' in [0, 100]
(no upper bound in the paper; beyond the logit range it equals softmax). delta' is a margin on logits,
not AS-Softmax's delta: the AS warm-up (delta = 1) does not apply to it (no ``supports_warmup``).
Shapes: x (M, C), t (M,) -> losses (M,), masked (M,).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ._base import Loss, LossOutput, check_range, class_index, mean_over_rows


def as_variant_loss(logits: Tensor, target: Tensor, *, delta: float) -> tuple[Tensor, Tensor]:
    t1 = target[:, None]
    o_t = logits.gather(1, t1)  # (M, 1)
    keep = logits > o_t - delta  # (M, C): o_t - o_i < delta'
    keep.scatter_(1, t1, True)
    kept = torch.where(keep, logits, -torch.inf)
    masked = keep.sum(dim=1) == 1
    loss = torch.logsumexp(kept, dim=1) - o_t.squeeze(1)
    return torch.where(masked, 0.0, loss), masked


class ASVariantLoss(Loss):
    name = "as_variant"
    kinds = frozenset({"multiclass", "token"})
    masks_rows = True

    def __init__(self, delta: float = 2.0) -> None:
        super().__init__()
        self.delta = check_range("delta", delta, 0.0, 100.0)

    def compute(self, x: Tensor, target: Tensor, groups: int = 1) -> LossOutput:
        rows, masked = as_variant_loss(x, class_index(target), delta=self.delta)
        return mean_over_rows(rows, target, masked, groups)
