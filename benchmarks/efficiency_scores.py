"""Scores, tables and goal checks of benchmarks/bench_efficiency.py: pure (records in, text out), no training.

Metric values are fractions (accuracy 0.983) everywhere in the records; tables and lines print points (98.33).
A record is one arm at one budget and search seed, as bench_efficiency's `ray_arm` stores it in arms.json:
per loss its verdict and best-set flag as the engine's answer rows printed them, test means, setting.

Definitions (docs/bench_efficiency.md, "Scores"):
- truth: per loss, the reference's selected setting re-run on TRUTH_SEEDS; the paired differences loss minus
  baseline on the seeds both have, their mean and 95% t-interval (`t_interval`, scipy.stats.t).
- decided share: decided verdicts (win, loss, equivalent) / every non-baseline loss of the answer.
- wrong (`wrong`): a `win` unless the truth's interval lies entirely above 0, a `loss` unless it lies entirely
  below 0 (an interval on the other side contradicts the claim; one that contains 0 is a null at the truth's
  resolution, and a sign claimed on a null is false), an `equivalent` whose truth mean difference is at or
  beyond ±margin; `undecided` is never wrong. A verdict on a loss without a truth (its 10-seed runs diverged)
  is not judged and counted apart.
- wrong share: wrong verdicts / decided verdicts that were judged (an answer that decides nothing has no
  share); the count over every comparison is printed beside it.
- gap: |arm's test mean for the loss − the reference's best test mean for it|, points, mean over losses.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tune_as.results.verdicts import unmarked

DECIDED = ("win", "loss", "equivalent")
# the engine's own words (tune_as.results.ranking.Row.verdict): decided ones, "baseline",
# "undecided (n seeds)", "" for a loss the answer did not confirm;
# anything not decided counts as undecided here
SHORT = {"win": "W", "loss": "L", "equivalent": "E", "undecided": "u"}
GOAL_GAP_POINTS = 0.35
GOAL_FWER = 0.05
GOAL_DECIDED_RATIO = 2.0


# -- numbers -------------------------------------------------------------------------------------------------
def t_interval(values: Sequence[float]) -> tuple[float, float, float]:
    """Mean and two-sided 95% t-interval (scipy.stats.t); NaN ends with fewer than 2 values, the point itself
    with zero spread."""
    from scipy import stats

    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, math.nan, math.nan
    half = stats.t.ppf(0.975, len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
    return mean, mean - half, mean + half


def truth_row(values: dict[int, float], base: dict[int, float]) -> dict[str, Any] | None:
    """One loss's truth against the baseline: paired by seed (loss − baseline, on the seeds both have);
    None with fewer than 2 such seeds."""
    shared = sorted(set(values) & set(base))
    if len(shared) < 2:
        return None
    d = [values[s] - base[s] for s in shared]
    mean, low, high = t_interval(d)
    return {"n": len(shared), "diff": mean, "low": low, "high": high,
            "test": statistics.fmean(values.values())}


def truth_says(truth: dict[str, Any] | None, margin: float) -> str:
    if truth is None:
        return "no truth (runs diverged)"
    side = "above 0" if truth["low"] > 0 else "below 0" if truth["high"] < 0 else "covers 0"
    inside = "inside" if abs(truth["diff"]) < margin else "outside"
    return f"interval {side}; mean {inside} ±{margin * 100:g}"


def word(verdict: str) -> str:
    """The engine's verdict text as one of win / loss / equivalent / undecided ("baseline" stays)."""
    verdict = unmarked(verdict)
    return verdict if verdict in (*DECIDED, "baseline") else "undecided"


def truly_null(truth: dict[str, Any]) -> bool:
    """Is the loss null at the truth's own resolution: does its 95% t-interval contain 0 (ends included)?

    The truth is a 10-seed estimate (`truth_row`: the mean paired difference and its unadjusted t-interval),
    not the true effect, so "truly null" can only mean "no difference the truth can resolve". The rule is the
    interval, not an exact mean of 0: a mean of exactly 0 (on a lattice of k / items it happens, e.g.
    sm_softmax at m=0, which is softmax: +0.00 [+0.00, +0.00]) always lies in its interval, so it is covered,
    and a mean of +0.01 with an interval of ±0.4 is the same evidence of no difference; an exact-zero rule
    would let a sign claimed on it pass. The price, stated: a true effect smaller than the truth resolves (its
    half-width, 0.2-0.4 points on digits) is scored wrong when an answer claims it. An answer's claim rests on
    at most 10 seeds at an adjusted alpha, so a real effect it proves is usually resolved by the truth's 10
    seeds, tested unadjusted, too."""
    return bool(truth["low"] <= 0 <= truth["high"])


def wrong(verdict: str, truth: dict[str, Any] | None, margin: float) -> bool | None:
    """Is the verdict contradicted by the truth? None: a decided verdict on a loss without a truth.

    win: wrong unless the truth's interval lies entirely above 0 (below 0 contradicts it; containing 0 is a
    null, `truly_null`, and a false win on a null is wrong). loss: the mirror image. equivalent: wrong when
    the truth's mean difference is at or beyond the margin. undecided: never wrong."""
    v = word(verdict)
    if v not in DECIDED:
        return False
    if truth is None:
        return None
    if v == "win":
        return bool(truth["high"] < 0 or truly_null(truth))
    if v == "loss":
        return bool(truth["low"] > 0 or truly_null(truth))
    return bool(abs(truth["diff"]) >= margin)


def num(value: Any) -> float:
    return float("nan") if value is None else float(value)


def noise_floor(per_loss: dict[str, Any], ref_seeds: int, seeds: int) -> float:
    """The mean per-loss gap (points) a perfect search would still show: each loss at the reference's own
    setting, its test mean over `seeds` new seeds against the reference's mean over `ref_seeds`. With the
    seed-to-seed standard deviation s of that setting, the difference of the two means is normal with sd
    s * sqrt(1/seeds + 1/ref_seeds), and E|N(0, v)| = sqrt(2 v / pi)."""
    gaps = [r["sd"] * math.sqrt((1 / seeds + 1 / ref_seeds) * 2 / math.pi) * 100 for r in per_loss.values()
            if not math.isnan(r["sd"])]
    return statistics.fmean(gaps) if gaps else math.nan


def measured_floor(ref_losses: dict[str, Any], truth_test: dict[str, dict[int, float]], seeds: int) -> float:
    """The mean per-loss gap (points) a perfect search scores, measured instead of modelled: each loss at the
    reference's own setting, its test mean over every `seeds`-subset of the truth's new seeds, against the
    reference's mean (exact: all C(10, seeds) subsets, no sampling). Unlike `noise_floor` it needs no normal
    model and no seed-to-seed sd from the reference's 3 runs, and it includes what the model leaves out: the
    reference's test mean at the point chosen on validation over the same seeds is optimistic (digits: its
    seeds-0-2 test means are 0.31 points from the truth's 10-seed means on average)."""
    per_loss = []
    for loss, ref_row in ref_losses.items():
        values = list(truth_test.get(loss, {}).values())
        if len(values) < seeds:
            continue
        per_loss.append(statistics.fmean(abs(statistics.fmean(c) - ref_row["test"]) * 100
                                         for c in itertools.combinations(values, seeds)))
    return statistics.fmean(per_loss) if per_loss else math.nan


# -- one arm's score -----------------------------------------------------------------------------------------
def score(ref: dict[str, Any], truth: dict[str, Any], arm: dict[str, Any], margin: float) -> dict[str, Any]:
    """Every score of one record against the reference (ranking, gap) and the truth (verdicts)."""
    from scipy.stats import kendalltau

    names = ref["ranking"]
    rl = ref["losses"]
    best = rl[ref["best"]]
    worst = -1.0  # a loss without a result ranks last
    arm_test = {n: (arm["losses"].get(n, {}).get("test") if arm["losses"].get(n, {}).get("test") is not None
                    else worst) for n in names}
    tau_all = float(kendalltau([rl[n]["test"] for n in names], [arm_test[n] for n in names]).statistic)
    # only pairs the reference separates (95% intervals that do not overlap)
    conc = disc = pairs = 0
    for a, b in itertools.combinations(names, 2):
        if rl[a]["low"] > rl[b]["high"] or rl[b]["low"] > rl[a]["high"]:
            pairs += 1
            s = np.sign(rl[a]["test"] - rl[b]["test"]) * np.sign(arm_test[a] - arm_test[b])
            conc += s > 0
            disc += s < 0
    gaps = [abs(arm_test[n] - rl[n]["test"]) * 100 for n in names if arm_test[n] != worst]
    winner = arm["winner"]
    others = [n for n in names if n != truth["baseline"]]
    verdicts = {n: word(arm["losses"].get(n, {}).get("verdict", "")) for n in others}
    judged = {n: wrong(verdicts[n], truth["losses"].get(n), margin) for n in others}
    decided = sum(v in DECIDED for v in verdicts.values())
    unjudged = sum(w is None for w in judged.values())
    bad = sorted(n for n, w in judged.items() if w)
    return {"winner": winner, "winner_ok": winner is not None and rl[winner]["test"] >= best["low"],
            "tau_all": tau_all, "tau_sep": (conc - disc) / pairs if pairs else math.nan, "sep_pairs": pairs,
            "gap": statistics.fmean(gaps) if gaps else math.nan, "missing": len(names) - len(gaps),
            "fraction": arm["compute"] / ref["compute"], "comparisons": len(others), "decided": decided,
            "decided_share": decided / len(others) if others else math.nan, "wrong": len(bad),
            "wrong_losses": bad,
            # wrong among the decided verdicts the truth could judge: an undecided verdict is never wrong, so
            # a share over every comparison would shrink as fewer are decided
            "judged": decided - unjudged,
            "wrong_share": len(bad) / (decided - unjudged) if decided - unjudged else math.nan,
            "unjudged": unjudged, "verdicts": verdicts,
            "best_size": sum(bool(r.get("best")) for r in arm["losses"].values())}


# -- the null simulation -------------------------------------------------------------------------------------
def distinct_runs(pool_size: int, losses: int, seeds: int, rng: np.random.Generator) -> np.ndarray:
    """Which run of the pool each loss draws on each seed: an index array of shape (losses, seeds).

    On every seed the losses take distinct runs (a random permutation of the pool), so two losses share a run
    only when the pool forces it: with more losses than runs every run is taken once before any is taken twice
    (a fresh permutation per pass), and which losses share is random. Drawing each loss with replacement
    instead (sim_racing.from_pools) gives a loss its baseline's very run on a seed with probability 1 / pool
    size: a paired difference of exactly 0 because the same run was counted twice, which real runs of two
    losses never are (their counts may still be equal, and distinct runs of the pool tie as often as real ones
    do)."""
    if pool_size < 1 or losses < 1 or seeds < 0:
        raise ValueError(f"expected a non-empty pool and losses, got pool {pool_size}, losses {losses}, "
                         f"seeds {seeds}")
    passes = -(-losses // pool_size)
    out = np.empty((losses, seeds), dtype=np.intp)
    for s in range(seeds):
        runs = np.concatenate([rng.permutation(pool_size) for _ in range(passes)])[:losses]
        out[rng.permutation(losses), s] = runs
    return out


def margin_step(margin: float, items: int | None) -> float:
    """The smallest difference at or beyond `margin` (a fraction) that a split of `items` items can show:
    ceil(margin × items) whole items / items (digits' 359 test images at margin 0.005: 2 images, 0.557
    points). None: a continuous metric, the margin itself."""
    if items is None:
        return margin
    if items < 1:
        raise ValueError(f"expected a split of at least 1 item, got {items}")
    return math.ceil(margin * items - 1e-9) / items


def shifted(values: np.ndarray, shift: float, items: int | None) -> np.ndarray:
    """`values` (fractions) moved by `shift`. On a split of `items` items the shift is whole items,
    k = shift × items, and a value on the lattice becomes (count + k) / items: the very float a run with k
    more right answers reports, so that equal counts compare equal, as in real runs. A value off the lattice
    (or a continuous metric, items None) is moved by `shift` as it is."""
    values = np.asarray(values, dtype=float)
    if items is None or shift == 0:
        return values + shift
    k = round(shift * items)
    if not math.isclose(k, shift * items, abs_tol=1e-6):
        raise ValueError(f"expected a shift of whole items of {items}, got {shift} ({shift * items:g} items)")
    counts = np.rint(values * items)
    return np.where(np.abs(values * items - counts) <= 1e-6, (counts + k) / items, values + shift)


def pool_races(plan: Any, runs: np.ndarray, signs: dict[str, int], items: tuple[int | None, int | None],
               answers: int, rng: np.random.Generator) -> tuple[Any, int]:
    """`answers` races (tune_as.results.racing.decide, every round up to max_seeds) on one pool of
    (validation, test) runs, fractions. On each seed the losses draw distinct runs (`distinct_runs`); a loss's
    runs are moved by signs[loss] (-1, 0 or +1) times the margin step of each split (`margin_step` of the
    plan's margin and `items`, (validation items, test items): whole items, `shifted`). Scored by
    sim_racing.score, the test shifts being the true effects. Returns the tally and the answers with a false
    'equivalent'."""
    import sim_racing

    from tune_as.results import racing

    val_items, test_items = items
    seeds = plan.seeds[: plan.max_seeds]
    step_val, step_test = margin_step(plan.margin, val_items), margin_step(plan.margin, test_items)
    effects = {loss: signs[loss] * step_test for loss in plan.losses}
    moved = {loss: np.column_stack([shifted(runs[:, 0], signs[loss] * step_val, val_items),
                                    shifted(runs[:, 1], signs[loss] * step_test, test_items)])
             for loss in plan.losses}
    tally, false_equivalent = sim_racing.Tally(), 0
    for _ in range(answers):
        idx = distinct_runs(len(runs), len(plan.losses), len(seeds), rng)
        results = {loss: {s: (float(moved[loss][j, 0]), float(moved[loss][j, 1]))
                          for s, j in zip(seeds, idx[i], strict=True)} for i, loss in enumerate(plan.losses)}
        answer = racing.decide(results, plan)
        sim_racing.score(tally, answer, effects, plan)
        false_equivalent += any(r.verdict == "equivalent"
                                and abs(effects[r.loss] - effects[plan.baseline]) >= plan.margin
                                for r in answer.rows)
    return tally, false_equivalent


def null_fwer(losses: Sequence[str], baseline: str, pool: Sequence[tuple[float, float | None]],
              margin_points: float, max_seeds: int, answers: int, seed: int,
              items: tuple[int | None, int | None] | None = None) -> dict[str, Any]:
    """The racing rule's family-wise error by simulation, on the baseline's truth runs `pool`
    (validation, test):

    - null: every loss is the baseline. On each seed every loss draws a distinct run of the pool
      (`distinct_runs`; shared only when there are more losses than runs). Any win or loss is false, and so is
      a best set without a best loss (sim_racing.score). `wrong` / `answers` is the null FWER of the goal.
    - at the margin: every loss but the baseline shifted by the smallest difference at or beyond the margin
      that the splits can show, in whole items (`margin_step`: 2 of digits' 359 test images), + and − in turn,
      drawn the same way. Its values stay on the metric's lattice, so equal counts (a paired difference of
      exactly 0, the same difference on every seed) occur as in real runs; a shift of exactly ±margin
      (0.005 = 1.795 images, sim_racing's --from scenario) leaves the lattice, and a shifted loss never ties
      its baseline's count. Every `equivalent` is false here, and so is any win or loss against the sign of
      the shift.
    items: (validation items, test items) of the task's splits; None (or a None inside): a continuous metric,
    shifted by exactly ±margin. With fewer than 2 runs in the pool, sim_racing's normal model (seed and run sd
    0.3 points each, its defaults) gives the null and there is no at-margin scenario. The engine's race plan:
    first look 3 seeds, then 2 more per round, up to max_seeds."""
    import sim_racing

    from tune_as.results.racing import Plan

    val_items, test_items = items if items is not None else (None, None)
    # the engine's plan: one test item as the intervals' resolution where its Plan has that field
    own = {"resolution_points": 100 / test_items} if test_items and "resolution_points" in {
        f.name for f in dataclasses.fields(Plan)} else {}
    plan = Plan(tuple(losses), baseline, tuple(range(max_seeds)), max_seeds=max_seeds,
                margin_points=margin_points, **own)
    zero = dict.fromkeys(plan.losses, 0.0)
    rng = np.random.default_rng(seed)
    margin: dict[str, Any] | None = None
    if len(pool) >= 2 and all(t is not None for _, t in pool):
        runs = np.array([(v, t) for v, t in pool], dtype=float)
        tally, _ = pool_races(plan, runs, dict.fromkeys(plan.losses, 0), (val_items, test_items),
                              answers, rng)
        share = (f"; {len(plan.losses)} losses > {len(runs)} runs: each run taken once before any twice"
                 if len(plan.losses) > len(runs) else "")
        source = (f"every loss draws from the baseline's {len(runs)} truth runs, "
                  f"a distinct run per loss on each seed{share}")
        step = margin_step(plan.margin, test_items)
        signs = {loss: 0 if loss == baseline else (1 if i % 2 else -1) for i, loss in enumerate(plan.losses)}
        at, false_eq = pool_races(plan, runs, signs, (val_items, test_items), answers, rng)
        margin = {"wrong": at.wrong_answer, "answers": at.answers, "false_equivalent": false_eq,
                  "text": sim_racing.cp(at.wrong_answer, at.answers),
                  "equivalent_text": sim_racing.cp(false_eq, at.answers), "shift_points": step * 100,
                  "items": test_items, "decided_share": at.decided / at.rows if at.rows else math.nan}
    else:
        draws = sim_racing.always(sim_racing.synthetic(plan, zero, 0.3, 0.3))
        source = ("normal model, seed and run sd 0.3 points (sim_racing.synthetic): "
                  "the truth's baseline has no pool")
        tally = sim_racing.run(plan, draws, zero, answers, rng)
    return {"wrong": tally.wrong_answer, "answers": tally.answers, "text": sim_racing.cp(tally.wrong_answer,
                                                                                          tally.answers),
            "source": source, "losses": len(plan.losses), "looks": plan.looks,
            "decided_share": tally.decided / tally.rows if tally.rows else math.nan, "margin": margin}


# -- output --------------------------------------------------------------------------------------------------
def fmt(x: Any, spec: str = ".2f") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    return "\n".join(["| " + " | ".join(header) + " |", "|" + " --- |" * len(header),
                      *("| " + " | ".join(r) + " |" for r in rows)])


def _setting(params: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in params.items()) or "-"


def reference_table(ref: dict[str, Any]) -> str:
    rows = []
    for i, loss in enumerate(ref["ranking"], 1):
        r = ref["losses"][loss]
        rows.append([str(i), loss, str(r["points"]), _setting(r["params"]), f"{r['val'] * 100:.2f}",
                     f"{r['test'] * 100:.2f} [{fmt(r['low'] * 100)}, {fmt(r['high'] * 100)}]"])
    return _table(["rank", "loss", "grid points", "selected setting", "val mean", "test mean [95% CI]"], rows)


def truth_table(ref: dict[str, Any], truth: dict[str, Any], margin: float) -> str:
    rows = []
    for loss in ref["ranking"]:
        t = truth["losses"].get(loss)
        mean = fmt(statistics.fmean(truth["test"][loss].values()) * 100) if truth["test"].get(loss) else "-"
        if loss == truth["baseline"]:
            rows.append([loss, _setting(ref["losses"][loss]["params"]), mean, "baseline", "-"])
            continue
        diff = ("-" if t is None
                else f"{t['diff'] * 100:+.2f} [{t['low'] * 100:+.2f}, {t['high'] * 100:+.2f}] ({t['n']})")
        rows.append([loss, _setting(ref["losses"][loss]["params"]), mean, diff, truth_says(t, margin)])
    return _table(["loss", "reference's setting", f"test mean, {len(truth['seeds'])} new seeds",
                   f"Δ test vs {truth['baseline']}, points [95% t-interval] (paired seeds)",
                   "the truth says"], rows)


def arms_table(records: Sequence[dict[str, Any]]) -> str:
    rows = []
    for r in records:
        s = r["score"]
        rows.append([r["arm"], f"{r['budget']:.0%}", str(r["seed"]), str(r["trials_per_loss"] or "by budget"),
                     f"{r['trials']} ({r['stopped_early']})", f"{r['compute']:.0f}", f"{s['fraction']:.1%}",
                     f"{r['wall']:.0f}", f"{s['decided']}/{s['comparisons']}", f"{s['wrong']}/{s['judged']}",
                     str(s["best_size"]), fmt(s["gap"]), str(s["winner"]), "yes" if s["winner_ok"] else "no",
                     fmt(s["tau_all"]), f"{fmt(s['tau_sep'])} ({s['sep_pairs']})"])
    return _table(["arm", "budget", "search seed", "trials/loss", "trials (stopped early)",
                   "compute (trial-epochs)", "fraction of reference", "wall s", "decided", "wrong / decided",
                   "best-set size", "mean gap, points", "winner", "winner in ref. interval", "τ all",
                   "τ separable (pairs)"], rows)


def groups(records: Sequence[dict[str, Any]],
           order: Sequence[str]) -> list[tuple[str, float, list[dict[str, Any]]]]:
    """Records by (arm, budget), in budget then `order`'s order."""
    keys = sorted({(r["arm"], r["budget"]) for r in records}, key=lambda g: (g[1], order.index(g[0])))
    return [(a, b, [r for r in records if r["arm"] == a and r["budget"] == b]) for a, b in keys]


def _mean(rs: Sequence[dict[str, Any]], key: str) -> float:
    return statistics.fmean(r["score"][key] for r in rs)


def wrong_of_decided(rs: Sequence[dict[str, Any]]) -> tuple[int, int, float]:
    """Wrong verdicts, judged decided verdicts and their share, pooled over the records (a seed that decided
    nothing adds nothing to either; NaN when nothing was decided)."""
    bad = sum(r["score"]["wrong"] for r in rs)
    judged = sum(r["score"]["judged"] for r in rs)
    return bad, judged, bad / judged if judged else math.nan


def _wrong_of_decided(rs: Sequence[dict[str, Any]]) -> str:
    bad, judged, share = wrong_of_decided(rs)
    return f"{bad}/{judged} ({fmt(share, '.3f')})"


def summary_table(records: Sequence[dict[str, Any]], order: Sequence[str]) -> str:
    """Per arm and budget, means over the search seeds (the per-seed values in brackets where they matter)."""
    rows = []
    for arm, budget, rs in groups(records, order):
        per = " / ".join(f"{r['score']['decided_share']:.2f}" for r in rs)
        rows.append([arm, f"{budget:.0%}", str(len(rs)), f"{_mean(rs, 'decided_share'):.2f} ({per})",
                     _wrong_of_decided(rs), str(sum(r["score"]["wrong"] for r in rs)),
                     fmt(_mean(rs, "gap")), f"{statistics.fmean(r['score']['best_size'] for r in rs):.1f}",
                     f"{statistics.fmean(r['compute'] for r in rs):.0f} ({_mean(rs, 'fraction'):.1%})",
                     f"{statistics.fmean(r['wall'] for r in rs):.0f}"])
    return _table(["arm", "budget", "search seeds", "decided share (per seed)", "wrong / decided (share)",
                   "wrong verdicts", "mean gap, points", "best-set size", "compute, trial-epochs (fraction)",
                   "wall s"], rows)


def verdict_table(records: Sequence[dict[str, Any]], ref: dict[str, Any], truth: dict[str, Any],
                  margin: float, order: Sequence[str]) -> str:
    """Per loss: the truth, then each arm's verdicts over its search seeds (W win, L loss, E equivalent,
    u undecided; a wrong one in bold with ✗)."""
    gs = groups(records, order)
    rows = []
    for loss in ref["ranking"]:
        if loss == truth["baseline"]:
            continue
        t = truth["losses"].get(loss)
        cells = [loss, "-" if t is None
                 else f"{t['diff'] * 100:+.2f} [{t['low'] * 100:+.2f}, {t['high'] * 100:+.2f}]"]
        for _, _, rs in gs:
            marks = []
            for r in rs:
                v = r["score"]["verdicts"][loss]
                marks.append(f"**{SHORT[v]}✗**" if wrong(v, t, margin) else SHORT[v])
            cells.append(" ".join(marks))
        rows.append(cells)
    return _table(["loss", "truth Δ, points [95%]", *(f"{a} {b:.0%}" for a, b, _ in gs)], rows)


def gap_table(records: Sequence[dict[str, Any]], ref: dict[str, Any], order: Sequence[str]) -> str:
    """Where the mean gap comes from: per loss, |arm's test − reference's best| in points, mean over search
    seeds ("-": no result in any seed), and in how many seeds the loss was confirmed."""
    gs = groups(records, order)
    rows = []
    for name in ref["ranking"]:
        cells = [name, fmt(ref["losses"][name]["sd"] * 100)]
        for _, _, rs in gs:
            gaps = [abs(r["losses"][name]["test"] - ref["losses"][name]["test"]) * 100 for r in rs
                    if r["losses"].get(name, {}).get("test") is not None]
            confirmed = sum(bool(r["losses"].get(name, {}).get("confirmed")) for r in rs)
            cells.append(f"{statistics.fmean(gaps):.2f} ({confirmed}/{len(rs)})" if gaps else "-")
        rows.append(cells)
    return _table(["loss", "reference test sd", *(f"{a} {b:.0%}" for a, b, _ in gs)], rows)


def summary_lines(records: Sequence[dict[str, Any]], ref: dict[str, Any], order: Sequence[str],
                  tru: dict[str, Any] | None = None) -> list[str]:
    out = [f"noise floor (the reference's own settings, new seeds): gap {ref['floor_confirmed']:.2f} points "
           f"with {len(ref['losses'])} losses confirmed on as many seeds as the reference, "
           f"{ref['floor_single']:.2f} with single runs (normal model)"]
    if tru is not None and "floor" in tru:
        out.append(f"noise floor, measured on the truth's runs (a perfect search: the reference's settings "
                   f"on every {tru['floor']['seeds']}-subset of the new seeds): "
                   f"gap {fmt(tru['floor']['confirmed'])} points confirmed, "
                   f"{fmt(tru['floor']['single'])} with single runs")
    gs = groups(records, order)
    for arm, budget, rs in gs:
        sc = [r["score"] for r in rs]
        out.append(f"search-vs-grid: {arm:<11} budget {budget:.0%} (spent {_mean(rs, 'fraction'):.1%}): "
                   f"winner in interval {sum(s['winner_ok'] for s in sc)}/{len(sc)}, "
                   f"tau_sep {fmt(_mean(rs, 'tau_sep'))}, tau_all {fmt(_mean(rs, 'tau_all'))}, "
                   f"gap {fmt(_mean(rs, 'gap'))} points, "
                   f"{sum(s['missing'] for s in sc)} loss results missing")
    for arm, budget, rs in gs:
        sc = [r["score"] for r in rs]
        per = " ".join(f"{s['decided']}/{s['comparisons']}" for s in sc)
        out.append(f"decided share: {arm:<11} budget {budget:.0%}: {_mean(rs, 'decided_share'):.2f} "
                   f"(per seed {per}), best-set size "
                   f"{statistics.fmean(s['best_size'] for s in sc):.1f}, compute "
                   f"{statistics.fmean(r['compute'] for r in rs):.0f} trial-epochs "
                   f"({_mean(rs, 'fraction'):.1%}), wall {statistics.fmean(r['wall'] for r in rs):.0f} s")
    for arm, budget, rs in gs:
        sc = [r["score"] for r in rs]
        named = "; ".join(f"seed {r['seed']}: {', '.join(r['score']['wrong_losses'])}" for r in rs
                          if r["score"]["wrong_losses"])
        unjudged = sum(s["unjudged"] for s in sc)
        bad, judged, share = wrong_of_decided(rs)
        per = " ".join(f"{s['wrong']}/{s['judged']}" for s in sc)
        out.append(f"wrong verdicts: {arm:<11} budget {budget:.0%}: "
                   f"{bad} of {sum(s['comparisons'] for s in sc)} comparisons; "
                   f"wrong {bad} of {judged} decided (share {fmt(share, '.3f')}; per seed {per})"
                   + (f" [{named}]" if named else "")
                   + (f", {unjudged} more decided without a truth (not judged)" if unjudged else ""))
    return out


def null_lines(null: dict[str, Any]) -> list[str]:
    """The null FWER line and, when the pool allowed it, the at-margin scenario's (`null_fwer`)."""
    out = [f"null FWER: {null['text']}; racing rule, {null['losses']} losses, looks {null['looks']}; "
           f"{null['source']}"]
    m = null.get("margin")
    if m:
        step = (f"{m['shift_points']:.3f} points = {round(m['shift_points'] / 100 * m['items'])} of "
                f"{m['items']} test items" if m["items"]
                else f"{m['shift_points']:g} points (continuous metric)")
        out.append(f"at the margin (each loss ±{step}, distinct draws as above): "
                   f"any wrong claim {m['text']}; false 'equivalent' {m['equivalent_text']}")
    return out


def goal_lines(records: Sequence[dict[str, Any]], null: dict[str, Any], task: str,
               floor: float = math.nan) -> list[str]:
    """The measurement's goals for this task (docs/bench_efficiency.md, "Goals"); an arm not run is "not run".
    `floor`: the measured gap of a perfect search (`measured_floor`), printed beside the gap goal; it does not
    change the goal's verdict."""

    def by_arm(arm: str) -> list[dict[str, Any]]:
        return [r for r in records if r["arm"] == arm]

    def verdict(ok: bool | None) -> str:
        return "not run" if ok is None else "met" if ok else "MISSED"

    wrong_total = sum(r["score"]["wrong"] for r in records)
    judged = sum(r["score"].get("judged", 0) for r in records)
    fixed, race = by_arm("fixed"), by_arm("race")
    share_race = _mean(race, "decided_share") if race else math.nan
    share_fixed = _mean(fixed, "decided_share") if fixed else math.nan
    # nothing decided by either is no gain: the race must decide something
    twice = share_race > 0 and share_race >= GOAL_DECIDED_RATIO * share_fixed if race and fixed else None
    gap = _mean(race, "gap") if race else math.nan
    rate = null["wrong"] / null["answers"]
    return [f"goal [{task}] 0 wrong verdicts over every arm and search seed: {wrong_total} of {judged} "
            f"decided ({len(records)} answers) -> {verdict(wrong_total == 0 if records else None)}",
            f"goal [{task}] decided share race >= {GOAL_DECIDED_RATIO:g}x fixed at the same compute "
            f"(and > 0): {fmt(share_race)} vs {fmt(share_fixed)}"
            + (f" = {share_race / share_fixed:.2f}x" if share_fixed > 0 else "") + f" -> {verdict(twice)}",
            f"goal [{task}] null FWER <= {GOAL_FWER:.0%}: {rate:.4f} -> {verdict(rate <= GOAL_FWER)}",
            f"goal [{task}] mean per-loss gap <= {GOAL_GAP_POINTS} points (race): {fmt(gap)} -> "
            f"{verdict(gap <= GOAL_GAP_POINTS if race else None)}"
            + (f" (a perfect search scores {fmt(floor)} here)" if not math.isnan(floor) else "")]


def plot(records: Sequence[dict[str, Any]], path: Path, task: str, order: Sequence[str]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    markers = dict(zip(order, "os^vDPX<>", strict=False))
    for arm in order:
        rs = sorted((r for r in records if r["arm"] == arm), key=lambda r: r["budget"])
        if not rs:
            continue
        for ax, key in zip(axes, ("decided_share", "gap"), strict=True):
            ax.scatter([r["score"]["fraction"] * 100 for r in rs], [r["score"][key] for r in rs],
                       marker=markers[arm], alpha=0.5)
            budgets = sorted({r["budget"] for r in rs})
            mx = [statistics.fmean(r["score"]["fraction"] * 100 for r in rs if r["budget"] == b)
                  for b in budgets]
            my = [statistics.fmean(r["score"][key] for r in rs if r["budget"] == b) for b in budgets]
            ax.plot(mx, my, marker=markers[arm], label=arm)
    axes[0].set(xlabel="compute, % of the grid reference", ylabel="decided verdicts / non-baseline losses",
                title="decided share")
    axes[1].set(xlabel="compute, % of the grid reference", ylabel="mean |arm − reference| test, points",
                title="per-loss gap")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(f"{task}, {len(records[0]['losses'])} losses: arms vs the grid and the truth "
                 "(points: search seeds; lines: mean)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
