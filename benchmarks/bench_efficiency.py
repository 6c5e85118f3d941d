"""Does the search pay, and are its verdicts right (issues 15 and 20)?
tune_as's whole answer (which loss wins, with which settings, and each loss's verdict against the baseline)
against an exhaustive grid reference and a 10-seed truth, at a fraction of the grid's compute.

    python benchmarks/bench_efficiency.py --quick           # a few minutes: smoke check
    python benchmarks/bench_efficiency.py --task digits     # docs/bench_efficiency.md
    python benchmarks/bench_efficiency.py --task clinc_oos  # frozen MiniLM features (../shared/data)

The reference: every multi-class loss over a grid of its parameters (GRIDS, inside the task's search space),
each point with several seeds, trained to the end by `tune_as.training.trial.run_trial` directly (no Ray),
every evaluation recorded and cached as JSON Lines under --cache-dir, so re-running the arms never repeats it.
Per loss the reference answer is the grid point with the best mean validation metric, its test mean and 95%
t-interval; the losses are ranked by that test mean. Reference compute = the sum of epochs trained.

The truth: each loss's reference-selected point re-run on TRUTH_SEEDS (10 seeds no grid run, search trial or
confirmation run of an arm uses; checked), in the same run cache; per loss the paired difference to the
baseline (softmax) with its 95% t-interval (efficiency_scores.truth_row).

The arms, each at total budgets (fractions of the reference compute, confirmation runs included) and search
seeds, all through `tune_as.engine.run_search` (real Ray Tune, Optuna, MLflow on SQLite):
  fixed        the fixed design: Optuna TPE per loss, warm start, per-loss ASHA, --confirm 3 --confirm-top 3
  race         --race --budget <the arm's budget in trial-epochs> (max seeds: the engine's default, 10)
  random_race  --race as above with --sampler random --no-warm-start
and, behind --arms, the earlier ablations of the fixed design: cross_loss (asha_scope="search"), random
(--sampler random --no-warm-start), no_warm_start, confirm_all (every loss confirmed).
Trials per loss are the largest whose estimated compute, with the confirmation the arm reserves, fits the
budget (`trials_for`); the compute actually spent (the engine's Outcome.compute) is reported next to it. The
verdicts and the best set are read from the engine's answer rows (Outcome.rows) and scored by
efficiency_scores.
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

from efficiency_scores import (
    arms_table,
    gap_table,
    goal_lines,
    measured_floor,
    noise_floor,
    null_fwer,
    null_lines,
    num,
    plot,
    reference_table,
    score,
    summary_lines,
    summary_table,
    t_interval,
    truth_row,
    truth_table,
    verdict_table,
)

from tune_as.results.budget import CONFIRM_SHARE

REPO = Path(__file__).resolve().parent.parent
DATA = REPO.parent / "shared" / "data"
# The truth's seeds: far above the grid's (0-2) and above every seed an arm uses (the search seed, and the
# confirmation seeds the engine takes as the integers after it: tune_as.results.selection.new_seeds);
# main checks.
TRUTH_SEEDS = tuple(range(1000, 1010))

# Reference grids per loss (parameter names as in search_spaces/<task>.yaml). Points outside a loss's search
# range are not allowed: the reference and the arms search the same space.
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
    # a head trained from scratch on cached mean-pooled all-MiniLM-L6-v2 features;
    # k reaches the task's 151 classes
    "clinc_oos": TaskSetup({"backbone": "minilm", "encoder": "frozen", "data_dir": DATA / "clinc_oos"},
                           5.0, 1e-3, 32, {**GRIDS, "sparse_softmax": {"k": [5, 10, 20, 50, 100]}},
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
    truth_seeds: tuple[int, ...]
    budgets: tuple[float, ...]
    search_seeds: tuple[int, ...]
    arms: tuple[str, ...]
    confirm: int  # the fixed design's seeds per confirmed loss
    confirm_top: int | None  # the fixed design's confirmed losses (and the baseline); None: every loss
    trials_per_loss: int | None  # None: the most each arm's budget allows (trials_for)
    sim_answers: int
    workers: int
    cache_dir: Path
    quick: bool = False

    @property
    def losses(self) -> tuple[str, ...]:
        return tuple(self.grids)

    def request(self, **kw: Any) -> Any:
        """The engine request every phase starts from (the reference's plan, its workers and the arms)."""
        from tune_as.engine.request import SearchRequest

        return SearchRequest(task=self.task, losses=self.losses, max_epochs=self.epochs,
                             overrides=self.overrides, cache_dir=self.cache_dir / "data", verbose=0,
                             **self.task_setup.request, **kw)

    @property
    def metric(self) -> str:
        return "accuracy"

    @property
    def overrides(self) -> tuple[tuple[str, Any], ...]:
        return (("lr", self.lr), ("batch_size", self.batch_size))


# -- running trials without Ray ------------------------------------------------------------------------------
class Collector:
    """A `tune_as.training.trial.Reporter` that keeps every evaluation
    (no checkpoints: nothing resumes here)."""

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
    """The config the engine's searcher would hand a trial of `loss` with these
    (search-space named) params."""
    from tune_as.space.search_space import config_key

    space = plan.space.losses[loss]
    return {**plan.base.to_dict(), **space.constants(), "loss": loss,
            **{config_key(k): v for k, v in params.items()}, "seed": seed}


# -- the reference and the truth -----------------------------------------------------------------------------
def reference(setup: Setup, plan: Any, cache: RunCache) -> dict[str, Any]:
    jobs: list[tuple[str, dict[str, Any], int]] = []
    for loss, grid in setup.grids.items():
        names = list(grid)
        for values in itertools.product(*(grid[n] for n in names)):
            for seed in setup.ref_seeds:
                jobs.append((loss, dict(zip(names, values, strict=True)), seed))
    configs = [trial_config(plan, loss, params, seed) for loss, params, seed in jobs]
    print(f"reference: {len(configs)} runs "
          f"({len(configs) - sum(config_id(c) in cache.done for c in configs)} to train)", flush=True)
    tic = time.perf_counter()
    results = cache.run(configs, setup)
    wall = time.perf_counter() - tic
    points: dict[str, dict[str, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for (loss, params, _), row in zip(jobs, results, strict=True):
        points[loss][json.dumps(params, sort_keys=True)].append(row)
    per_loss = {}
    for loss, by_point in points.items():
        scored = [(statistics.fmean(num(r["best_val"]) for r in rows), key, rows)
                  for key, rows in by_point.items()]
        # a point with a diverged seed (no validation result) is not a result, as in the engine; max keeps the
        # first of equals: grid order
        val, key, rows = max(scored, key=lambda s: -math.inf if math.isnan(s[0]) else s[0])
        mean, low, high = t_interval([num(r["test"]) for r in rows])
        sd = statistics.stdev(num(r["test"]) for r in rows) if len(rows) > 1 else math.nan
        per_loss[loss] = {"params": json.loads(key), "val": val, "test": mean, "low": low, "high": high,
                          "points": len(by_point), "sd": sd}
    ranking = sorted(per_loss, key=lambda loss: -per_loss[loss]["test"])
    n = len(setup.ref_seeds)
    return {"losses": per_loss, "ranking": ranking, "best": ranking[0], "runs": len(results),
            "compute": _epochs(results), "trial_seconds": sum(r["seconds"] for r in results),
            "wall_this_call": wall, "floor_confirmed": noise_floor(per_loss, n, n),
            "floor_single": noise_floor(per_loss, n, 1)}


def truth(setup: Setup, plan: Any, ref: dict[str, Any], cache: RunCache) -> dict[str, Any]:
    """Each loss's reference-selected point on the truth's seeds; per loss its paired difference to the
    baseline. A run without a test result (diverged) leaves its seed out of the pairs."""
    jobs = [(loss, seed) for loss in setup.losses for seed in setup.truth_seeds]
    configs = [trial_config(plan, loss, ref["losses"][loss]["params"], seed) for loss, seed in jobs]
    print(f"truth: {len(configs)} runs ({len(configs) - sum(config_id(c) in cache.done for c in configs)} "
          "to train)", flush=True)
    results = cache.run(configs, setup)
    test: dict[str, dict[int, float]] = {loss: {} for loss in setup.losses}
    val: dict[str, dict[int, float]] = {loss: {} for loss in setup.losses}
    for (loss, seed), row in zip(jobs, results, strict=True):
        if row["error"] is None and math.isfinite(num(row["test"])) and math.isfinite(num(row["best_val"])):
            test[loss][seed], val[loss][seed] = float(row["test"]), float(row["best_val"])
    base = plan.baseline
    return {"baseline": base, "seeds": list(setup.truth_seeds), "test": test, "val": val,
            "losses": {loss: truth_row(test[loss], test[base]) for loss in setup.losses if loss != base},
            "compute": _epochs(results),
            "floor": {"seeds": len(setup.ref_seeds), "single": measured_floor(ref["losses"], test, 1),
                      "confirmed": measured_floor(ref["losses"], test, len(setup.ref_seeds))}}


def _epochs(results: list[dict[str, Any]]) -> float:
    return sum(r["curve"][-1][0] for r in results if r["curve"])


# -- the arms ------------------------------------------------------------------------------------------------
FIXED, RACING = "fixed", "racing"
# arm -> (its confirmation design, the SearchRequest options it changes beyond the design's)
ARMS: dict[str, tuple[str, dict[str, Any]]] = {
    "fixed": (FIXED, {}),
    "race": (RACING, {}),
    "random_race": (RACING, {"sampler": "random", "warm_start": False}),
    # earlier ablations of the fixed design (docs/bench_efficiency.md, history)
    "cross_loss": (FIXED, {"asha_scope": "search"}),  # one set of ASHA brackets for every loss
    "random": (FIXED, {"sampler": "random", "warm_start": False}),
    "no_warm_start": (FIXED, {"warm_start": False}),  # what the warm start from each loss's defaults buys
    "confirm_all": (FIXED, {"confirm_top": None}),  # what confirming only the top losses buys
}
DEFAULT_ARMS = ("fixed", "race", "random_race")
STOPPED = 0.4  # the share of trials per-loss ASHA stopped at its rung in this benchmark's first runs (T = 5)


def arm_options(setup: Setup, arm: str, budget_epochs: float) -> dict[str, Any]:
    """The arm's SearchRequest options: its confirmation design, then its own changes."""
    design, own = ARMS[arm]
    if design == RACING:  # a race stops at the budget: it caps the confirmation (the search runs its trials)
        return {"race": True, "budget": round(budget_epochs, 1), **own}
    return {"confirm": setup.confirm, "confirm_top": setup.confirm_top, **own}


def reserved(setup: Setup, options: dict[str, Any]) -> float:
    """The confirmation epochs an arm's trials per loss leave room for. Fixed design: its confirm seeds for
    the losses it confirms (the top K and the baseline). Race: its first look for every loss (the race's first
    round, racing.Plan's `first` seeds each), so that every loss can get a verdict; later rounds take what the
    budget leaves."""
    from tune_as.results.racing import Plan

    n, e = len(setup.losses), setup.epochs
    if options.get("race"):
        return n * Plan.first * e
    top = options["confirm_top"]
    return (n if top is None else min(n, top + 1)) * options["confirm"] * e


def trials_for(budget_epochs: float, setup: Setup, reserve: float, tunable: int,
               reduction_factor: float = 3.0) -> int:
    """The largest trials per loss whose estimated compute (search + `reserve`) fits the budget, at least 1.
    A loss with nothing to tune gets one search trial (the engine's quota when it confirms). Per-loss ASHA
    judges nothing below `reduction_factor` trials; above, about STOPPED of the trials stop at its one rung (a
    third of the epochs, rounded up to an evaluation)."""
    n, e = len(setup.losses), setup.epochs
    rung = math.ceil(e / reduction_factor)
    best = 1
    for t in range(1, 200):
        per_trial = e if t < reduction_factor else (1 - STOPPED) * e + STOPPED * rung
        if tunable * t * per_trial + (n - tunable) * e + reserve <= budget_epochs:
            best = t
    return best


def ray_arm(setup: Setup, arm: str, options: dict[str, Any], trials: int | None, seed: int,
            work: Path) -> dict[str, Any]:
    from tune_as.engine.run import run_search

    request = setup.request(trials_per_loss=trials, seed=seed, storage_path=work / "ray",
                            mlflow_uri=f"sqlite:///{work / 'mlflow.db'}", max_concurrent=setup.workers,
                            name=f"{arm}-t{trials}-s{seed}", **options)
    return answer(run_search(request))


def answer(outcome: Any) -> dict[str, Any]:
    """The engine's answer as a record: per loss its numbers, setting, verdict and best-set flag as the
    answer's rows (tune_as.results.ranking.Row) hold them, what it cost, and the confirmation seeds it
    used."""
    rows = outcome.rows
    per_loss = {r.loss: {"val": statistics.fmean(r.val) if r.val else None,
                         "test": statistics.fmean(r.test) if r.test else None, "setting": r.setting,
                         "confirmed": r.confirmed, "seeds": len(r.test) if r.confirmed else 0,
                         "verdict": r.verdict, "best": r.best} for r in rows}
    c = outcome.compute
    return {"losses": per_loss, "winner": rows[0].loss if rows and rows[0].val else None,
            "compute": c.search_epochs + c.confirm_epochs, "search_compute": c.search_epochs,
            "confirm_compute": c.confirm_epochs, "wall": c.wall_s, "trials": len(outcome.trials),
            "stopped_early": sum(t.stopped_early for t in outcome.trials),
            "confirmation_seeds": sorted({int(t.seed) for t in outcome.confirmations})}


def check_seeds(setup: Setup) -> str | None:
    """Why the truth's seeds could meet another phase's, or None. A search that confirms runs its trials on
    its seed s (a loss with nothing to tune gets one trial) and confirms on
    s + 1, s + 2, ... (selection.new_seeds)."""
    from tune_as.engine.request import SearchRequest

    most = max(SearchRequest.max_seeds, setup.confirm)
    used = set(setup.ref_seeds) | {s + k for s in setup.search_seeds for k in range(most + 1)}
    clash = sorted(used & set(setup.truth_seeds))
    return f"the truth's seeds {clash} are used by the grid or an arm" if clash else None


# -- main ----------------------------------------------------------------------------------------------------
def run(setup: Setup, plot_path: Path | None, cached_only: bool = False,
        reference_only: bool = False) -> dict[str, Any]:
    from tune_as.engine.request import SearchRequest

    setup.cache_dir.mkdir(parents=True, exist_ok=True)
    cache = RunCache(setup.cache_dir / "runs.jsonl")
    arms_file = setup.cache_dir / "arms.json"
    arms: dict[str, Any] = json.loads(arms_file.read_text()) if arms_file.is_file() else {}
    margin_points = SearchRequest.margin  # every arm runs the engine's default margin
    order = list(ARMS)
    with tempfile.TemporaryDirectory() as tmp:
        plan = plan_for(setup, Path(tmp))
        # the null simulation's lattice: accuracy on a split of N items moves in steps of 1/N
        items = (len(plan.data.validation), len(plan.data.test) if plan.data.test is not None else None)
        ref = reference(setup, plan, cache)
        print(reference_table(ref), flush=True)
        tru = truth(setup, plan, ref, cache)
        print(truth_table(ref, tru, margin_points / 100), flush=True)
        records: list[dict[str, Any]] = []
        if reference_only:
            return {"reference": ref, "truth": tru, "records": records}
        tunable = sum(bool(plan.space.losses[loss].params) for loss in setup.losses)
        for budget in setup.budgets:
            for seed in setup.search_seeds:
                for arm in setup.arms:
                    options = arm_options(setup, arm, budget * ref["compute"])
                    # a race takes the engine's own split of its --budget (tune_as.results.budget)
                    trials = setup.trials_per_loss or (None if options.get("race") else trials_for(
                        budget * ref["compute"], setup, reserved(setup, options), tunable))
                    # the engine's split
                    split = {"confirm_share": CONFIRM_SHARE} if options.get("race") else {}
                    key = "v3|" + json.dumps({"arm": arm, "seed": seed, "trials": trials, **options, **split},
                                             sort_keys=True)
                    if key not in arms and cached_only:
                        continue
                    if key not in arms:
                        print(f"arm {arm}, budget {budget:.0%} ({trials} trials per loss), "
                              f"search seed {seed}", flush=True)
                        arms[key] = ray_arm(setup, arm, options, trials, seed,
                                            Path(tmp) / f"{arm}-{budget}-{seed}")
                        arms_file.write_text(json.dumps(arms, indent=1))
                    rec = {"arm": arm, "budget": budget, "seed": seed, "trials_per_loss": trials, **arms[key]}
                    assert not set(rec["confirmation_seeds"]) & set(setup.truth_seeds), "truth seeds reused"
                    rec["score"] = score(ref, tru, rec, margin_points / 100)
                    records.append(rec)
    pool = [(tru["val"][tru["baseline"]][s], tru["test"][tru["baseline"]][s])
            for s in tru["test"][tru["baseline"]]]
    null = null_fwer(setup.losses, tru["baseline"], pool, margin_points, SearchRequest.max_seeds,
                     setup.sim_answers, seed=0, items=items)
    if records:
        print("\n" + arms_table(records))
        print("\n" + summary_table(records, order))
        print("\n" + verdict_table(records, ref, tru, margin_points / 100, order))
        print("\n" + gap_table(records, ref, order))
    print("\n" + "\n".join([*summary_lines(records, ref, order, tru), *null_lines(null),
                            *goal_lines(records, null, setup.task + (" (quick)" if setup.quick else ""),
                                        tru["floor"]["confirmed"])]))
    if plot_path is not None and records:
        plot(records, plot_path, setup.task, order)
    result = {"reference": ref, "truth": tru, "records": records, "null": null}
    (setup.cache_dir / "result.json").write_text(json.dumps(result, indent=1, default=str))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", choices=sorted(TASKS), default="digits")
    parser.add_argument("--quick", action="store_true",
                        help="digits, 3 losses, tiny grids, 2 epochs, 2 trials per loss, "
                             "one search seed: a smoke check")
    parser.add_argument("--ref-seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--budgets", type=float, nargs="+", default=[0.15],
                        help="fractions of the reference's compute, confirmation included (default 0.15)")
    parser.add_argument("--search-seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(DEFAULT_ARMS))
    parser.add_argument("--confirm", type=int, default=3, help="the fixed design's seeds per confirmed loss")
    parser.add_argument("--confirm-top", type=int, default=3,
                        help="the fixed design confirms the K losses best on validation (and softmax); "
                             "0: every loss")
    parser.add_argument("--trials-per-loss", type=int, default=None,
                        help="every arm's search trials per loss (default: the most its budget allows)")
    parser.add_argument("--sim-answers", type=int, default=2000,
                        help="answers of each null-simulation scenario (the null, and at the margin)")
    parser.add_argument("--workers", type=int, default=2,
                        help="concurrent 1-thread trials (Ray's max_concurrent too)")
    parser.add_argument("--cache-dir", type=Path, default=None,
                        help="runs and arm results "
                             "(default: .tune_as_cache/bench_efficiency[_<task>|_quick])")
    parser.add_argument("--reference-only", action="store_true",
                        help="train (or read) the reference and the truth; run no arm")
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
                  ref_seeds=(0, 1) if quick else tuple(args.ref_seeds), truth_seeds=TRUTH_SEEDS,
                  budgets=(2.0,) if quick else tuple(args.budgets),
                  search_seeds=(0,) if quick else tuple(args.search_seeds), arms=tuple(args.arms),
                  confirm=args.confirm, confirm_top=args.confirm_top or None,
                  trials_per_loss=2 if quick else args.trials_per_loss,
                  sim_answers=300 if quick else args.sim_answers, workers=args.workers,
                  cache_dir=cache.resolve(), quick=quick)
    clash = check_seeds(setup)
    if clash:
        parser.exit(2, f"bench_efficiency: expected seeds disjoint from the truth's {TRUTH_SEEDS[0]}-"
                       f"{TRUTH_SEEDS[-1]}, got {clash}\n")
    tic = time.perf_counter()
    run(setup, args.plot, args.cached_only, args.reference_only)
    print(f"wall {time.perf_counter() - tic:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
