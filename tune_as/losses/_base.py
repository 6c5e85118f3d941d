"""Shared input handling for every loss: the three input kinds, ignore_index, the mean over counted rows.

Input kinds (C classes):
- ``multiclass``: logits (N, C), target (N,) int
- ``token``:      logits (N, T, C), target (N, T) int, ``-100`` marks a position that does not count
- ``multilabel``: logits (N, C), target (N, C) multi-hot (float, int or bool)

A loss subclasses :class:`Loss` and implements ``rows`` (int targets) and/or ``multilabel_rows``
(multi-hot targets); each returns per-row losses (M,) and a bool (M,) "masked" vector or ``None``.
"""

from __future__ import annotations

import inspect
import math
from typing import TYPE_CHECKING, ClassVar, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

if TYPE_CHECKING:
    from ..accumulation import AdaptiveAccumulation

IGNORE_INDEX = -100
KINDS = frozenset({"multiclass", "token", "multilabel"})


class LossOutput(NamedTuple):
    loss: Tensor  # scalar fp32 (fp64 for fp64 logits): mean over rows that count
    n_rows: Tensor  # 0-dim int64: rows (tokens) that counted
    n_masked: Tensor  # 0-dim int64: counted rows whose loss is exactly 0 (every competitor dropped)


def input_kind(logits: Tensor, target: Tensor) -> str:
    """Which of the three input kinds (logits, target) is; ValueError when it is none of them."""
    if logits.dim() == 2 and target.dim() == 1 and target.shape[0] == logits.shape[0]:
        return "multiclass"
    if logits.dim() == 3 and target.dim() == 2 and target.shape == logits.shape[:2]:
        return "token"
    if logits.dim() == 2 and target.shape == logits.shape:
        return "multilabel"
    raise ValueError(
        "expected logits (N, C) with target (N,) or (N, C), or logits (N, T, C) with target (N, T); "
        f"got logits {tuple(logits.shape)} and target {tuple(target.shape)}"
    )


def check_range(
    name: str, value: float, lo: float, hi: float, *, lo_open: bool = False, hi_open: bool = False
) -> float:
    """``value`` as a float if it lies in [lo, hi] (ends excluded by ``lo_open`` / ``hi_open``), else ValueError."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a number, got {value!r}")
    v = float(value)
    if not (math.isfinite(v) and (v > lo if lo_open else v >= lo) and (v < hi if hi_open else v <= hi)):
        interval = f"{'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}"
        raise ValueError(f"{name} must be in {interval}, got {value!r}")
    return v


def check_int(name: str, value: int, lo: int, hi: int, *, even: bool = False) -> int:
    """``value`` if it is an int in [lo, hi] (and even when asked), else ValueError."""
    ok = isinstance(value, int) and not isinstance(value, bool) and lo <= value <= hi
    if not ok or (even and value % 2):
        kind = "an even integer" if even else "an integer"
        raise ValueError(f"{name} must be {kind} in [{lo}, {hi}], got {value!r}")
    return value


def softmax_rows(x: Tensor, row_max: Tensor | None = None) -> Tensor:
    """softmax(x) over dim 1, in a new tensor. PyTorch's fused CPU kernel is fast except for short rows
    (C < 16: 6x slower than these three passes at (4096, 9)); ``row_max`` (M, 1) if already known."""
    if x.shape[1] >= 16:
        return torch.softmax(x, dim=1)
    e = torch.sub(x, x.amax(dim=1, keepdim=True) if row_max is None else row_max).exp_()
    return e.div_(e.sum(dim=1, keepdim=True))


def margin_cross_entropy(x: Tensor, t: Tensor, margin: float, scale: float = 1.0) -> Tensor:
    """-log softmax(scale * (x - margin * onehot(t)))[t] per row: AM-Softmax (Eq. 21), SM-Softmax (Eq. 8)."""
    z = x.scatter_add(1, t[:, None], torch.full_like(x[:, :1], -margin))  # (M, C)
    return F.cross_entropy(z * scale if scale != 1.0 else z, t, reduction="none")


class DeltaMixin:
    """A validated, settable ``delta`` in [0, 1] (AS-Softmax family): the training loop owns its schedule."""

    _delta: float

    @property
    def delta(self) -> float:
        return self._delta

    @delta.setter
    def delta(self, value: float) -> None:
        self._delta = check_range("delta", value, 0.0, 1.0)


class Loss(nn.Module):
    """Base class: ``forward(logits, target) -> LossOutput``; subclasses implement the per-row maths."""

    name: ClassVar[str]
    kinds: ClassVar[frozenset[str]]
    needs_cosine_head: ClassVar[bool] = False

    def __init__(self) -> None:  # no hyper-parameters unless a subclass declares them
        super().__init__()

    def hparams(self) -> dict[str, float | int | str]:
        """The current hyper-parameters, under the keyword names of ``__init__`` (= ``build_loss``)."""
        names = [n for n in inspect.signature(type(self).__init__).parameters if n != "self"]
        return {n: getattr(self, n) for n in names}

    def make_accumulator(self) -> AdaptiveAccumulation | None:
        """The AS-Speed accumulation schedule (``as_speed``); None: one micro-batch per optimizer step."""
        return None

    def rows(self, x: Tensor, t: Tensor) -> tuple[Tensor, Tensor | None]:
        """x (M, C) float, t (M,) int64 valid class indices -> losses (M,), masked (M,) bool or None."""
        raise NotImplementedError

    def multilabel_rows(self, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor | None]:
        """x (N, C) float, y (N, C) multi-hot in {0, 1} of x's dtype -> losses (N,), masked or None."""
        raise NotImplementedError

    def extra_repr(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.hparams().items())

    def forward(self, logits: Tensor, target: Tensor) -> LossOutput:
        kind = input_kind(logits, target)
        if kind not in self.kinds:
            raise ValueError(f"loss {self.name!r} supports {sorted(self.kinds)} inputs, got {kind!r}")
        # Losses are computed in fp32 (fp64 kept for gradcheck): bf16/fp16 exp and 1e12 sentinels overflow.
        if torch.is_autocast_enabled(logits.device.type):
            with torch.autocast(logits.device.type, enabled=False):
                return self._compute(logits.float(), target, kind)
        x = logits if logits.dtype in (torch.float32, torch.float64) else logits.float()
        return self._compute(x, target, kind)

    def _compute(self, x: Tensor, target: Tensor, kind: str) -> LossOutput:
        if kind != "multilabel":
            t = target.reshape(-1).long()
            return self.mean_over_rows(x.reshape(t.shape[0], -1), t)
        rows, masked = self.multilabel_rows(x, target.to(x.dtype))
        n_rows = torch.full((), rows.shape[0], dtype=torch.int64, device=x.device)
        return LossOutput(rows.sum() / max(rows.shape[0], 1), n_rows, count(masked, x.device))

    def mean_over_rows(self, x: Tensor, t: Tensor) -> LossOutput:
        """x (M, C), t (M,) int64 with -100 for ignored rows -> the mean over the other rows.

        Ignored rows get class 0 for ``rows`` and are then zeroed. A loss may override this to fuse the
        reduction into its own kernel (``as_softmax``)."""
        valid = t != IGNORE_INDEX
        rows, masked = self.rows(x, torch.where(valid, t, 0))
        n_rows = valid.sum()
        loss = torch.where(valid, rows, 0.0).sum() / n_rows.clamp(min=1)
        return LossOutput(loss, n_rows, count(masked & valid if masked is not None else None, x.device))


def count(masked: Tensor | None, device: torch.device) -> Tensor:
    """The number of masked rows as a 0-dim int64 tensor (0 for a loss without masking)."""
    return masked.sum() if masked is not None else torch.zeros((), dtype=torch.int64, device=device)
