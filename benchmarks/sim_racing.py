"""Null simulation of the answer's decision rules (tune_as.results.racing.decide, the full racing rule).

Each simulated answer draws every loss's results on all max_seeds seeds up front and calls `decide` once:
the replay uses a loss's seeds only up to where the race would have stopped it, so this is the same answer
as running the rounds one by one (tests/test_racing.py checks that), at a third of the cost.

Scenarios:
- synthetic (default): per-seed value = 80% + effect(loss) + seed effect (shared by every loss on a seed,
  the pairing) + run noise, in points, for validation and test alike;
  * all-null: every loss identical to the baseline; any win/loss claim is wrong;
  * half-null: half the losses identical to the baseline, the others 1 point better or worse;
  * mixed (not null): 3 losses +1 point, 3 losses -1 point, 3 within 0.2 points (+0.2, -0.2, +0.1), the
    rest identical; decided share, seeds used and wrong verdicts, racing and the fixed design side by side.
- --from FILE: real per-seed results (`read_pools` below has the format) instead of a normal model. Each
  answer takes one pool (one task and loss setting: its per-seed results), in turn; each run of each of the K
  losses draws a (validation, test) pair from it with replacement, and the race runs as above (all its rounds,
  up to max_seeds; the seeds spent are those its decisions used, what the engine runs without a budget). Seeds
  pair as in the engine: every loss runs the plan's seeds and the rule takes differences seed by seed; two
  losses' draws on one seed are independent (a null whatever seed effect real losses share). Two scenarios:
  the null (every loss identical: any win or loss is false) and the margin scenario (each loss but the
  baseline on the pool shifted by exactly +margin or -margin, in turn, validation and test alike: every
  'equivalent' is false, the equivalence test's error). --mix resamples all pools as one,
  each centred on the mean of the pools.

The answer is wrong when a verdict is wrong or its best set holds no truly best loss (Hsu's promise); an
excluded loss that ties for best is counted apart: with ties the promise is per best loss, not for all.

- --lattice N: the synthetic model on an N-item split (each value a whole number of items), for the null and
  for true differences exactly at +-margin: equal counts on every seed occur as on a real test split.

Run: python benchmarks/sim_racing.py [--answers 2000] [--quick] [--from FILE [--mix]] [--lattice N]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tune_as.results.racing import Answer, Plan, Results, decide  # noqa: E402

Draw = Callable[[np.random.Generator], Results]


@dataclass
class Tally:
    answers: int = 0
    wrong_answer: int = 0  # any wrong claim: a verdict or a best-set exclusion
    wrong_verdicts: int = 0  # answers with a wrong verdict
    wrong_best: int = 0  # answers whose best set has no truly best loss (what Hsu's rule promises)
    best_out: int = 0  # answers with some truly best loss excluded (not promised when several tie)
    wrong_claims: int = 0  # wrong verdicts, counted one by one
    decided: int = 0
    rows: int = 0
    seeds: int = 0
    losses: int = 0
    best_size: int = 0


def wrong(verdict: str, effect: float, margin: float) -> bool:
    """Is the claim false for a true mean difference `effect` (fractions)?"""
    return ((verdict == "win" and effect <= 0) or (verdict == "loss" and effect >= 0)
            or (verdict == "equivalent" and abs(effect) >= margin))


def score(tally: Tally, answer: Answer, effects: dict[str, float], plan: Plan) -> None:
    top = max(effects.values())
    bad_rows = [r for r in answer.rows
                if wrong(r.verdict, effects[r.loss] - effects[plan.baseline], plan.margin)]
    tops = [loss for loss, e in effects.items() if e == top]
    no_best = not any(loss in answer.best for loss in tops)
    tally.answers += 1
    tally.wrong_verdicts += bool(bad_rows)
    tally.wrong_claims += len(bad_rows)
    tally.wrong_best += no_best
    tally.best_out += any(loss not in answer.best for loss in tops)
    tally.wrong_answer += bool(bad_rows or no_best)
    tally.decided += sum(r.verdict != "undecided" for r in answer.rows)
    tally.rows += len(answer.rows)
    tally.seeds += sum(answer.seeds_used.values())
    tally.losses += len(answer.seeds_used)
    tally.best_size += len(answer.best)


def cp(x: int, n: int) -> str:
    ci = stats.binomtest(x, n).proportion_ci(confidence_level=0.95, method="exact")
    return f"{x}/{n} = {x / n:.4f} [{ci.low:.4f}, {ci.high:.4f}] (Clopper-Pearson 95%)"


def synthetic(plan: Plan, effects_points: dict[str, float], seed_sd: float, run_sd: float) -> Draw:
    seeds = plan.seeds[: plan.max_seeds]

    def draw(rng: np.random.Generator) -> Results:
        shared = rng.normal(0.0, seed_sd, len(seeds))
        out = {}
        for loss, eff in effects_points.items():
            val = 80.0 + eff + shared + rng.normal(0.0, run_sd, len(seeds))
            test = 80.0 + eff + shared + rng.normal(0.0, run_sd, len(seeds))
            out[loss] = {s: (v / 100, t / 100) for s, v, t in zip(seeds, val, test, strict=True)}
        return out

    return draw


# -- real per-seed results (--from) --------------------------------------------------------------------------
Pools = dict[str, np.ndarray]  # "task/setting" -> (seeds, 2) array of (validation, test) as fractions


def read_pools(path: Path) -> Pools:
    """The per-seed results of one or more (task, loss setting) pairs, from either file:

    - JSON (any name but *.jsonl): one object, or a list of them, each
      `{"task": "digits", "metric": "accuracy", "source": "how it was measured",
        "runs": {"softmax": {"1": 93.2, "2": 92.9, ...},
                 "label_smoothing eps=0.1": {"1": [93.5, 92.8], ...}}}`
      runs: setting -> seed -> the metric in points (percent, as the answer prints it): a number is the test
      metric (used for validation too), a pair is [validation, test]. "source" is free text, optional.
    - JSON Lines (*.jsonl): the run cache of benchmarks/bench_efficiency.py (one finished trial a line:
      {"config": {... "loss", "seed" ...}, "best_val": 0.93, "test": 0.92, "error": null}, fractions); a pool
      is every seed of one config, named by its loss and the settings that differ between the file's configs.
    Pools with fewer than 3 results or a single distinct value are left out
    (a bootstrap of them says nothing)."""
    try:
        text = path.read_text()
        pools = _from_cache(path, text) if path.suffix == ".jsonl" else _from_json(path, json.loads(text))
    except (OSError, ValueError) as exc:
        raise SystemExit(f"{path}: {exc}") from None
    usable = {name: runs for name, runs in pools.items()
              if len(runs) >= 3 and len(np.unique(runs, axis=0)) > 1}
    for name in sorted(set(pools) - set(usable)):
        print(f"left out {name}: {len(pools[name])} results, {len(np.unique(pools[name], axis=0))} distinct")
    if not usable:
        raise SystemExit(f"{path}: expected a pool with at least 3 results of 2 or more values, got none")
    return usable


def _from_json(path: Path, raw: object) -> Pools:
    pools: Pools = {}
    for i, entry in enumerate(raw if isinstance(raw, list) else [raw]):
        if not isinstance(entry, dict) or not isinstance(entry.get("runs"), dict):
            raise ValueError(f"entry {i}: expected an object with \"runs\": {{setting: {{seed: value}}}}, "
                             f"got {str(entry)[:80]}")
        task = str(entry.get("task", path.stem))
        for setting, by_seed in entry["runs"].items():
            if not isinstance(by_seed, dict):
                raise ValueError(f"{task} {setting}: expected {{seed: value}}, got {str(by_seed)[:80]}")
            pairs = []
            for seed, value in by_seed.items():
                pair = value if isinstance(value, list) else [value, value]
                if not str(seed).lstrip("-").isdigit() or len(pair) != 2 or not all(
                        isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
                        for x in pair):
                    raise ValueError(f"{task} {setting}: expected an integer seed and a number or "
                                     f"[validation, test] in points, got {seed!r}: {value!r}")
                pairs.append((pair[0] / 100, pair[1] / 100))
            pools[f"{task}/{setting}"] = np.array(pairs, dtype=float).reshape(-1, 2)
    return pools


def _from_cache(path: Path, text: str) -> Pools:
    rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    for i, row in enumerate(rows, 1):
        if not isinstance(row, dict) or not isinstance(row.get("config"), dict):
            raise ValueError(f"line {i}: expected a finished trial "
                             f"{{\"config\": {{...}}, \"best_val\", \"test\"}}, got {str(row)[:80]}")
    good = [r for r in rows if not r.get("error") and isinstance(r.get("best_val"), (int, float))
            and isinstance(r.get("test"), (int, float)) and math.isfinite(r["best_val"])
            and math.isfinite(r["test"])]
    settings = [{k: v for k, v in r["config"].items() if k != "seed"} for r in good]
    differ = sorted({k for c in settings for k in c
                     if k != "loss" and len({json.dumps(d.get(k)) for d in settings}) > 1})
    grouped: dict[str, list[tuple[float, float]]] = {}
    for row, config in zip(good, settings, strict=True):
        name = " ".join([str(config.get("loss")), *(f"{k}={config[k]}" for k in differ if k in config)])
        grouped.setdefault(f"{path.parent.name}/{name}", []).append(
            (float(row["best_val"]), float(row["test"])))
    return {name: np.array(pairs, dtype=float) for name, pairs in grouped.items()}


def centred(pools: Pools) -> Pools:
    """Every pool moved to the mean of the pools' means, as one pool (--mix)."""
    grand = np.mean([runs.mean(axis=0) for runs in pools.values()], axis=0)
    return {"all pools, centred": np.concatenate([runs - runs.mean(axis=0) + grand
                                                  for runs in pools.values()])}


def from_pools(plan: Plan, pools: Pools, shift: dict[str, float], answers: int,
               rng: np.random.Generator) -> tuple[Tally, int]:
    """`answers` races, each on one pool (in turn) shifted per loss by `shift` (fractions); the tally and the
    answers with a false 'equivalent'."""
    tally, false_equivalent = Tally(), 0
    names, seeds = sorted(pools), plan.seeds[: plan.max_seeds]
    for i in range(answers):
        runs = pools[names[i % len(names)]]
        results = {loss: {s: (float(v), float(t)) for s, (v, t) in
                          zip(seeds, runs[rng.integers(0, len(runs), len(seeds))] + shift[loss], strict=True)}
                   for loss in plan.losses}
        answer = decide(results, plan)
        score(tally, answer, shift, plan)
        false_equivalent += any(r.verdict == "equivalent"
                                and abs(shift[r.loss] - shift[plan.baseline]) >= plan.margin
                                for r in answer.rows)
    return tally, false_equivalent


def report_from(path: Path, plan: Plan, pools: Pools, answers: int, rng: np.random.Generator) -> None:
    """The two scenarios of --from, one line per figure."""
    for name, runs in sorted(pools.items()):
        print(f"pool {name}: {len(runs)} seeds, test {runs[:, 1].mean() * 100:.2f} ± "
              f"{runs[:, 1].std(ddof=1) * 100:.2f} points, validation {runs[:, 0].mean() * 100:.2f} ± "
              f"{runs[:, 0].std(ddof=1) * 100:.2f}")
    k, most = len(plan.losses), len(plan.losses) * plan.max_seeds
    null, _ = from_pools(plan, pools, dict.fromkeys(plan.losses, 0.0), answers, rng)
    print(f"null, {k} identical losses from {path.name}: family-wise error (any false win/loss): "
          f"{cp(null.wrong_verdicts, answers)}")
    print(f"null: seeds spent {null.seeds / null.losses:.2f} per loss, "
          f"{null.seeds / answers:.1f} runs per answer (at most {most})")
    m = plan.margin
    shift = {loss: 0.0 if loss == plan.baseline else (m if i % 2 else -m)
             for i, loss in enumerate(plan.losses)}
    at_margin, false_eq = from_pools(plan, pools, shift, answers, rng)
    print(f"true differences exactly ±{plan.margin_points:g} points: "
          f"false 'equivalent' in {cp(false_eq, answers)}")
    print(f"±{plan.margin_points:g} points: any wrong claim (a verdict, or a best set without a best loss) "
          f"in {cp(at_margin.wrong_answer, answers)}")
    print(f"±{plan.margin_points:g} points: seeds spent {at_margin.seeds / at_margin.losses:.2f} per loss, "
          f"{at_margin.seeds / answers:.1f} runs per answer (at most {most})")


def lattice(plan: Plan, items: int, effects_points: dict[str, float], seed_sd: float, run_sd: float) -> Draw:
    """The synthetic model on a finite split: each run's accuracy is a whole number of `items` (latent value
    in points rounded to the nearest item), so equal counts on every seed happen as they do on a real test
    split."""
    seeds = plan.seeds[: plan.max_seeds]

    def on_lattice(points: np.ndarray) -> np.ndarray:
        return np.round(points / 100 * items) / items

    def draw(rng: np.random.Generator) -> Results:
        shared = rng.normal(0.0, seed_sd, len(seeds))
        out = {}
        for loss, eff in effects_points.items():
            val = on_lattice(95.0 + eff + shared + rng.normal(0.0, run_sd, len(seeds)))
            test = on_lattice(95.0 + eff + shared + rng.normal(0.0, run_sd, len(seeds)))
            out[loss] = {s: (float(v), float(t)) for s, v, t in zip(seeds, val, test, strict=True)}
        return out

    return draw


def report_lattice(plan: Plan, items: int, seed_sd: float, run_sd: float, answers: int,
                   rng: np.random.Generator) -> None:
    """Two scenarios on an `items`-item split: every loss identical to the baseline (any win/loss is false),
    and every other loss exactly +-margin from it in the latent metric (any 'equivalent' is false)."""
    step = 100 / items
    print(f"lattice: {items} items (one item = {step:.3f} points), run noise {run_sd} points, margin "
          f"{plan.margin_points:g} points{' (below one item)' if plan.margin_points < step else ''}")
    null = run(plan, always(lattice(plan, items, dict.fromkeys(plan.losses, 0.0), seed_sd, run_sd)),
               dict.fromkeys(plan.losses, 0.0), answers, rng)
    print(f"  null, {len(plan.losses)} identical losses: "
          f"any false win/loss: {cp(null.wrong_verdicts, answers)}")
    m = plan.margin_points
    shift = {loss: 0.0 if loss == plan.baseline else (m if i % 2 else -m)
             for i, loss in enumerate(plan.losses)}
    draw = lattice(plan, items, shift, seed_sd, run_sd)
    false_eq = decided = rows = 0
    for _ in range(answers):
        answer = decide(draw(rng), plan)
        false_eq += any(r.verdict == "equivalent" for r in answer.rows)
        decided += sum(r.verdict != "undecided" for r in answer.rows)
        rows += len(answer.rows)
    print(f"  true differences exactly ±{m:g} points: false 'equivalent' in {cp(false_eq, answers)}; "
          f"decided {decided / rows:.3f} of the verdicts")


def always(draw: Draw) -> Callable[[int], Draw]:
    return lambda _answer: draw


def run(plan: Plan, draws: Callable[[int], Draw], effects: dict[str, float], answers: int,
        rng: np.random.Generator) -> Tally:
    tally = Tally()
    for i in range(answers):
        score(tally, decide(draws(i)(rng), plan), effects, plan)
    return tally


def report(name: str, tally: Tally, null: bool) -> None:
    print(f"[{name}]")
    if null:
        print(f"  null FWER: {cp(tally.wrong_answer, tally.answers)}")
        print(f"    verdicts: {cp(tally.wrong_verdicts, tally.answers)}")
        print(f"    best set without a best loss: {cp(tally.wrong_best, tally.answers)}")
    else:
        print(f"  FWER: {cp(tally.wrong_answer, tally.answers)}")
        print(f"  wrong verdicts: {tally.wrong_claims} claims in {tally.wrong_verdicts} of {tally.answers} "
              f"answers; best set without a best loss: {tally.wrong_best}")
    print(f"  (not promised when several losses tie for best) some best loss excluded: "
          f"{cp(tally.best_out, tally.answers)}")
    print(f"  decided share: {tally.decided / tally.rows:.3f} of {tally.rows} verdicts; "
          f"mean seeds used per loss: {tally.seeds / tally.losses:.2f}; "
          f"mean best-set size: {tally.best_size / tally.answers:.2f}")


def one_sided(test: str, x: np.ndarray) -> np.ndarray:
    """Row-wise one-sided p of H0 mean <= 0: "t" (one-sample t) or "wilcoxon" (signed-rank)."""
    if test == "t":
        return np.asarray(stats.ttest_1samp(x, 0.0, axis=1, alternative="greater").pvalue)
    return np.asarray(stats.wilcoxon(x, axis=1, alternative="greater").pvalue)


def peeking(looks: tuple[int, ...], answers: int, rng: np.random.Generator) -> None:
    """What the racing rule avoids: one true null, one-sided tests at 0.05 repeated at every look without
    correction (as a pruner testing at each step does), against one test at the last look."""
    d = rng.normal(size=(answers, looks[-1]))
    for test in ("t", "wilcoxon"):
        ever = np.zeros(answers, dtype=bool)
        for n in looks:
            ever |= one_sided(test, d[:, :n]) <= 0.05
        once = int((one_sided(test, d) <= 0.05).sum())
        print(f"  {test}: once at n={looks[-1]}: {cp(once, answers)}")
        print(f"  {test}: at every look {looks}: {cp(int(ever.sum()), answers)}")


# -- the rule x scenario table (--rules) ---------------------------------------------------------------------
# Each answer's runs are drawn once and decided by every rule: today's per-loss t (alpha spent by n), the
# pooled variance (the simulation's reference: valid only under equal noise) and the moderated model
# (the default).
RULES = {"per-loss": {"noise": "per-loss", "spending": "n"}, "pooled": {"noise": "pooled", "spending": "n2"},
         "moderated": {"noise": "moderated", "spending": "n2"}}
BASE_POINTS, SEED_SD, RUN_SD, ITEMS = 95.0, 0.3, 0.3, 359


@dataclass(frozen=True)
class Scenario:
    """Per-seed value = BASE_POINTS + effect + seed effect (shared) + noise of sd `sd` (one per loss, the
    baseline first); `tails`: t-distributed noise with that many degrees of freedom; `diverge`: that loss's
    run lands at chance (10%) with probability 0.2 on each seed; `lattice`: whole items of ITEMS; `pools`:
    resample real runs."""

    name: str
    sd: tuple[float, ...]
    effect: tuple[float, ...]
    tails: float | None = None
    diverge: int | None = None
    lattice: bool = False
    # "null": every real pool centred on one mean; "real": as measured (truth = means)
    pools: str | None = None
    max_seeds: tuple[int, ...] = (5, 10)


def scenarios(k: int) -> list[Scenario]:
    m = k - 1
    eq = (RUN_SD,) * k
    zero = (0.0,) * k
    s_d = math.sqrt(2) * RUN_SD  # the spread of a paired difference under equal noise
    one = lambda factor: (RUN_SD, RUN_SD * factor, *(RUN_SD,) * (m - 1))  # noqa: E731
    return [
        Scenario("all-null, equal noise", eq, zero),
        Scenario("all-null, spreads spanning 10x (0.1-1.0)", (RUN_SD, *np.geomspace(0.1, 1.0, m)), zero),
        Scenario("all-null, one loss 5x noisier", one(5), zero, max_seeds=(5,)),
        Scenario("all-null, one loss 10x noisier", one(10), zero),
        Scenario("all-null, baseline 3x noisier", (3 * RUN_SD, *(RUN_SD,) * m), zero, max_seeds=(5,)),
        Scenario("all-null, baseline 5x noisier", (5 * RUN_SD, *(RUN_SD,) * m), zero, max_seeds=(5,)),
        Scenario("all-null, baseline 10x noisier", (10 * RUN_SD, *(RUN_SD,) * m), zero),
        Scenario("all-null, one loss diverges (chance on 1 in 5 seeds)", eq, zero, diverge=1, max_seeds=(5,)),
        Scenario("all-null, heavy tails (t, 3 df)", eq, zero, tails=3.0, max_seeds=(5,)),
        Scenario(f"all-null on the {ITEMS}-item lattice", eq, zero, lattice=True, max_seeds=(5,)),
        Scenario(f"every loss at +-margin on the {ITEMS}-item lattice", eq,
                 (0.0, *(0.5 if i % 2 else -0.5 for i in range(1, k))), lattice=True, max_seeds=(5,)),
        Scenario("partial null: 3 losses at +1, +2, +3 s, the rest null", eq,
                 (0.0, s_d, 2 * s_d, 3 * s_d, *(0.0,) * (m - 3))),
        Scenario("real digits pools (20 seeds x 13 losses), centred: null", eq, zero, pools="null"),
        Scenario("real digits pools as measured (truth: their means)", eq, zero, pools="real"),
    ]


def scenario_draw(sc: Scenario, plan: Plan, rng: np.random.Generator,
                  pools: np.ndarray | None) -> tuple[Results, dict[str, float]]:
    """One answer's runs on the plan's seeds, and each loss's true effect (fractions)."""
    seeds = plan.seeds[: plan.max_seeds]
    if pools is not None:
        # (losses, seeds, 2) in points; a seed index drawn for all losses keeps their pairing
        pick = rng.integers(0, pools.shape[1], len(seeds))
        means = pools.mean(axis=1, keepdims=True)
        data = pools - means + means.mean(axis=0) if sc.pools == "null" else pools
        truth = data[:, :, 1].mean(axis=1)
        runs = data[:, pick, :] / 100
        return ({loss: {s: (float(v), float(t)) for s, (v, t) in zip(seeds, runs[i], strict=True)}
                 for i, loss in enumerate(plan.losses)},
                {loss: float(truth[i] - truth[0]) / 100 for i, loss in enumerate(plan.losses)})
    shared = rng.normal(0.0, SEED_SD, len(seeds))
    out = {}
    for i, loss in enumerate(plan.losses):
        pair = []
        for _ in range(2):  # validation, test
            e = (rng.standard_t(sc.tails, len(seeds)) / math.sqrt(sc.tails / (sc.tails - 2)) if sc.tails
                 else rng.normal(0.0, 1.0, len(seeds))) * sc.sd[i]
            v = BASE_POINTS + sc.effect[i] + shared + e
            if sc.diverge == i:
                v = np.where(rng.random(len(seeds)) < 0.2, 10.0, v)
            if sc.lattice:
                v = np.round(v / 100 * ITEMS) / ITEMS * 100
            pair.append(v / 100)
        out[loss] = {s: (float(a), float(b)) for s, a, b in zip(seeds, *pair, strict=True)}
    return out, {loss: (sc.effect[i] - sc.effect[0]) / 100 for i, loss in enumerate(plan.losses)}


def _rules_cell(job: tuple[int, int, int, int, str]) -> list[tuple[str, int, str, Tally]]:
    """One scenario at one max_seeds, every rule on the same answers (a process-pool job)."""
    index, max_seeds, answers, seed, pools_file = job
    k = 13
    sc = scenarios(k)[index]
    losses = ("baseline", *(f"loss{i:02d}" for i in range(1, k)))
    pools = None
    if sc.pools:
        doc = json.loads(Path(pools_file).read_text())
        names = [doc["baseline"], *sorted(n for n in doc["runs"] if n != doc["baseline"])]
        pools = np.array([[doc["runs"][n][s] for s in sorted(doc["runs"][n], key=int)] for n in names],
                         dtype=float)
    plans = {name: Plan(losses, "baseline", tuple(range(1000, 1000 + max_seeds)), max_seeds=max_seeds,
                        resolution_points=100 / ITEMS if sc.lattice or sc.pools else 0.0, **how)  # type: ignore[arg-type]
             for name, how in RULES.items()}
    tallies = {name: Tally() for name in RULES}
    rng = np.random.default_rng([seed, index, max_seeds])
    for _ in range(answers):
        results, effects = scenario_draw(sc, plans["moderated"], rng, pools)
        for name, plan in plans.items():
            score(tallies[name], decide(results, plan), effects, plan)
    return [(sc.name, max_seeds, name, tallies[name]) for name in RULES]


def rules_table(answers: int, seed: int, pools_file: Path, workers: int) -> None:
    """The table of docs/verdicts.md, section 12: each scenario x rule, its verdicts' family-wise error (any
    false win, loss or equivalence) with its Clopper-Pearson 95% interval, and the share of verdicts
    decided."""
    from concurrent.futures import ProcessPoolExecutor

    jobs = [(i, n, answers, seed, str(pools_file)) for i, sc in enumerate(scenarios(13))
            for n in sc.max_seeds]
    print(f"{answers} answers per scenario, 13 losses (12 comparisons), alpha 0.05 (verdicts 0.025), "
          f"margin 0.5 points, seed {seed}; synthetic noise sd {RUN_SD} points, "
          f"seed effect sd {SEED_SD}; pools {pools_file}")
    print("| scenario | seeds | " + " | ".join(f"{r}: verdicts wrong [95% CI] | decided" for r in RULES)
          + " |")
    print("| --- | --- | " + " | ".join("--- | ---" for _ in RULES) + " |")
    with ProcessPoolExecutor(workers) as pool:
        for rows in pool.map(_rules_cell, jobs):
            cells = []
            for *_, tally in rows:
                ci = stats.binomtest(tally.wrong_verdicts, tally.answers).proportion_ci(0.95, method="exact")
                cells.append(f"{tally.wrong_verdicts / tally.answers:.4f} [{ci.low:.4f}, {ci.high:.4f}] | "
                             f"{tally.decided / tally.rows:.3f}")
            print(f"| {rows[0][0]} | {rows[0][1]} | " + " | ".join(cells) + " |", flush=True)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--answers", type=int, default=2000, help="simulated answers per scenario (default 2000)")
    p.add_argument("--quick", action="store_true",
                   help="300 answers per scenario, no fixed-design comparison")
    p.add_argument("--losses", type=int, default=13, help="losses, the baseline included (default 13)")
    p.add_argument("--from", dest="from_file", type=Path, default=None, metavar="FILE",
                   help="real per-seed results: JSON, or bench_efficiency.py's runs.jsonl (read_pools)")
    p.add_argument("--mix", action="store_true", help="with --from: resample all pools, centred, as one")
    p.add_argument("--lattice", type=int, default=None, metavar="N",
                   help="values on an N-item split (whole items, e.g. 359 for digits' test split): "
                        "the null and the at-margin scenarios only")
    p.add_argument("--seed-sd", type=float, default=0.3, help="seed effect shared by all losses, points")
    p.add_argument("--run-sd", type=float, default=0.3, help="run-to-run noise of one loss, points")
    p.add_argument("--margin", type=float, default=0.5, help="equivalence margin, points (default 0.5)")
    p.add_argument("--alpha", type=float, default=0.05)
    p.add_argument("--first", type=int, default=3)
    p.add_argument("--step", type=int, default=2)
    p.add_argument("--max-seeds", type=int, default=10)
    p.add_argument("--best-rule", choices=("hsu", "holm"), default="hsu",
                   help="the best set's rule (tune_as.results.verdicts.best_set; default hsu)")
    p.add_argument("--seed", type=int, default=0, help="random seed of the simulation")
    p.add_argument("--rules", action="store_true",
                   help="the rule x scenario table of docs/verdicts.md section 12 "
                        "(per-loss, pooled, moderated on the same answers; "
                        "--from names the real pools, default benchmarks/digits_pools.json)")
    p.add_argument("--workers", type=int, default=2, help="with --rules: processes (default 2)")
    p.add_argument("--noise", choices=("moderated", "per-loss", "pooled"), default="moderated",
                   help="the noise model of the other modes "
                        "(default moderated; sections 7-10 measured per-loss)")
    p.add_argument("--spending", choices=("n", "n2"), default="n2",
                   help="alpha per look, by seeds or their square (default n2; sections 7-10 measured n)")
    p.add_argument("--peeking", action="store_true",
                   help="also show the error of unadjusted tests repeated at every look (20,000 nulls)")
    args = p.parse_args(argv)
    answers = 300 if args.quick else args.answers
    if args.rules:
        rules_table(answers, args.seed, args.from_file or Path(__file__).with_name("digits_pools.json"),
                    args.workers)
        return
    losses = ("baseline", *(f"loss{i:02d}" for i in range(1, args.losses)))
    plan = Plan(losses, "baseline", tuple(range(1000, 1000 + args.max_seeds)), first=args.first,
                step=args.step, max_seeds=args.max_seeds, alpha=args.alpha, margin_points=args.margin,
                best_rule=args.best_rule, resolution_points=100 / args.lattice if args.lattice else 0.0,
                noise=args.noise, spending=args.spending)
    fixed = Plan.fixed(losses, "baseline", plan.seeds, args.max_seeds, alpha=args.alpha,
                       margin_points=args.margin, best_rule=args.best_rule, noise=args.noise)
    rng = np.random.default_rng(args.seed)
    print(f"{args.losses} losses, looks {plan.looks}, alpha {args.alpha} (verdicts {args.alpha / 2}, "
          f"best set {args.alpha / 2}, rule {args.best_rule}), margin {args.margin} points, "
          f"{answers} answers per scenario, seed {args.seed}")
    started = time.perf_counter()
    others = losses[1:]
    if args.lattice is not None:
        report_lattice(plan, args.lattice, args.seed_sd, args.run_sd, answers, rng)
    elif args.from_file is not None:
        pools = read_pools(args.from_file)
        report_from(args.from_file, plan, centred(pools) if args.mix else pools, answers, rng)
    else:
        sd = (args.seed_sd, args.run_sd)
        scenarios: list[tuple[str, dict[str, float], bool]] = [
            ("all-null: every loss identical to the baseline", dict.fromkeys(losses, 0.0), True),
            ("half-null: half identical, the others 1 point better or worse",
             {"baseline": 0.0, **{loss: 0.0 if j < len(others) // 2 else (1.0 if j % 2 == 0 else -1.0)
                                  for j, loss in enumerate(others)}}, True),
        ]
        mixed_pattern = [1.0, 1.0, 1.0, -1.0, -1.0, -1.0, 0.2, -0.2, 0.1]
        mixed = {"baseline": 0.0, **{loss: mixed_pattern[i] if i < len(mixed_pattern) else 0.0
                                     for i, loss in enumerate(others)}}
        scenarios.append(("mixed: 3 losses +1 point, 3 losses -1 point, 3 within 0.2 points, "
                          "the rest identical", mixed, False))
        for name, effects_points, null in scenarios:
            effects = {loss: e / 100 for loss, e in effects_points.items()}
            draw = synthetic(plan, effects_points, *sd)
            report(name, run(plan, always(draw), effects, answers, rng), null)
            if not null and not args.quick:
                report(name + f" -- fixed design, {args.max_seeds} seeds, one look",
                       run(fixed, always(draw), effects, answers, rng), null)
    if args.peeking:
        print("[peeking: one true null, no correction for the looks]")
        peeking(plan.looks, 20_000, rng)
    print(f"({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
