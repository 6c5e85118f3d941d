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
- --from FILE: real per-seed results, JSON {"loss": {"seed": [val, test or null]}}; each answer takes one
  loss's runs (in turn) and gives every arm its own resample of them, with replacement: all arms identical
  in distribution, so every win/loss claim is wrong.

The answer is wrong when a verdict is wrong or its best set holds no truly best loss (Hsu's promise); an
excluded loss that ties for best is counted apart: with ties the promise is per best loss, not for all.

Run: python benchmarks/sim_racing.py [--answers 2000] [--quick] [--from FILE]
"""

from __future__ import annotations

import argparse
import json
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
    bad_rows = [r for r in answer.rows if wrong(r.verdict, effects[r.loss] - effects[plan.baseline], plan.margin)]
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


def resampled(plan: Plan, runs: dict[str, list[tuple[float, float | None]]]) -> Callable[[int], Draw]:
    """All arms drawn from one source loss's runs (with replacement, each arm on its own)."""
    seeds = plan.seeds[: plan.max_seeds]
    sources = sorted(runs)

    def for_answer(i: int) -> Draw:
        source = runs[sources[i % len(sources)]]

        def draw(rng: np.random.Generator) -> Results:
            return {loss: {s: source[int(j)] for s, j in zip(seeds, rng.integers(0, len(source), len(seeds)),
                                                               strict=True)}
                    for loss in plan.losses}

        return draw

    return for_answer


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
        print(f"  wrong verdicts: {tally.wrong_claims} claims in {tally.wrong_verdicts} of {tally.answers} answers;"
              f" best set without a best loss: {tally.wrong_best}")
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


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--answers", type=int, default=2000, help="simulated answers per scenario (default 2000)")
    p.add_argument("--quick", action="store_true", help="300 answers per scenario, no fixed-design comparison")
    p.add_argument("--losses", type=int, default=13, help="losses, the baseline included (default 13)")
    p.add_argument("--from", dest="from_file", type=Path, default=None, metavar="FILE",
                   help='real per-seed results, JSON {"loss": {"seed": [val, test]}}')
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
    p.add_argument("--peeking", action="store_true",
                   help="also show the error of unadjusted tests repeated at every look (20,000 nulls)")
    args = p.parse_args(argv)
    answers = 300 if args.quick else args.answers
    losses = ("baseline", *(f"loss{i:02d}" for i in range(1, args.losses)))
    plan = Plan(losses, "baseline", tuple(range(1000, 1000 + args.max_seeds)), first=args.first, step=args.step,
                max_seeds=args.max_seeds, alpha=args.alpha, margin_points=args.margin, best_rule=args.best_rule)
    fixed = Plan.fixed(losses, "baseline", plan.seeds, args.max_seeds, alpha=args.alpha,
                       margin_points=args.margin, best_rule=args.best_rule)
    rng = np.random.default_rng(args.seed)
    print(f"{args.losses} losses, looks {plan.looks}, alpha {args.alpha} (verdicts {args.alpha / 2}, best set "
          f"{args.alpha / 2}, rule {args.best_rule}), margin {args.margin} points, {answers} answers per scenario, "
          f"seed {args.seed}")
    started = time.perf_counter()
    others = losses[1:]
    if args.from_file is not None:
        raw = json.loads(args.from_file.read_text())
        runs = {loss: [(float(v), None if t is None else float(t)) for v, t in by_seed.values()]
                for loss, by_seed in raw.items() if len(by_seed) >= 2}
        if not runs:
            raise SystemExit(f"{args.from_file}: no loss with at least 2 seeds")
        zero = dict.fromkeys(losses, 0.0)
        report(f"from {args.from_file.name}: every arm resamples one loss's runs ({len(runs)} losses in turn)",
               run(plan, resampled(plan, runs), zero, answers, rng), null=True)
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
        scenarios.append(("mixed: 3 losses +1 point, 3 losses -1 point, 3 within 0.2 points, the rest identical",
                          mixed, False))
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
