"""Scores, tables and goal checks of benchmarks/bench_efficiency.py: pure (records in, text out), no training.

Metric values are fractions (accuracy 0.983) everywhere in the records; tables and lines print points (98.33).
A record is one arm at one budget and search seed, as bench_efficiency's `ray_arm` stores it in arms.json:
per loss its verdict and best-set flag as the engine's answer rows printed them, test means, setting.

Definitions (docs/bench_efficiency.md, "Scores"):
- truth: per loss, the reference's selected setting re-run on TRUTH_SEEDS; the paired differences loss minus
  baseline on the seeds both have, their mean and 95% t-interval (`t_interval`, scipy.stats.t).
- decided share: decided verdicts (win, loss, equivalent) / every non-baseline loss of the answer.
- wrong: a `win` whose truth interval lies entirely below 0, a `loss` whose truth interval lies entirely above 0,
  an `equivalent` whose truth mean difference is at or beyond ±margin; `undecided` is never wrong. A verdict on
  a loss without a truth (its 10-seed runs diverged) is not judged and counted apart.
- gap: |arm's test mean for the loss − the reference's best test mean for it|, points, mean over losses.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tune_as.results.verdicts import unmarked

DECIDED = ("win", "loss", "equivalent")
# the engine's own words (tune_as.results.ranking.Row.verdict): decided ones, "baseline", "undecided (n seeds)",
# "" for a loss the answer did not confirm; anything not decided counts as undecided here
SHORT = {"win": "W", "loss": "L", "equivalent": "E", "undecided": "u"}
GOAL_GAP_POINTS = 0.35
GOAL_FWER = 0.05
GOAL_DECIDED_RATIO = 2.0


# -- numbers ----------------------------------------------------------------------------------------------------
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
    return {"n": len(shared), "diff": mean, "low": low, "high": high, "test": statistics.fmean(values.values())}


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


def wrong(verdict: str, truth: dict[str, Any] | None, margin: float) -> bool | None:
    """Is the verdict contradicted by the truth? None: a decided verdict on a loss without a truth."""
    v = word(verdict)
    if v not in DECIDED:
        return False
    if truth is None:
        return None
    if v == "win":
        return bool(truth["high"] < 0)
    if v == "loss":
        return bool(truth["low"] > 0)
    return bool(abs(truth["diff"]) >= margin)


def num(value: Any) -> float:
    return float("nan") if value is None else float(value)


def noise_floor(per_loss: dict[str, Any], ref_seeds: int, seeds: int) -> float:
    """The mean per-loss gap (points) a perfect search would still show: each loss at the reference's own setting,
    its test mean over `seeds` new seeds against the reference's mean over `ref_seeds`. With the seed-to-seed
    standard deviation s of that setting, the difference of the two means is normal with sd
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
    bad = sorted(n for n, w in judged.items() if w)
    return {"winner": winner, "winner_ok": winner is not None and rl[winner]["test"] >= best["low"],
            "tau_all": tau_all, "tau_sep": (conc - disc) / pairs if pairs else math.nan, "sep_pairs": pairs,
            "gap": statistics.fmean(gaps) if gaps else math.nan, "missing": len(names) - len(gaps),
            "fraction": arm["compute"] / ref["compute"], "comparisons": len(others), "decided": decided,
            "decided_share": decided / len(others) if others else math.nan, "wrong": len(bad), "wrong_losses": bad,
            "wrong_share": len(bad) / len(others) if others else math.nan,
            "unjudged": sum(w is None for w in judged.values()), "verdicts": verdicts,
            "best_size": sum(bool(r.get("best")) for r in arm["losses"].values())}


# -- the null simulation -------------------------------------------------------------------------------------
def null_fwer(losses: Sequence[str], baseline: str, pool: Sequence[tuple[float, float | None]], margin_points: float,
              max_seeds: int, answers: int, seed: int) -> dict[str, Any]:
    """The racing rule's family-wise error when no loss differs from the baseline, by benchmarks/sim_racing.py:
    every loss of each simulated answer resamples (with replacement) `pool`, the baseline's truth runs
    (validation, test) (sim_racing.from_pools, its --from mode); with fewer than 2 runs in the pool, its normal
    model instead (seed and run sd 0.3 points each, its defaults). The engine's race plan: first look 3 seeds,
    then 2 more per round, up to max_seeds."""
    import sim_racing

    from tune_as.results.racing import Plan

    plan = Plan(tuple(losses), baseline, tuple(range(max_seeds)), max_seeds=max_seeds, margin_points=margin_points)
    zero = dict.fromkeys(plan.losses, 0.0)
    if len(pool) >= 2 and all(t is not None for _, t in pool):
        pools = {f"truth/{baseline}": np.array([(v, t) for v, t in pool], dtype=float)}
        tally, _ = sim_racing.from_pools(plan, pools, zero, answers, np.random.default_rng(seed))
        source = f"every loss resamples the baseline's {len(pool)} truth runs (sim_racing.from_pools, its --from mode)"
    else:
        draws = sim_racing.always(sim_racing.synthetic(plan, zero, 0.3, 0.3))
        source = "normal model, seed and run sd 0.3 points (sim_racing.synthetic): the truth's baseline has no pool"
        tally = sim_racing.run(plan, draws, zero, answers, np.random.default_rng(seed))
    return {"wrong": tally.wrong_answer, "answers": tally.answers, "text": sim_racing.cp(tally.wrong_answer,
                                                                                          tally.answers),
            "source": source, "losses": len(plan.losses), "looks": plan.looks,
            "decided_share": tally.decided / tally.rows if tally.rows else math.nan}


# -- output ----------------------------------------------------------------------------------------------------
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
        diff = "-" if t is None else f"{t['diff'] * 100:+.2f} [{t['low'] * 100:+.2f}, {t['high'] * 100:+.2f}] ({t['n']})"
        rows.append([loss, _setting(ref["losses"][loss]["params"]), mean, diff, truth_says(t, margin)])
    return _table(["loss", "reference's setting", f"test mean, {len(truth['seeds'])} new seeds",
                   f"Δ test vs {truth['baseline']}, points [95% t-interval] (paired seeds)", "the truth says"], rows)


def arms_table(records: Sequence[dict[str, Any]]) -> str:
    rows = []
    for r in records:
        s = r["score"]
        rows.append([r["arm"], f"{r['budget']:.0%}", str(r["seed"]), str(r["trials_per_loss"] or "by budget"),
                     f"{r['trials']} ({r['stopped_early']})", f"{r['compute']:.0f}", f"{s['fraction']:.1%}",
                     f"{r['wall']:.0f}", f"{s['decided']}/{s['comparisons']}", str(s["wrong"]),
                     str(s["best_size"]), fmt(s["gap"]), str(s["winner"]), "yes" if s["winner_ok"] else "no",
                     fmt(s["tau_all"]), f"{fmt(s['tau_sep'])} ({s['sep_pairs']})"])
    return _table(["arm", "budget", "search seed", "trials/loss", "trials (stopped early)", "compute (trial-epochs)",
                   "fraction of reference", "wall s", "decided", "wrong", "best-set size", "mean gap, points",
                   "winner", "winner in ref. interval", "τ all", "τ separable (pairs)"], rows)


def groups(records: Sequence[dict[str, Any]], order: Sequence[str]) -> list[tuple[str, float, list[dict[str, Any]]]]:
    """Records by (arm, budget), in budget then `order`'s order."""
    keys = sorted({(r["arm"], r["budget"]) for r in records}, key=lambda g: (g[1], order.index(g[0])))
    return [(a, b, [r for r in records if r["arm"] == a and r["budget"] == b]) for a, b in keys]


def _mean(rs: Sequence[dict[str, Any]], key: str) -> float:
    return statistics.fmean(r["score"][key] for r in rs)


def summary_table(records: Sequence[dict[str, Any]], order: Sequence[str]) -> str:
    """Per arm and budget, means over the search seeds (the per-seed values in brackets where they matter)."""
    rows = []
    for arm, budget, rs in groups(records, order):
        per = " / ".join(f"{r['score']['decided_share']:.2f}" for r in rs)
        rows.append([arm, f"{budget:.0%}", str(len(rs)), f"{_mean(rs, 'decided_share'):.2f} ({per})",
                     f"{_mean(rs, 'wrong_share'):.3f}", str(sum(r["score"]["wrong"] for r in rs)),
                     fmt(_mean(rs, "gap")), f"{statistics.fmean(r['score']['best_size'] for r in rs):.1f}",
                     f"{statistics.fmean(r['compute'] for r in rs):.0f} ({_mean(rs, 'fraction'):.1%})",
                     f"{statistics.fmean(r['wall'] for r in rs):.0f}"])
    return _table(["arm", "budget", "search seeds", "decided share (per seed)", "wrong share", "wrong verdicts",
                   "mean gap, points", "best-set size", "compute, trial-epochs (fraction)", "wall s"], rows)


def verdict_table(records: Sequence[dict[str, Any]], ref: dict[str, Any], truth: dict[str, Any], margin: float,
                  order: Sequence[str]) -> str:
    """Per loss: the truth, then each arm's verdicts over its search seeds (W win, L loss, E equivalent,
    u undecided; a wrong one in bold with ✗)."""
    gs = groups(records, order)
    rows = []
    for loss in ref["ranking"]:
        if loss == truth["baseline"]:
            continue
        t = truth["losses"].get(loss)
        cells = [loss, "-" if t is None else f"{t['diff'] * 100:+.2f} [{t['low'] * 100:+.2f}, {t['high'] * 100:+.2f}]"]
        for _, _, rs in gs:
            marks = []
            for r in rs:
                v = r["score"]["verdicts"][loss]
                marks.append(f"**{SHORT[v]}✗**" if wrong(v, t, margin) else SHORT[v])
            cells.append(" ".join(marks))
        rows.append(cells)
    return _table(["loss", "truth Δ, points [95%]", *(f"{a} {b:.0%}" for a, b, _ in gs)], rows)


def gap_table(records: Sequence[dict[str, Any]], ref: dict[str, Any], order: Sequence[str]) -> str:
    """Where the mean gap comes from: per loss, |arm's test − reference's best| in points, mean over search seeds
    ("-": no result in any seed), and in how many seeds the loss was confirmed."""
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
    out = [f"noise floor (the reference's own settings, new seeds): gap {ref['floor_confirmed']:.2f} points with "
           f"{len(ref['losses'])} losses confirmed on as many seeds as the reference, {ref['floor_single']:.2f} "
           "with single runs (normal model)"]
    if tru is not None and "floor" in tru:
        out.append(f"noise floor, measured on the truth's runs (a perfect search: the reference's settings on every "
                   f"{tru['floor']['seeds']}-subset of the new seeds): gap {fmt(tru['floor']['confirmed'])} points "
                   f"confirmed, {fmt(tru['floor']['single'])} with single runs")
    gs = groups(records, order)
    for arm, budget, rs in gs:
        sc = [r["score"] for r in rs]
        out.append(f"search-vs-grid: {arm:<11} budget {budget:.0%} (spent {_mean(rs, 'fraction'):.1%}): "
                   f"winner in interval {sum(s['winner_ok'] for s in sc)}/{len(sc)}, "
                   f"tau_sep {fmt(_mean(rs, 'tau_sep'))}, tau_all {fmt(_mean(rs, 'tau_all'))}, "
                   f"gap {fmt(_mean(rs, 'gap'))} points, {sum(s['missing'] for s in sc)} loss results missing")
    for arm, budget, rs in gs:
        sc = [r["score"] for r in rs]
        per = " ".join(f"{s['decided']}/{s['comparisons']}" for s in sc)
        out.append(f"decided share: {arm:<11} budget {budget:.0%}: {_mean(rs, 'decided_share'):.2f} "
                   f"(per seed {per}), best-set size "
                   f"{statistics.fmean(s['best_size'] for s in sc):.1f}, compute "
                   f"{statistics.fmean(r['compute'] for r in rs):.0f} trial-epochs ({_mean(rs, 'fraction'):.1%}), "
                   f"wall {statistics.fmean(r['wall'] for r in rs):.0f} s")
    for arm, budget, rs in gs:
        sc = [r["score"] for r in rs]
        named = "; ".join(f"seed {r['seed']}: {', '.join(r['score']['wrong_losses'])}" for r in rs
                          if r["score"]["wrong_losses"])
        unjudged = sum(s["unjudged"] for s in sc)
        out.append(f"wrong verdicts: {arm:<11} budget {budget:.0%}: {sum(s['wrong'] for s in sc)} of "
                   f"{sum(s['comparisons'] for s in sc)} comparisons (share {_mean(rs, 'wrong_share'):.3f}; per seed "
                   f"{' '.join(str(s['wrong']) for s in sc)})" + (f" [{named}]" if named else "")
                   + (f", {unjudged} decided without a truth" if unjudged else ""))
    return out


def null_line(null: dict[str, Any]) -> str:
    return (f"null FWER: {null['text']}; racing rule, {null['losses']} losses, looks {null['looks']}; "
            f"{null['source']}")


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
    fixed, race = by_arm("fixed"), by_arm("race")
    share_race = _mean(race, "decided_share") if race else math.nan
    share_fixed = _mean(fixed, "decided_share") if fixed else math.nan
    # nothing decided by either is no gain: the race must decide something
    twice = share_race > 0 and share_race >= GOAL_DECIDED_RATIO * share_fixed if race and fixed else None
    gap = _mean(race, "gap") if race else math.nan
    rate = null["wrong"] / null["answers"]
    return [f"goal [{task}] 0 wrong verdicts over every arm and search seed: {wrong_total} "
            f"({len(records)} answers) -> {verdict(wrong_total == 0 if records else None)}",
            f"goal [{task}] decided share race >= {GOAL_DECIDED_RATIO:g}x fixed at the same compute (and > 0): "
            f"{fmt(share_race)} vs {fmt(share_fixed)}"
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
            mx = [statistics.fmean(r["score"]["fraction"] * 100 for r in rs if r["budget"] == b) for b in budgets]
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
