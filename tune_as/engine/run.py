"""Run a planned search through one Ray Tune `Tuner`, confirm the selected settings with new seeds, and give
the answer: a ranking of the losses (tune_as.engine.ranking), printed and logged to the parent MLflow run."""

from __future__ import annotations

import dataclasses
import fcntl
import os
import shlex
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

# Set before Ray Tune is imported. A diverged trial ends with an error result that has no validation metric
# (none exists): Tune's strict check would reject that result; the searcher and the callback read `error`.
os.environ.setdefault("TUNE_DISABLE_STRICT_METRIC_CHECKING", "1")
# Ray warns whenever two such forced snapshots fall within 5 s. Its cause was a checkpoint at every evaluation
# (one snapshot per epoch per trial, 104 warnings in the README's search); trials now checkpoint at most every
# --checkpoint-interval seconds and at their end, and the snapshot at a trial's end is wanted (above): short
# trials ending together would still trip the warning, so it is off for that case only.
os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")
# The progress table is Ray's CLIReporter, with our columns (the newer output engine picks its own).
os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")

from ray import tune  # noqa: E402
from ray.tune import CLIReporter  # noqa: E402
from ray.tune.schedulers import ASHAScheduler, FIFOScheduler, TrialScheduler  # noqa: E402
from ray.tune.search import ConcurrencyLimiter, Searcher  # noqa: E402

from tune_as import schema, tracking  # noqa: E402
from tune_as.config import TrialConfig  # noqa: E402
from tune_as.engine import cluster, ranking  # noqa: E402
from tune_as.engine.callbacks import DropFinishedWeights, MlflowCallback, completed, trainable, trial_name  # noqa: E402
from tune_as.engine.plan import SearchPlan, git_commit, plan_search, state_of  # noqa: E402
from tune_as.engine.request import SearchRequest  # noqa: E402
from tune_as.engine.schedulers import PerLossASHA, default_grace_period  # noqa: E402
from tune_as.engine.searcher import FixedConfigs, PerLossSearcher  # noqa: E402
from tune_as.engine.state import CONFIRM_DIR, write_json  # noqa: E402
from tune_as.errors import UserError  # noqa: E402
from tune_as.report_select import TrialRun  # noqa: E402
from tune_as.search_space import config_key  # noqa: E402

SCHEDULER_STATE = "scheduler.json"


class SearchInterrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM: Ray Tune stopped the trials and saved its state; the message is the resume command."""


@dataclasses.dataclass(frozen=True)
class Compute:
    """What a search cost: epochs trained by every trial (stopped, failed and diverged ones included) and wall time
    of this call (a resumed search counts the epochs of every call, the wall time of this one)."""

    search_epochs: float
    confirm_epochs: float
    search_trials: int
    confirm_trials: int
    wall_s: float

    def line(self) -> str:
        minutes, seconds = divmod(round(self.wall_s), 60)
        return (f"Compute: {self.search_epochs + self.confirm_epochs:g} trial-epochs (search {self.search_epochs:g} "
                f"in {self.search_trials} trials, confirmation {self.confirm_epochs:g} in {self.confirm_trials} "
                f"runs), wall {minutes} min {seconds:02d} s")


@dataclasses.dataclass
class Outcome:
    """What a finished search returns: the ranking rows, the trials behind them and what it all cost."""

    rows: list[ranking.Row]
    trials: list[TrialRun]
    confirmations: list[TrialRun]
    markdown: str
    compute: Compute


# -- the search folder ------------------------------------------------------------------------------------
def claim(search_dir: Path, resume: bool) -> IO[str]:
    """Create (or, resuming, open) the search's folder and hold its lock for this process's lifetime: two
    processes can never run one search. mkdir is atomic, so of two new searches of one name one gets exit 2.
    A new folder is closed to other users (700): a resume unpickles Ray's state from it (engine.state)."""
    try:
        search_dir.mkdir(mode=0o700, parents=True, exist_ok=resume)
    except FileExistsError:
        raise UserError(f"--name: expected a new search name, but {search_dir} was just created by another "
                        "process") from None
    handle = open(search_dir / schema.NAME_LOCK, "a+")  # noqa: SIM115 - held until the process exits
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        raise UserError(f"--resume: expected a search no other process is running, but {search_dir.name} is "
                        "running now (its folder is locked)") from None
    return handle


def _write_state(search_dir: Path, state: dict[str, Any]) -> None:
    write_json(search_dir / schema.SEARCH_STATE_FILE, state)


def resume_hint(plan: SearchPlan) -> str:
    """The command that resumes this search, to paste in a shell as is (from any folder: the path is absolute)."""
    storage = shlex.quote(str(plan.search_dir.parent))
    hint = f"python -m tune_as.search --resume --name {plan.name} --storage-path {storage}"
    uri = plan.request.mlflow_uri
    if uri and tracking.redact_uri(uri) == uri:  # a URI with a password is not printed: pass it again
        hint += f" --mlflow-uri {shlex.quote(uri)}"
    return hint


# -- Tune -------------------------------------------------------------------------------------------------
def _trainable_for(plan: SearchPlan, res: dict[str, float]) -> Any:
    return tune.with_resources(tune.with_parameters(
        trainable, data=plan.data, task=plan.task, checkpoint_interval_s=plan.request.checkpoint_interval_s), res)


def _reporter(plan: SearchPlan) -> CLIReporter:
    metric = plan.metric
    params = {"seed": "seed"} | {config_key(d.name): d.name for s in plan.space.losses.values() for d in s.params}
    # validation only: test metrics during a search invite choosing on test
    return CLIReporter(metric_columns={"epoch": "epoch", f"val_{metric}": f"val_{metric}",
                                       f"best_val_{metric}": f"best_val_{metric}", "masked_ratio": "masked"},
                       parameter_columns=params, max_report_frequency=30, sort_by_metric=False)


def _tuner(plan: SearchPlan, tracker: tracking.MlflowTracker, res: dict[str, float], name: str, role: str,
           search_alg: Searcher, scheduler: TrialScheduler, num_samples: int, epochs: float) -> tune.Tuner:
    r = plan.request
    run_config = tune.RunConfig(
        name=name, storage_path=str(plan.search_dir if role == schema.ROLE_CONFIRMATION else plan.search_dir.parent),
        callbacks=[MlflowCallback(tracker, plan.metric, epochs, role), DropFinishedWeights()], verbose=r.verbose,
        progress_reporter=_reporter(plan), failure_config=tune.FailureConfig(max_failures=r.max_failures),
        # One: Ray then snapshots the experiment as soon as a trial has saved a checkpoint, so a driver killed right
        # after a trial finished never forgets that trial (with 2, a killed search re-ran finished trials).
        checkpoint_config=tune.CheckpointConfig(num_to_keep=1))
    return tune.Tuner(_trainable_for(plan, res), run_config=run_config, tune_config=tune.TuneConfig(
        scheduler=scheduler, search_alg=search_alg, num_samples=num_samples, reuse_actors=True,
        trial_name_creator=trial_name, trial_dirname_creator=trial_name))


def _scheduler(plan: SearchPlan) -> TrialScheduler:
    r, epochs = plan.request, float(plan.base.epochs)
    if not r.asha:
        return FIFOScheduler()
    grace = min(r.grace_period, epochs) if r.grace_period else default_grace_period(epochs, r.reduction_factor)
    metric = f"val_{plan.metric}"
    if r.asha_scope == "search":  # the ablation: every loss in one set of brackets
        return ASHAScheduler(time_attr="epoch", max_t=epochs, grace_period=grace,  # type: ignore[arg-type]
                             reduction_factor=r.reduction_factor, metric=metric, mode="max")
    scheduler = PerLossASHA("epoch", epochs, grace, r.reduction_factor, plan.space.trials_per_loss,
                            plan.search_dir / SCHEDULER_STATE)
    scheduler.set_search_properties(metric, "max")
    return scheduler


def _fit(tuner: tune.Tuner, tracker: tracking.MlflowTracker, hint: str, expected: int) -> tune.ResultGrid:
    """Ray Tune swallows Ctrl-C (it checkpoints and returns), so an interruption is recognised by trials left
    open or not finished."""
    try:
        grid = tuner.fit()
    except KeyboardInterrupt:
        raise SearchInterrupted(hint) from None
    if tracker.unfinished() or grid.num_terminated + grid.num_errors < expected:
        raise SearchInterrupted(hint)
    return grid


def _epochs(grid: tune.ResultGrid) -> float:
    """Epochs trained by every trial of a grid, with or without a result."""
    return sum(float((grid[i].metrics or {}).get("epoch", 0.0)) for i in range(len(grid)))


def _results(grid: tune.ResultGrid, metric: str, epochs: float) -> list[TrialRun]:
    runs = []
    for i in range(len(grid)):
        result = grid[i]
        metrics, config = result.metrics or {}, result.config or {}
        number = Path(result.path).name.rsplit("_", 1)[-1]  # the folder is the trial's name: <loss>_<number>
        run = ranking.trial_run(str(metrics.get("trial_id", result.path)), config, metrics, metric,
                                completed(metrics, epochs), int(number) if number.isdigit() else 0)
        if run is not None:
            runs.append(run)
    return runs


# -- the search -----------------------------------------------------------------------------------------------
@contextmanager
def _tracked(plan: SearchPlan, params: dict[str, Any], tags: dict[str, str],
             state: dict[str, Any] | None = None) -> Iterator[tuple[tracking.MlflowTracker, dict[str, float]]]:
    """The outside world, checked in order of cost before anything is written, then the search's folder (held
    for the block), its saved `state` and its parent MLflow run, closed FINISHED, KILLED or FAILED at the end."""
    r = plan.request
    if r.address:  # before the tracking store: a first use of an SQLite file creates it
        cluster.check_address(r.address)
    tracker = tracking.MlflowTracker(r.mlflow_uri, plan.experiment, plan.search_id)
    tracker.check_reachable()
    # a resume finds a search that another process runs before it starts Ray (its folder exists already)
    lock = claim(plan.search_dir, resume=True) if r.resume else None
    cluster.init_ray(r.address, r.dashboard_host)
    res = cluster.resources(r.cpus_per_trial, r.gpus_per_trial)
    lock = lock or claim(plan.search_dir, resume=False)  # a new search writes its folder only now
    if state is not None:
        _write_state(plan.search_dir, state)
    tracker.start_search(params=params, tags={schema.TASK: plan.task.name, schema.METRIC: f"val_{plan.metric}",
                                              schema.MODE: "max", **tags})
    MlflowCallback.register(tracker)
    status = "FAILED"
    try:
        yield tracker, res
        status = "FINISHED"
    except KeyboardInterrupt:
        status = "KILLED"
        raise
    finally:
        tracker.search_ended(status)
        lock.close()


def run_search(r: SearchRequest) -> Outcome:
    """Plan and validate (nothing written on bad input), search, confirm, rank. Returns the answer."""
    plan = plan_search(r)
    r = plan.request
    state = state_of(plan)
    params = {"task": plan.task.name, "losses": ",".join(plan.losses), "trials_per_loss": plan.space.trials_per_loss,
              "backbone": plan.base.backbone, "encoder": plan.base.encoder, "epochs": plan.base.epochs,
              "seed": r.seed, "confirm": r.confirm, "git_commit": git_commit(), "search_space": str(plan.space.path)}
    with _tracked(plan, params, {}, state) as (tracker, res):
        print(f"MLflow: {tracker.shown}  experiment {plan.experiment!r}, parent run {tracker.parent_id}")
        print(f"Optuna studies: {schema.optuna_url(plan.search_dir)}  "
              f"(optuna-dashboard {schema.optuna_url(plan.search_dir)})")
        outcome = _search_and_confirm(plan, tracker, res)
    _write_state(plan.search_dir, {**state, "finished": True})
    return outcome


def _search_and_confirm(plan: SearchPlan, tracker: tracking.MlflowTracker, res: dict[str, float]) -> Outcome:
    r, hint, epochs, tic = plan.request, resume_hint(plan), float(plan.base.epochs), time.monotonic()
    if r.resume and tune.Tuner.can_restore(str(plan.search_dir)):
        tuner = tune.Tuner.restore(str(plan.search_dir), _trainable_for(plan, res), resume_unfinished=True,
                                   resume_errored=True)
    else:
        searcher = PerLossSearcher(plan.space, plan.base, schema.optuna_url(plan.search_dir), plan.task.name,
                                   metric=f"best_val_{plan.metric}", seed=r.seed, sampler=r.sampler,
                                   warm=r.warm_start)
        tuner = _tuner(plan, tracker, res, plan.name, schema.ROLE_TRIAL,
                       ConcurrencyLimiter(searcher, max_concurrent=cluster.concurrency(r.max_concurrent, res)),
                       _scheduler(plan), plan.n_trials, epochs)
    grid = _fit(tuner, tracker, hint, plan.n_trials)
    trials = _results(grid, plan.metric, epochs)
    confirmations: list[TrialRun] = []
    confirm_epochs = 0.0
    if r.confirm:
        configs = confirmation_configs(trials, r.confirm, r.confirm_top)
        losses = sorted({c.loss for c in configs})
        print(f"\nConfirming {len(losses)} selected settings with {r.confirm} new seeds each ({len(configs)} runs, "
              "no early stopping)" + (f": the {r.confirm_top} best on validation and {ranking.BASELINE}, "
                                      f"{', '.join(losses)}" if r.confirm_top else ""))
        confirmations, confirm_epochs = run_trials(plan, tracker, res, configs, hint)
    rows = ranking.rank(trials, confirmations, plan.metric)
    title = (f"{plan.task.name}: which loss wins ({plan.metric}, %; {epochs:g} epochs each; "
             + (f"{r.confirm} confirmation seeds" if r.confirm else "single runs, not confirmed: add --confirm N")
             + (f" for the top {r.confirm_top} and {ranking.BASELINE}, single runs below" if r.confirm_top else "")
             + ")")
    text = ranking.markdown(rows, title)
    compute = Compute(_epochs(grid), confirm_epochs, len(grid), len(confirmations), time.monotonic() - tic)
    print("\n" + text + "\n" + compute.line())
    with tempfile.TemporaryDirectory() as tmp:
        md, csv = Path(tmp) / schema.RANKING_MD, Path(tmp) / schema.RANKING_CSV
        md.write_text(text)
        csv.write_text(ranking.csv_text(rows))
        tracker.search_artifacts([md, csv], {schema.SEARCH_EPOCHS: compute.search_epochs,
                                             schema.CONFIRM_EPOCHS: compute.confirm_epochs})
    return Outcome(rows, trials, confirmations, text, compute)


def confirmation_configs(trials: list[TrialRun], n: int, top: int | None = None) -> list[TrialConfig]:
    """Each loss's selected setting with the same N new seeds (deterministic: a resume recomputes the same).
    `top`: only the losses whose selected setting has one of the `top` best validation metrics (ties to the
    loss name), and softmax, the baseline every paired difference needs."""
    from tune_as.schema import config_from_params

    seeds = ranking.confirmation_seeds(trials, n)
    cells = ranking.selected(trials)
    losses = sorted(cells)
    if top is not None:
        best = sorted(losses, key=lambda loss: (-cells[loss].val, loss))[:top]
        losses = sorted(set(best) | ({ranking.BASELINE} & set(cells)))
    return [dataclasses.replace(config_from_params(cells[loss].params), seed=seed) for loss in losses for seed in seeds]


def run_trials(plan: SearchPlan, tracker: tracking.MlflowTracker, res: dict[str, float],
               configs: list[TrialConfig], hint: str) -> tuple[list[TrialRun], float]:
    """Run complete trial configs to the end (no early stopping) as child runs with role=confirmation, in a
    Tune experiment of their own inside the search folder (resumable like the search)."""
    path = plan.search_dir / CONFIRM_DIR
    if tune.Tuner.can_restore(str(path)):
        tuner = tune.Tuner.restore(str(path), _trainable_for(plan, res), resume_unfinished=True, resume_errored=True)
    else:
        searcher = ConcurrencyLimiter(FixedConfigs([c.to_dict() for c in configs], f"best_val_{plan.metric}"),
                                      max_concurrent=cluster.concurrency(plan.request.max_concurrent, res))
        tuner = _tuner(plan, tracker, res, CONFIRM_DIR, schema.ROLE_CONFIRMATION, searcher, FIFOScheduler(),
                       len(configs), max(c.epochs for c in configs))
    grid = _fit(tuner, tracker, hint, len(configs))
    return _results(grid, plan.metric, float(plan.base.epochs)), _epochs(grid)


def confirm_settings(r: SearchRequest, configs: list[TrialConfig]) -> list[TrialRun]:
    """The report's `--confirm`: run given settings (with their seeds) as a confirmation batch of their own,
    a parent run with tag purpose=confirmation. The request names the task, data and where to track."""
    if not configs:
        raise UserError("confirm_settings: expected at least one trial config, got none")
    first = configs[0]
    request = dataclasses.replace(r, task=first.task, backbone=first.backbone, encoder=first.encoder,
                                  max_length=first.max_length, max_train_samples=first.max_train_samples,
                                  max_eval_samples=first.max_eval_samples, asha=False,
                                  data_dir=Path(first.data_dir) if first.data_dir else r.data_dir,
                                  name=r.name or f"{first.task}-confirm-{os.getpid()}-{len(configs)}")
    plan = plan_search(request)
    params = {"task": plan.task.name, "trials": len(configs), "git_commit": git_commit()}
    with _tracked(plan, params, {schema.PURPOSE: schema.ROLE_CONFIRMATION}) as (tracker, res):
        return run_trials(plan, tracker, res, configs, "(confirmation runs: rerun the report to continue)")[0]
