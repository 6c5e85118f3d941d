"""Does the search pay (issue 15)? tune_as's whole answer (which loss wins, with which settings) against an
exhaustive grid reference, at a fraction of the grid's compute.

    python benchmarks/bench_efficiency.py --quick                      # a few minutes: smoke check
    python benchmarks/bench_efficiency.py --task digits                # docs/bench_efficiency.md
    python benchmarks/bench_efficiency.py --task clinc_oos             # frozen MiniLM features (../shared/data)

The reference: every multi-class loss over a grid of its parameters (GRIDS, inside the task's search space),
each point with several seeds, trained to the end by `tune_as.training.trial.run_trial` directly (no Ray), every
evaluation recorded and cached as JSON Lines under --cache-dir, so re-running the arms never repeats it. Per loss
the reference answer is the grid point with the best mean validation metric, its test mean and 95% t-interval;
the losses are ranked by that test mean. Reference compute = the sum of epochs trained.

The arms, each at total budgets (fractions of the reference compute, confirmation runs included) and search
seeds, all through `tune_as.engine.run_search` (real Ray Tune, Optuna, MLflow on SQLite):
  search      the default search: Optuna TPE per loss, warm start first, per-loss ASHA, --confirm 3 --confirm-top K
  cross_loss  the same with asha_scope="search" (one set of ASHA brackets for every loss: the old behaviour)
  random      --sampler random --no-warm-start: uniform draws from the same space, per-loss ASHA, same confirmation
A budget is met by choosing trials per loss (the largest whose estimated compute fits); the compute actually
spent (the engine's Outcome.compute) is reported next to it.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import itertools
import json
import math
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
DATA = REPO.parent / "shared" / "data"
ARMS = ("search", "cross_loss", "random", "no_warm_start", "confirm_all")
DEFAULT_ARMS = ARMS[:3]  # the arms; the last two are ablations of this benchmark's default changes

# Reference grids per loss (parameter names as in search_spaces/<task>.yaml). Points outside a loss's search range
# are not allowed: the reference and the arms search the same space.
GRIDS: dict[str, dict[str, list[Any]]] = {
    "softmax": {},
    "sparsemax": {},
    "entmax15": {},
    "t_softmax": {"tau": [0.25, 0.5, 1.0, 2.0, 4.0, 8.0]},
    "label_smoothing": {"eps": [0.0, 0.1, 0.2, 0.3, 0.4]},
    "sparse_softmax": {"k": [2, 3, 4, 6, 9]},
    "am_softmax": {"s": [2.0, 5.0, 10.0, 30.0], "m": [0.0, 0.15, 0.3, 0.45]},
    "taylor_softmax": {"n": [2, 4, 6, 8, 10], "backward": ["finite", "inf"]},
    "sm_softmax": {"m": [0.0, 0.25, 0.5, 0.75, 1.0]},
    "sm_taylor_softmax": {"m": [0.0, 0.5, 1.0], "n": [2, 6, 10]},
    "as_variant": {"delta": [0.0, 2.0, 4.0, 6.0, 8.0]},
    "as_softmax": {"delta": [0.05, 0.15, 0.25, 0.35, 0.5], "warmup_r": [0.0, 0.1, 0.2, 0.3]},
    "as_speed": {"delta": [0.1, 0.3, 0.5], "lam": [0.5, 1.0, 1.5], "max_steps": [2, 4, 6], "warmup_r": [0.1]},
}
QUICK_GRIDS: dict[str, dict[str, list[Any]]] = {
    "softmax": {}, "t_softmax": {"tau": [0.5, 2.0]}, "as_softmax": {"delta": [0.1, 0.3], "warmup_r": [0.0]},
}


@dataclasses.dataclass(frozen=True)
class TaskSetup:
    """One task's fixed trial settings (the same for every trial of the reference and the arms)."""

    request: dict[str, Any]  # SearchRequest fields beyond the task (backbone, encoder, data_dir)
    epochs: float
    lr: float
    batch_size: int
    grids: dict[str, dict[str, list[Any]]]
    note: str


TASKS = {
    "digits": TaskSetup({}, 5.0, 5e-3, 64, GRIDS, "scikit-learn's 8x8 digits, the task's small CNN"),
    # a head trained from scratch on cached mean-pooled all-MiniLM-L6-v2 features; k reaches the task's 151 classes
    "clinc_oos": TaskSetup({"backbone": "minilm", "encoder": "frozen", "data_dir": DATA / "clinc_oos"}, 5.0, 1e-3, 32,
                           {**GRIDS, "sparse_softmax": {"k": [5, 10, 20, 50, 100]}},
                           "CLINC150 + oos (151 classes), frozen MiniLM features, a linear head"),
}


@dataclasses.dataclass(frozen=True)
class Setup:
    """Every setting a run of the benchmark shares (one object; the CLI fills it)."""

    task: str
    task_setup: TaskSetup
    grids: dict[str, dict[str, list[Any]]]
    epochs: float
    lr: float
    batch_size: int
    ref_seeds: tuple[int, ...]
    budgets: tuple[float, ...]
    search_seeds: tuple[int, ...]
    arms: tuple[str, ...]
    confirm: int
    confirm_top: int | None
    workers: int
    cache_dir: Path

    @property
    def losses(self) -> tuple[str, ...]:
        return tuple(self.grids)

    def request(self, **kw: Any) -> Any:
        """The engine request every phase starts from (the reference's plan, its workers and the arms)."""
        from tune_as.engine.request import SearchRequest

        return SearchRequest(task=self.task, losses=self.losses, max_epochs=self.epochs, overrides=self.overrides,
                             cache_dir=self.cache_dir / "data", verbose=0, **self.task_setup.request, **kw)

    @property
    def metric(self) -> str:
        return "accuracy"

    @property
    def overrides(self) -> tuple[tuple[str, Any], ...]:
        return (("lr", self.lr), ("batch_size", self.batch_size))


# -- running trials without Ray ---------------------------------------------------------------------------------
class Collector:
    """A `tune_as.training.trial.Reporter` that keeps every evaluation (no checkpoints: nothing resumes here)."""

    def __init__(self) -> None:
        self.reports: list[dict[str, Any]] = []

    def wants_checkpoint(self, final: bool) -> bool:
        return False

    def report(self, metrics: dict[str, Any], checkpoint_dir: Path | None) -> None:
        self.reports.append(dict(metrics))


_WORKER: dict[str, Any] = {}


def _init_worker(setup: Setup) -> None:
    import torch

    from tune_as.engine.plan import plan_search

    torch.set_num_threads(1)  # one core per worker: what a 1-CPU Ray trial gets
    with tempfile.TemporaryDirectory() as tmp:  # the plan writes nothing but the (shared) data cache
        plan = plan_search(setup.request(storage_path=Path(tmp)))
    _WORKER.update(task=plan.task, data=plan.data, metric=setup.metric)


def _train(config: dict[str, Any]) -> dict[str, Any]:
    from tune_as.training.trial import run_trial

    rec, tic = Collector(), time.perf_counter()
    run_trial(config, _WORKER["data"], _WORKER["task"], rec)
    last, metric = rec.reports[-1], _WORKER["metric"]
    return {"config": config, "seconds": time.perf_counter() - tic,
            "curve": [[r["epoch"], r.get(f"val_{metric}", float("nan"))] for r in rec.reports],
            "best_val": last.get(f"best_val_{metric}"), "test": last.get(f"test_{metric}"),
            "steps": last.get("optimizer_steps"), "error": last.get("error")}


def config_id(config: dict[str, Any]) -> str:
    return hashlib.sha1(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()[:16]


class RunCache:
    """Finished trials as JSON Lines (one line per trial, keyed by its full config): shared by every phase."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.done: dict[str, dict[str, Any]] = {}
        if path.is_file():
            for line in path.read_text().splitlines():
                if line.strip():
                    row = json.loads(line)
                    self.done[config_id(row["config"])] = row

    def run(self, configs: list[dict[str, Any]], setup: Setup) -> list[dict[str, Any]]:
        """Results in the order of `configs`, training (in `workers` processes) only what is not cached."""
        todo = list({config_id(c): c for c in configs if config_id(c) not in self.done}.values())
        if todo:
            ctx = multiprocessing.get_context("spawn")  # no forked Ray/torch state in the workers
            with ctx.Pool(setup.workers, _init_worker, (setup,)) as pool, open(self.path, "a") as out:
                for i, row in enumerate(pool.imap_unordered(_train, todo), 1):
                    self.done[config_id(row["config"])] = row
                    out.write(json.dumps(row) + "\n")
                    out.flush()
                    if i % 25 == 0 or i == len(todo):
                        print(f"  trained {i}/{len(todo)}", flush=True)
        return [self.done[config_id(c)] for c in configs]


def plan_for(setup: Setup, storage: Path) -> Any:
    from tune_as.engine.plan import plan_search

    return plan_search(setup.request(storage_path=storage))


def trial_config(plan: Any, loss: str, params: dict[str, Any], seed: int) -> dict[str, Any]:
    """The config the engine's searcher would hand a trial of `loss` with these (search-space named) params."""
    from tune_as.space.search_space import config_key

    space = plan.space.losses[loss]
    return {**plan.base.to_dict(), **space.constants(), "loss": loss,
            **{config_key(k): v for k, v in params.items()}, "seed": seed}


# -- the reference ----------------------------------------------------------------------------------------------
def t_interval(values: list[float]) -> tuple[float, float, float]:
    from scipy import stats

    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, math.nan, math.nan
    half = stats.t.ppf(0.975, len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
    return mean, mean - half, mean + half


def reference(setup: Setup, plan: Any, cache: RunCache) -> dict[str, Any]:
    jobs: list[tuple[str, dict[str, Any], int]] = []
    for loss, grid in setup.grids.items():
        names = list(grid)
        for values in itertools.product(*(grid[n] for n in names)):
            for seed in setup.ref_seeds:
                jobs.append((loss, dict(zip(names, values, strict=True)), seed))
    configs = [trial_config(plan, loss, params, seed) for loss, params, seed in jobs]
    print(f"reference: {len(configs)} runs ({len(configs) - sum(config_id(c) in cache.done for c in configs)} "
          "to train)", flush=True)
    tic = time.perf_counter()
    results = cache.run(configs, setup)
    wall = time.perf_counter() - tic
    points: dict[str, dict[str, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for (loss, params, _), row in zip(jobs, results, strict=True):
        points[loss][json.dumps(params, sort_keys=True)].append(row)
    per_loss = {}
    for loss, by_point in points.items():
        scored = [(statistics.fmean(_num(r["best_val"]) for r in rows), key, rows) for key, rows in by_point.items()]
        # a point with a diverged seed (no validation result) is not a result, as in the engine; max keeps the
        # first of equals: grid order
        val, key, rows = max(scored, key=lambda s: -math.inf if math.isnan(s[0]) else s[0])
        mean, low, high = t_interval([_num(r["test"]) for r in rows])
        sd = statistics.stdev(_num(r["test"]) for r in rows) if len(rows) > 1 else math.nan
        per_loss[loss] = {"params": json.loads(key), "val": val, "test": mean, "low": low, "high": high,
                          "points": len(by_point), "sd": sd}
    compute = sum(r["curve"][-1][0] for r in results if r["curve"])
    ranking = sorted(per_loss, key=lambda loss: -per_loss[loss]["test"])
    n = len(setup.ref_seeds)
    return {"losses": per_loss, "ranking": ranking, "best": ranking[0], "runs": len(results), "compute": compute,
            "trial_seconds": sum(r["seconds"] for r in results), "wall_this_call": wall,
            "floor_confirmed": noise_floor(per_loss, n, n), "floor_single": noise_floor(per_loss, n, 1)}


def noise_floor(per_loss: dict[str, Any], ref_seeds: int, seeds: int) -> float:
    """The mean per-loss gap (points) a perfect search would still show: each loss at the reference's own setting,
    its test mean over `seeds` new seeds against the reference's mean over `ref_seeds`. With the seed-to-seed
    standard deviation s of that setting, the difference of the two means is normal with sd
    s * sqrt(1/seeds + 1/ref_seeds), and E|N(0, v)| = sqrt(2 v / pi)."""
    gaps = [r["sd"] * math.sqrt((1 / seeds + 1 / ref_seeds) * 2 / math.pi) * 100 for r in per_loss.values()
            if not math.isnan(r["sd"])]
    return statistics.fmean(gaps) if gaps else math.nan


def _num(value: Any) -> float:
    return float("nan") if value is None else float(value)


# -- budgets --------------------------------------------------------------------------------------------------
STOPPED = 0.4  # the share of trials per-loss ASHA stopped at its rung in this benchmark's first runs (T = 5)


def confirm_top(setup: Setup, arm: str) -> int | None:
    return ARM_OPTIONS[arm].get("confirm_top", setup.confirm_top)


def confirmed_losses(setup: Setup, top: int | None) -> int:
    n = len(setup.losses)
    return n if top is None else min(n, top + 1)  # + softmax, the baseline


def trials_for(budget_epochs: float, setup: Setup, top: int | None, reduction_factor: float = 3.0) -> int:
    """The largest trials per loss whose estimated compute (search + confirmation) fits the budget, at least 1.
    Per-loss ASHA judges nothing below `reduction_factor` trials; above, about STOPPED of the trials stop at its
    one rung (a third of the epochs, rounded up to an evaluation)."""
    n, e = len(setup.losses), setup.epochs
    confirm = confirmed_losses(setup, top) * setup.confirm * e
    rung = math.ceil(e / reduction_factor)
    best = 1
    for t in range(1, 200):
        per_trial = e if t < reduction_factor else (1 - STOPPED) * e + STOPPED * rung
        if n * t * per_trial + confirm <= budget_epochs:
            best = t
    return best


# -- the arms ---------------------------------------------------------------------------------------------------
ARM_OPTIONS: dict[str, dict[str, Any]] = {
    "search": {}, "cross_loss": {"asha_scope": "search"}, "random": {"sampler": "random", "warm_start": False},
    "no_warm_start": {"warm_start": False},  # what the warm start from each loss's defaults buys
    "confirm_all": {"confirm_top": None},  # what confirming only the top losses buys: every loss confirmed
}


def ray_arm(setup: Setup, arm: str, trials: int, seed: int, work: Path) -> dict[str, Any]:
    from tune_as.engine.run import run_search

    options = {"confirm_top": setup.confirm_top, **ARM_OPTIONS[arm]}
    request = setup.request(trials_per_loss=trials, seed=seed, confirm=setup.confirm,
                            storage_path=work / "ray", mlflow_uri=f"sqlite:///{work / 'mlflow.db'}",
                            max_concurrent=setup.workers, name=f"{arm}-t{trials}-s{seed}", **options)
    outcome = run_search(request)
    c = outcome.compute
    return answer(outcome.rows, c.search_epochs + c.confirm_epochs, c.wall_s, len(outcome.trials),
                  sum(t.stopped_early for t in outcome.trials))


def answer(rows: list[Any], compute: float, wall: float, trials: int, stopped: int) -> dict[str, Any]:
    per_loss = {r.loss: {"val": statistics.fmean(r.val) if r.val else None,
                         "test": statistics.fmean(r.test) if r.test else None,
                         "setting": r.setting, "confirmed": r.confirmed} for r in rows}
    winner = rows[0].loss if rows and rows[0].val else None
    return {"losses": per_loss, "winner": winner, "compute": compute, "wall": wall, "trials": trials,
            "stopped_early": stopped}


# -- scores -----------------------------------------------------------------------------------------------------
def score(ref: dict[str, Any], arm: dict[str, Any]) -> dict[str, Any]:
    from scipy.stats import kendalltau

    names = ref["ranking"]
    rl = ref["losses"]
    best = rl[ref["best"]]
    worst = -1.0  # a loss without a confirmed result ranks last
    arm_test = {n: (arm["losses"].get(n, {}).get("test") if arm["losses"].get(n, {}).get("test") is not None
                    else worst) for n in names}
    tau_all = float(kendalltau([rl[n]["test"] for n in names], [arm_test[n] for n in names]).statistic)
    # the criterion: only pairs the reference separates (95% intervals that do not overlap)
    conc = disc = pairs = 0
    for a, b in itertools.combinations(names, 2):
        if rl[a]["low"] > rl[b]["high"] or rl[b]["low"] > rl[a]["high"]:
            pairs += 1
            s = np.sign(rl[a]["test"] - rl[b]["test"]) * np.sign(arm_test[a] - arm_test[b])
            conc += s > 0
            disc += s < 0
    gaps = [abs(arm_test[n] - rl[n]["test"]) * 100 for n in names if arm_test[n] != worst]
    winner = arm["winner"]
    return {"winner": winner, "winner_ok": winner is not None and rl[winner]["test"] >= best["low"],
            "tau_all": tau_all, "tau_sep": (conc - disc) / pairs if pairs else math.nan, "sep_pairs": pairs,
            "gap": statistics.fmean(gaps) if gaps else math.nan, "missing": len(names) - len(gaps),
            "fraction": arm["compute"] / ref["compute"]}


# -- output -----------------------------------------------------------------------------------------------------
def _fmt(x: Any, spec: str = ".2f") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def reference_table(ref: dict[str, Any]) -> str:
    lines = ["| rank | loss | grid points | selected setting | val mean | test mean [95% CI] |", "|" + " --- |" * 6]
    for i, loss in enumerate(ref["ranking"], 1):
        r = ref["losses"][loss]
        setting = ", ".join(f"{k}={v}" for k, v in r["params"].items()) or "-"
        lines.append(f"| {i} | {loss} | {r['points']} | {setting} | {r['val'] * 100:.2f} | {r['test'] * 100:.2f} "
                     f"[{_fmt(r['low'] * 100)}, {_fmt(r['high'] * 100)}] |")
    return "\n".join(lines)


def arms_table(records: list[dict[str, Any]]) -> str:
    lines = ["| arm | budget | search seed | trials/loss | trials (stopped early) | compute (epochs) | fraction of "
             "reference | wall s | winner | winner in ref. interval | τ all | τ separable (pairs) | mean gap, "
             "points (losses without result) |", "|" + " --- |" * 13]
    for r in records:
        s = r["score"]
        lines.append(f"| {r['arm']} | {r['budget']:.0%} | {r['seed']} | {r['trials_per_loss']} | {r['trials']} "
                     f"({r['stopped_early']}) | {r['compute']:.0f} | {s['fraction']:.1%} | {r['wall']:.0f} | "
                     f"{s['winner']} | {'yes' if s['winner_ok'] else 'no'} | {_fmt(s['tau_all'])} | "
                     f"{_fmt(s['tau_sep'])} ({s['sep_pairs']}) | {_fmt(s['gap'])} ({s['missing']}) |")
    return "\n".join(lines)


def gap_table(records: list[dict[str, Any]], ref: dict[str, Any]) -> str:
    """Where the mean gap comes from: per loss, |arm's test − reference's best| in points, mean over search seeds
    ("-": no result in any seed), and in how many seeds the loss was confirmed."""
    groups = sorted({(r["arm"], r["budget"]) for r in records}, key=lambda g: (g[1], ARMS.index(g[0])))
    names = ref["ranking"]
    lines = ["| loss | reference test sd | " + " | ".join(f"{a} {b:.0%}" for a, b in groups) + " |",
             "|" + " --- |" * (len(groups) + 2)]
    for name in names:
        cells = []
        for arm, budget in groups:
            rs = [r for r in records if r["arm"] == arm and r["budget"] == budget]
            gaps = [abs(r["losses"][name]["test"] - ref["losses"][name]["test"]) * 100 for r in rs
                    if r["losses"].get(name, {}).get("test") is not None]
            confirmed = sum(bool(r["losses"].get(name, {}).get("confirmed")) for r in rs)
            cells.append(f"{statistics.fmean(gaps):.2f} ({confirmed}/{len(rs)})" if gaps else "-")
        lines.append(f"| {name} | {_fmt(ref['losses'][name]['sd'] * 100)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def summary_lines(records: list[dict[str, Any]], ref: dict[str, Any]) -> list[str]:
    out = [f"noise floor (the reference's own settings, new seeds): gap {ref['floor_confirmed']:.2f} points with "
           f"{len(ref['losses'])} losses confirmed on as many seeds as the reference, {ref['floor_single']:.2f} "
           "with single runs"]
    for arm in ARMS:
        for budget in sorted({r["budget"] for r in records}):
            rs = [r for r in records if r["arm"] == arm and r["budget"] == budget]
            if not rs:
                continue
            sc = [r["score"] for r in rs]
            out.append(f"search-vs-grid: {arm:<10} budget {budget:.0%} (spent {statistics.fmean(s['fraction'] for s in sc):.1%}): "
                       f"winner in interval {sum(s['winner_ok'] for s in sc)}/{len(sc)}, "
                       f"tau_sep {_fmt(statistics.fmean(s['tau_sep'] for s in sc))}, "
                       f"tau_all {_fmt(statistics.fmean(s['tau_all'] for s in sc))}, "
                       f"gap {_fmt(statistics.fmean(s['gap'] for s in sc))} points, "
                       f"{sum(s['missing'] for s in sc)} loss results missing")
    return out


def plot(records: list[dict[str, Any]], path: Path, task: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    # the τ counts only pairs the reference separates; with none (a saturated task) draw τ over all losses
    separable = any(r["score"]["sep_pairs"] for r in records)
    tau_key = "tau_sep" if separable else "tau_all"
    for arm, marker in zip(ARMS, "os^vD", strict=True):
        rs = sorted((r for r in records if r["arm"] == arm), key=lambda r: r["budget"])
        if not rs:
            continue
        for ax, key in zip(axes, (tau_key, "gap"), strict=True):
            xs = [r["score"]["fraction"] * 100 for r in rs]
            ys = [r["score"][key] for r in rs]
            ax.scatter(xs, ys, marker=marker, alpha=0.5)
            budgets = sorted({r["budget"] for r in rs})
            mx = [statistics.fmean(r["score"]["fraction"] * 100 for r in rs if r["budget"] == b) for b in budgets]
            my = [statistics.fmean(r["score"][key] for r in rs if r["budget"] == b) for b in budgets]
            ax.plot(mx, my, marker=marker, label=arm)
            if key == "gap":  # a gap over fewer losses is not comparable: say how many had no result
                for b, x, y in zip(budgets, mx, my, strict=True):
                    missing = statistics.fmean(r["score"]["missing"] for r in rs if r["budget"] == b)
                    if missing:
                        ax.annotate(f"{missing:.1f} of {len(records[0]['losses'])} losses "
                                    "without result", (x, y), fontsize=7, xytext=(4, -10), textcoords="offset points")
    axes[0].set(xlabel="compute, % of the grid reference",
                ylabel="Kendall τ, " + ("pairs the reference separates" if separable else "all losses (τ-b)"),
                title="ranking agreement")
    axes[1].set(xlabel="compute, % of the grid reference", ylabel="mean |confirmed − reference| test, points",
                title="per-loss gap")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(f"{task}, {len(records[0]['losses'])} losses: search arms vs exhaustive grid (points: search seeds; lines: mean)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


# -- main -------------------------------------------------------------------------------------------------------
def run(setup: Setup, plot_path: Path | None, cached_only: bool = False, reference_only: bool = False) -> dict[str, Any]:
    setup.cache_dir.mkdir(parents=True, exist_ok=True)
    cache = RunCache(setup.cache_dir / "runs.jsonl")
    arms_file = setup.cache_dir / "arms.json"
    arms: dict[str, Any] = json.loads(arms_file.read_text()) if arms_file.is_file() else {}
    with tempfile.TemporaryDirectory() as tmp:
        plan = plan_for(setup, Path(tmp))
        ref = reference(setup, plan, cache)
        print(reference_table(ref), flush=True)
        records = []
        if reference_only:
            return {"reference": ref, "records": records}
        for budget in setup.budgets:
            for seed in setup.search_seeds:
                for arm in setup.arms:
                    top = confirm_top(setup, arm)
                    trials = trials_for(budget * ref["compute"], setup, top)
                    key = f"{arm}|{budget}|{seed}|{trials}|top{top}|v2"  # v2: engine arms
                    if key not in arms and cached_only:
                        continue
                    if key not in arms:
                        print(f"arm {arm}, budget {budget:.0%} ({trials} trials per loss), search seed {seed}",
                              flush=True)
                        work = Path(tmp) / key.replace("|", "_")
                        arms[key] = ray_arm(setup, arm, trials, seed, work)
                        arms_file.write_text(json.dumps(arms, indent=1))
                    rec = {"arm": arm, "budget": budget, "seed": seed, "trials_per_loss": trials, **arms[key]}
                    rec["score"] = score(ref, rec)
                    records.append(rec)
    print("\n" + arms_table(records))
    print("\n" + gap_table(records, ref))
    print("\n" + "\n".join(summary_lines(records, ref)))
    if plot_path is not None:
        plot(records, plot_path, setup.task)
    result = {"reference": ref, "records": records}
    (setup.cache_dir / "result.json").write_text(json.dumps(result, indent=1, default=str))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", choices=sorted(TASKS), default="digits")
    parser.add_argument("--quick", action="store_true", help="digits, 3 losses, tiny grids, 2 epochs: a smoke check")
    parser.add_argument("--ref-seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--budgets", type=float, nargs="+", default=[0.10, 0.15, 0.25])
    parser.add_argument("--search-seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--arms", nargs="+", choices=ARMS, default=list(DEFAULT_ARMS))
    parser.add_argument("--confirm", type=int, default=3)
    parser.add_argument("--confirm-top", type=int, default=3,
                        help="confirm the K losses best on validation (and softmax); 0: every loss")
    parser.add_argument("--workers", type=int, default=2, help="concurrent 1-thread trials (Ray's max_concurrent too)")
    parser.add_argument("--cache-dir", type=Path, default=None,
                        help="runs and arm results (default: .tune_as_cache/bench_efficiency[_<task>|_quick])")
    parser.add_argument("--reference-only", action="store_true", help="train (or read) the reference; run no arm")
    parser.add_argument("--cached-only", action="store_true",
                        help="tables and plot from the arm results already cached; run no new arm")
    parser.add_argument("--plot", type=Path, default=None, help="PNG path (e.g. docs/bench_efficiency.png)")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    quick = args.quick
    task = "digits" if quick else args.task
    ts = TASKS[task]
    if ts.request.get("data_dir") and not Path(ts.request["data_dir"]).is_dir():
        parser.exit(2, f"bench_efficiency: --task {task} expected its data in {ts.request['data_dir']}, "
                       "which does not exist (../shared/data beside the repository)\n")
    cache = args.cache_dir or REPO / ".tune_as_cache" / (
        "bench_efficiency_quick" if quick else "bench_efficiency" + ("" if task == "digits" else "_" + task))
    setup = Setup(task=task, task_setup=ts, grids=QUICK_GRIDS if quick else ts.grids,
                  epochs=2.0 if quick else ts.epochs, lr=ts.lr, batch_size=ts.batch_size,
                  ref_seeds=(0, 1) if quick else tuple(args.ref_seeds),
                  budgets=(0.9,) if quick else tuple(args.budgets),
                  search_seeds=(0,) if quick else tuple(args.search_seeds),
                  arms=tuple(args.arms), confirm=1 if quick else args.confirm,
                  confirm_top=None if quick or not args.confirm_top else args.confirm_top,
                  workers=args.workers, cache_dir=cache.resolve())
    tic = time.perf_counter()
    run(setup, args.plot, args.cached_only, args.reference_only)
    print(f"wall {time.perf_counter() - tic:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
