"""AS-Speed: adaptive gradient accumulation from the masked-row ratio (AS-Softmax paper, Section 3.3, Eq. 19).

    steps_accum = lambda * N_all / (N_all - N_masked)                                    (Eq. 19)

re-evaluated when an accumulation cycle begins, from the rows observed since the previous evaluation,
rounded to an integer (Python's ``round``, half to even) and then restricted as the paper says:
(i) never below the previous value, (ii) at most 1 above it, (iii) at most ``max_steps``; at least 1.

A cycle in which every row was masked (N_masked = N_all > 0) makes Eq. 19 infinite: the restrictions
then give previous + 1 (capped). Such a cycle leaves an all-zero gradient: the training loop skips the
optimizer step (it counts the cycle's rows itself, tune_as.training.trial). Evaluations with no observed row
keep ``steps``.

Usage in a training loop::

    acc = AdaptiveAccumulation(lam=0.5, max_steps=5)
    while training:
        rows = masked = 0
        for _ in range(acc.steps):
            out = loss_fn(model(batch), labels); out.loss.backward()
            rows, masked = rows + out.n_rows, masked + out.n_masked
        # else every row was masked: a zero gradient, and AdamW would still move the weights
        if rows > masked:
            optimizer.step()
        optimizer.zero_grad()
        acc.observe(rows, masked)
        acc.cycle_start()

``observe`` accepts 0-dim tensors and only adds them up (no device sync); the sums are read once per
cycle, in ``cycle_start``.

The valid ranges of the two hyper-parameters are defined here, once (``check_schedule``); the ``as_speed``
loss validates its ``lam`` and ``max_steps`` with it.
"""

from __future__ import annotations

import math
from typing import Any

from torch import Tensor

Count = int | Tensor

LAM_RANGE = (0.0, 16.0)  # lam in (0, 16], open at 0 (the paper's Table 6 uses 0.5 to 1.5)
MAX_STEPS_RANGE = (1, 64)  # max_steps: an int in [1, 64] (the paper's s: 2 to 5)


def check_schedule(lam: float, max_steps: int) -> tuple[float, int]:
    """(lam as a float, max_steps) if lam is in (0, 16] and max_steps an int in [1, 64], else ValueError."""
    lo, hi = LAM_RANGE
    if (isinstance(lam, bool) or not isinstance(lam, (int, float))
            or not (math.isfinite(lam) and lo < lam <= hi)):
        raise ValueError(f"lam must be in ({lo:g}, {hi:g}], got {lam!r}")
    lo_steps, hi_steps = MAX_STEPS_RANGE
    if isinstance(max_steps, bool) or not isinstance(max_steps, int) or not lo_steps <= max_steps <= hi_steps:
        raise ValueError(f"max_steps must be an integer in [{lo_steps}, {hi_steps}], got {max_steps!r}")
    return float(lam), max_steps


class AdaptiveAccumulation:
    def __init__(self, lam: float, max_steps: int) -> None:
        self.lam, self.max_steps = check_schedule(lam, max_steps)
        self._steps = 1
        self._n_all: Count = 0  # rows observed since the last evaluation
        self._n_masked: Count = 0

    @property
    def steps(self) -> int:
        """Micro-batches to accumulate in the current cycle (1 = no accumulation)."""
        return self._steps

    def observe(self, n_rows: Count, n_masked: Count) -> None:
        """Count one micro-batch: rows that counted and rows that were masked (``LossOutput`` fields)."""
        self._n_all = self._n_all + n_rows
        self._n_masked = self._n_masked + n_masked

    def cycle_start(self) -> int:
        """Re-evaluate Eq. 19 with the three restrictions from the rows observed since the last call."""
        n_all, n_masked = int(self._n_all), int(self._n_masked)
        if not 0 <= n_masked <= n_all:
            raise ValueError(f"observed n_masked must be in [0, n_rows], got n_masked={n_masked}, "
                             f"n_rows={n_all}")
        if n_all > 0:
            # Every row masked: Eq. 19 is infinite and the restrictions give previous + 1 (capped).
            wanted = round(self.lam * n_all / (n_all - n_masked)) if n_masked < n_all else self.max_steps
            self._steps = max(1, min(max(wanted, self._steps), self._steps + 1, self.max_steps))
        self._n_all, self._n_masked = 0, 0
        return self._steps

    def state_dict(self) -> dict[str, Any]:
        return {
            "lam": self.lam,
            "max_steps": self.max_steps,
            "steps": self._steps,
            "n_all": int(self._n_all),
            "n_masked": int(self._n_masked),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if (state["lam"], state["max_steps"]) != (self.lam, self.max_steps):
            raise ValueError(
                f"checkpoint has lam={state['lam']}, max_steps={state['max_steps']}; "
                f"this accumulator has lam={self.lam}, max_steps={self.max_steps}"
            )
        self._steps = int(state["steps"])
        self._n_all, self._n_masked = int(state["n_all"]), int(state["n_masked"])

    def __repr__(self) -> str:
        return f"AdaptiveAccumulation(lam={self.lam}, max_steps={self.max_steps}, steps={self._steps})"
