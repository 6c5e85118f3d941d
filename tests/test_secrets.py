"""A password in a tracking URI is sent to MLflow but never printed, logged or stored (issue 14.1, 14.3).

The server is a real `mlflow server --app-name basic-auth` that refuses anonymous requests, so a run that gets
written proves the password reached it. MLflow's auth app needs the `mlflow[auth]` extra (Flask-WTF); where
that is not installed the same tests run against a plain server, which ignores the credentials it is sent.

`assert_secret_absent` is meant for other tests too (e.g. a grep over a whole CLI run's output).
"""

from __future__ import annotations

import base64
import importlib.util
import os
import secrets
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote, quote_plus

import pytest
from conftest import MlflowServer, free_port, running
from mlflow.environment_variables import MLFLOW_TRACKING_PASSWORD, MLFLOW_TRACKING_USERNAME
from mlflow.tracking import MlflowClient

from tune_as.errors import UserError
from tune_as.report import runs as report
from tune_as.tracking import client as tracking
from tune_as.tracking import schema
from tune_as.tracking.tracker import MlflowTracker

USER, PASSWORD = "admin", "s3cr3t@Pa:ss-word"  # '@' and ':' inside: the userinfo ends at the LAST '@'
TAGS = {schema.ROLE: schema.ROLE_TRIAL, schema.LOSS: "softmax"}


def assert_secret_absent(text: str, user: str, password: str) -> None:
    """Fail if `password` appears in `text` in any form a URL or an HTTP request could carry it: as is,
    percent-encoded, or inside a basic-auth header. The failure message names the form, not the context."""
    forms = {"as is": password, "percent-encoded": quote(password, safe=""),
             "form-encoded": quote_plus(password),
             "in a basic-auth header": base64.b64encode(f"{user}:{password}".encode()).decode()}
    found = [name for name, form in forms.items() if form in text]
    assert not found, f"the password appears {', '.join(found)}"


class AuthServer(MlflowServer):
    """conftest's server with MLflow's basic-auth app (admin USER, password PASSWORD) when mlflow[auth] is
    installed, else the plain server. start() can be called again after stop(): same port, same stores."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.auth = importlib.util.find_spec("flask_wtf") is not None
        self.env = dict(os.environ)
        if self.auth:
            ini = root / "basic_auth.ini"
            ini.write_text("[mlflow]\ndefault_permission = READ\n"
                           f"database_uri = sqlite:///{root / 'auth.db'}\n"
                           f"admin_username = {USER}\n"
                           "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"
                           "auth_cache_ttl_seconds = 3600\n")  # else each request hashes the password anew
            self.env.update(MLFLOW_AUTH_CONFIG_PATH=str(ini), MLFLOW_AUTH_ADMIN_PASSWORD=PASSWORD,
                            MLFLOW_FLASK_SERVER_SECRET_KEY=secrets.token_hex(16))

    def command(self) -> list[str]:
        return [*super().command(), *(["--app-name", "basic-auth"] if self.auth else [])]

    def ready_probe(self) -> urllib.request.Request:
        # Ready when an authenticated API call answers: the auth app's first one (lazy start-up, password
        # hashing) can outlast MLflow's 10 s request timeout on a busy machine.
        header = {"Authorization": "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()}
        return urllib.request.Request(f"{self.uri}/api/2.0/mlflow/experiments/search?max_results=1",
                                      headers=header)

    def start(self, timeout: float = 300.0, env: dict[str, str] | None = None) -> None:
        super().start(timeout, env or self.env)


@pytest.fixture(scope="module")
def secured_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AuthServer]:
    with running(AuthServer(tmp_path_factory.mktemp("mlflow-auth"))) as server:
        yield server


@pytest.fixture(autouse=True)
def credentials_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts without MLflow credentials or link settings in the environment and leaves none behind
    (open_client writes them into this process's environment). Requests may take their time: the auth app
    checks a password in seconds on a busy machine, beyond tune_as's 10 s default."""
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "600")
    for name in (MLFLOW_TRACKING_USERNAME.name, MLFLOW_TRACKING_PASSWORD.name,
                 "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"):
        monkeypatch.setenv(name, "")  # recorded first, so the teardown restores the state before the test
        monkeypatch.delenv(name)


@pytest.mark.parametrize(("uri", "shown"), [
    ("http://alice:S3cretPW@127.0.0.1:9", "http://alice:***@127.0.0.1:9"),
    ("http://:S3cretPW@127.0.0.1:9/prefix", "http://:***@127.0.0.1:9/prefix"),  # empty user name
    ("https://bob:p@ss@w0rd@host/p?q=1", "https://bob:***@host/p?q=1"),  # '@' in the password
    ("postgresql+psycopg2://u:p%40x@h:5432/db", "postgresql+psycopg2://u:***@h:5432/db"),
    ("http://token-as-user@host:5000", "http://token-as-user@host:5000"),  # no password: nothing to hide
    ("sqlite:///runs/a@b.db", "sqlite:///runs/a@b.db"),
])
def test_redact_uri(uri: str, shown: str) -> None:
    assert tracking.redact_uri(uri) == shown


def test_scrub_removes_the_password_in_every_form() -> None:
    uri = f"http://{USER}:{quote(PASSWORD, safe='')}@host"
    header = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    text = f"GET {uri}/x failed; password {PASSWORD}; header Basic {header}; form {quote(PASSWORD, safe='')}"
    scrubbed = tracking.scrub(text, uri)
    assert_secret_absent(scrubbed, USER, PASSWORD)
    assert f"http://{USER}:***@host/x failed" in scrubbed


@pytest.mark.parametrize("user", ["alice", ""])
def test_unreachable_credentialed_uri_is_one_line_without_the_password(
        user: str, capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> None:
    uri = f"http://{user}:S3cretPW@127.0.0.1:{free_port()}"
    with pytest.raises(UserError) as info:
        MlflowTracker(uri, "x", "s").check_reachable()
    message = str(info.value)
    assert message.startswith(f"MLflow tracking URI http://{user}:***@127.0.0.1:") and "\n" not in message
    assert message.endswith("got Connection refused")
    out, err = capfd.readouterr()
    assert_secret_absent(message + out + err + caplog.text, user, "S3cretPW")


@pytest.mark.slow
def test_report_reaches_a_credentialed_server(secured_server: AuthServer) -> None:
    """The report's connect used to check /health with urllib, which took `user:password@` for part of the
    host name ("Name or service not known")."""
    client = report.connect(f"http://{USER}:{quote(PASSWORD, safe='')}@127.0.0.1:{secured_server.port}")
    assert "Default" in {e.name for e in client.search_experiments()}
    if secured_server.auth:
        with pytest.raises(UserError) as wrong:
            report.connect(f"http://{USER}:not-the-password-42@127.0.0.1:{secured_server.port}")
        assert "received: API request to endpoint /api/2.0/mlflow/experiments/search failed with error " \
               "code 401" in str(wrong.value)
        assert_secret_absent(str(wrong.value), USER, "not-the-password-42")


@pytest.mark.slow
def test_a_search_and_an_outage_never_show_the_password(
        secured_server: AuthServer, tmp_path: Path, capfd: pytest.CaptureFixture[str],
        caplog: pytest.LogCaptureFixture) -> None:
    if secured_server.auth:  # the server really wants the password: anonymous requests are refused
        with pytest.raises(urllib.error.HTTPError) as anonymous:
            urllib.request.urlopen(f"{secured_server.uri}/api/2.0/mlflow/experiments/search?max_results=1")
        assert anonymous.value.code == 401
    uri = f"http://{USER}:{PASSWORD}@127.0.0.1:{secured_server.port}"
    artifact = tmp_path / schema.PMARGIN_FILE
    artifact.write_bytes(b"not really numpy")
    tracker = MlflowTracker(uri, "secrets", "s1", final_flush_s=5)
    tracker.check_reachable()
    tracker.start_search(params={"task": "digits"}, tags={schema.TASK: "digits"})
    tracker.trial_started("t1", {"loss": "softmax", "lr": 0.1}, TAGS)
    tracker.trial_result("t1", {"training_iteration": 1, "val_accuracy": 0.5})
    tracker.trial_ended("t1", "FINISHED", artifacts=[artifact])
    tracker.trial_started("t2", {"loss": "softmax", "lr": 1.0}, TAGS)
    # an error quoting it
    tracker.trial_ended("t2", "FAILED", error=f"RuntimeError: could not post to {uri}/api")
    assert not tracker.pending  # everything written: the password reached the server

    secured_server.stop()  # an outage: several attempts, one warning
    tracker.trial_started("t3", {"loss": "softmax", "lr": 0.5}, TAGS)
    for step in (1, 2, 3):
        tracker.trial_result("t3", {"training_iteration": step, "val_accuracy": step / 10})
        tracker.flush()
    tracker.trial_ended("t3", "FINISHED")
    assert len(tracker.pending) == 5 and tracker.outage_since is not None  # buffered, not dropped
    secured_server.start()
    assert tracker.search_ended("FINISHED") and tracker.experiment_id is not None

    out, err = capfd.readouterr()
    runs = MlflowClient(secured_server.uri).search_runs([tracker.experiment_id])  # credentials from the env
    stored = repr([(run.data.params, run.data.tags) for run in runs])
    for text in (out, err, caplog.text, stored):
        assert_secret_absent(text, USER, PASSWORD)
    assert caplog.text.count(f"MLflow unreachable at http://{USER}:***@127.0.0.1:{secured_server.port}") == 1
    assert "View run" not in out  # MLflow's per-run links are off for the search as for the report
    trials = {run.data.tags[schema.TRIAL]: run for run in runs if schema.TRIAL in run.data.tags}
    assert {t: run.info.status for t, run in trials.items()} == \
        {"t1": "FINISHED", "t2": "FAILED", "t3": "FINISHED"}
    assert f"{USER}:***@" in trials["t2"].data.tags[schema.ERROR]
    assert [a.path for a in MlflowClient(secured_server.uri).list_artifacts(trials["t1"].info.run_id)] == \
        [artifact.name]
