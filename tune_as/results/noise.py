"""The noise model of an answer: how noisy each loss's runs are, estimated with help from the other losses.

Every loss runs on the same seeds, a block design: value[loss, seed] = loss effect + seed effect + noise, each
loss's noise with a variance of its own. `fit` estimates those variances from one look's runs;
`Model.difference` gives the variance of a paired difference between two losses and its degrees of freedom.
The rules (`RULES`):

- "per-loss" (before 2026-12-07): no model; each comparison's own paired spread, n - 1 degrees of freedom.
- "moderated" (the default): each loss's variance from the two-way (loss + seed) fit, moderated toward the
  pooled variance of the other losses: var~ = (nu var^ + d0 pool) / (nu + d0), nu + d0 degrees of freedom. The
  prior weight d0 is at most `Rule.prior_df` and less where the losses' variances disperse more than chance
  explains (`prior_weight`). A difference's variance is the sum of its two losses' (noise independent given
  the seed), on the smaller of their degrees of freedom. Checks that take a loss out of the model
  (docs/verdicts.md, section 12): a loss out of line with the others (`Rule.level`: a diverged run, a far
  noisier loss) leaves the pool and the seed effects, and its comparisons take their own spread; the
  baseline's variance is moderated only when it is plainly in line (`Rule.anchor_level`), else its own is
  used; fewer than two poolable losses: no model. And a claim must also pass its own paired t-test at
  `Rule.gate` times the look's alpha (tune_as.results.verdicts).
- "pooled" (the simulation's reference only, invalid under unequal noise): one residual variance for all.

Pure numpy and scipy; the rule was chosen by simulation (benchmarks/sim_racing.py --rules).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

Noise = Literal["per-loss", "moderated", "pooled"]
NOISES: tuple[Noise, ...] = ("moderated", "per-loss", "pooled")
CHOICES: tuple[Noise, ...] = ("moderated", "per-loss")  # what a user may choose
_TINY = 1e-24  # variances at or below are exactly zero (identical runs, rounding)


@dataclass(frozen=True)
class Rule:
    """How a model is fitted and used. prior_df: the prior's largest weight in degrees of freedom.
    estimate_df: lower it where the losses' variances disperse more than chance (`prior_weight`). level: a
    loss is out of line when its robust residual variance exceeds the median loss's by more than
    the (1 - level) chi-square quantile of that ratio allows (0: never). anchor_level: the same check for the
    baseline, stricter, deciding whether its own variance is moderated. gate: a claim's own paired t-test must
    reject at gate x the look's alpha (None: no gate). min_df: a difference on the smaller of its two losses'
    degrees of freedom (else Satterthwaite's)."""

    prior_df: float
    estimate_df: bool
    level: float
    anchor_level: float
    gate: float | None
    min_df: bool


RULES: dict[str, Rule] = {
    "moderated": Rule(prior_df=4.0, estimate_df=True, level=0.001, anchor_level=0.25, gate=0.25, min_df=True),
    "pooled": Rule(prior_df=float("inf"), estimate_df=False, level=0.0, anchor_level=0.0, gate=None,
                   min_df=False),
}


@dataclass(frozen=True)
class Model:
    """The fitted model of one look. var, df: each row's noise variance of one run and its degrees of freedom
    (NaN where a row has fewer than 2 seeds). pooled: rows whose variance was moderated. out_of_line: rows
    taken out of the model (their comparisons take their own spread). pool, pool_df: the pooled residual
    variance of the two-way fit and its degrees of freedom (0: nothing could be pooled, every comparison takes
    its own spread). prior_df: the prior weight used."""

    names: tuple[str, ...]
    var: np.ndarray
    df: np.ndarray
    pooled: frozenset[str]
    out_of_line: tuple[str, ...]
    pool: float
    pool_df: int
    prior_df: float
    rule: Rule

    @functools.cached_property
    def _index(self) -> dict[str, int]:
        return {name: i for i, name in enumerate(self.names)}

    def usable(self, a: str, b: str) -> bool:
        """Whether the difference a - b takes its spread from the model (else from its own seeds)."""
        index = self._index
        return (self.pool_df > 0 and a in index and b in index and not {a, b} & set(self.out_of_line)
                and bool(np.isfinite(self.var[index[a]]) and np.isfinite(self.var[index[b]])))

    def difference(self, a: str, b: str) -> tuple[float, float]:
        """Variance of one seed's difference a - b and its degrees of freedom."""
        i, j = self._index[a], self._index[b]
        va, vb, da, db = float(self.var[i]), float(self.var[j]), float(self.df[i]), float(self.df[j])
        v = va + vb
        if self.rule.min_df:
            return v, min(da, db)
        den = va * va / da + vb * vb / db
        return v, v * v / den if den > 0 else da + db


def _nanmedian(a: np.ndarray, axis: int) -> np.ndarray:
    """Median along `axis` ignoring NaN (NaN where all are), keeping the axis: np.nanmedian's result without
    its masked arrays, which cost 10x more on these small matrices."""
    s = np.sort(a, axis=axis)  # NaN sort last
    c = (~np.isnan(a)).sum(axis=axis, keepdims=True)
    lo = np.take_along_axis(s, np.maximum((c - 1) // 2, 0), axis=axis)
    hi = np.take_along_axis(s, np.maximum(c // 2 - (c == 0), 0), axis=axis)
    return np.where(c > 0, (lo + hi) / 2, np.nan)


def _median_polish(x: np.ndarray, sweeps: int = 10) -> np.ndarray:
    """Tukey's median polish of rows x seeds (NaN: missing): the residuals of a robust additive fit."""
    r = x.copy()
    for _ in range(sweeps):
        r -= np.nan_to_num(_nanmedian(r, axis=1))
        r -= np.nan_to_num(_nanmedian(r, axis=0))
    return r


@functools.lru_cache(maxsize=256)
def _limit(level: float, nu: int, nu_median: float) -> float:
    """How far above the median loss's variance chance takes a loss's at `level`: a ratio of chi-square
    quantiles."""
    from scipy import stats  # lazily: 1.4 CPU s a driver spends before its first trial
    return float(stats.chi2.ppf(1 - level, nu) / nu / (stats.chi2.ppf(0.5, nu_median) / nu_median))


def _out_of_line(x: np.ndarray, candidates: Sequence[int], level: float) -> list[int]:
    """Rows (of all) whose robust residual variance exceeds the candidates' median by more than chance allows
    at `level`: the median polish keeps a diverged run from hiding in the seed effects."""
    if level <= 0:
        return []
    r = _median_polish(x)
    n = (~np.isnan(x)).sum(axis=1)
    u = np.where(n > 1, np.nansum(r * r, axis=1) / np.maximum(n - 1, 1), np.nan)
    pool = [i for i in candidates if n[i] > 1]
    if len(pool) < 3:
        return []
    scale = float(np.median(u[pool]))
    nu_median = float(np.median(n[pool] - 1))
    return [i for i in range(x.shape[0])
            if n[i] > 1 and u[i] > _limit(level, int(n[i] - 1), nu_median) * scale + _TINY]


def _additive(x: np.ndarray) -> tuple[np.ndarray, float, int]:
    """Least-squares row + seed fit of rows x seeds (NaN: missing): the seed effects, the residual mean square
    and its degrees of freedom (cells - rows - seeds + 1; 0 when nothing is left)."""
    there = ~np.isnan(x)
    rows, cols = np.nonzero(there)
    seeds = np.unique(cols)
    col = np.searchsorted(seeds, cols)
    design = np.zeros((rows.size, x.shape[0] + seeds.size))
    design[np.arange(rows.size), rows] = 1.0
    design[np.arange(rows.size), x.shape[0] + col] = 1.0
    y = x[there]
    coef, *_ = np.linalg.lstsq(design, y, rcond=None)
    df = int(rows.size - np.unique(rows).size - seeds.size + 1)
    resid = y - design @ coef
    effects = np.full(x.shape[1], np.nan)
    effects[seeds] = coef[x.shape[0]:]
    return effects, float(resid @ resid / df) if df > 0 else float("nan"), max(df, 0)


def _trigamma_inverse(y: float) -> float:
    """x with trigamma(x) = y > 0, by bisection on the log scale (trigamma falls from +inf to 0)."""
    from scipy import special

    lo, hi = 1e-6, 1e8
    for _ in range(80):
        mid = float(np.sqrt(lo * hi))
        lo, hi = (mid, hi) if special.polygamma(1, mid) > y else (lo, mid)
    return float(np.sqrt(lo * hi))


def prior_weight(u: np.ndarray, nu: np.ndarray, cap: float) -> float:
    """The prior's weight d0 from how much more the residual variances u (nu degrees of freedom each) disperse
    on the log scale than chance explains, the moment estimator of Smyth (2004, limma):
    var(log s^2) = trigamma(nu/2) + trigamma(d0/2). At most `cap`: with equal noise the excess is zero or
    negative in about half the answers (d0 infinite), so `cap` is the weight the model is proven with; unequal
    noise lowers it toward 0."""
    from scipy import special

    ok = (u > _TINY) & (nu > 0)
    if ok.sum() < 3:
        return cap
    z = np.log(u[ok]) - (special.digamma(nu[ok] / 2) - np.log(nu[ok] / 2))
    excess = float(np.var(z, ddof=1) - np.mean(special.polygamma(1, nu[ok] / 2)))
    return cap if excess <= 0 else float(min(cap, 2 * _trigamma_inverse(excess)))


def fit(x: np.ndarray, names: Sequence[str], anchor: str | None = None,
        rule: Rule = RULES["moderated"]) -> Model:
    """The model of rows x seeds `x` (NaN: a seed the row lacks). anchor: a row never pooled into the others'
    variance (the baseline: its noise enters every comparison)."""
    names = tuple(names)
    k = len(names)
    a = names.index(anchor) if anchor in names else None
    n = (~np.isnan(x)).sum(axis=1)
    candidates = [i for i in range(k) if i != a and n[i] > 1]
    judged = [*candidates, *([a] if a is not None and n[a] > 1 else [])]
    flagged = set(_out_of_line(x, judged, rule.level))
    anchor_alone = a is not None and a in _out_of_line(x, judged, rule.anchor_level)
    group = [i for i in candidates if i not in flagged]
    var, df = np.full(k, np.nan), np.full(k, np.nan)
    out = tuple(names[i] for i in sorted(flagged))
    if len(group) < 2:
        return Model(names, var, df, frozenset(), out, float("nan"), 0, 0.0, rule)
    effects, pool, pool_df = _additive(x[group])
    if pool_df < 1 or not pool > _TINY:
        return Model(names, var, df, frozenset(), out, float("nan"), 0, 0.0, rule)
    prior = rule.prior_df
    if rule.estimate_df:
        prior = prior_weight(np.nanvar(x[group] - effects, axis=1, ddof=1), n[group] - 1.0, rule.prior_df)
    pooled = set()
    for i in range(k):
        others = [g for g in group if g != i]
        if n[i] < 2 or len(others) < 2:
            continue
        seed_effects, ms, ms_df = _additive(x[others]) if i in group else (effects, pool, pool_df)
        there = ~np.isnan(x[i])
        nu = int(there.sum()) - 1
        # the seed effects carry the other rows' noise: about ms / (rows on the seed) of variance per seed
        rows_on = (~np.isnan(x[others][:, there])).sum(axis=0)
        u = float(np.var(x[i, there] - seed_effects[there], ddof=1))
        own = max(u - ms * float(np.mean(1.0 / np.maximum(rows_on, 1))), 0.0) if ms_df > 0 else u
        if i in flagged or (i == a and anchor_alone) or not ms_df > 0:
            var[i], df[i] = own, nu
            continue
        d0 = min(prior, float(ms_df))
        var[i] = ms if np.isinf(d0) else (nu * own + d0 * ms) / (nu + d0)
        df[i] = nu + d0
        pooled.add(names[i])
    return Model(names, var, df, frozenset(pooled), out, pool, pool_df, float(prior), rule)
