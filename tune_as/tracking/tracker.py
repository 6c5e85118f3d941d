"""MLflow tracking, driven from the Ray driver only (a Tune callback calls this), so SQLite never sees
concurrent writers. Schema: docs/architecture.md ("MLflow schema").

Every write goes through a FIFO queue: when the tracking server is unreachable, the operations stay queued
and are retried, in order, on the next callback (and for up to `final_flush_s` at the end of the search). The
search itself never fails because MLflow is briefly away.

`open_client` is the one door to MLflow for this package (the search's tracker and the report): no password
of a tracking URI can reach a printed or logged line (see its docstring).
"""

from __future__ import annotations

import base64
import fcntl
import logging
import os
import shutil
import tempfile
import time
import urllib.parse
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tune_as.errors import UserError, first_line, tcp_unreachable
from tune_as.tracking.schema import ERROR, LAST_STEP, NODE, ORPHANED, PARENT, ROLE, ROLE_SEARCH, SEARCH, TRIAL

# Fail fast instead of MLflow's default minutes of blocking retries: our own queue retries instead.
os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")

import requests  # noqa: E402  (MLflow's HTTP transport: its exception types tell an outage)
from mlflow.entities import Metric, Param, RunTag  # noqa: E402
from mlflow.environment_variables import MLFLOW_TRACKING_PASSWORD, MLFLOW_TRACKING_USERNAME  # noqa: E402
from mlflow.exceptions import MlflowException  # noqa: E402
from mlflow.protos import databricks_pb2 as codes  # noqa: E402
from mlflow.tracking import MlflowClient  # noqa: E402

log = logging.getLogger(__name__)
DB_PORTS = {"postgresql": 5432, "mysql": 3306, "mssql": 1433}
DEFAULT_URI = "sqlite:///mlflow.db"
NON_METRICS = {"error", "node_id", "done", "trial_id", "experiment_id", "date", "hostname", "node_ip", "pid",
               "experiment_tag", "config", "time_this_iter_s", "time_total_s", "timestamp", "time_since_restore",
               "iterations_since_restore", "checkpoint_dir_name", "should_checkpoint", "training_iteration"}
# What MLflow raises when its server or database is away for now (the cause/context chain of its exceptions):
# the HTTP transport's failures, and the error codes MLflow gives transient states ("database is locked" is
# TEMPORARILY_UNAVAILABLE). Anything else is an answer: retrying the same write would get the same answer.
_NETWORK_FAILURES = (requests.exceptions.ConnectionError, requests.exceptions.Timeout,
                     requests.exceptions.RetryError, ConnectionError, TimeoutError)
_TRANSIENT_CODES = {codes.ErrorCode.Name(code) for code in (
    codes.TEMPORARILY_UNAVAILABLE, codes.DEADLINE_EXCEEDED, codes.REQUEST_LIMIT_EXCEEDED, codes.RESOURCE_EXHAUSTED)}


def _userinfo(uri: str) -> tuple[str, str | None, str]:
    """(user, password or None, the URI without them), as written in the URI (percent-encoding kept). The
    userinfo is everything before the LAST '@' of the network location, so a password may contain '@'."""
    netloc = urllib.parse.urlsplit(uri).netloc
    userinfo, at, hostport = netloc.rpartition("@")
    if not at:
        return "", None, uri
    user, colon, password = userinfo.partition(":")
    return user, (password if colon else None), uri.replace(f"//{netloc}", f"//{hostport}", 1)


def redact_uri(uri: str) -> str:
    """The URI with any password replaced by ***: the only form of a tracking URI to print or log."""
    user, password, bare = _userinfo(uri)
    return uri if password is None else bare.replace("//", f"//{user}:***@", 1)


def scrub(text: str, uri: str) -> str:
    """`text` with the password of `uri` replaced by *** wherever it appears: as written in the URI, decoded,
    or inside a basic-auth header. Every exception text that reaches a user line passes through here."""
    user, password, _ = _userinfo(uri)
    if not password:
        return text
    plain_user, plain = urllib.parse.unquote(user), urllib.parse.unquote(password)
    basic = base64.b64encode(f"{plain_user}:{plain}".encode()).decode()
    for secret in sorted({password, plain, urllib.parse.quote(plain, safe=""), basic}, key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """The exception, then what it was raised from or while handling, down to the root."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def is_outage(exc: BaseException) -> bool:
    """True when `exc` says the tracking store is away for now (retry later), judged by exception types along
    its cause/context chain, never by its text: MLflow wraps a refused connection or a timeout in a plain
    MlflowException whose context is the `requests` error."""
    return any(isinstance(e, _NETWORK_FAILURES) or (isinstance(e, MlflowException) and e.error_code in _TRANSIENT_CODES)
               for e in _chain(exc))


def failure_reason(exc: BaseException, uri: str) -> str:
    """Why a call to MLflow at `uri` failed, in one line without secrets: the operating system's reason for a
    network failure ("Connection refused", "Name or service not known"), else the exception's first line."""
    reasons = [e.strerror for e in _chain(exc) if isinstance(e, OSError) and e.strerror]
    return scrub(reasons[-1] if reasons else first_line(exc), uri)[:300]


def check_database_port(uri: str) -> None:
    """For a database tracking URI, a UserError in seconds when nothing listens (MLflow would retry with
    exponential back-off for minutes). Other URIs are left to the client."""
    parts = urllib.parse.urlsplit(uri)
    default = DB_PORTS.get(parts.scheme.split("+")[0])
    if default is None or not parts.hostname:
        return
    port = parts.port or default
    reason = tcp_unreachable(parts.hostname, port)
    if reason:
        raise UserError(f"MLflow tracking URI {redact_uri(uri)} is not usable: expected a reachable "
                        f"database at {parts.hostname}:{port}, received: {reason}")


class TrackingUnusable(UserError):
    """Nothing usable answers at a tracking URI. `shown` is the URI without its password, `reason` says why."""

    def __init__(self, shown: str, reason: str) -> None:
        self.shown, self.reason = shown, reason
        super().__init__(f"MLflow tracking URI {shown} is not usable: expected a reachable tracking server or "
                         f"database, got {reason}")


def _credentials_to_env(uri: str) -> str:
    """For an http(s) URI with user:password@, put them in MLflow's MLFLOW_TRACKING_USERNAME/PASSWORD (over any
    set before: the URI is the more specific) and return the URI without them. MLflow sends them as basic auth
    either way, but only a URI without them keeps them out of MLflow's own messages ("API request to URL
    failed", "View run ... at URL"). An empty user name stays in the URI: MLflow sends the environment's
    credentials only when both are non-empty, `requests` sends a URI's as they are."""
    user, password, bare = _userinfo(uri)
    if not urllib.parse.urlsplit(uri).scheme.startswith("http") or not user or not password:
        return uri
    os.environ[MLFLOW_TRACKING_USERNAME.name] = urllib.parse.unquote(user)
    os.environ[MLFLOW_TRACKING_PASSWORD.name] = urllib.parse.unquote(password)
    return bare


@contextmanager
def _first_use_lock(uri: str) -> Iterator[None]:
    """Serializes MLflow's opening of a SQLite file across processes: two processes migrating a fresh file at
    once leave it broken ("table _alembic_tmp_tags already exists"). The lock is an flock on a sibling
    `<file>.lock`, released when the client exists (the schema is complete by then)."""
    path = uri.removeprefix("sqlite:///").split("?", 1)[0] if uri.startswith("sqlite:///") else ""
    fd = None
    if path and path != ":memory:":
        try:
            fd = os.open(f"{path}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        except OSError:  # e.g. a read-only folder: MLflow cannot migrate a file there either, and says so
            fd = None
    try:
        if fd is not None:
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        if fd is not None:
            os.close(fd)


def open_client(uri: str) -> MlflowClient:
    """A client for `uri`, checked with one cheap request, or TrackingUnusable in seconds (for a database URI,
    check_database_port's UserError). The one way this package opens MLflow, so that:
    - a password in an http(s) URI never reaches MLflow's messages (`_credentials_to_env`), and every reason
      printed passes through `scrub`;
    - MLflow prints no "View run ... at URL" line per run: the CLIs print their own summary;
    - the first use of a fresh SQLite file is serialized across processes (`_first_use_lock`)."""
    check_database_port(uri)
    os.environ["MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"] = "true"
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    target = _credentials_to_env(uri)
    try:
        with _first_use_lock(target):
            client = MlflowClient(tracking_uri=target)
        client.search_experiments(max_results=1)
    except Exception as exc:  # noqa: BLE001 - any failure means "cannot use this URI"
        raise TrackingUnusable(redact_uri(uri), failure_reason(exc, uri)) from None
    return client


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
        self.runs: dict[str, str] = {}  # Ray trial id -> MLflow run id
        self.trial_tags: dict[str, dict[str, str]] = {}
        self.run_names: dict[str, str] = {}
        self.ended: set[str] = set()
        self.last_step: dict[str, int] = {}
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
        self.experiment_id = exp.experiment_id if exp else self.client.create_experiment(self.experiment)
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

    def _child(self, trial_id: str) -> str:
        """The run of a trial: from memory, else from MLflow (after a driver restart), else a new one."""
        if trial_id in self.runs:
            return self.runs[trial_id]
        assert self.experiment_id is not None and self.parent_id is not None, "start_search() comes first"
        found = self.client.search_runs([self.experiment_id], max_results=1, filter_string=(
            f"tags.`{SEARCH}` = '{self.search_id}' and tags.`{TRIAL}` = '{trial_id}'"))
        if found:
            run = found[0]
            self.last_step[trial_id] = int(run.data.tags.get(LAST_STEP, 0))
        else:
            run = self.client.create_run(self.experiment_id, run_name=self.run_names.get(trial_id, trial_id), tags={
                PARENT: self.parent_id, SEARCH: self.search_id, TRIAL: trial_id,
                **self.trial_tags.get(trial_id, {})})
        self.runs[trial_id] = run.info.run_id
        return run.info.run_id

    def trial_started(self, trial_id: str, config: dict[str, Any], tags: dict[str, str], name: str | None = None) -> None:
        """Open (or, after a restart, find) the trial's child run, named `name` (default: the trial id)."""
        self.trial_tags[trial_id] = tags
        self.run_names[trial_id] = name or trial_id

        def op() -> None:
            new = trial_id not in self.runs
            run_id = self._child(trial_id)
            self.client.update_run(run_id, status="RUNNING")
            if new:  # MLflow accepts re-logging an identical param after a driver restart
                params = [Param(k, str(v)[:6000]) for k, v in sorted(config.items()) if v is not None]
                self.client.log_batch(run_id, params=params)
        self._enqueue(f"start of {trial_id}", op)

    def trial_result(self, trial_id: str, result: dict[str, Any]) -> None:
        step = int(result.get("training_iteration", 0))
        if step <= self.last_step.get(trial_id, 0):
            return  # replayed after a restore from checkpoint: already logged
        self.last_step[trial_id] = step
        now = int(time.time() * 1000)
        metrics = [Metric(k, float(v), now, step) for k, v in result.items()
                   if k not in NON_METRICS and isinstance(v, (int, float)) and not isinstance(v, bool)]
        tags = [RunTag(LAST_STEP, str(step))]
        if result.get("node_id"):
            tags.append(RunTag(NODE, str(result["node_id"])))
        if result.get("error"):
            tags.append(RunTag(ERROR, scrub(str(result["error"]), self.uri)[:5000]))

        def op() -> None:
            self.client.log_batch(self._child(trial_id), metrics=metrics, tags=tags)
        self._enqueue(f"result {step} of {trial_id}", op)

    def trial_ended(self, trial_id: str, status: str, error: str | None = None,
                    artifacts: list[Path] | None = None, tags: dict[str, str] | None = None) -> None:
        self.ended.add(trial_id)
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

    def search_artifacts(self, paths: list[Path], metrics: dict[str, float] | None = None) -> None:
        """Log files (the search's ranking) and metrics (its compute) to the parent run; files are copied now,
        and both are delivered through the queue."""
        staged = Path(tempfile.mkdtemp(prefix="tune_as_art_"))
        for path in paths:
            shutil.copy2(path, staged / path.name)

        def op() -> None:
            for path in sorted(staged.iterdir()):
                self.client.log_artifact(str(self.parent_id), str(path))
            for key, value in (metrics or {}).items():
                self.client.log_metric(str(self.parent_id), key, value)
            shutil.rmtree(staged, ignore_errors=True)
        self._enqueue("search artifacts", op)

    def unfinished(self) -> list[str]:
        return sorted(set(self.trial_tags) - self.ended)

    def _close_orphans(self) -> None:
        """A driver killed between opening a trial's run and Ray's next experiment-state save leaves a run for a
        trial Ray never resumes (the searcher replaces it). When the search then finishes, such a run is still
        RUNNING and untouched by this process: mark it KILLED and soft-delete it (restorable in MLflow), so
        the experiment has exactly one run per trial."""
        assert self.experiment_id is not None
        found = self.client.search_runs([self.experiment_id], max_results=5000, filter_string=(
            f"tags.`{SEARCH}` = '{self.search_id}' and tags.`{ROLE}` != 'search' and attributes.status = 'RUNNING'"))
        for run in found:
            if run.data.tags.get(TRIAL) not in self.runs:
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
