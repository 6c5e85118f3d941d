"""Run a planned search through one Ray Tune `Tuner`, confirm the selected settings with new seeds, and give
the answer: a ranking of the losses (tune_as.results.ranking), printed and logged to the parent MLflow run."""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any, TextIO

from ray import tune
from ray.tune.schedulers import FIFOScheduler, TrialScheduler
from ray.tune.search import ConcurrencyLimiter, Searcher

from tune_as.engine import callbacks, cluster, disk, interrupt, members, storage, worker
from tune_as.engine.folder import claim, resume_hint, write_state
from tune_as.engine.head import Head
from tune_as.engine.plan import SearchPlan, git_commit, plan_confirmation, plan_search, state_of
from tune_as.engine.progress import reporter
from tune_as.engine.record import (
    Compute,
    Confirmed,
    answer_record,
    check_margin,
    failures_of,
    margin_points,
    parent_params,
    reach,
    resolution_points,
    trial_runs,
)
from tune_as.engine.request import SearchRequest
from tune_as.engine.schedulers import PerLossASHA, default_grace_period
from tune_as.engine.searcher import FixedConfigs, PerLossSearcher, catch_up
from tune_as.engine.state import SCHEDULER_FILE, part_dir, round_name
from tune_as.errors import INTERRUPTED, NO_RESULT, Ending, UserError
from tune_as.results import racing, ranking
from tune_as.results.answer import answer_table, summary
from tune_as.results.budget import last_look
from tune_as.results.forest import forest
from tune_as.results.render import MACHINE_FORMATS, fit
from tune_as.results.selection import Cell, TrialRun
from tune_as.settings import DataSettings, TrialSettings
from tune_as.tracking import schema
from tune_as.tracking import tracker as tracking


class NoResult(Exception, Ending):
    """The search ended with no result for any loss (the parent run is FAILED)."""
    exit_code = NO_RESULT


class SearchInterrupted(KeyboardInterrupt, Ending):
    """Ctrl-C or SIGTERM: Ray Tune stopped the trials and saved its state; the message is the resume command."""
    exit_code = INTERRUPTED

    def message(self) -> str:
        return interrupt.interrupted_line(str(self))


@dataclasses.dataclass
class Outcome:
    """What a finished search returns: the ranking rows, the trials behind them and what it all cost."""

    rows: list[ranking.Row]
    trials: list[TrialRun]
    confirmations: list[TrialRun]
    markdown: str
    compute: Compute


@dataclasses.dataclass(frozen=True)
class Session:
    """A planned search with the outside world open (`_tracked`): its tracker, a trial's resources, its resume line."""

    plan: SearchPlan
    tracker: tracking.MlflowTracker
    resources: dict[str, float]
    hint: str


# -- Tune -------------------------------------------------------------------------------------------------
def _trainable_for(plan: SearchPlan, res: dict[str, float]) -> Any:
    return tune.with_resources(tune.with_parameters(
        worker.trainable, data=plan.data, task=plan.task, checkpoint_interval_s=plan.request.checkpoint_interval_s), res)


def _tuner(session: Session, path: Path, role: str, search_alg: Searcher, scheduler: TrialScheduler, num_samples: int) -> tune.Tuner:
    plan, r = session.plan, session.plan.request
    callback = callbacks.MlflowCallback(session.tracker, plan.metric, role, plan.data_settings.to_params())
    run_config = tune.RunConfig(
        name=path.name, storage_path=str(path.parent),  # an experiment of the search's (engine.state)
        storage_filesystem=storage.whole_files(),  # no state file cut short by a killed driver (engine.storage)
        callbacks=[callback, *callbacks.common()], verbose=min(r.verbose, 1),
        progress_reporter=reporter(plan, role), failure_config=tune.FailureConfig(max_failures=r.max_failures),
        stop=disk.StopOnFullDisk(),  # a worker's full disk ends the search (engine.disk), not only its trial
        # one: Ray snapshots the experiment once a trial saved a checkpoint (a killed driver forgets no finished trial)
        checkpoint_config=tune.CheckpointConfig(num_to_keep=1))
    return tune.Tuner(_trainable_for(plan, session.resources), run_config=run_config, tune_config=tune.TuneConfig(
        scheduler=scheduler, search_alg=search_alg, num_samples=num_samples, reuse_actors=True,
        trial_name_creator=callbacks.trial_name, trial_dirname_creator=callbacks.trial_name))


def _restored(session: Session, where: Path, searcher: PerLossSearcher | None = None,
              before: dict[str, int] | None = None) -> tune.Tuner:
    """A saved experiment, its searcher's state first caught up with the trials Ray saved (`searcher.catch_up`)."""
    catch_up(where, storage.saved_trials(where), searcher, before)
    return storage.restored(where, _trainable_for(session.plan, session.resources))


def _scheduler(plan: SearchPlan) -> TrialScheduler:
    r = plan.request
    if not r.asha:
        return FIFOScheduler()
    max_t = {loss: plan.max_epochs(loss) for loss in plan.losses}
    epochs = min(max_t.values())  # the grace period must fit the shortest loss's budget
    grace = min(r.grace_period, epochs) if r.grace_period else default_grace_period(epochs, r.reduction_factor)
    metric = f"val_{plan.metric}"
    # scope "search" is the ablation: every loss's trials in one set of rungs
    compared = plan.search_trials * (len(plan.losses) if r.asha_scope == "search" else 1)
    scheduler = PerLossASHA("epoch", max_t, grace, r.reduction_factor, compared,
                            plan.search_dir / SCHEDULER_FILE, scope=r.asha_scope)
    scheduler.set_search_properties(metric, "max")
    return scheduler


def _fit(session: Session, tuner: tune.Tuner, expected: int | None) -> tune.ResultGrid:
    """The grid; Ray Tune swallows Ctrl-C, so fewer than `expected` trials ended (None: any not ended) is one."""
    try:
        grid = tuner.fit()
    except KeyboardInterrupt:
        raise SearchInterrupted(session.hint) from None
    if (interrupt.noticed.is_set() or session.tracker.unfinished()
            or grid.num_terminated + grid.num_errors < (len(grid) if expected is None else expected)):
        raise SearchInterrupted(session.hint)
    return grid


# -- the search -----------------------------------------------------------------------------------------------
@contextmanager
def _tracked(plan: SearchPlan, params: dict[str, Any], tags: dict[str, str], state: dict[str, Any] | None = None,
             hint: str | None = None, head: Head | None = None) -> Iterator[Session]:
    """The world checked, then the search's folder (held), state and parent run (FINISHED/KILLED/FAILED at end)."""
    r = plan.request
    cluster.tune_environment(resume=r.resume)
    if r.address:  # before the tracking store: a first use of an SQLite file creates it
        cluster.check_address(r.address)
    tracker = tracking.MlflowTracker(r.mlflow_uri, plan.experiment, plan.search_id, journal_dir=plan.search_dir)
    # the tracking store opens (seconds for a new SQLite schema) while Ray starts, both before anything is written
    with ThreadPoolExecutor(1, thread_name_prefix="tune_as-mlflow-open") as pool:
        opened = pool.submit(tracker.check_reachable, not r.resume)
        lock = claim(plan.search_dir, resume=True) if r.resume else None
        cluster.init_ray(r.address, r.dashboard_host, quiet=r.verbose < 2, dashboard=r.dashboard, head=head)
        opened.result()
    res = cluster.resources(r.cpus_per_trial, r.gpus_per_trial)
    lock = lock or claim(plan.search_dir, resume=False)  # a new search writes its folder only now
    if state is not None:
        write_state(plan.search_dir, state)
    tracker.start_search(params=params, tags={schema.TASK: plan.task.name, schema.METRIC: f"val_{plan.metric}",
                                              schema.MODE: "max", **tags})
    if tracker.replay(skip_search_end=True):  # writes an earlier run of this search could not deliver go first
        print(f"MLflow: delivering {len(tracker.pending)} writes kept in {tracking.JOURNAL} first")
    callbacks.MlflowCallback.register(tracker)
    session = Session(plan, tracker, res, hint or resume_hint(plan))
    interrupt.register(tracker, session.hint)
    status = "FAILED"
    try:
        with disk.stopping(plan.search_dir, session.hint):  # a full disk stops it as an interruption does
            yield session
        status = "FINISHED"
    except (KeyboardInterrupt, disk.DiskFull):
        status = "KILLED"
        raise
    finally:
        interrupt.ending()
        try:
            tracker.search_ended(status)
        finally:
            interrupt.ended()
            lock.close()
    if tracker.pending:  # kept in the journal (no exception is in flight here: the search finished)
        raise tracking.WritesKept(tracker)


def _shown(path: Path) -> Path:
    """A path as printed: relative to the working folder when inside it (a line a terminal can hold)."""
    try:
        return path.resolve().relative_to(Path.cwd())
    except ValueError:
        return path


def run_search(r: SearchRequest, head: Head | None = None, answer_to: TextIO | None = None) -> Outcome:
    """Plan and validate (nothing written on bad input), search, confirm, rank; the answer. `head`: the CLI's local
    Ray (engine.head), joined. `answer_to`: where the answer is printed (default stdout)."""
    plan = plan_search(r)
    check_margin(plan)
    state, params = state_of(plan), parent_params(plan, git_commit())
    tags = {schema.DATA_WARNINGS: " | ".join(plan.data.warnings)[:5000]} if plan.data.warnings else {}
    with _tracked(plan, params, tags, state, head=head) as session:
        print(f"MLflow: {session.tracker.shown}\n  experiment {plan.experiment!r}, parent run {session.tracker.parent_id}")
        studies = schema.optuna_url(_shown(plan.search_dir))
        print(f"Optuna studies: {studies}" if importlib.util.find_spec("optuna_dashboard") is None else
              f"Optuna studies: optuna-dashboard {studies}")
        for note in plan.data.notes:  # what was done to the data (carved splits, cut texts), every run, built or cached
            print(fit(f"Data: {note}"))
        outcome = _search_and_confirm(session, answer_to or sys.stdout)
    write_state(plan.search_dir, {**state, "finished": True})
    return outcome


def _search_and_confirm(session: Session, answer_to: TextIO) -> Outcome:
    plan = session.plan
    r, tic = plan.request, time.monotonic()
    if r.resume and storage.restorable(plan.experiment_dir):
        grids = _lost_trials(session, _fit(session, _restored(session, plan.experiment_dir, _per_loss(session)), None))
    else:
        grids = [_fit(session, _tuner(session, plan.experiment_dir, schema.ROLE_TRIAL, _searcher(session),
                                      _scheduler(plan), plan.n_trials), plan.n_trials)]
    trials = trial_runs(grids, plan)
    search_epochs = sum(members.grid_epochs(grid) for grid in grids)
    confirmed = _confirm(session, trials, search_epochs) if plan.confirming else Confirmed()
    record = answer_record(plan, trials, confirmed.plan, confirmed.notes, confirmed.rounds, failures_of(grids))
    answered = answer_table(record, trials, confirmed.runs)
    rows = answered.rows
    compute = Compute(search_epochs, confirmed.epochs, sum(map(len, grids)), len(confirmed.runs),
                      time.monotonic() - tic, r.budget)
    text = answered.table.markdown()
    shown, tail = answered.table.render(r.output_format), compute.line() + "\n" + schema.ui_line(
        session.tracker.shown, str(session.tracker.experiment_id))
    machine = r.output_format in MACHINE_FORMATS  # the answer alone on answer_to; what it cost, where to look apart
    print(shown if machine else "\n" + shown + "\n" + tail, end="" if machine else "\n", file=answer_to, flush=True)
    if machine:
        print(tail)
    with tempfile.TemporaryDirectory() as tmp:
        md, csv, record_file = (Path(tmp) / name for name in (schema.RANKING_MD, schema.RANKING_CSV,
                                                              schema.ANSWER_JSON))
        md.write_text(text)
        csv.write_text(answered.table.csv())
        record_file.write_text(record.to_json())
        metrics, tags = summary(answered, record.margin_points)
        figure = Path(tmp) / schema.ANSWER_PNG  # the answer as a forest plot (tune_as.results.forest)
        drawn = forest(answered, record.margin_points, plan.baseline, plan.metric, figure, plan.name)
        session.tracker.search_artifacts([md, csv, record_file, *([figure] if drawn else [])], {
            schema.SEARCH_EPOCHS: compute.search_epochs, schema.CONFIRM_EPOCHS: compute.confirm_epochs, **metrics},
            {schema.NOTE: text, **{schema.ANSWER_TAG_PREFIX + k: v for k, v in tags.items()}})
    if not any(row.val for row in rows):
        raise NoResult(f"no loss has a result: every trial failed, diverged or was stopped early "
                       f"({'; '.join(f'{row.loss}: {row.failure}' for row in rows)[:600]})")
    return Outcome(rows, trials, confirmed.runs, text, compute)


def _per_loss(session: Session) -> PerLossSearcher:  # the search's searcher: one Optuna study per loss
    plan, r = session.plan, session.plan.request
    return PerLossSearcher(plan.space, plan.base, schema.optuna_url(plan.search_dir), plan.task.name,
                           metric=f"best_val_{plan.metric}", seed=r.seed, sampler=r.sampler,
                           warm=r.warm_start, quota={loss: plan.quota(loss) for loss in plan.losses})


def _limited(session: Session, searcher: Searcher) -> Searcher:  # counted by the searcher (set_max_concurrency)
    return ConcurrencyLimiter(searcher, cluster.concurrency(session.plan.request.max_concurrent, session.resources))


def _searcher(session: Session, ran: dict[str, int] | None = None) -> Searcher:
    searcher = _per_loss(session)  # `ran` trials of each loss already run, in a part (`_lost_trials`): no Ray
    if ran is not None:  # trial runs there, so an Optuna trial still running is an orphan
        searcher.close_running()
        searcher.suggested = {loss: ran.get(loss, 0) for loss in session.plan.losses}
    return _limited(session, searcher)


def _lost_trials(session: Session, grid: tune.ResultGrid) -> list[tune.ResultGrid]:
    """The resumed search's grid and its parts: a trial Ray's state lost (docs/architecture.md), never asked for
    again by the searcher, runs in a part of the search's own, `<search>.part2`, asked from its loss's study."""
    plan, grids = session.plan, [grid]
    while True:
        ran = Counter(str((g[i].config or {}).get("loss")) for g in grids for i in range(len(g)))
        lost = {loss: plan.quota(loss) - ran[loss] for loss in plan.losses if ran[loss] < plan.quota(loss)}
        if not lost:
            return grids
        where = part_dir(plan.search_dir, plan.experiment_dir, len(grids) + 1)
        if storage.restorable(where):
            grids.append(_fit(session, _restored(session, where, _per_loss(session), dict(ran)), None))
            continue
        print(fit(f"Search: Ray's saved state of {plan.experiment_dir.name} lacks {sum(lost.values())} trial(s) of "
                  f"{', '.join(sorted(lost))} (the driver was killed while Ray copied it); they run now."))
        grids.append(_fit(session, _tuner(session, where, schema.ROLE_TRIAL, _searcher(session, dict(ran)),
                                          _scheduler(plan), sum(lost.values())), sum(lost.values())))


def _confirm(session: Session, trials: list[TrialRun], search_epochs: float) -> Confirmed:
    """Confirm each loss's selected setting with new seeds, in the rounds the race decides (one for `--confirm N`),
    each a Tune experiment of its own: a resume restores its round and replays the pure race (no seed runs twice)."""
    plan, r = session.plan, session.plan.request
    cells = ranking.selected(trials)
    # best on the search's validation first: a round the budget cannot pay in full goes to them (and the baseline)
    losses = sorted((loss for loss in plan.losses if loss in cells), key=lambda loss: (-cells[loss].val, loss))
    if plan.baseline not in cells or len(losses) < 2:
        return Confirmed(notes=(f"Not confirmed: the baseline {plan.baseline} has no result (every trial stopped "
                                "early or failed), so no verdict can be given." if plan.baseline not in cells else
                                "Not confirmed: fewer than two losses have a result.",))
    if r.confirm_top is not None:
        best = losses[: r.confirm_top]  # already best on validation first
        losses = [loss for loss in losses if loss in best or loss == plan.baseline]
    seeds = ranking.confirmation_seeds(trials, r.confirm or r.max_seeds)
    per_run = max(plan.max_epochs(loss) for loss in losses)
    last = last_look(r.max_seeds, r.budget, search_epochs, len(losses), per_run)  # fixed before any seed
    step = resolution_points(plan)
    noise: racing.Noise = "per-loss" if r.noise == "per-loss" else "moderated"  # the request checked its choices
    race = (racing.Plan.fixed(losses, plan.baseline, seeds, r.confirm, margin_points=margin_points(plan),
                              resolution_points=step, noise=noise) if r.confirm
            else racing.Plan(tuple(losses), plan.baseline, tuple(seeds), max_seeds=last, margin_points=margin_points(plan),
                             resolution_points=step, noise=noise))
    runs: list[TrialRun] = []
    rounds: list[tuple[str, ...]] = []
    epochs, notes = 0.0, []
    if not r.confirm and last < r.max_seeds:
        notes.append(f"--budget {r.budget:g}: the race's last look is at {last} seeds per loss, what the budget "
                     f"left after the search pays for every loss (--max-seeds {r.max_seeds}); its alpha goes there.")
    notes.append(reach(race, plan.baseline, search_epochs, per_run, fixed=bool(r.confirm)))
    print(fit(notes[-1]))
    attempted: set[tuple[str, int]] = set()
    for round_no in range(1, len(race.looks) + 1):
        left = None if r.budget is None else max(0, int((r.budget - search_epochs - epochs) // per_run))
        answer = racing.decide(ranking.race_results(runs, plan.metric), race, left)
        if answer.done:
            break
        wanted = [(loss, s) for loss, ss in answer.next_seeds.items() for s in ss]
        if attempted & set(wanted):  # a run of this round failed: racing on would ask for it forever
            notes.append("Racing stopped early: a confirmation run failed (see the runs marked FAILED in MLflow).")
            break
        attempted |= set(wanted)
        configs = [dataclasses.replace(_settings(cells[loss]), seed=s) for loss, s in wanted]
        print(f"\nConfirmation round {round_no}: {len(configs)} runs of {len(answer.next_seeds)} losses, "
              f"no early stopping (seeds {', '.join(map(str, sorted({seed for _, seed in wanted})))})")
        new, spent = run_trials(session, configs, round_no)
        runs += new
        rounds.append(tuple(run.run_id for run in new))
        epochs += spent
    results = ranking.race_results(runs, plan.metric)
    if r.budget is not None and not racing.decide(results, race, None).done:
        notes.append(f"--budget {r.budget:g} trial-epochs spent before every verdict was decided.")
    return Confirmed(runs, epochs, race, tuple(notes), tuple(rounds))


def _settings(cell: Cell) -> TrialSettings:
    settings = cell.runs[0].settings
    assert settings is not None, "a search's trial runs carry their typed settings"
    return settings


def run_trials(session: Session, configs: list[TrialSettings], round_no: int = 1) -> tuple[list[TrialRun], float]:
    """Run complete trial settings to the end as confirmation child runs, in a resumable Tune experiment of their
    own (`--seeds-per-trial N`: populations, engine.members); a lost run runs again in `<round>.part2`."""
    plan = session.plan
    path = plan.search_dir / round_name(plan.search_dir, plan.token or plan.search_id, round_no)
    todo, notes = members.group(configs, plan.request.seeds_per_trial, partial(members.population_problem, plan.data))
    for note in notes:
        print(fit(note))
    runs: list[TrialRun] = []
    epochs, part = 0.0, 1
    while todo:
        where = part_dir(plan.search_dir, path, part)
        restored = storage.restorable(where)
        if restored:  # a restored round's trials all ended: whatever its state lost is `todo`
            grid = _fit(session, _restored(session, where), None)
        else:
            searcher = _limited(session, FixedConfigs(todo, f"best_val_{plan.metric}"))
            grid = _fit(session, _tuner(session, where, schema.ROLE_CONFIRMATION, searcher, FIFOScheduler(),
                                        len(todo)), len(todo))
        runs += trial_runs([grid], plan)
        epochs += members.grid_epochs(grid)
        todo = members.missing(todo, [grid[i].config or {} for i in range(len(grid))])
        if todo and not restored:  # a new Tuner that ended runs every config (else _fit raised): never a loop
            raise RuntimeError(f"{where.name}: expected a trial for each of its configs, got none for {todo[0]}")
        if todo:
            print(fit(f"Confirmation round {round_no}: Ray's saved state of {where.name} lacks {len(todo)} of "
                      "its runs (the driver was killed while Ray copied it); they run now."))
        part += 1
    return runs, epochs


def confirm_settings(r: SearchRequest, data: DataSettings, configs: list[TrialSettings]) -> list[TrialRun]:
    """The report's `--confirm`: run given settings (with their seeds) on the data `data` describes, as a
    confirmation batch of its own: a parent run with tag purpose=confirmation. `r` says where to track and run."""
    if not configs:
        raise UserError("confirm_settings: expected at least one trial setting, got none")
    plan = plan_confirmation(r, data, configs)
    params = {"task": plan.task.name, "trials": len(configs), "git_commit": git_commit()}
    with _tracked(plan, params, {schema.PURPOSE: schema.ROLE_CONFIRMATION},
                  hint="(confirmation runs: rerun the report to continue)") as session:
        return run_trials(session, configs)[0]
