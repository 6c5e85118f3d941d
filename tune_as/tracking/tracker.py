"""The runs of one search, written from the Ray driver only (a Tune callback calls this), so SQLite never sees
concurrent writers. Schema: docs/architecture.md ("MLflow schema").

Every write goes through a FIFO queue of operations kept as data (JSON): when the tracking server is
unreachable, the operations stay queued and are retried, in order, on the next callback (and for up to
`final_flush_s` at the end of the search). The search itself never fails because MLflow is briefly away. What
is still queued when the search ends is kept in its folder (`tracking_journal.jsonl`, with the files it logs
beside it), never dropped: `--resume` or `python -m tune_as.sync` delivers it (operations are idempotent: a
run is found by its trial's tag, metrics already logged are skipped by step).
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlflow.entities import Metric, Param, Run, RunTag
from mlflow.tracking import MlflowClient

from tune_as.errors import UserError
from tune_as.tracking import journal
from tune_as.tracking.background import Writer
from tune_as.tracking.client import DEFAULT_URI, failure_reason, is_outage, open_client, redact_uri, scrub

# also the tracker's names
from tune_as.tracking.journal import JOURNAL, JOURNAL_FILES, OPERATIONS, WritesKept  # noqa: F401
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
CLOSED = ("FINISHED", "FAILED", "KILLED")  # MLflow run statuses that say a trial's run was ended
NON_METRICS = {"error", "node_id", "done", "trial_id", "experiment_id", "date", "hostname", "node_ip", "pid",
               "experiment_tag", "config", "time_this_iter_s", "time_total_s", "timestamp",
               "time_since_restore", "iterations_since_restore", "checkpoint_dir_name", "should_checkpoint",
               "training_iteration"}


@dataclass
class TrialRecord:
    """What the tracker knows of one trial: its run (None until found or created), how to open it, how far its
    metrics are queued (`last_step`) and known to be in MLflow (`logged`), whether it ended, and whether its
    run was found already closed (FINISHED, FAILED or KILLED) in MLflow."""

    tags: dict[str, str]
    name: str
    run_id: str | None = None
    last_step: int = 0
    logged: int = 0
    ended: bool = False
    closed: bool = False


class MlflowTracker:
    """The runs of one search. `uri` may hold a password: print `shown` (the URI without it), never `uri`."""

    def __init__(self, uri: str | None, experiment: str, search_id: str, final_flush_s: float = 120.0,
                 journal_dir: Path | None = None) -> None:
        self.uri = uri or DEFAULT_URI
        self.shown = redact_uri(self.uri)
        self.experiment = experiment
        self.search_id = search_id
        self.final_flush_s = final_flush_s
        self._client: MlflowClient | None = None
        self.experiment_id: str | None = None
        self.parent_id: str | None = None
        self.trials: dict[str, TrialRecord] = {}  # by Ray trial id
        self.pending: deque[tuple[str, dict[str, Any]]] = deque()
        self.journal_dir = journal_dir  # the search's folder: writes not delivered at its end are kept there
        self.unkept: str | None = None  # why the journal could not be written (a full disk), if it could not
        self.outage_since: float | None = None
        # one flush at a time: the search's thread, or the writer's (`start_writer`)
        self.lock = threading.RLock()
        self.writer: Writer | None = None

    @property
    def client(self) -> MlflowClient:
        """Opened by `check_reachable` (or on first use)."""
        if self._client is None:
            self._client = open_client(self.uri)
        return self._client

    # -- set-up (synchronous: errors here are the user's to see) -----------------------------------------
    def check_reachable(self, new: bool = False) -> None:
        """UserError unless the store answers and the experiment is usable. An experiment deleted in the
        MLflow UI (soft-deleted: MLflow keeps its name taken) is not restored behind the user's back, which
        would bring its discarded runs back into the report: the error says how to restore it or to use
        another name. A `new` search whose name the experiment already holds is refused: `start_search` would
        add its runs to that search's parent run, and the report would pool two searches as one."""
        self._client = open_client(self.uri)
        exp = self._client.get_experiment_by_name(self.experiment)
        if exp is not None and exp.lifecycle_stage == "deleted":
            raise UserError(
                f"MLflow experiment {self.experiment!r} at {self.shown} is deleted: expected an active or "
                f"new experiment; restore it with `mlflow experiments restore --experiment-id "
                f"{exp.experiment_id}` (MLFLOW_TRACKING_URI set to this tracking URI), or choose another "
                "experiment name (--experiment)")
        if new and exp is not None and (found := self._parent(exp.experiment_id)) is not None:
            raise UserError(f"--name: expected a new search name, but MLflow experiment {self.experiment!r} "
                            f"at {self.shown} holds a search named {self.search_id!r} already (parent run "
                            f"{found.info.run_id}); choose another --name, or resume that search from its "
                            "folder (--resume)")

    def start_search(self, params: dict[str, Any], tags: dict[str, str]) -> str:
        """Find (on resume) or create the experiment and the parent run of this search."""
        exp = self.client.get_experiment_by_name(self.experiment)
        self.experiment_id = exp.experiment_id if exp else self.client.create_experiment(
            self.experiment, tags={EXPERIMENT_KIND: MODEL_RUNS})
        if exp is not None and exp.tags.get(EXPERIMENT_KIND) != MODEL_RUNS:
            self.client.set_experiment_tag(self.experiment_id, EXPERIMENT_KIND, MODEL_RUNS)
        if found := self._parent(self.experiment_id):
            self.parent_id = found.info.run_id
            self.client.update_run(self.parent_id, status="RUNNING")
        else:
            run = self.client.create_run(self.experiment_id, run_name=self.search_id,
                                         tags={ROLE: ROLE_SEARCH, SEARCH: self.search_id, **tags})
            self.parent_id = run.info.run_id
            self.client.log_batch(self.parent_id, params=[Param(k, str(v)[:6000]) for k, v in params.items()])
        return self.parent_id

    def _parent(self, experiment_id: str) -> Run | None:
        """This search's parent run in the experiment, if it exists."""
        found = self.client.search_runs([experiment_id], max_results=1, filter_string=(
            f"tags.`{SEARCH}` = '{self.search_id}' and tags.`{ROLE}` = 'search'"))
        return found[0] if found else None

    def attach(self) -> None:
        """Find this search's experiment and parent run, changing nothing (to deliver its journal)."""
        exp = self.client.get_experiment_by_name(self.experiment)
        found = self._parent(exp.experiment_id) if exp is not None else None
        if exp is None or found is None:
            raise UserError(f"MLflow at {self.shown}: expected the parent run of search {self.search_id!r} "
                            f"in experiment {self.experiment!r}, got none")
        self.experiment_id, self.parent_id = exp.experiment_id, found.info.run_id

    # -- queued operations: data (JSON), so that what cannot be delivered is kept on disk -------------------
    def _enqueue(self, what: str, op: dict[str, Any]) -> None:
        self.pending.append((what, op))
        if self.writer is None:
            self.flush()
        else:
            self.writer.wake()

    def start_writer(self) -> None:
        """From now on, deliver on a thread of its own (tune_as.tracking.background), off the caller's event
        loop."""
        if self.writer is None:
            self.writer = Writer(self)

    def flush(self, deadline: float | None = None) -> bool:
        """Run queued operations in order; stop at the first outage. True when the queue is empty."""
        with self.lock:
            return self._flush(deadline)

    def _flush(self, deadline: float | None) -> bool:
        while self.pending:
            what, op = self.pending[0]
            try:
                self._execute(op)
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

    def _execute(self, op: dict[str, Any]) -> None:
        kind = op["op"]
        if kind not in OPERATIONS:
            raise ValueError(f"a tracking operation: expected one of {', '.join(OPERATIONS)}, got {kind!r}")
        if kind == "orphans":
            self._close_orphans()
        elif kind == "search_end":
            if self.parent_id:
                self.client.set_terminated(self.parent_id, op["status"])
        else:
            {"start": self._start, "result": self._result, "end": self._end,
             "artifacts": self._search_artifacts}[kind](op)

    def _record(self, trial_id: str, ended: bool = False) -> TrialRecord:
        """A trial's record; one the driver never saw start gets a bare one, `ended` when the writer makes it
        (a replayed journal's write is of no trial running now: never one `unfinished` waits for)."""
        return self.trials.setdefault(trial_id, TrialRecord(tags={}, name=trial_id, ended=ended))

    def _child(self, trial_id: str) -> str:
        """The run of a trial: from memory, else from MLflow (after a driver restart), else a new one."""
        record = self._record(trial_id, ended=True)
        if record.run_id is not None:
            return record.run_id
        assert self.experiment_id is not None and self.parent_id is not None, "start_search() comes first"
        found = self.client.search_runs([self.experiment_id], max_results=1, filter_string=(
            f"tags.`{SEARCH}` = '{self.search_id}' and tags.`{TRIAL}` = '{trial_id}'"))
        if found:
            run = found[0]
            record.logged = self._logged_step(run)
            record.last_step = max(record.last_step, record.logged)
            record.closed = run.info.status in CLOSED
        else:
            run = self.client.create_run(self.experiment_id, run_name=record.name, tags={
                PARENT: self.parent_id, SEARCH: self.search_id, TRIAL: trial_id, **record.tags})
        record.run_id = run.info.run_id
        return run.info.run_id

    def _logged_step(self, run: Run) -> int:
        """The last step of a run's metrics. Not its LAST_STEP tag alone: the SQLite store commits a batch's
        metrics and its tags in separate transactions, so a driver killed between the two leaves the tag a
        step behind. A closed run's tag is whole (its end is delivered after every result, from one FIFO
        queue): no request per metric for it, which a resume makes for each trial it settles."""
        tagged = int(run.data.tags.get(LAST_STEP, 0))
        if run.info.status in CLOSED:
            return tagged
        steps = [m.step for key in run.data.metrics
                 for m in self.client.get_metric_history(run.info.run_id, key)]
        return max([tagged, *steps])

    def trial_started(self, trial_id: str, config: dict[str, Any], tags: dict[str, str],
                      name: str | None = None, settle: bool = False) -> None:
        """Open (or, after a restart, find) the trial's child run, named `name` (default: the trial id).
        `settle`: the trial ended under an earlier driver (`trial_ended(settle=True)` follows): a run found
        closed stays closed, one found open or not found is opened, to be ended as the trial did."""
        params = {k: str(v)[:6000] for k, v in sorted(config.items()) if v is not None}
        self._record(trial_id).ended = False  # running (again, for a trial Ray restored)
        self._enqueue(f"start of {trial_id}", {"op": "start", "trial": trial_id, "params": params,
                                               "tags": tags, "name": name or trial_id, "settle": settle})

    def _start(self, op: dict[str, Any]) -> None:
        record = self._record(op["trial"], ended=True)
        record.tags, record.name = op["tags"], op["name"]
        new = record.run_id is None
        run_id = self._child(op["trial"])
        if op.get("settle") and record.closed:
            return
        self.client.update_run(run_id, status="RUNNING")
        if new:  # MLflow accepts re-logging an identical param after a driver restart
            self.client.log_batch(run_id, params=[Param(k, v) for k, v in op["params"].items()])

    def trial_result(self, trial_id: str, result: dict[str, Any]) -> None:
        step = int(result.get("training_iteration", 0))
        record = self._record(trial_id)
        if step <= record.last_step:
            return  # replayed after a restore from checkpoint: already logged
        record.last_step = step
        now = int(time.time() * 1000)
        metrics = [[k, float(v), now] for k, v in result.items()
                   if k not in NON_METRICS and isinstance(v, (int, float)) and not isinstance(v, bool)]
        tags = {LAST_STEP: str(step)}
        if result.get("node_id"):
            tags[NODE] = str(result["node_id"])
        if result.get("error"):
            tags[ERROR] = scrub(str(result["error"]), self.uri)[:5000]
        self._enqueue(f"result {step} of {trial_id}", {"op": "result", "trial": trial_id, "step": step,
                                                       "metrics": metrics, "tags": tags})

    def _result(self, op: dict[str, Any]) -> None:
        record, step = self._record(op["trial"], ended=True), int(op["step"])
        run_id = self._child(op["trial"])
        if step <= record.logged:
            return  # queued before the run (and how far it is logged) was found after a restart
        self.client.log_batch(run_id, metrics=[Metric(k, v, ts, step) for k, v, ts in op["metrics"]],
                              tags=[RunTag(k, v) for k, v in op["tags"].items()])
        record.logged = step

    def trial_ended(self, trial_id: str, status: str, error: str | None = None,
                    artifacts: list[Path] | None = None, tags: dict[str, str] | None = None,
                    settle: bool = False) -> None:
        """Close the trial's run as `status`; `settle` (see `trial_started`): unless MLflow has it closed
        already."""
        self._record(trial_id).ended = True
        extra = dict(tags or {})
        if error:
            extra[ERROR] = (scrub(error.strip().splitlines()[-1], self.uri)[:5000] if error.strip()
                            else "error")
        self._enqueue(f"end of {trial_id}", {"op": "end", "trial": trial_id, "status": status, "tags": extra,
                                             "staged": _staged(artifacts), "settle": settle})

    def _end(self, op: dict[str, Any]) -> None:
        record = self._record(op["trial"], ended=True)
        record.ended = True  # a replayed end too: not left for search_ended to close as KILLED
        run_id = self._child(op["trial"])
        if op.get("settle") and record.closed:
            if op["staged"]:
                shutil.rmtree(op["staged"], ignore_errors=True)
            return
        if op["tags"]:
            self.client.log_batch(run_id, tags=[RunTag(k, v) for k, v in op["tags"].items()])
        self._log_staged(run_id, op["staged"])
        self.client.set_terminated(run_id, op["status"])

    def search_artifacts(self, paths: list[Path], metrics: dict[str, float] | None = None,
                         tags: dict[str, str] | None = None) -> None:
        """Log files (the search's ranking), metrics (its compute, each loss's difference) and tags (verdicts,
        the winner) to the parent run; files are copied now, and all is delivered through the queue."""
        self._enqueue("search artifacts", {"op": "artifacts", "staged": _staged(paths),
                                           "time": int(time.time() * 1000),
                                           "metrics": {k: float(v) for k, v in (metrics or {}).items()},
                                           "tags": {k: v[:5000] for k, v in (tags or {}).items()}})

    def _search_artifacts(self, op: dict[str, Any]) -> None:
        self._log_staged(str(self.parent_id), op["staged"])
        self.client.log_batch(str(self.parent_id),
                              metrics=[Metric(k, v, op["time"], 0) for k, v in op["metrics"].items()],
                              tags=[RunTag(k, v) for k, v in op["tags"].items()])

    def _log_staged(self, run_id: str, staged: str | None) -> None:
        """The files copied when the operation was queued (Ray may delete a checkpoint before MLflow is
        back)."""
        if staged is None:
            return
        folder = Path(staged)
        for path in sorted(folder.iterdir()):
            self.client.log_artifact(run_id, str(path))
        shutil.rmtree(folder, ignore_errors=True)

    def unfinished(self) -> list[str]:
        return sorted(t for t, record in self.trials.items() if not record.ended)

    def _close_orphans(self) -> None:
        """A driver killed between opening a trial's run and Ray's next experiment-state save leaves a run for
        a trial Ray never resumes (the searcher replaces it). When the search then finishes, such a run is
        still RUNNING and untouched by this process: mark it KILLED and soft-delete it (restorable in MLflow),
        so the experiment has exactly one run per trial."""
        assert self.experiment_id is not None
        found = self.client.search_runs([self.experiment_id], max_results=5000, filter_string=(
            f"tags.`{SEARCH}` = '{self.search_id}' and tags.`{ROLE}` != 'search' "
            "and attributes.status = 'RUNNING'"))
        for run in found:
            record = self.trials.get(run.data.tags.get(TRIAL, ""))
            if record is None or record.run_id is None:
                self.client.set_tag(run.info.run_id, ORPHANED, "trial lost with a killed driver")
                self.client.set_terminated(run.info.run_id, "KILLED")
                self.client.delete_run(run.info.run_id)
                log.warning("MLflow: closed orphaned run %s of trial %s", run.info.run_id,
                            run.data.tags.get(TRIAL))

    def search_ended(self, status: str) -> bool:
        """Close the parent run (and, after an interruption, every trial still open, as KILLED) and wait
        (bounded) for buffered writes. False if some writes could not be delivered: they are then kept in the
        journal (`keep`), when the tracker has a folder for it."""
        writer, self.writer = self.writer, None
        if writer is not None:  # what it has not delivered is flushed here, bounded
            writer.stop()
        for trial_id in self.unfinished():
            self.trial_ended(trial_id, "KILLED")
        if status == "FINISHED":
            self._enqueue("orphaned runs", {"op": "orphans"})
        self._enqueue("end of search", {"op": "search_end", "status": status})
        done = self.flush(deadline=time.monotonic() + self.final_flush_s)
        kept = self.keep()
        if not done:
            log.error("MLflow: %d writes could not be delivered to %s%s", len(self.pending), self.shown,
                      f"; kept in {kept}" if kept else "")
        return done

    def keep(self) -> Path | None:
        """What is still queued, kept in the search's folder (tune_as.tracking.journal.keep)."""
        return journal.keep(self)

    def replay(self, skip_search_end: bool = False) -> int:
        """The journal's writes queued first (tune_as.tracking.journal.replay)."""
        return journal.replay(self, skip_search_end)


def _staged(paths: list[Path] | None) -> str | None:
    """The files copied to a folder of their own now (None when there are none)."""
    if not paths:
        return None
    staged = Path(tempfile.mkdtemp(prefix="tune_as_art_"))
    for path in paths:
        shutil.copy2(path, staged / path.name)
    return str(staged)
