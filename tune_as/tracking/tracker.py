"""The runs of one search, written from the Ray driver only (a Tune callback calls this), so SQLite never sees
concurrent writers. Schema: docs/architecture.md ("MLflow schema").

Every write goes through a FIFO queue: when the tracking server is unreachable, the operations stay queued
and are retried, in order, on the next callback (and for up to `final_flush_s` at the end of the search). The
search itself never fails because MLflow is briefly away.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlflow.entities import Metric, Param, Run, RunTag
from mlflow.tracking import MlflowClient

from tune_as.errors import UserError
from tune_as.tracking.client import DEFAULT_URI, failure_reason, is_outage, open_client, redact_uri, scrub
from tune_as.tracking.schema import (
    ERROR,
    EXPERIMENT_KIND,
    LAST_STEP,
    MODEL_RUNS,
    NODE,
    ORPHANED,
    PARENT,
    ROLE,
    ROLE_SEARCH,
    SEARCH,
    TRIAL,
)

log = logging.getLogger(__name__)
NON_METRICS = {"error", "node_id", "done", "trial_id", "experiment_id", "date", "hostname", "node_ip", "pid",
               "experiment_tag", "config", "time_this_iter_s", "time_total_s", "timestamp", "time_since_restore",
               "iterations_since_restore", "checkpoint_dir_name", "should_checkpoint", "training_iteration"}


@dataclass
class TrialRecord:
    """What the tracker knows of one trial: its run (None until found or created), how to open it, how far its
    metrics are queued (`last_step`) and known to be in MLflow (`logged`), and whether it ended."""

    tags: dict[str, str]
    name: str
    run_id: str | None = None
    last_step: int = 0
    logged: int = 0
    ended: bool = False


class MlflowTracker:
    """The runs of one search. `uri` may hold a password: print `shown` (the URI without it), never `uri`."""

    def __init__(self, uri: str | None, experiment: str, search_id: str, final_flush_s: float = 120.0) -> None:
        self.uri = uri or DEFAULT_URI
        self.shown = redact_uri(self.uri)
        self.experiment = experiment
        self.search_id = search_id
        self.final_flush_s = final_flush_s
        self._client: MlflowClient | None = None
        self.experiment_id: str | None = None
        self.parent_id: str | None = None
        self.trials: dict[str, TrialRecord] = {}  # by Ray trial id
        self.pending: deque[tuple[str, Callable[[], None]]] = deque()
        self.outage_since: float | None = None

    @property
    def client(self) -> MlflowClient:
        """Opened by `check_reachable` (or on first use)."""
        if self._client is None:
            self._client = open_client(self.uri)
        return self._client

    # -- set-up (synchronous: errors here are the user's to see) -----------------------------------------
    def check_reachable(self) -> None:
        """UserError unless the store answers and the experiment is usable. An experiment deleted in the MLflow
        UI (soft-deleted: MLflow keeps its name taken) is not restored behind the user's back, which would bring
        its discarded runs back into the report: the error says how to restore it or to use another name."""
        self._client = open_client(self.uri)
        exp = self._client.get_experiment_by_name(self.experiment)
        if exp is not None and exp.lifecycle_stage == "deleted":
            raise UserError(
                f"MLflow experiment {self.experiment!r} at {self.shown} is deleted: expected an active or new "
                f"experiment; restore it with `mlflow experiments restore --experiment-id {exp.experiment_id}` "
                "(MLFLOW_TRACKING_URI set to this tracking URI), or choose another experiment name (--experiment)")

    def start_search(self, params: dict[str, Any], tags: dict[str, str]) -> str:
        """Find (on resume) or create the experiment and the parent run of this search."""
        exp = self.client.get_experiment_by_name(self.experiment)
        self.experiment_id = exp.experiment_id if exp else self.client.create_experiment(
            self.experiment, tags={EXPERIMENT_KIND: MODEL_RUNS})
        if exp is not None and exp.tags.get(EXPERIMENT_KIND) != MODEL_RUNS:
            self.client.set_experiment_tag(self.experiment_id, EXPERIMENT_KIND, MODEL_RUNS)
        found = self.client.search_runs([self.experiment_id], max_results=1,
                                        filter_string=f"tags.`{SEARCH}` = '{self.search_id}' and tags.`{ROLE}` = 'search'")
        if found:
            self.parent_id = found[0].info.run_id
            self.client.update_run(self.parent_id, status="RUNNING")
        else:
            run = self.client.create_run(self.experiment_id, run_name=self.search_id,
                                         tags={ROLE: ROLE_SEARCH, SEARCH: self.search_id, **tags})
            self.parent_id = run.info.run_id
            self.client.log_batch(self.parent_id, params=[Param(k, str(v)[:6000]) for k, v in params.items()])
        return self.parent_id

    # -- queued operations ------------------------------------------------------------------------------
    def _enqueue(self, what: str, op: Callable[[], None]) -> None:
        self.pending.append((what, op))
        self.flush()

    def flush(self, deadline: float | None = None) -> bool:
        """Run queued operations in order; stop at the first outage. True when the queue is empty."""
        while self.pending:
            what, op = self.pending[0]
            try:
                op()
            except Exception as exc:  # noqa: BLE001
                if not is_outage(exc):
                    log.warning("MLflow: dropped %s: %s", what, failure_reason(exc, self.uri))
                    self.pending.popleft()
                    continue
                if self.outage_since is None:  # one line per outage, not per attempt
                    self.outage_since = time.monotonic()
                    log.warning("MLflow unreachable at %s (%s); buffering writes and retrying",
                                self.shown, failure_reason(exc, self.uri))
                if deadline is None or time.monotonic() > deadline:
                    return False
                time.sleep(2.0)
                continue
            self.pending.popleft()
            if self.outage_since is not None:
                log.warning("MLflow reachable again after %.0f s; replaying buffered writes",
                            time.monotonic() - self.outage_since)
                self.outage_since = None
        return True

    def _record(self, trial_id: str) -> TrialRecord:
        """A trial's record; one the driver never saw start (a restored Ray trial's events) gets a bare one."""
        return self.trials.setdefault(trial_id, TrialRecord(tags={}, name=trial_id))

    def _child(self, trial_id: str) -> str:
        """The run of a trial: from memory, else from MLflow (after a driver restart), else a new one."""
        record = self._record(trial_id)
        if record.run_id is not None:
            return record.run_id
        assert self.experiment_id is not None and self.parent_id is not None, "start_search() comes first"
        found = self.client.search_runs([self.experiment_id], max_results=1, filter_string=(
            f"tags.`{SEARCH}` = '{self.search_id}' and tags.`{TRIAL}` = '{trial_id}'"))
        if found:
            run = found[0]
            record.logged = self._logged_step(run)
            record.last_step = max(record.last_step, record.logged)
        else:
            run = self.client.create_run(self.experiment_id, run_name=record.name, tags={
                PARENT: self.parent_id, SEARCH: self.search_id, TRIAL: trial_id, **record.tags})
        record.run_id = run.info.run_id
        return run.info.run_id

    def _logged_step(self, run: Run) -> int:
        """The last step of a run's metrics. Not its LAST_STEP tag alone: the SQLite store commits a batch's metrics
        and its tags in separate transactions, so a driver killed between the two leaves the tag a step behind."""
        steps = [m.step for key in run.data.metrics for m in self.client.get_metric_history(run.info.run_id, key)]
        return max([int(run.data.tags.get(LAST_STEP, 0)), *steps])

    def trial_started(self, trial_id: str, config: dict[str, Any], tags: dict[str, str], name: str | None = None) -> None:
        """Open (or, after a restart, find) the trial's child run, named `name` (default: the trial id)."""
        record = self._record(trial_id)
        record.tags, record.name = tags, name or trial_id

        def op() -> None:
            new = record.run_id is None
            run_id = self._child(trial_id)
            self.client.update_run(run_id, status="RUNNING")
            if new:  # MLflow accepts re-logging an identical param after a driver restart
                params = [Param(k, str(v)[:6000]) for k, v in sorted(config.items()) if v is not None]
                self.client.log_batch(run_id, params=params)
        self._enqueue(f"start of {trial_id}", op)

    def trial_result(self, trial_id: str, result: dict[str, Any]) -> None:
        step = int(result.get("training_iteration", 0))
        record = self._record(trial_id)
        if step <= record.last_step:
            return  # replayed after a restore from checkpoint: already logged
        record.last_step = step
        now = int(time.time() * 1000)
        metrics = [Metric(k, float(v), now, step) for k, v in result.items()
                   if k not in NON_METRICS and isinstance(v, (int, float)) and not isinstance(v, bool)]
        tags = [RunTag(LAST_STEP, str(step))]
        if result.get("node_id"):
            tags.append(RunTag(NODE, str(result["node_id"])))
        if result.get("error"):
            tags.append(RunTag(ERROR, scrub(str(result["error"]), self.uri)[:5000]))

        def op() -> None:
            run_id = self._child(trial_id)
            if step <= record.logged:  # queued before the run (and how far it is logged) was found after a restart
                return
            self.client.log_batch(run_id, metrics=metrics, tags=tags)
            record.logged = step
        self._enqueue(f"result {step} of {trial_id}", op)

    def trial_ended(self, trial_id: str, status: str, error: str | None = None,
                    artifacts: list[Path] | None = None, tags: dict[str, str] | None = None) -> None:
        self._record(trial_id).ended = True
        staged = None
        if artifacts:  # copy now: Ray may delete the checkpoint before MLflow is reachable again
            staged = Path(tempfile.mkdtemp(prefix="tune_as_art_"))
            for path in artifacts:
                shutil.copy2(path, staged / path.name)

        def op() -> None:
            run_id = self._child(trial_id)
            extra = dict(tags or {})
            if error:
                extra[ERROR] = scrub(error.strip().splitlines()[-1], self.uri)[:5000] if error.strip() else "error"
            if extra:
                self.client.log_batch(run_id, tags=[RunTag(k, v) for k, v in extra.items()])
            if staged is not None:
                for path in sorted(staged.iterdir()):
                    self.client.log_artifact(run_id, str(path))
                shutil.rmtree(staged, ignore_errors=True)
            self.client.set_terminated(run_id, status)
        self._enqueue(f"end of {trial_id}", op)

    def search_artifacts(self, paths: list[Path], metrics: dict[str, float] | None = None,
                         tags: dict[str, str] | None = None) -> None:
        """Log files (the search's ranking), metrics (its compute, each loss's difference) and tags (verdicts, the
        winner) to the parent run; files are copied now, and all is delivered through the queue."""
        staged = Path(tempfile.mkdtemp(prefix="tune_as_art_"))
        for path in paths:
            shutil.copy2(path, staged / path.name)

        def op() -> None:
            for path in sorted(staged.iterdir()):
                self.client.log_artifact(str(self.parent_id), str(path))
            self.client.log_batch(str(self.parent_id), metrics=[
                Metric(k, float(v), int(time.time() * 1000), 0) for k, v in (metrics or {}).items()],
                tags=[RunTag(k, v[:5000]) for k, v in (tags or {}).items()])
            shutil.rmtree(staged, ignore_errors=True)
        self._enqueue("search artifacts", op)

    def unfinished(self) -> list[str]:
        return sorted(t for t, record in self.trials.items() if not record.ended)

    def _close_orphans(self) -> None:
        """A driver killed between opening a trial's run and Ray's next experiment-state save leaves a run for a
        trial Ray never resumes (the searcher replaces it). When the search then finishes, such a run is still
        RUNNING and untouched by this process: mark it KILLED and soft-delete it (restorable in MLflow), so
        the experiment has exactly one run per trial."""
        assert self.experiment_id is not None
        found = self.client.search_runs([self.experiment_id], max_results=5000, filter_string=(
            f"tags.`{SEARCH}` = '{self.search_id}' and tags.`{ROLE}` != 'search' and attributes.status = 'RUNNING'"))
        for run in found:
            record = self.trials.get(run.data.tags.get(TRIAL, ""))
            if record is None or record.run_id is None:
                self.client.set_tag(run.info.run_id, ORPHANED, "trial lost with a killed driver")
                self.client.set_terminated(run.info.run_id, "KILLED")
                self.client.delete_run(run.info.run_id)
                log.warning("MLflow: closed orphaned run %s of trial %s", run.info.run_id, run.data.tags.get(TRIAL))

    def search_ended(self, status: str) -> bool:
        """Close the parent run (and, after an interruption, every trial still open, as KILLED) and wait
        (bounded) for buffered writes. False if some writes could not be delivered."""
        parent = self.parent_id
        for trial_id in self.unfinished():
            self.trial_ended(trial_id, "KILLED")
        if status == "FINISHED":
            self._enqueue("orphaned runs", self._close_orphans)

        def op() -> None:
            if parent:
                self.client.set_terminated(parent, status)
        self._enqueue("end of search", op)
        done = self.flush(deadline=time.monotonic() + self.final_flush_s)
        if not done:
            log.error("MLflow: %d writes could not be delivered to %s", len(self.pending), self.shown)
        return done
