"""A search's session with the outside world: Ray, the MLflow parent run, the search's folder, and the Tuners.

`open_session` checks the world, joins Ray, opens the tracking store and the parent run, holds the search's
folder, and closes them all (the parent FINISHED, KILLED or FAILED) however the search ends. The rest builds,
restores and runs one Tune experiment: `tuner` (new), `restored` (saved, its searcher caught up), `fit`
(Ctrl-C and lost trials raise `SearchInterrupted`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ray import tune
from ray.tune.schedulers import FIFOScheduler, TrialScheduler
from ray.tune.search import Searcher

from tune_as.engine import callbacks, cluster, concurrency, disk, interrupt, storage, worker
from tune_as.engine.folder import claim, resume_hint, write_state
from tune_as.engine.head import Head
from tune_as.engine.links import OptunaLinks
from tune_as.engine.plan import SearchPlan
from tune_as.engine.progress import RunView, reporter, view_for
from tune_as.engine.schedulers import PerLossASHA, default_grace_period
from tune_as.engine.searcher import PerLossSearcher, catch_up
from tune_as.engine.state import SCHEDULER_FILE
from tune_as.errors import INTERRUPTED, Ending
from tune_as.tracking import schema, views
from tune_as.tracking import tracker as tracking


class SearchInterrupted(KeyboardInterrupt, Ending):
    """Ctrl-C or SIGTERM: Ray Tune stopped the trials and saved its state; the message is the resume
    command."""
    exit_code = INTERRUPTED

    def message(self) -> str:
        return interrupt.interrupted_line(str(self))


@dataclasses.dataclass(frozen=True)
class Session:
    """A planned search with the outside world open: its tracker, a trial's resources, its resume line, its
    progress view (on stderr)."""

    plan: SearchPlan
    tracker: tracking.MlflowTracker
    resources: dict[str, float]
    hint: str
    progress: RunView


@contextmanager
def open_session(plan: SearchPlan, params: dict[str, Any], tags: dict[str, str],
                 state: dict[str, Any] | None = None, hint: str | None = None,
                 head: Head | None = None) -> Iterator[Session]:
    """The world checked, then the search's folder (held), state and parent run (FINISHED/KILLED/FAILED at
    end)."""
    r = plan.request
    cluster.tune_environment(resume=r.resume)
    if r.address:  # before the tracking store: a first use of an SQLite file creates it
        cluster.check_address(r.address)
    tracker = tracking.MlflowTracker(r.mlflow_uri, plan.experiment, plan.search_id,
                                     journal_dir=plan.search_dir)
    # the tracking store opens (seconds for a new SQLite
    # schema) while Ray starts, both before anything is written
    with ThreadPoolExecutor(1, thread_name_prefix="tune_as-mlflow-open") as pool:
        opened = pool.submit(tracker.check_reachable, not r.resume)
        lock = claim(plan.search_dir, resume=True) if r.resume else None
        cluster.init_ray(r.address, r.dashboard_host, quiet=r.verbose < 2, dashboard=r.dashboard, head=head)
        opened.result()
    res = cluster.resources(r.cpus_per_trial, r.gpus_per_trial)
    lock = lock or claim(plan.search_dir, resume=False)  # a new search writes its folder only now
    if state is not None:
        write_state(plan.search_dir, state)
    tracker.start_search(params=params, tags={
        schema.TASK: plan.task.name, schema.METRIC: f"val_{plan.metric}", schema.MODE: "max",
        schema.OPTUNA_STORAGE: schema.optuna_url(plan.search_dir.resolve()), **tags})
    # the runs table with loss, metric in percent and setting (tracking.views): the address the search prints
    views.save(tracker.client, str(tracker.experiment_id), plan.search_id, plan.metric, plan.confirming)
    # writes an earlier run of this search could not deliver go first
    if tracker.replay(skip_search_end=True):
        print(f"MLflow: delivering {len(tracker.pending)} writes kept in {tracking.JOURNAL} first")
    callbacks.MlflowCallback.register(tracker)
    session = Session(plan, tracker, res, hint or resume_hint(plan), view_for(plan))
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


def trainable_for(plan: SearchPlan, res: dict[str, float]) -> Any:
    return tune.with_resources(tune.with_parameters(
        worker.trainable, data=plan.data, task=plan.task,
        checkpoint_interval_s=plan.request.checkpoint_interval_s), res)


def tuner(session: Session, path: Path, role: str, search_alg: Searcher, scheduler: TrialScheduler,
          num_samples: int) -> tune.Tuner:
    """A new Tune experiment at `path` whose trials are `role` runs (trial or confirmation) of the search."""
    plan, r = session.plan, session.plan.request
    # a search trial's run names its Optuna trial; a confirmation has none
    optuna = OptunaLinks(schema.optuna_url(plan.search_dir), plan.task.name) if role == schema.ROLE_TRIAL \
        else None
    callback = callbacks.MlflowCallback(
        session.tracker, plan.metric, role, plan.data_settings.to_params(),
        uses_backbone=plan.task.uses_backbone,
        searched={loss: s.searched() for loss, s in plan.space.losses.items()}, optuna=optuna)
    run_config = tune.RunConfig(
        name=path.name, storage_path=str(path.parent),  # an experiment of the search's (engine.state)
        # no state file cut short by a killed driver (engine.storage)
        storage_filesystem=storage.whole_files(),
        callbacks=[callback, *callbacks.common()], verbose=min(r.verbose, 1),
        progress_reporter=reporter(plan),
        failure_config=tune.FailureConfig(max_failures=r.max_failures),
        stop=disk.StopOnFullDisk(),  # a worker's full disk ends the search (engine.disk), not only its trial
        # one: Ray snapshots the experiment once a trial saved a checkpoint (a killed driver forgets no trial)
        checkpoint_config=tune.CheckpointConfig(num_to_keep=1))
    return tune.Tuner(
        trainable_for(plan, session.resources), run_config=run_config, tune_config=tune.TuneConfig(
            scheduler=scheduler, search_alg=search_alg, num_samples=num_samples, reuse_actors=True,
            trial_name_creator=callbacks.trial_name, trial_dirname_creator=callbacks.trial_name))


def restored(session: Session, where: Path, searcher: PerLossSearcher | None = None,
             before: dict[str, int] | None = None) -> tune.Tuner:
    """A saved experiment, its searcher's state first caught up with the trials Ray saved
    (`searcher.catch_up`)."""
    catch_up(where, storage.saved_trials(where), searcher, before)
    return storage.restored(where, trainable_for(session.plan, session.resources))


def search_scheduler(plan: SearchPlan) -> TrialScheduler:
    """ASHA per loss (a trial is compared only with its own loss's; `--asha-scope search` is the ablation)."""
    r = plan.request
    if not r.asha:
        return FIFOScheduler()
    max_t = {loss: plan.max_epochs(loss) for loss in plan.losses}
    epochs = min(max_t.values())  # the grace period must fit the shortest loss's budget
    grace = (min(r.grace_period, epochs) if r.grace_period
             else default_grace_period(epochs, r.reduction_factor))
    # scope "search" is the ablation: every loss's trials in one set of rungs
    compared = plan.search_trials * (len(plan.losses) if r.asha_scope == "search" else 1)
    chosen = PerLossASHA("epoch", max_t, grace, r.reduction_factor, compared,
                         plan.search_dir / SCHEDULER_FILE, scope=r.asha_scope)
    chosen.set_search_properties(f"val_{plan.metric}", "max")
    return chosen


def fit(session: Session, experiment: tune.Tuner, expected: int | None) -> tune.ResultGrid:
    """The grid; Ray Tune swallows Ctrl-C, so fewer than `expected` trials ended (None: any not ended) is
    one."""
    try:
        grid = experiment.fit()
    except KeyboardInterrupt:
        raise SearchInterrupted(session.hint) from None
    if (interrupt.noticed.is_set() or session.tracker.unfinished()
            or grid.num_terminated + grid.num_errors < (len(grid) if expected is None else expected)):
        raise SearchInterrupted(session.hint)
    return grid


def per_loss(session: Session) -> PerLossSearcher:
    """The search's searcher: one Optuna study per loss, each with its quota of trials."""
    plan, r = session.plan, session.plan.request
    return PerLossSearcher(plan.space, plan.base, schema.optuna_url(plan.search_dir), plan.task.name,
                           metric=f"best_val_{plan.metric}", seed=r.seed, sampler=r.sampler,
                           warm=r.warm_start, quota={loss: plan.quota(loss) for loss in plan.losses})


def limited(session: Session, searcher: Searcher) -> Searcher:
    """`searcher` with at most --max-concurrent trials running, else as many as the cluster holds while it
    runs (counted by the searcher)."""
    return concurrency.limited(searcher, session.plan.request.max_concurrent, session.resources)
