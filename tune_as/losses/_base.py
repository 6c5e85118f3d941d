"""The loss contract: one hook, one return type, one reducer, and the capabilities a loss declares.

Input kinds (C classes):
- ``multiclass``: logits (N, C), target (N,) int
- ``token``:      logits (N, T, C), target (N, T) int, ``-100`` marks a position that does not count
- ``multilabel``: logits (N, C), target (N, C) multi-hot (float, int or bool)

``Loss.forward`` checks the kind, casts to fp32 (fp64 kept), flattens token input to rows and calls the one
hook every loss implements, ``compute(x, target, groups) -> LossOutput``: x (M, C); target (M,) int64
with -100 for rows that do not count, or (M, C) multi-hot in x's dtype. A loss defined row by row computes
per-row losses (its pure ``xxx_loss`` function) and hands them to the one reducer, ``mean_over_rows``;
``softmax``, the AS-Softmax family and Eq. 14 reduce inside their fused kernels, with the reducer's semantics
(tested).

``groups``: the M rows are G consecutive blocks of M / G rows, each reduced on its own (``LossOutput`` of (G,)
tensors). ``Loss.forward_members`` uses it for a population (tune_as.training.population): P members' batches
in one call, each member's loss, counts and gradient its own, where P calls would pay P times the launches and
the Python of a small loss (GPU: launch-bound at these sizes, docs/benchmarks.md). G = 1: 0-dim tensors.

Capabilities are declared on the class, never probed with ``getattr``:
- ``supports_warmup``: ``set_warmup(active)`` makes the loss plain cross-entropy (delta = 1) while active.
- ``masks_rows``: the loss can report ``n_masked > 0`` (rows with loss 0 and gradient 0); every other loss
  always returns the shared zero count, so a training loop never needs to read it (tested for every loss).
- ``supports_row_skipping``: ``masked_examples(logits, target)`` says which examples have loss 0 and
  gradient 0.
- ``make_accumulator()``: the AS-Speed schedule, or None.
- ``needs_cosine_head``: the loss expects cosine logits (AM-Softmax).
Calling ``set_warmup`` or ``masked_examples`` on a loss without the capability is a ``TypeError``.
"""

from __future__ import annotations

import inspect
import math
from typing import TYPE_CHECKING, ClassVar, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

if TYPE_CHECKING:
    from .accumulation import AdaptiveAccumulation

IGNORE_INDEX = -100
KINDS = frozenset({"multiclass", "token", "multilabel"})


class LossOutput(NamedTuple):
    # fp32 (fp64 for fp64 logits): mean over rows that count; 0 when none does. 0-dim, (G,) by group
    loss: Tensor
    n_rows: Tensor  # int64, loss's shape: rows (tokens) that counted
    n_masked: Tensor  # int64, loss's shape: counted rows whose loss is exactly 0 with gradient 0 (AS family)


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
    """``value`` as a float if it lies in [lo, hi] (ends excluded by ``lo_open`` / ``hi_open``), else
    ValueError."""
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


def class_index(target: Tensor) -> Tensor:
    """Targets (M,) with every -100 replaced by class 0, so that per-row code can index with them; the
    reducer then gives those rows weight 0."""
    return target.masked_fill(target == IGNORE_INDEX, 0)


def margin_cross_entropy(x: Tensor, t: Tensor, margin: float, scale: float = 1.0) -> Tensor:
    """-log softmax(scale * (x - margin * onehot(t)))[t] per row: AM-Softmax (Eq. 21), SM-Softmax (Eq. 8)."""
    z = x.scatter_add(1, t[:, None], torch.full_like(x[:, :1], -margin))  # (M, C)
    return F.cross_entropy(z * scale if scale != 1.0 else z, t, reduction="none")


_ZEROS: dict[tuple[torch.device, int], Tensor] = {}


def zero_count(device: torch.device, groups: int = 1) -> Tensor:
    """int64 zeros (0-dim; (groups,) for groups > 1), the n_masked of a loss that masks nothing: one per
    device and shape, shared, so no loss call pays for a new one. An inference tensor: an in-place update
    outside inference mode raises."""
    zero = _ZEROS.get((device, groups))
    if zero is None:
        with torch.inference_mode():
            shape = () if groups == 1 else (groups,)
            zero = _ZEROS[device, groups] = torch.zeros(shape, dtype=torch.int64, device=device)
    return zero


def by_group(values: Tensor, groups: int) -> Tensor:
    """Per-row values (M,) or (M, 1) -> their sum (0-dim) for groups == 1, else their sums (groups,) over
    consecutive blocks of M / groups rows."""
    return values.sum() if groups == 1 else values.reshape(groups, -1).sum(dim=1)


def mean_over_rows(rows: Tensor, target: Tensor, masked: Tensor | None = None, groups: int = 1) -> LossOutput:
    """The one reducer: per-row losses (M,) -> their mean over the rows that count, with the counts (per group
    of M / groups consecutive rows: (groups,) tensors for groups > 1).

    ``target`` is the loss's target: (M,) int with -100 for rows that do not count (their per-row loss,
    computed on ``class_index``, is discarded), or (M, C) multi-hot (every row counts). ``masked`` (M,) bool
    marks rows whose loss is exactly 0 (None: the loss masks no row). No row counted: loss 0, gradient 0."""
    if target.dim() == 2:
        n = rows.shape[0] // groups
        loss = by_group(rows, groups) / max(n, 1)
        n_rows = torch.full(loss.shape, n, dtype=torch.int64, device=rows.device)
    else:
        valid = target != IGNORE_INDEX
        n_rows = by_group(valid, groups)
        loss = by_group(torch.where(valid, rows, 0.0), groups) / n_rows.clamp(min=1)
        masked = masked & valid if masked is not None else None
    n_masked = by_group(masked, groups) if masked is not None else zero_count(rows.device, groups)
    return LossOutput(loss, n_rows, n_masked)


class Loss(nn.Module):
    """Base class: ``forward(logits, target) -> LossOutput``; a subclass implements ``compute``."""

    name: ClassVar[str]
    kinds: ClassVar[frozenset[str]]
    needs_cosine_head: ClassVar[bool] = False
    masks_rows: ClassVar[bool] = False
    supports_warmup: ClassVar[bool] = False
    supports_row_skipping: ClassVar[bool] = False

    def __init__(self) -> None:  # no hyper-parameters unless a subclass declares them
        super().__init__()

    def compute(self, x: Tensor, target: Tensor, groups: int = 1) -> LossOutput:
        """x (M, C) fp32/fp64; target (M,) int64 (-100: does not count) or (M, C) multi-hot of x's dtype;
        reduced per group of M / groups consecutive rows (the module docstring)."""
        raise NotImplementedError

    def hparams(self) -> dict[str, float | int | str]:
        """The current hyper-parameters, under the keyword names of ``__init__`` (= ``build_loss``)."""
        names = [n for n in inspect.signature(type(self).__init__).parameters if n != "self"]
        return {n: getattr(self, n) for n in names}

    def make_accumulator(self) -> AdaptiveAccumulation | None:
        """The AS-Speed accumulation schedule (``as_speed``); None: one micro-batch per optimizer step."""
        return None

    def class_scores(self, logits: Tensor) -> Tensor:
        """Scores whose argmax over the last dim is the loss's predicted class: any increasing function of the
        loss's own class probabilities. The logits themselves for every loss whose probabilities increase with
        the logit (softmax and its variants, sparsemax, entmax, cosine logits); the Taylor family overrides
        it. Multi-label tasks predict every class whose score is > 0 (docs/losses.md, "Multi-label
        prediction"), so a multi-label loss's scores must also keep the sign of its decision: its logits for
        Eq. 14 and its variants (o > 0) and for bce (sigmoid(o) > 0.5 iff o > 0)."""
        return logits

    def set_warmup(self, active: bool) -> None:
        """AS warm-up (``supports_warmup``): delta = 1, i.e. cross-entropy, while active; the searched delta
        after."""
        raise TypeError(f"loss {self.name!r} has no warm-up (supports_warmup is False)")

    def masked_rows(self, x: Tensor, target: Tensor) -> Tensor:
        """(M,) bool, flattened input as ``compute``: True for a row with loss 0 and gradient 0, or that does
        not count. Implemented by the losses with ``supports_row_skipping``."""
        raise TypeError(f"loss {self.name!r} masks no rows (supports_row_skipping is False)")

    @torch.no_grad()
    def masked_examples(self, logits: Tensor, target: Tensor) -> Tensor:
        """(N,) bool, one per example (first dim): True iff each of its counted rows is masked, i.e. its loss
        is exactly 0 with gradient exactly 0 at the current delta (an example with no counted row is True).
        Agrees exactly with ``n_masked``. TypeError unless ``supports_row_skipping``."""
        if not self.supports_row_skipping:
            raise TypeError(f"loss {self.name!r} masks no rows (supports_row_skipping is False)")
        x, t = self._flatten(logits, target)
        if torch.is_autocast_enabled(x.device.type):
            with torch.autocast(x.device.type, enabled=False):
                rows = self.masked_rows(x, t)
        else:
            rows = self.masked_rows(x, t)
        return rows.reshape(logits.shape[0], -1).all(dim=1)

    def extra_repr(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.hparams().items())

    def forward(self, logits: Tensor, target: Tensor) -> LossOutput:
        return self._compute(*self._flatten(logits, target), 1)

    def forward_members(self, logits: Tensor, target: Tensor) -> LossOutput:
        """P independent batches in one call: logits (P, N, C) with target (P, N) int or (P, N, C) multi-hot
        -> LossOutput of (P,) tensors, member i's equal to ``forward(logits[i], target[i])`` up to float
        rounding; the gradient of ``loss`` weighted by w (P,) is each member's own gradient times w_i."""
        if logits.dim() != 3 or target.dim() < 2 or target.shape[:2] != logits.shape[:2]:
            raise ValueError("forward_members: expected logits (P, N, C) with target (P, N) or (P, N, C), "
                             f"got logits {tuple(logits.shape)} and target {tuple(target.shape)}")
        members = logits.shape[0]
        rows = logits.reshape(-1, logits.shape[-1])
        out = self._compute(*self._flatten(rows, target.reshape(rows.shape[0], *target.shape[2:])), members)
        return LossOutput(*(v.reshape(1) for v in out)) if members == 1 else out  # (P,) for one member too

    def _compute(self, x: Tensor, t: Tensor, groups: int) -> LossOutput:
        # Losses are computed in fp32 (fp64 kept for gradcheck): bf16/fp16 exp and large sentinels overflow.
        if torch.is_autocast_enabled(x.device.type):
            with torch.autocast(x.device.type, enabled=False):
                return self.compute(x, t, groups)
        return self.compute(x, t, groups)

    def _flatten(self, logits: Tensor, target: Tensor) -> tuple[Tensor, Tensor]:
        """(x (M, C) fp32 or fp64, target (M,) int64 or (M, C) multi-hot of x's dtype); ValueError for a bad
        kind."""
        kind = input_kind(logits, target)
        if kind not in self.kinds:
            raise ValueError(f"loss {self.name!r} supports {sorted(self.kinds)} inputs, got {kind!r}")
        x = logits if logits.dtype in (torch.float32, torch.float64) else logits.float()
        if kind == "multilabel":
            return x, target if target.dtype == x.dtype else target.to(x.dtype)
        if kind == "token":
            x, target = x.reshape(-1, x.shape[-1]), target.reshape(-1)
        return x, target if target.dtype == torch.int64 else target.long()


class WarmupDelta:
    """A validated delta in [0, 1] with the AS warm-up (``supports_warmup``): ``delta`` reads the delta in
    use (1 while the warm-up is active); setting it sets the searched value, which ``hparams()`` reports."""

    supports_warmup: ClassVar[bool] = True
    _delta: float
    _warmup: bool = False

    @property
    def delta(self) -> float:
        return 1.0 if self._warmup else self._delta

    @delta.setter
    def delta(self, value: float) -> None:
        self._delta = check_range("delta", value, 0.0, 1.0)

    def set_warmup(self, active: bool) -> None:
        self._warmup = bool(active)

    def hparams(self) -> dict[str, float | int | str]:
        return {**super().hparams(), "delta": self._delta}  # type: ignore[misc]
