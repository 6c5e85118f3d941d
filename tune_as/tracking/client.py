"""The one door to MLflow (the search's tracker and the report both open clients here) and its secrets: no
password of a tracking URI can reach a printed or logged line (`redact_uri`, `scrub`, `open_client`). Whether
a failure is an outage (retry later) or an answer (do not) is judged here, by exception types."""

from __future__ import annotations

import base64
import fcntl
import logging
import os
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager

import requests  # MLflow's HTTP transport: its exception types tell an outage
from mlflow.environment_variables import MLFLOW_TRACKING_PASSWORD, MLFLOW_TRACKING_USERNAME
from mlflow.exceptions import MlflowException
from mlflow.protos import databricks_pb2 as codes
from mlflow.tracking import MlflowClient

from tune_as.errors import UserError, first_line, tcp_unreachable
from tune_as.tracking.schema import sqlite_file

log = logging.getLogger(__name__)
DB_PORTS = {"postgresql": 5432, "mysql": 3306, "mssql": 1433}
DEFAULT_URI = "sqlite:///mlflow.db"
# What MLflow raises when its server or database is away for now (the cause/context chain of its exceptions):
# the HTTP transport's failures, and the error codes MLflow gives transient states ("database is locked" is
# TEMPORARILY_UNAVAILABLE). Anything else is an answer: retrying the same write would get the same answer.
_NETWORK_FAILURES = (requests.exceptions.ConnectionError, requests.exceptions.Timeout,
                     requests.exceptions.RetryError, ConnectionError, TimeoutError)
_TRANSIENT_CODES = {codes.ErrorCode.Name(code) for code in (
    codes.TEMPORARILY_UNAVAILABLE, codes.DEADLINE_EXCEEDED, codes.REQUEST_LIMIT_EXCEEDED,
    codes.RESOURCE_EXHAUSTED)}


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
    return any(isinstance(e, _NETWORK_FAILURES)
               or (isinstance(e, MlflowException) and e.error_code in _TRANSIENT_CODES)
               for e in _chain(exc))


# Loggers of the libraries under MLflow that print a traceback for each failed request while a store is away
# (MLflow's database layer logs every OperationalError with its traceback; SQLAlchemy's pools, a failed
# connection reset). A filter on a logger sees only its own records, hence each name.
OUTAGE_LOGGERS = ("mlflow.store.db.utils", "sqlalchemy.pool.base", "sqlalchemy.pool.impl.QueuePool",
                  "sqlalchemy.pool.impl.NullPool", "sqlalchemy.pool.impl.SingletonThreadPool")


def _database_away(exc: BaseException) -> bool:
    """A database driver's or SQLAlchemy's "cannot reach / cannot use the database now" (MLflow turns
    SQLAlchemy's OperationalError into TEMPORARILY_UNAVAILABLE, which `is_outage` reads)."""
    return any(type(e).__name__ in ("OperationalError", "InterfaceError")
               and type(e).__module__.split(".")[0] in ("sqlalchemy", "sqlite3", "psycopg2", "psycopg",
                                                         "pymysql")
               for e in _chain(exc))


class OutageVoice(logging.Filter):
    """Drops a library's record of an outage (its exception `is_outage`, or a database away): the tracker
    says it once, in one line with its duration ("MLflow unreachable at ...; buffering", "reachable again
    after N s"), the same for SQLite, PostgreSQL and HTTP stores. Every other record passes. `dropped` counts
    what it kept out."""

    dropped = 0

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if exc is None and record.args:  # MLflow passes the exception as the message's argument
            exc = next((a for a in (record.args if isinstance(record.args, tuple) else ())
                        if isinstance(a, BaseException)), None)
        if exc is not None and (is_outage(exc) or _database_away(exc)):
            OutageVoice.dropped += 1
            return False
        return True


def one_voice() -> None:
    """Install `OutageVoice` on the outage loggers, once per process."""
    for name in OUTAGE_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, OutageVoice) for f in logger.filters):
            logger.addFilter(OutageVoice())


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
    """Nothing usable answers at a tracking URI. `shown` is the URI without its password, `reason` says
    why."""

    def __init__(self, shown: str, reason: str) -> None:
        self.shown, self.reason = shown, reason
        super().__init__(f"MLflow tracking URI {shown} is not usable: expected a reachable tracking server "
                         f"or database, got {reason}")


def _credentials_to_env(uri: str) -> str:
    """For an http(s) URI with user:password@, put them in MLflow's MLFLOW_TRACKING_USERNAME/PASSWORD (over
    any set before: the URI is the more specific) and return the URI without them. MLflow sends them as basic
    auth either way, but only a URI without them keeps them out of MLflow's own messages ("API request to URL
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
    path = sqlite_file(uri)
    fd = None
    if path is not None:
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
    one_voice()
    os.environ["MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"] = "true"
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    # Fail fast instead of MLflow's default minutes of blocking retries: our own queue retries instead (MLflow
    # reads both at each request, so setting them here, before the first, is enough).
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
    target = _credentials_to_env(uri)
    try:
        with _first_use_lock(target):
            client = MlflowClient(tracking_uri=target)
        client.search_experiments(max_results=1)
    except Exception as exc:  # noqa: BLE001 - any failure means "cannot use this URI"
        raise TrackingUnusable(redact_uri(uri), failure_reason(exc, uri)) from None
    return client
