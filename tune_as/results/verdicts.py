"""The statistical verdicts of an answer, pure (numpy and scipy; statsmodels only checks them in the tests).

Two families of claims, each family-wise controlled at the alpha it is given (docs/verdicts.md says why):

- `compare_with_baseline`: each loss against the baseline on the seeds both have (paired differences). Three
  one-sided nulls per loss: H_win (mean d <= 0), H_loss (mean d >= 0), H_eq (|mean d| >= margin, TOST);
  t-tests on the noise model's spread (tune_as.results.noise) or each difference's own, Holm's step-down over
  every open hypothesis. A rejection is a claim (`win`, `loss`, `equivalent`); nothing rejected is
  `undecided`.
- `best_set`: Hsu's multiple comparisons with the best, Bonferroni form, on validation: a loss is excluded iff
  another is significantly better at alpha / (k - 1); the best loss is in the set with
  probability >= 1 - alpha.

Metrics and margins are fractions (accuracy 0.913; 0.5 points = 0.005).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from tune_as.results import noise as noise_model
from tune_as.results.pvalues import EXACT_TOL, _own, _pvalues, _summaries, _summary, holm

Verdict = Literal["win", "loss", "equivalent", "undecided"]
Hypothesis = Literal["win", "loss", "equivalent"]
HYPOTHESES: tuple[Hypothesis, ...] = ("win", "loss", "equivalent")
# seed -> metric value of one loss's confirmation runs
SeedValues = Mapping[int, float]


def points(margin_points: float) -> float:
    """A user's margin in points (percent) as a fraction of the metric: 0.5 -> 0.005."""
    return margin_points / 100.0


def _matrix(values: Mapping[str, SeedValues], names: Sequence[str]) -> np.ndarray:
    """names x seeds (the union of their seeds, sorted), NaN where a loss has no run of the seed."""
    seeds = sorted(set().union(*(values[loss] for loss in names))) if names else []
    column = {s: j for j, s in enumerate(seeds)}
    x = np.full((len(names), len(seeds)), np.nan)
    for i, loss in enumerate(names):
        for s, v in values[loss].items():
            x[i, column[s]] = v
    return x


def _three(se: np.ndarray, df: np.ndarray, mean: np.ndarray, margin: float) -> tuple[np.ndarray, ...]:
    """p of H_win, H_loss and H_eq (TOST: the larger of the two one-sided p's), element-wise."""
    above = _pvalues(np.stack([se, se]), np.stack([df, df]), np.stack([mean, mean]),
                     np.array([0.0, -margin])[:, None], greater=True)  # H0 mean <= 0, mean <= -margin
    below = _pvalues(np.stack([se, se]), np.stack([df, df]), np.stack([mean, mean]),
                     np.array([0.0, margin])[:, None], greater=False)  # H0 mean >= 0, mean >= +margin
    return above[0], below[0], np.maximum(above[1], below[1])


def simultaneous_interval(d: Sequence[float] | np.ndarray, alpha_side: float,
                          resolution: float = 0.0) -> tuple[float, float] | None:
    """Two-sided t interval for the mean of d with alpha_side on each side; None with fewer than 2 values.
    Its half-width is at least `resolution` (one item of the split, a fraction): see `_intervals`."""
    n, mean, sd = _summary(np.asarray(d, dtype=float))
    return _intervals(*_own(np.array([n]), np.array([sd])), np.array([mean]), alpha_side, resolution)[0]


def _intervals(se: np.ndarray, df: np.ndarray, mean: np.ndarray, alpha_side: float,
               resolution: float = 0.0) -> list[tuple[float, float] | None]:
    """t intervals whose half-width is at least `resolution`: a zero-width interval (equal counts on every
    seed) would claim a precision that a finite split cannot have (docs/verdicts.md, section 10)."""
    half = np.full(se.shape, np.nan)
    ok = np.isfinite(se) & np.isfinite(df) & (df >= 1)
    if ok.any():
        from scipy import stats  # lazily: 1.4 CPU s a driver spends before its first trial
        half[ok] = np.maximum(stats.t.ppf(1.0 - alpha_side, df[ok]) * se[ok], resolution)
    return [(float(m - h), float(m + h)) if good else None for m, h, good in zip(mean, half, ok, strict=True)]


def model_of(values: Mapping[str, SeedValues], anchor: str | None = None,
             rule: noise_model.Rule = noise_model.RULES["moderated"]) -> noise_model.Model:
    """The noise model (tune_as.results.noise) of loss -> seed -> metric; anchor: the baseline."""
    names = list(values)
    return noise_model.fit(_matrix(values, names), names, anchor, rule)


@dataclass(frozen=True)
class Spread:
    """Per pair a - b: n, mean, the standard error and df its test uses (the model's where `modelled`, else
    its own on n - 1), and its own for the model's gate (`own_se` never below one item of the split)."""
    n: np.ndarray
    mean: np.ndarray
    se: np.ndarray
    df: np.ndarray
    own_se: np.ndarray
    own_df: np.ndarray
    modelled: np.ndarray


def spread(values: Mapping[str, SeedValues], pairs: Sequence[tuple[str, str]],
           model: noise_model.Model | None = None, resolution: float = 0.0) -> Spread:
    """The spread of each pair's mean paired difference (on the seeds both have), in one pass over
    `values`."""
    names = list(values)
    x = _matrix(values, names)
    row = {name: i for i, name in enumerate(names)}
    diffs = np.stack([x[row[a]] - x[row[b]] for a, b in pairs]) if pairs else np.zeros((0, x.shape[1]))
    n, mean, sd = _summaries(diffs)
    own_se, own_df = _own(n, sd)
    se, df, modelled = own_se.copy(), own_df.copy(), np.zeros(len(pairs), dtype=bool)
    for k, (a, b) in enumerate(pairs):
        if model is not None and n[k] >= 2 and model.usable(a, b):
            v, df[k] = model.difference(a, b)
            se[k], modelled[k] = np.sqrt(v / n[k]), True
    with np.errstate(invalid="ignore", divide="ignore"):  # no spread below one item of the split
        return Spread(n, mean, se, df, np.maximum(own_se, resolution / np.sqrt(n)), own_df, modelled)


def _gated(p: np.ndarray, own: np.ndarray, sp: Spread, model: noise_model.Model | None,
           alpha: float) -> np.ndarray:
    """p where a modelled claim's own test `own` passes the rule's gate at `alpha` (or there is no gate);
    else 1."""
    gate = None if model is None else model.rule.gate
    return p if gate is None else np.where(~sp.modelled | (own <= gate * alpha), p, 1.0)


def paired_differences(a: SeedValues, b: SeedValues) -> np.ndarray:
    """a - b on the seeds both have, in seed order."""
    shared = sorted(set(a) & set(b))
    return np.array([a[s] - b[s] for s in shared], dtype=float)


@dataclass(frozen=True)
class Comparison:
    """One loss against the baseline (differences loss minus baseline, fractions of the metric).

    `interval` is simultaneous over the family (Bonferroni, alpha / (3m) on each side at the look's alpha):
    Holm's later steps can decide a claim while this interval still touches 0. `p_adjusted` is the
    Holm-adjusted p of the claim made (when it was made), or the smallest adjusted p of the loss when
    undecided. `decided_at`: the look that made the claim (verdicts are sticky). `rejected`: its nulls
    rejected so far. `df`, `sd`: its test's degrees of freedom and per-seed spread (None below 2 seeds)."""

    loss: str
    n: int
    mean_diff: float | None
    interval: tuple[float, float] | None
    p_adjusted: float
    verdict: Verdict
    decided_at: int | None = None
    rejected: frozenset[Hypothesis] = frozenset()
    df: float | None = None
    sd: float | None = None


# Marks a claim Holm's step-down made while the printed single-step interval still reaches past it.
STEP_DOWN_MARK = "\u2020"
STEP_DOWN_NOTE = (f"{STEP_DOWN_MARK}: decided by Holm's step-down, which tests at a looser level once other "
                  "claims are made; the simultaneous interval shown is the single-step (Bonferroni) one and "
                  "still reaches past the claim (docs/verdicts.md).")


def interval_shows(row: Comparison, margin: float) -> bool:
    """Whether the row's simultaneous interval shows its claim on its own (a win's above 0, a loss's below 0,
    an equivalence's inside +-margin; True with no claim or interval): Holm's later steps test at looser
    levels."""
    if row.interval is None or row.verdict == "undecided":
        return True
    lo, hi = row.interval
    if row.verdict == "win":
        return lo > 0
    if row.verdict == "loss":
        return hi < 0
    return -margin - EXACT_TOL <= lo and hi <= margin + EXACT_TOL


def unmarked(word: str) -> str:
    """A printed verdict without its step-down mark ('loss\u2020' -> 'loss'): the mark annotates, it is no
    fifth word."""
    return word.removesuffix(STEP_DOWN_MARK)


def verdict_word(row: Comparison, margin: float) -> str:
    """The verdict as printed: a claim (marked where its interval does not show it), or
    'undecided (n seeds)'."""
    if row.verdict == "undecided":
        return f"undecided ({row.n} seeds)"
    return row.verdict + ("" if interval_shows(row, margin) else STEP_DOWN_MARK)


def _verdict(rejected: Collection[Hypothesis]) -> Verdict:
    """A rejected H_eq wins over a rejected directional null: inside the user's margin is practically
    nothing."""
    if "equivalent" in rejected:
        return "equivalent"
    if "win" in rejected and "loss" not in rejected:
        return "win"
    if "loss" in rejected and "win" not in rejected:
        return "loss"
    return "undecided"


def _check_margin(margin: float) -> None:
    if not (math.isfinite(margin) and margin >= 0):
        raise ValueError(f"expected a margin >= 0 (a fraction: 0.5 points = 0.005), received {margin!r}")


def _check_alpha(alpha: float) -> None:
    if not (0 < alpha < 1):
        raise ValueError(f"expected 0 < alpha < 1, received {alpha!r}")


def _check_values(values: Mapping[str, SeedValues]) -> None:
    for loss, by_seed in values.items():
        bad = {s: v for s, v in by_seed.items() if not math.isfinite(v)}
        if bad:
            raise ValueError(f"{loss}: metric values must be finite numbers, received {bad}")


def compare_with_baseline(values: Mapping[str, SeedValues], baseline: str, margin: float, alpha: float, *,
                          earlier: Mapping[str, Comparison] | None = None,
                          testable: Collection[str] | None = None, look: int = 1, resolution: float = 0.0,
                          model: noise_model.Model | None = None) -> tuple[Comparison, ...]:
    """Verdict rows of every loss of `values` but the baseline, in the order of `values`, at one look.

    values: loss -> seed -> metric (the baseline included). margin: the equivalence margin as a fraction.
    alpha: this look's family-wise alpha. earlier: the rows of the previous look (claims are kept; their
    rejected nulls leave the family). testable: the losses whose new data is tested at this look (default:
    all); the other open nulls keep their place in Holm's family with p = 1 (docs/verdicts.md: dropping
    them would void the proof). A loss with fewer than 2 paired seeds stays undecided. resolution: one item of
    the split the metric is computed on (a fraction; 0: continuous), the least half-width of an interval.
    model: the noise model of these values (`model_of`; None: each comparison's own spread); a claim from it
    must also pass its own paired t-test at `Rule.gate` x alpha, on a spread of at least `resolution`
    (`spread`)."""
    _check_margin(margin)
    _check_alpha(alpha)
    _check_values(values)
    if baseline not in values:
        raise ValueError(f"the baseline {baseline!r} has no results (losses given: {sorted(values)})")
    earlier = earlier or {}
    names = [loss for loss in values if loss != baseline]
    live_names = set(names) if testable is None else set(testable)
    sp = spread(values, [(loss, baseline) for loss in names], model, resolution)  # loss minus baseline
    n, mean, se, df = sp.n, sp.mean, sp.se, sp.df
    raw = {h: _gated(p, own, sp, model, alpha)  # a claim from the model passes its own paired test too
           for h, p, own in zip(HYPOTHESES, _three(se, df, mean, margin),
                                _three(sp.own_se, sp.own_df, mean, margin), strict=True)}

    family: list[tuple[int, Hypothesis]] = []
    family_p: list[float] = []
    for i, loss in enumerate(names):
        before = earlier.get(loss)
        done = before is not None and before.verdict != "undecided"
        live = not done and loss in live_names and n[i] >= 2
        for h in HYPOTHESES:
            if before is None or h not in before.rejected:
                family.append((i, h))
                family_p.append(float(raw[h][i]) if live else 1.0)
    reject, adjusted = holm(family_p, alpha) if family else (np.zeros(0, bool), np.zeros(0))
    now: dict[int, dict[Hypothesis, tuple[bool, float]]] = {}
    for (i, h), r, a in zip(family, reject, adjusted, strict=True):
        now.setdefault(i, {})[h] = (bool(r), float(a))

    intervals = _intervals(se, df, mean, alpha / (3 * len(names)), resolution) if names else []
    rows = []
    for i, loss in enumerate(names):
        count, interval = int(n[i]), intervals[i]
        dof = float(df[i]) if np.isfinite(df[i]) else None
        spread_i = float(se[i] * np.sqrt(n[i])) if dof is not None and np.isfinite(se[i]) else None
        mean_diff = float(mean[i]) if count else None
        before = earlier.get(loss)
        if before is not None and before.verdict != "undecided":
            rows.append(dataclasses.replace(before, n=count, mean_diff=mean_diff, interval=interval, df=dof,
                                            sd=spread_i))
            continue
        tests = now.get(i, {})
        rejected = frozenset(before.rejected if before else ()) | {h for h, (r, _) in tests.items() if r}
        verdict = _verdict(rejected)
        if verdict == "undecided":
            p_adj = min((a for _, a in tests.values()), default=1.0)
            rows.append(Comparison(loss, count, mean_diff, interval, p_adj, verdict, None, rejected, dof,
                                   spread_i))
        else:
            claim: Hypothesis = verdict
            p_adj = tests[claim][1] if claim in tests else (before.p_adjusted if before else 0.0)
            rows.append(Comparison(loss, count, mean_diff, interval, p_adj, verdict, look, rejected, dof,
                                   spread_i))
    return tuple(rows)


@dataclass(frozen=True)
class Best:
    """The best loss and its company on the validation metric. leader: the member with the highest mean.
    members: the best set, by mean (descending). means: mean per loss that has results.
    excluded_by: excluded loss -> the loss found significantly better than it."""

    leader: str | None
    members: tuple[str, ...]
    means: Mapping[str, float] = field(default_factory=dict)
    excluded_by: Mapping[str, str] = field(default_factory=dict)


BestRule = Literal["hsu", "holm"]


def best_set(values: Mapping[str, SeedValues], alpha: float, *, excluded: Mapping[str, str] | None = None,
             testable: Collection[str] | None = None, rule: BestRule = "hsu",
             model: noise_model.Model | None = None, resolution: float = 0.0) -> Best:
    """Hsu's multiple comparisons with the best (Bonferroni form) on `values` (loss -> seed -> validation
    metric; choosing by test would be using test to choose). With k losses that have results, loss i is
    excluded iff some j is better by a one-sided paired t-test on their shared seeds at alpha / (k - 1):
    only the k - 1 tests against the true best can wrongly exclude it, so a given best loss is in the set
    with probability >= 1 - alpha. When several losses tie for best, that holds for each, not for all at
    once (13 identical losses: one of them is excluded in ~20% of answers, docs/verdicts.md).

    rule="holm" (opt-in) makes every exclusion a controlled claim, ties included: Holm's step-down over the
    open losses on q_i = (k - 1) * min_j p(j better than i), i.e. the closed test of "these losses all tie
    for best" with a Bonferroni local test. excluded: exclusions of earlier looks (kept, out of the family);
    testable: the losses whose pairs are tested at this look (default: all; an untested open loss keeps
    its place in Holm's family with q = 1). model: the noise model of `values` (None: each pair's own spread).
    resolution: one item of the split (a fraction), the least spread the model's gate reads."""
    _check_alpha(alpha)
    _check_values(values)
    names = [loss for loss, by_seed in values.items() if by_seed]
    x = _matrix(values, names)
    means = dict(zip(names, (float(m) for m in _summaries(x)[1]), strict=True))
    out = dict(excluded or {})
    k = len(names)
    if k > 1:
        # [j, i]: j minus i on their shared seeds
        sp = spread({loss: values[loss] for loss in names}, [(a, b) for a in names for b in names], model,
                    resolution)
        p = _gated(_pvalues(sp.se, sp.df, sp.mean, 0.0, greater=True),  # H0: mean(j - i) <= 0: j not better
                   _pvalues(sp.own_se, sp.own_df, sp.mean, 0.0, greater=True), sp, model, alpha).reshape(k, k)
        live = np.array([testable is None or loss in testable for loss in names])
        p[~(live[:, None] & live[None, :])] = 1.0
        np.fill_diagonal(p, 1.0)
        open_ = [i for i, loss in enumerate(names) if loss not in out]
        if rule == "holm":
            q = np.minimum(1.0, (k - 1) * p[:, open_].min(axis=0))
            drop = holm(q, alpha)[0] if open_ else np.zeros(0, dtype=bool)
        elif rule == "hsu":
            drop = p[:, open_].min(axis=0) <= alpha / (k - 1)
        else:
            raise ValueError(f"expected rule 'hsu' or 'holm', received {rule!r}")
        for i, dropped in zip(open_, drop, strict=True):
            if dropped:
                out[names[i]] = names[int(np.argmin(p[:, i]))]
    rank = {loss: r for r, loss in enumerate(names)}
    members = tuple(sorted((loss for loss in names if loss not in out), key=lambda s: (-means[s], rank[s])))
    return Best(members[0] if members else None, members, means, out)
