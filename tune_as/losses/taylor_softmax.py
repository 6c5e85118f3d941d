"""Taylor softmax cross-entropy (softmax-alternatives paper, Eq. 3-6).

    f^n(z) = sum_{i=0}^{n} z^i / i!                  (Eq. 3; > 0 for even n)
    Tsm^n(z)_i = f^n(z_i) / sum_j f^n(z_j)           (Eq. 4),   L = -log Tsm^n(z)_t

``backward="finite"``: the exact gradient of L (Eq. 5),
f^{n-1}(z_i) / sum_j f^n(z_j) - y_i f^{n-1}(z_i) / f^n(z_i).
``backward="inf"`` (Taylor_inf): the softmax-like gradient Tsm^n(z)_i - y_i (Eq. 6), exact only as n -> inf.
n is an even int in [2, 16]. f^n overflows fp32 for |z| beyond about (n! 1e38)^(1/n) (1.4e19 for n = 2,
3e4 for n = 10). Shapes: x (M, C), t (M,) -> (M,).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ._base import Loss, LossOutput, check_int, class_index, mean_over_rows

BACKWARDS = ("finite", "inf")


def taylor_exp(z: Tensor, n: int) -> Tensor:
    """f^n(z) = sum_{i=0}^n z^i / i!, by Horner's rule: 1 + z (1 + z/2 (1 + ... (1 + z/n)))."""
    f = torch.ones_like(z)
    for i in range(n, 0, -1):
        f = 1.0 + (z / i) * f
    return f


def taylor_probs(logits: Tensor, target: Tensor, n: int, margin: float = 0.0) -> Tensor:
    """Tsm^n with the target logit lowered by ``margin`` (SM-Taylor, softmax-alternatives Sec. 2.4):
    (M, C)."""
    z = (logits if margin == 0.0
         else logits.scatter_add(1, target[:, None], torch.full_like(logits[:, :1], -margin)))
    f = taylor_exp(z, n)  # (M, C), positive
    return f / f.sum(dim=1, keepdim=True)


class _TaylorInfFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, t: Tensor, n: int) -> Tensor:
        q = taylor_probs(x, t, n)
        ctx.save_for_backward(q, t)
        return -torch.log(q.gather(1, t[:, None])).squeeze(1)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:
        q, t = ctx.saved_tensors
        out = q.scatter_add(1, t[:, None], torch.full_like(q[:, :1], -1.0))  # Tsm - y (Eq. 6)
        return out * grad[:, None], None, None


def taylor_softmax_loss(logits: Tensor, target: Tensor, *, n: int, backward: str) -> Tensor:
    if backward == "inf":
        return _TaylorInfFunction.apply(logits, target, n)
    return -torch.log(taylor_probs(logits, target, n).gather(1, target[:, None])).squeeze(1)


class TaylorSoftmaxLoss(Loss):
    name = "taylor_softmax"
    kinds = frozenset({"multiclass", "token"})

    def __init__(self, n: int = 2, backward: str = "finite") -> None:
        super().__init__()
        self.n = check_int("n", n, 2, 16, even=True)
        if backward not in BACKWARDS:
            raise ValueError(f"backward must be one of {list(BACKWARDS)}, got {backward!r}")
        self.backward = backward

    def compute(self, x: Tensor, target: Tensor, groups: int = 1) -> LossOutput:
        return mean_over_rows(taylor_softmax_loss(x, class_index(target), n=self.n, backward=self.backward),
                              target, groups=groups)

    def class_scores(self, logits: Tensor) -> Tensor:
        return taylor_class_scores(logits, self.n)


def taylor_class_scores(logits: Tensor, n: int) -> Tensor:
    """f^n(z), the numerator of Tsm^n (Eq. 4): the class with the largest Taylor probability is predicted. f^n
    is not increasing (for even n it is smallest near z = -1 and grows again below), so a model trained on a
    Taylor loss can give its target class a large negative logit: the argmax of the logits would then miss it
    (SM-Taylor, n = 2, m >= 0.5 reached 0% validation accuracy on clinc_oos that way;
    docs/bench_efficiency.md)."""
    return taylor_exp(logits.float(), n)
