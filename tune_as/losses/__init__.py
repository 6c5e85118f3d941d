"""The loss library: every softmax variant of the papers behind one registry.

    from tune_as.losses import LOSSES, build_loss, LossOutput
    loss_fn = build_loss("as_softmax", delta=0.3)   # nn.Module; unknown name / bad value -> ValueError
    out = loss_fn(logits, target)                    # LossOutput(loss, n_rows, n_masked)
    loss_fn.supports_warmup, loss_fn.set_warmup(True)            # AS warm-up: delta = 1 while active
    loss_fn.supports_row_skipping, loss_fn.masked_examples(logits, target)  # (N,) bool
    loss_fn.make_accumulator()                       # AS-Speed's Eq. 19 schedule, or None

See docs/losses.md for each loss's formula, paper and equation, and hyper-parameter ranges.
"""

from __future__ import annotations

import inspect
from typing import Any

from ._base import IGNORE_INDEX, KINDS, Loss, LossOutput
from .am_softmax import AMSoftmaxLoss
from .as_softmax import ASSoftmaxLoss
from .as_speed import ASSpeedLoss
from .as_variant import ASVariantLoss
from .bce import BCELoss
from .entmax15 import Entmax15Loss
from .label_smoothing import LabelSmoothingLoss
from .multilabel_as_softmax import MultilabelASSoftmaxLoss
from .multilabel_softmax import MultilabelSoftmaxLoss
from .multilabel_sparse_softmax import MultilabelSparseSoftmaxLoss
from .multilabel_t_softmax import MultilabelTSoftmaxLoss
from .sm_softmax import SMSoftmaxLoss
from .sm_taylor_softmax import SMTaylorSoftmaxLoss
from .softmax import SoftmaxLoss
from .sparse_softmax import SparseSoftmaxLoss
from .sparsemax import SparsemaxLoss
from .t_softmax import TSoftmaxLoss
from .taylor_softmax import TaylorSoftmaxLoss

LOSSES: dict[str, type[Loss]] = {
    cls.name: cls
    for cls in (
        SoftmaxLoss, TSoftmaxLoss, LabelSmoothingLoss, ASSoftmaxLoss, ASSpeedLoss, ASVariantLoss,
        SparseSoftmaxLoss, SparsemaxLoss, Entmax15Loss, AMSoftmaxLoss, TaylorSoftmaxLoss, SMSoftmaxLoss,
        SMTaylorSoftmaxLoss, MultilabelSoftmaxLoss, MultilabelASSoftmaxLoss, MultilabelSparseSoftmaxLoss,
        MultilabelTSoftmaxLoss, BCELoss,
    )
}


def build_loss(name: str, **hparams: Any) -> Loss:
    """The loss registered as ``name`` with the given hyper-parameters; ValueError for a bad name or value."""
    if name not in LOSSES:
        raise ValueError(f"unknown loss {name!r}; expected one of {sorted(LOSSES)}")
    cls = LOSSES[name]
    accepted = set(inspect.signature(cls.__init__).parameters) - {"self"}
    unknown = sorted(set(hparams) - accepted)
    if unknown:
        raise ValueError(f"loss {name!r} takes hyper-parameters {sorted(accepted)}, got unknown {unknown}")
    return cls(**hparams)


def row_skipping_problem(name: str) -> str | None:
    """Why ``skip_masked_rows`` cannot be true for loss ``name`` (one line), or None when it can: the one rule
    the plan (before anything runs) and a trial (given a config by hand) both apply."""
    if LOSSES[name].supports_row_skipping:
        return None
    able = sorted(n for n, cls in LOSSES.items() if cls.supports_row_skipping)
    return f"skip_masked_rows: expected false for {name} (only {able} can skip masked rows), got true"


__all__ = ["IGNORE_INDEX", "KINDS", "LOSSES", "Loss", "LossOutput", "build_loss", "row_skipping_problem"]
