"""Racing the confirmation runs: rounds of seeds, a look after each, sticky verdicts, pure and replayable.

Round 1 gives every loss `first` seeds; each later round adds `step` seeds to the losses still active, up to
`max_seeds`. The looks (n = 3, 5, 7, 9, 10 for the defaults) are fixed in advance by the plan, and so is the
alpha each look spends (`alpha_schedule`); the answer's alpha is split in halves between the verdicts
against the baseline and the best set (tune_as.results.verdicts). docs/verdicts.md has the rule and the
proof that every printed claim is controlled family-wise over all looks.

`decide(results, plan)` replays the race from the results alone (which seeds each loss has), so a resume
after a crash recomputes the same decisions and asks only for the seeds still missing. A fixed design
(`--confirm N`) is the plan with one look: `Plan.fixed(..., n=N)`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from tune_as.results import noise
from tune_as.results.noise import NOISES, Noise
from tune_as.results.verdicts import (
    Best,
    BestRule,
    Comparison,
    SeedValues,
    best_set,
    compare_with_baseline,
    model_of,
    points,
)

# A race's looks: FIRST_LOOK seeds per loss, then LOOK_STEP more each round (3, 5, 7, 9, 10 up to
# --max-seeds 10). Declared here only: the plan, the budget's split and its last look read them.
FIRST_LOOK = 3
LOOK_STEP = 2

# loss -> seed -> (validation metric, test metric or None when the task has no test labels)
Results = Mapping[str, Mapping[int, tuple[float, float | None]]]
Metric = Literal["test", "val"]


def look_schedule(first: int, step: int, max_seeds: int) -> tuple[int, ...]:
    """The seeds per loss at each look: first, first + step, ..., capped at max_seeds (3, 5, 7, 9, 10)."""
    if not 1 <= first <= max_seeds or step < 1:
        raise ValueError(f"expected 1 <= first <= max_seeds and step >= 1, received first={first}, "
                         f"step={step}, max_seeds={max_seeds}")
    looks = [first]
    while looks[-1] < max_seeds:
        looks.append(min(looks[-1] + step, max_seeds))
    return tuple(looks)


Spending = Literal["n", "n2"]
SPENDINGS: tuple[Spending, ...] = ("n", "n2")


def alpha_schedule(looks: Sequence[int], alpha: float, spending: Spending = "n") -> tuple[float, ...]:
    """The alpha each look spends, proportional to its seeds per loss ("n") or their square ("n2"): weights
    growing with n, since an early look has few degrees of freedom and little power and the last look the
    most. Sums to <= alpha: the union bound over looks then bounds the family-wise error of the whole race by
    alpha."""
    if not looks or not 0 < alpha < 1 or spending not in SPENDINGS:
        raise ValueError(f"expected looks, 0 < alpha < 1 and a spending in {SPENDINGS}, "
                         f"received {list(looks)}, {alpha}, {spending!r}")
    weights = [n * n if spending == "n2" else n for n in looks]
    total = sum(weights)
    # the factor keeps the float sum <= alpha despite rounding (the exact shares sum to alpha)
    return tuple(alpha * w / total * (1 - 1e-12) for w in weights)


@dataclass(frozen=True)
class Plan:
    """The race's design, fixed before the first seed.

    losses: every loss of the answer (the baseline included), in display order. seeds: the confirmation
    seeds in the order they are handed out (at least max_seeds; the engine picks them once, e.g. the
    integers after the search's seeds). margin_points: the equivalence margin in points (0.5 = 0.005 of the
    metric). verdict_on: the metric of the verdicts against the baseline ("auto": test when every run has
    one, else validation); the best set always uses validation. best_rule: "hsu" (the default, Hsu's
    Bonferroni form) or "holm" (every exclusion controlled, ties included; see verdicts.best_set).
    resolution_points: one item of the split the verdicts are computed on, in points (100 / items; 0: a
    continuous metric), the least half-width of a printed interval (verdicts._intervals). noise: the verdicts'
    noise model (tune_as.results.noise: "moderated", "per-loss", or the simulation's "pooled"). spending:
    alpha per look by seeds ("n") or their square ("n2"); None: "n" for the per-loss rule, "n2" otherwise."""

    losses: tuple[str, ...]
    baseline: str
    seeds: tuple[int, ...]
    first: int = FIRST_LOOK
    step: int = LOOK_STEP
    max_seeds: int = 10
    alpha: float = 0.05
    margin_points: float = 0.5
    verdict_on: Literal["auto", "test", "val"] = "auto"
    best_rule: BestRule = "hsu"
    resolution_points: float = 0.0
    noise: Noise = "moderated"
    # None: "n" with the per-loss rule (its rule before the model), else "n2"
    spending: Spending | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "losses", tuple(self.losses))
        object.__setattr__(self, "seeds", tuple(int(s) for s in self.seeds))
        if (len(set(self.losses)) != len(self.losses) or self.baseline not in self.losses
                or len(self.losses) < 2):
            raise ValueError(f"expected distinct losses including the baseline {self.baseline!r} "
                             f"and at least one other, received {list(self.losses)}")
        look_schedule(self.first, self.step, self.max_seeds)
        if self.first < 2 and self.first < self.max_seeds:
            raise ValueError(f"a race needs first >= 2 seeds (a t-test needs 2), received first={self.first}")
        if len(set(self.seeds)) != len(self.seeds) or len(self.seeds) < self.max_seeds:
            raise ValueError(f"expected at least max_seeds={self.max_seeds} distinct seeds, received "
                             f"{list(self.seeds)}")
        if not 0 < self.alpha < 1:
            raise ValueError(f"expected 0 < alpha < 1, received {self.alpha}")
        if not (math.isfinite(self.margin_points) and self.margin_points >= 0):
            raise ValueError(f"expected a margin >= 0 points, received {self.margin_points}")
        if self.verdict_on not in ("auto", "test", "val"):
            raise ValueError(f"expected verdict_on auto, test or val, received {self.verdict_on!r}")
        if self.best_rule not in ("hsu", "holm"):
            raise ValueError(f"expected best_rule hsu or holm, received {self.best_rule!r}")
        if self.spending is None:
            object.__setattr__(self, "spending", "n" if self.noise == "per-loss" else "n2")
        if self.spending not in SPENDINGS:
            raise ValueError(f"expected spending {' or '.join(SPENDINGS)}, received {self.spending!r}")
        if self.noise not in NOISES:
            raise ValueError(f"expected noise {' or '.join(NOISES)}, received {self.noise!r}")
        if not (math.isfinite(self.resolution_points) and 0 <= self.resolution_points <= 100):
            raise ValueError(f"expected a resolution in [0, 100] points, received {self.resolution_points}")

    @classmethod
    def fixed(cls, losses: Sequence[str], baseline: str, seeds: Sequence[int], n: int, *, alpha: float = 0.05,
              margin_points: float = 0.5, verdict_on: Literal["auto", "test", "val"] = "auto",
              best_rule: BestRule = "hsu", resolution_points: float = 0.0,
              noise: Noise = "moderated") -> Plan:
        """`--confirm N`: exactly n seeds for every loss, one look spending the full alpha."""
        return cls(tuple(losses), baseline, tuple(seeds), first=n, step=1, max_seeds=n, alpha=alpha,
                   margin_points=margin_points, verdict_on=verdict_on, best_rule=best_rule,
                   resolution_points=resolution_points, noise=noise)

    @property
    def margin(self) -> float:
        """The equivalence margin as a fraction of the metric."""
        return points(self.margin_points)

    @property
    def looks(self) -> tuple[int, ...]:
        return look_schedule(self.first, self.step, self.max_seeds)

    @property
    def alphas_verdicts(self) -> tuple[float, ...]:
        """Per look: the verdicts' half of alpha, spread by `alpha_schedule`."""
        return alpha_schedule(self.looks, self.alpha / 2, self.spending or "n2")

    @property
    def alphas_best(self) -> tuple[float, ...]:
        """Per look: the best set's half of alpha, spread the same way."""
        return alpha_schedule(self.looks, self.alpha / 2, self.spending or "n2")


def decidable(plan: Plan) -> tuple[tuple[int, float], ...]:
    """Per look: (seeds per loss, the smallest |mean difference| a claim can rest on there, in units of s, the
    seed-to-seed spread of a loss's paired differences to the baseline), at Holm's first step, the loosest a
    look gets for its first claim (`_first_step`). Said before the race runs, so a budget whose looks cannot
    decide the differences a user cares about is seen before it is spent."""
    return tuple((n, float(_first_step(plan, a, n)))
                 for n, a in zip(plan.looks, plan.alphas_verdicts, strict=True) if n >= 2)


def _first_step(plan: Plan, alpha: float, n: int | np.ndarray) -> np.ndarray:
    """Holm's first step over the plan's 3m verdict hypotheses at `alpha`, with n seeds: the smallest
    |mean| / s that a one-sided t-test rejects at. Per-loss: t(1 - alpha / (3m), n - 1) / sqrt(n). Moderated,
    with every loss's noise equal (the model's own case): the model's test, t(1 - alpha / (3m),
    n - 1 + d0) / sqrt(n) with d0 the prior's full weight (Rule.prior_df), or the gate, t(1 - gate * alpha,
    n - 1) / sqrt(n), whichever is larger."""
    m = len(plan.losses) - 1
    n = np.asarray(n)
    from scipy import stats  # lazily: 1.4 CPU s a driver spends before its first trial
    own = stats.t.ppf(1 - alpha / (3 * m), n - 1) / np.sqrt(n)
    if plan.noise == "per-loss":
        return own
    rule = noise.RULES[plan.noise]
    model = stats.t.ppf(1 - alpha / (3 * m), n - 1 + min(rule.prior_df, 1e6)) / np.sqrt(n)
    return model if rule.gate is None else np.maximum(
        model, stats.t.ppf(1 - rule.gate * alpha, n - 1) / np.sqrt(n))


def seeds_to_decide(plan: Plan, mean: float, sd: float, limit: int = 100) -> int | None:
    """The fewest seeds (2..limit) with which a fixed design (one look spending the verdicts' whole alpha)
    would decide a loss whose paired differences have this mean and spread, at Holm's first step: a win or
    loss once |mean| > t(1 - a / (3m), n - 1) * sd / sqrt(n), equivalence once |mean| plus that is inside the
    margin. None when no number up to `limit` would (or sd is 0: equal values are no evidence). An estimate at
    the observed effect, which new seeds will move, not a promise."""
    if not (sd > 0 and math.isfinite(mean)):
        return None
    n = np.arange(2, limit + 1)
    half = _first_step(plan, plan.alpha / 2, n) * sd
    ok = (abs(mean) > half) | (abs(mean) + half < plan.margin)
    return int(n[np.argmax(ok)]) if ok.any() else None


@dataclass(frozen=True)
class Look:
    """One look taken: its index (1-based), the seeds per loss, the alpha of each family, the losses tested,
    and what the verdicts' noise model did there."""

    index: int
    n: int
    alpha_verdicts: float
    alpha_best: float
    tested: tuple[str, ...]
    # the noise model's: losses (the baseline too) that took their own spread
    out_of_line: tuple[str, ...] = ()
    # the noise model's pooled degrees of freedom (0: no model, every comparison its own spread)
    pool_df: int = 0
    prior_df: float = 0.0  # the noise model's prior weight d0


@dataclass(frozen=True)
class Answer:
    """The state of the race after the looks the results allow.

    look: looks taken (0: round 1 not complete yet). rows: one verdict per non-baseline loss (plan order).
    leader / best: the best set on validation, by mean. seeds_used: per loss, the seeds its decisions used
    (seeds beyond them, e.g. of a round it dropped out of, are ignored). active: the losses in the pending
    round. next_seeds: loss -> the seeds to run now (a subset of `active`'s when the budget is short; never
    a seed already run). alpha_spent: the family-wise alpha spent by the looks taken (both halves)."""

    look: int
    looks: tuple[Look, ...]
    metric: Metric
    rows: tuple[Comparison, ...]
    leader: str | None
    best: tuple[str, ...]
    val_means: Mapping[str, float]
    seeds_used: Mapping[str, int]
    active: tuple[str, ...]
    next_seeds: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    alpha_spent: float = 0.0

    @property
    def done(self) -> bool:
        """The race is over: nothing left to run; rows, leader and best are final."""
        return not self.next_seeds

    def row(self, loss: str) -> Comparison:
        return next(r for r in self.rows if r.loss == loss)


def _metric(results: Results, plan: Plan) -> Metric:
    tests = [t for by_seed in results.values() for (_, t) in by_seed.values()]
    if plan.verdict_on == "val":
        return "val"
    if plan.verdict_on == "test":
        if any(t is None for t in tests):
            raise ValueError("verdict_on='test' but some runs have no test metric")
        return "test"
    return "test" if tests and all(t is not None for t in tests) else "val"


def _check(results: Results, plan: Plan) -> dict[str, dict[int, tuple[float, float | None]]]:
    """The results restricted to the plan's first max_seeds seeds; unknown losses or seeds are errors."""
    unknown = sorted(set(results) - set(plan.losses))
    if unknown:
        raise ValueError(f"results for losses not in the plan: {unknown} (plan: {list(plan.losses)})")
    usable = set(plan.seeds[: plan.max_seeds])
    out: dict[str, dict[int, tuple[float, float | None]]] = {}
    for loss, by_seed in results.items():
        strange = sorted(set(by_seed) - set(plan.seeds))
        if strange:
            raise ValueError(f"{loss}: results for seeds the plan does not have: {strange}")
        out[loss] = {s: (float(v), None if t is None else float(t))
                     for s, (v, t) in by_seed.items() if s in usable}
    return out


def _allocate(missing: dict[str, tuple[int, ...]], active: set[str], plan: Plan, results: Results,
              round_seeds: Sequence[int], rows: Mapping[str, Comparison], means: Mapping[str, float],
              seeds_left: int | None) -> dict[str, tuple[int, ...]]:
    """The seeds to run for the pending round: all that are missing, or when seeds_left cannot pay for them,
    whole losses in priority order (each with its baseline's seeds): losses that started the round first
    (a resume finishes what it began), then undecided losses by their smallest adjusted p (the closest to a
    decision), then decided ones kept for the best set by validation mean, then plan order."""
    if seeds_left is None or sum(len(s) for s in missing.values()) <= seeds_left:
        return missing
    base = plan.baseline

    def priority(loss: str) -> tuple[int, int, float, int]:
        started = any(s in results.get(loss, {}) for s in round_seeds)
        row = rows.get(loss)
        undecided = row is None or row.verdict == "undecided"
        closeness = (row.p_adjusted if row else 1.0) if undecided else -means.get(loss, 0.0)
        return (0 if started else 1, 0 if undecided else 1, closeness, plan.losses.index(loss))

    left, base_paid, chosen = seeds_left, False, []
    for loss in sorted((x for x in active if x != base), key=priority):
        own = len(missing.get(loss, ()))
        cost = own + (0 if base_paid else len(missing.get(base, ())))
        if cost and cost <= left:
            chosen.append(loss)
            left -= cost
            base_paid = True
    out = {loss: missing[loss] for loss in chosen if loss in missing}
    if chosen and base in missing:
        out[base] = missing[base]
    return {loss: out[loss] for loss in plan.losses if loss in out}


def decide(results: Results, plan: Plan, seeds_left: int | None = None) -> Answer:
    """Replay the race on `results` (loss -> seed -> (val, test or None)) and say where it stands.

    seeds_left: the runs the budget still allows (None: no limit). When the pending round does not fit, it
    goes to whole losses by `_allocate`'s priority; a loss is never given seeds without its baseline on
    the same seeds; when nothing fits, the round closes with the losses that completed it and the others
    leave the race. Pure and deterministic: the same results, plan and seeds_left give the same answer."""
    clean = _check(results, plan)
    metric = _metric(clean, plan)
    base = plan.baseline
    n_used = dict.fromkeys(plan.losses, 0)
    rows: dict[str, Comparison] = {
        loss: Comparison(loss, 0, None, None, 1.0, "undecided") for loss in plan.losses if loss != base}
    best = Best(None, ())
    looks: list[Look] = []
    active = set(plan.losses)
    prev = 0

    val = {loss: {s: v for s, (v, _) in runs.items()} for loss, runs in clean.items()}
    on = val if metric == "val" else {
        loss: {s: t for s, (_, t) in runs.items() if t is not None} for loss, runs in clean.items()}

    def used(values: Mapping[str, SeedValues]) -> dict[str, SeedValues]:
        """Each loss's values on the seeds its decisions use."""
        return {loss: {s: values[loss][s] for s in plan.seeds[: n_used[loss]]} for loss in plan.losses}

    def answer(active_now: set[str], request: Mapping[str, tuple[int, ...]]) -> Answer:
        return Answer(len(looks), tuple(looks), metric,
                      tuple(rows[loss] for loss in plan.losses if loss != base),
                      best.leader, best.members, dict(best.means), dict(n_used),
                      tuple(loss for loss in plan.losses if loss in active_now), dict(request),
                      math.fsum(x.alpha_verdicts + x.alpha_best for x in looks))

    for k, (n_k, a_verdicts, a_best) in enumerate(zip(plan.looks, plan.alphas_verdicts, plan.alphas_best,
                                                      strict=True), start=1):
        if not active - {base}:
            break
        round_seeds = plan.seeds[prev:n_k]
        missing = {loss: tuple(s for s in round_seeds if s not in clean.get(loss, {}))
                   for loss in plan.losses if loss in active}
        missing = {loss: m for loss, m in missing.items() if m}
        if missing:
            request = _allocate(missing, active, plan, clean, round_seeds, rows, best.means, seeds_left)
            if request:
                return answer(active, request)
        at_look = {loss for loss in active if loss not in missing}
        if base not in at_look or not at_look - {base}:
            break  # the budget closed a round that nobody could finish with its baseline
        for loss in at_look:
            n_used[loss] = n_k
        tested = at_look - {base}
        rule = noise.RULES.get(plan.noise)  # None: per-loss
        model = model_of(used(on), base, rule) if rule else None
        rows = {r.loss: r for r in compare_with_baseline(
            used(on), base, plan.margin, a_verdicts, earlier=rows, testable=tested, look=k,
            resolution=points(plan.resolution_points), model=model)}
        best = best_set(used(val), a_best, excluded=best.excluded_by, testable=at_look, rule=plan.best_rule,
                        model=model_of(used(val), None, rule) if rule else None,
                        resolution=points(plan.resolution_points))
        looks.append(Look(k, n_k, a_verdicts, a_best, tuple(loss for loss in plan.losses if loss in at_look),
                          model.out_of_line if model else (), model.pool_df if model else 0,
                          model.prior_df if model else 0.0))
        prev = n_k
        crowded = len(best.members) > 1
        keep = {loss for loss in tested if n_k < plan.max_seeds
                and (rows[loss].verdict == "undecided" or (crowded and loss in best.members))}
        active = keep | {base} if keep else set()
    return answer(set(), {})
