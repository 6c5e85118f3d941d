"""The p-values under the verdicts (tune_as.results.verdicts), pure numpy (scipy.stats imported when first
needed): n, mean and spread of paired differences along the seeds, one-sided t-tests of a mean on its standard
error, and Holm's step-down over a family of p-values."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

# |difference| below this is rounding of fractions, not a difference: spreads and distances to a null's
# boundary under it are treated as exactly zero (identical runs give no NaN and no division by zero).
EXACT_TOL = 1e-12


def _pvalues(se: np.ndarray, df: np.ndarray, mean: np.ndarray, shift: float | np.ndarray,
             greater: bool) -> np.ndarray:
    """One-sided t p-values, element-wise, for a mean with standard error se on df degrees of freedom.
    greater=True tests H0: mean <= shift against mean > shift; greater=False tests H0: mean >= shift against
    mean < shift. NaN se or df < 1 (fewer than 2 seeds): p = 1. Zero spread is no evidence, p = 1: equal
    counts on a finite split are not identical runs (docs/verdicts.md, sections 9 and 10)."""
    se, df, mean, shift_a = np.broadcast_arrays(np.asarray(se, dtype=float), np.asarray(df, dtype=float),
                                                np.asarray(mean, dtype=float), np.asarray(shift, dtype=float))
    p = np.ones(se.shape, dtype=float)
    ok = np.isfinite(se) & np.isfinite(df) & (df >= 1) & np.isfinite(mean)
    if not ok.any():
        return p
    signed = np.where(ok, (mean - shift_a) if greater else (shift_a - mean), 0.0)
    spread = np.where(ok, se, 0.0)
    tested = ok & ~(spread <= EXACT_TOL * np.maximum(1.0, np.abs(np.where(ok, mean, 0.0))))
    if tested.any():
        from scipy import stats  # lazily: 1.4 CPU s a driver spends before its first trial
        p[tested] = stats.t.sf(signed[tested] / spread[tested], df[tested])
    return p


def _own(n: np.ndarray, sd: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Standard error and degrees of freedom of a mean of n values from their own spread (NaN below 2)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        ok = n >= 2
        return np.where(ok, sd / np.sqrt(np.maximum(n, 1)), np.nan), np.where(ok, n - 1.0, np.nan)


def _summary(d: np.ndarray) -> tuple[int, float, float]:
    n, mean, sd = _summaries(d.reshape(1, -1))
    return int(n[0]), float(mean[0]), float(sd[0])


def _summaries(d: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """n, mean and standard deviation (ddof 1) along the last axis, NaN marking a missing value (a seed
    one of the pair does not have); mean is NaN for n = 0, sd for n < 2."""
    there = ~np.isnan(d)
    n = there.sum(axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(there, d, 0.0).sum(axis=-1) / n
        sq = np.where(there, d - mean[..., None], 0.0) ** 2
        sd = np.sqrt(sq.sum(axis=-1) / (n - 1))
    return n, np.where(n > 0, mean, np.nan), np.where(n > 1, sd, np.nan)


def holm(pvalues: Sequence[float] | np.ndarray, alpha: float) -> tuple[np.ndarray, np.ndarray]:
    """Holm's step-down: (reject, adjusted p) in the input's order; reject iff adjusted p <= alpha.
    Hand-written (statsmodels' multipletests, which tests/test_verdicts.py checks it against, calls
    gc.collect() each time)."""
    p = np.asarray(pvalues, dtype=float)
    if p.ndim != 1 or not np.all((p >= 0) & (p <= 1)):
        raise ValueError(f"holm: expected a 1-d array of p-values in [0, 1], received {pvalues!r}")
    order = np.argsort(p, kind="stable")
    m = p.size
    adjusted_sorted = np.minimum(1.0, np.maximum.accumulate(p[order] * np.arange(m, 0, -1)))
    adjusted = np.empty(m)
    adjusted[order] = adjusted_sorted
    return adjusted <= alpha, adjusted
