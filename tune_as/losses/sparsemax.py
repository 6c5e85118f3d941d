"""Sparsemax loss (Martins & Astudillo 2016, Eq. 18), via the ``entmax`` package.

    p* = sparsemax(z) = argmin_{p in simplex} ||p - z||^2
    L  = -z_t + 1/2 sum_{j: p*_j > 0} (z_j^2 - tau(z)^2) + 1/2,   the Fenchel-Young loss of p*

ignore_index rows are filtered by the base class before ``entmax`` sees them (the package mishandles
-100). Computed in fp32 (entmax gives NaN in bf16). Shapes: x (M, C), t (M,) -> (M,).
"""

from __future__ import annotations

from entmax import sparsemax_loss as _entmax_sparsemax_loss
from torch import Tensor

from ._base import Loss


def sparsemax_loss(logits: Tensor, target: Tensor) -> Tensor:
    return _entmax_sparsemax_loss(logits, target)


class SparsemaxLoss(Loss):
    name = "sparsemax"
    kinds = frozenset({"multiclass", "token"})

    def rows(self, x: Tensor, t: Tensor) -> tuple[Tensor, None]:
        return sparsemax_loss(x, t), None
