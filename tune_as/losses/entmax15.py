"""1.5-entmax loss (Peters et al. 2019, alpha = 1.5), via the ``entmax`` package (sort-based, exact).

    p* = 1.5-entmax(z) = argmax_{p in simplex} p.z + H^T_{1.5}(p),   [p*]_i = [z_i / 2 - tau]_+^2
    L  = (p* - e_t).z + H^T_{1.5}(p*),   the Fenchel-Young loss of p*

``entmax`` never sees -100 nor -inf logits (see ``sparsemax.py``). Computed in fp32.
Shapes: x (M, C), t (M,) -> (M,).
"""

from __future__ import annotations

from entmax import entmax15_loss as _entmax_entmax15_loss
from torch import Tensor

from ._base import Loss, LossOutput, class_index, mean_over_rows
from .sparsemax import finite_padding


def entmax15_loss(logits: Tensor, target: Tensor) -> Tensor:
    return _entmax_entmax15_loss(finite_padding(logits), target)


class Entmax15Loss(Loss):
    name = "entmax15"
    kinds = frozenset({"multiclass", "token"})

    def compute(self, x: Tensor, target: Tensor, groups: int = 1) -> LossOutput:
        return mean_over_rows(entmax15_loss(x, class_index(target)), target, groups=groups)
