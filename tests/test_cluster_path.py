"""The cluster path without Docker (docs/cluster.md, path 1), run for real on this machine.

A throwaway PostgreSQL from Debian's packages, `mlflow server` on it, and a two-node Ray cluster made
with `ray start --head` + `ray start --address` (token authentication on, as on a real cluster), then
`python -m tune_as.search --address ... --mlflow-uri http://...`: the runs must land in PostgreSQL and
the trials must have run on both nodes.

Every server binds 127.0.0.1 where it can (PostgreSQL, MLflow, the Ray dashboard); Ray's GCS and raylets
listen on all interfaces (Ray has no loopback-only option), which is what the token protects. Nothing
here calls `ray stop`: it kills every Ray process of the machine, including other people's. Each node is
a `ray start --block` in its own session; SIGTERM makes it stop its processes, and the test then checks
that no process of its temp dir is left.
"""

from __future__ import annotations

import json
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import closing, contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import faults
import pytest
from conftest import REPO, SERVER_ENV, free_port, shared_data

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

TASK = "clinc_oos"
LOSSES = ("softmax", "as_softmax")
TRIALS_PER_LOSS = 2
PG_USER = "tune_as"
# SQLAlchemy 2.1 maps a bare postgresql:// to psycopg 3; the `postgres` extra installs psycopg2.
MLFLOW_PG_SCHEME = "postgresql+psycopg2"


def _wait_http(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float,
               headers: dict[str, str] | None = None) -> None:
    """Poll `url` until it answers 200; fail early, with the log, if the server process died."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=3) as r:
                if r.status == 200:
                    return
        except OSError:  # refused, reset, timed out, or an HTTP error status
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{url} did not answer 200 within {timeout}s:\n{log.read_text()[-3000:]}")


def _stop_session(proc: subprocess.Popen[bytes], grace: float = 30.0) -> None:
    """SIGTERM a process started with start_new_session=True; SIGKILL its process group if it lingers."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        with suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace)
    with suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


# --- PostgreSQL -------------------------------------------------------------------------------------


def _pg_bin_dir() -> Path:
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"), key=lambda p: int(p.parent.parent.name))
    if not found:
        pytest.skip("PostgreSQL server binaries not found in /usr/lib/postgresql/*/bin "
                    "(install Debian's `postgresql` package: .ci/run does it when run as root)")
    return found[-1].parent


def _pg_os_user() -> str | None:
    """PostgreSQL refuses to run as root: as root, run its binaries as the unprivileged `postgres` user."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        pytest.skip("running as root and there is no `postgres` user to run PostgreSQL as")
    return "postgres"


@dataclass
class Postgres:
    bin_dir: Path
    os_user: str | None
    root: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="ta-pg-")))
    port: int = field(default_factory=free_port)
    password: str = field(default_factory=lambda: secrets.token_hex(16))

    @property
    def data(self) -> Path:
        return self.root / "data"

    def url(self, database: str, scheme: str = "postgresql") -> str:
        return f"{scheme}://{PG_USER}:{self.password}@127.0.0.1:{self.port}/{database}"

    def _run(self, *args: str) -> None:
        res = subprocess.run([str(self.bin_dir / args[0]), *args[1:]], user=self.os_user, cwd=self.root,
                             capture_output=True, text=True, timeout=120)
        if res.returncode != 0:
            raise RuntimeError(f"{args[0]} failed ({res.returncode}):\n{res.stdout}\n{res.stderr}")

    def start(self) -> None:
        pwfile = self.root / "pwfile"
        pwfile.write_text(self.password + "\n")
        if self.os_user is not None:
            entry = pwd.getpwnam(self.os_user)
            for path in (self.root, pwfile):
                os.chown(path, entry.pw_uid, entry.pw_gid)
        self.root.chmod(0o700)
        self._run("initdb", "-D", str(self.data), "-U", PG_USER, f"--pwfile={pwfile}", "--auth=scram-sha-256",
                  "-E", "UTF8", "--no-locale", "--no-sync")
        pwfile.unlink()
        options = (f"-p {self.port} -c listen_addresses=127.0.0.1 -c unix_socket_directories={self.root} "
                   "-c fsync=off")
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.root / "postgres.log"), "-o", options,
                  "-w", "-t", "60", "start")

    def create_database(self, name: str) -> None:
        import psycopg2

        conn = psycopg2.connect(self.url("postgres"))
        conn.autocommit = True  # CREATE DATABASE cannot run inside a transaction
        with conn.cursor() as cur:
            cur.execute(f"CREATE DATABASE {name}")
        conn.close()

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():
            self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture(scope="module")
def postgres() -> Iterator[Postgres]:
    pytest.importorskip("psycopg2", reason="psycopg2 (the `postgres` extra) talks to PostgreSQL")
    server = Postgres(_pg_bin_dir(), _pg_os_user())
    try:
        server.start()
        server.create_database("mlflow")
        yield server
    finally:
        server.stop()


# --- MLflow on PostgreSQL ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def mlflow_on_postgres(postgres: Postgres, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`mlflow server --backend-store-uri postgresql://...` on 127.0.0.1, as docs/cluster.md starts it."""
    root = tmp_path_factory.mktemp("mlflow-pg")
    port, log = free_port(), root / "mlflow-server.log"
    cmd = [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
           "--backend-store-uri", postgres.url("mlflow", MLFLOW_PG_SCHEME), "--artifacts-destination",
           str(root / "artifacts"), "--workers", "1"]
    with open(log, "ab") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, **SERVER_ENV})
    try:
        _wait_http(f"http://127.0.0.1:{port}/health", proc, log, timeout=240)
        yield f"http://127.0.0.1:{port}"
    finally:
        _stop_session(proc, grace=20)


# --- a two-node Ray cluster ---------------------------------------------------------------------------


@dataclass
class RayCluster:
    token: str
    temp_dir: Path
    gcs_port: int
    dashboard_port: int
    nodes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    # the fault hook's settings for every trial (tests/faults.py; workers inherit the nodes' environment): by
    # default a search's first two trials meet before they go on, so each node certainly runs one
    hooks: dict[str, str] = field(default_factory=lambda: {"TUNE_AS_MEET": "2"})

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.gcs_port}"

    @property
    def dashboard(self) -> str:
        return f"http://127.0.0.1:{self.dashboard_port}"

    def env(self) -> dict[str, str]:
        """The environment of every process of the cluster and of its drivers (PLATFORM.md: all of them)."""
        env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_TOKEN_PATH")}
        env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=self.token, RAY_USAGE_STATS_ENABLED="0",
                   # Ray jobs run `python` from the PATH of `ray start`: make it this environment's.
                   PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
                   # tests/faults.py in every trial of the cluster, set by `hooks`
                   TUNE_AS_TRIAL_HOOK="faults:hook", TUNE_AS_FAULT_DIR=str(self.temp_dir / "faults"),
                   **self.hooks,
                   PYTHONPATH=os.pathsep.join(filter(None,
                                                     [str(REPO / "tests"), os.environ.get("PYTHONPATH")])))
        return env

    def start_node(self, *args: str) -> None:
        # Every port is chosen free, so this cluster does not collide with another Ray on the machine.
        ports = {f"--{name}": str(free_port()) for name in (
            "node-manager-port", "object-manager-port", "dashboard-agent-listen-port",
            "dashboard-agent-grpc-port", "runtime-env-agent-port", "metrics-export-port")}
        cmd = [str(Path(sys.executable).parent / "ray"), "start", "--block", "--num-cpus=1",
               *(x for kv in ports.items() for x in kv), *args]
        log = self.temp_dir / f"node{len(self.nodes)}.log"
        with open(log, "ab") as out:
            self.nodes.append(subprocess.Popen(cmd, env=self.env(), stdout=out, stderr=subprocess.STDOUT,
                                               start_new_session=True))

    def alive_nodes(self) -> list[dict[str, Any]]:
        req = urllib.request.Request(f"{self.dashboard}/api/v0/nodes",
                                     headers={"Authorization": f"Bearer {self.token}"})
        with urllib.request.urlopen(req, timeout=10) as r:
            nodes = json.load(r)["data"]["result"]["result"]
        return [n for n in nodes if n["state"] == "ALIVE"]

    def wait_for_nodes(self, n: int, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for proc in self.nodes:
                if proc.poll() is not None:
                    logs = "\n".join(p.read_text()[-2000:] for p in self.temp_dir.glob("node*.log"))
                    raise RuntimeError(f"`ray start` exited with {proc.returncode}:\n{logs}")
            try:
                if len(self.alive_nodes()) >= n:
                    return
            except (OSError, KeyError, ValueError):
                pass
            time.sleep(1.0)
        raise RuntimeError(f"the Ray cluster did not reach {n} alive nodes within {timeout}s")

    def leftover_pids(self) -> list[int]:
        """Processes whose command line names this cluster's temp dir (every Ray process of it does)."""
        marker, pids = str(self.temp_dir).encode(), []
        for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
            try:
                if marker in cmdline.read_bytes():
                    pids.append(int(cmdline.parent.name))
            except OSError:
                continue
        return [p for p in pids if p != os.getpid()]

    def stop(self) -> None:
        for proc in reversed(self.nodes):  # workers first, then the head
            _stop_session(proc)

    def start_head(self) -> None:
        """The head (again, after it was lost: on the same ports), once its GCS answers."""
        self.start_node("--head", f"--port={self.gcs_port}", "--dashboard-host=127.0.0.1",
                        f"--dashboard-port={self.dashboard_port}",
                        f"--ray-client-server-port={free_port()}", f"--temp-dir={self.temp_dir}")
        _wait_http(f"{self.dashboard}/api/gcs_healthz", self.nodes[-1],
                   self.temp_dir / f"node{len(self.nodes) - 1}.log", timeout=120)

    def add_node(self, *args: str) -> None:
        """One more node, once the cluster counts it alive."""
        self.start_node(f"--address={self.address}", *args)
        self.wait_for_nodes(len(self.nodes))


@contextmanager
def started(nodes: int = 2, hooks: dict[str, str] | None = None) -> Iterator[RayCluster]:
    """A head and `nodes - 1` more nodes (with the resource `node_b`), one CPU each, stopped with every
    process of theirs at the end."""
    # A short temp dir: Ray puts unix sockets under it and socket paths are limited to 107 bytes.
    cluster = RayCluster(token=secrets.token_hex(32), temp_dir=Path(tempfile.mkdtemp(prefix="ta-ray-")),
                         gcs_port=free_port(), dashboard_port=free_port())
    if hooks is not None:
        cluster.hooks = hooks
    (cluster.temp_dir / "faults").mkdir()
    try:
        cluster.start_head()
        for _ in range(nodes - 1):
            cluster.add_node('--resources={"node_b": 1}')
        yield cluster
    finally:
        cluster.stop()
        leftovers = cluster.leftover_pids()
        for pid in leftovers:  # only processes of this cluster, found by its own temp dir
            os.kill(pid, signal.SIGKILL)
        shutil.rmtree(cluster.temp_dir, ignore_errors=True)
        assert not leftovers, f"`ray start --block` left processes behind after SIGTERM: {leftovers}"


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[RayCluster]:
    with started() as cluster:
        yield cluster


# --- the tests --------------------------------------------------------------------------------------


def test_two_node_cluster_with_token_protected_dashboard(ray_cluster: RayCluster) -> None:
    """What docs/cluster.md promises: two nodes, and a dashboard that wants the token."""
    nodes = ray_cluster.alive_nodes()
    assert len(nodes) == 2
    assert sum(bool(n["is_head_node"]) for n in nodes) == 1
    assert any("node_b" in n["resources_total"] for n in nodes)

    with pytest.raises(urllib.error.HTTPError) as no_token:
        urllib.request.urlopen(f"{ray_cluster.dashboard}/api/version", timeout=10)
    assert no_token.value.code == 401
    wrong = urllib.request.Request(f"{ray_cluster.dashboard}/api/version",
                                   headers={"Authorization": f"Bearer {secrets.token_hex(32)}"})
    with pytest.raises(urllib.error.HTTPError) as bad_token:
        urllib.request.urlopen(wrong, timeout=10)
    assert bad_token.value.code == 403


def test_job_api_takes_the_token_from_the_environment(ray_cluster: RayCluster, tmp_path: Path) -> None:
    """How the compose `search` service and a KubeRay RayJob submit: `ray job submit` with RAY_AUTH_TOKEN."""
    probe = "import ray; ray.init(address='auto'); print('alive nodes:', sum(n['Alive'] for n in " \
            "ray.nodes()))"
    cmd = [str(Path(sys.executable).parent / "ray"), "job", "submit", "--address", ray_cluster.dashboard,
           "--", "python", "-c", probe]
    ok = subprocess.run(cmd, env=ray_cluster.env(), capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0 and "alive nodes: 2" in ok.stdout, ok.stdout[-3000:] + ok.stderr[-3000:]

    without = {k: v for k, v in ray_cluster.env().items() if k != "RAY_AUTH_TOKEN"}
    without["HOME"] = str(tmp_path)  # no ~/.ray/auth_token to fall back on
    denied = subprocess.run(cmd, env=without, capture_output=True, text=True, timeout=120)
    assert denied.returncode != 0
    assert "authentication token" in denied.stdout + denied.stderr


def test_search_on_the_cluster_lands_in_postgres(ray_cluster: RayCluster, mlflow_on_postgres: str,
                                                 postgres: Postgres, tmp_path: Path) -> None:
    data_dir = shared_data(TASK)
    import psycopg2

    cmd = [sys.executable, "-m", "tune_as.search", "--task", TASK, "--smoke",
           "--address", ray_cluster.address, "--mlflow-uri", mlflow_on_postgres,
           "--losses", ",".join(LOSSES), "--trials-per-loss", str(TRIALS_PER_LOSS),
           "--data-dir", str(data_dir), "--storage-path", str(tmp_path / "results"),
           # One CPU per trial and two in flight: with one CPU per node, one trial runs on each node (the
           # first two meet at their first report, tests/faults.py: a fast trial cannot end before the other
           # starts and leave its actor to it)
           "--cpus-per-trial", "1", "--max-concurrent", "2"]
    res = subprocess.run(cmd, cwd=REPO, env=ray_cluster.env(), capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, \
        f"search failed ({res.returncode}):\n{res.stdout[-4000:]}\n{res.stderr[-6000:]}"

    with closing(psycopg2.connect(postgres.url("mlflow"))) as conn, conn.cursor() as cur:
        cur.execute("SELECT experiment_id FROM experiments WHERE name = %s AND lifecycle_stage = 'active'",
                    (TASK,))
        experiments = cur.fetchall()
        assert len(experiments) == 1, f"expected one experiment named {TASK!r}, got {experiments}"
        cur.execute(
            """SELECT r.run_uuid, r.status, role.value, parent.value, loss.value, node.value
               FROM runs r
               JOIN tags role ON role.run_uuid = r.run_uuid AND role.key = 'tune_as.role'
               LEFT JOIN tags parent ON parent.run_uuid = r.run_uuid AND parent.key = 'mlflow.parentRunId'
               LEFT JOIN tags loss ON loss.run_uuid = r.run_uuid AND loss.key = 'tune_as.loss'
               LEFT JOIN tags node ON node.run_uuid = r.run_uuid AND node.key = 'tune_as.node_id'
               WHERE r.experiment_id = %s AND r.lifecycle_stage = 'active'""",
            (experiments[0][0],))
        runs = cur.fetchall()
        cur.execute("""SELECT DISTINCT m.run_uuid FROM metrics m JOIN runs r ON r.run_uuid = m.run_uuid
                       WHERE r.experiment_id = %s AND m.key = 'val_accuracy'""", (experiments[0][0],))
        with_val_accuracy = {row[0] for row in cur.fetchall()}

    parents = [r for r in runs if r[2] == "search"]
    trials = [r for r in runs if r[2] == "trial"]
    assert len(parents) == 1, f"expected one parent run (tune_as.role=search), got {parents}"
    assert len(trials) == len(LOSSES) * TRIALS_PER_LOSS, trials
    assert {t[3] for t in trials} == {parents[0][0]}, "every trial run must be a child of the search run"
    assert {t[4] for t in trials} == set(LOSSES)
    assert {t[1] for t in trials} == {"FINISHED"}, [(t[0], t[1]) for t in trials]
    assert {t[0] for t in trials} <= with_val_accuracy, "every trial must log val_accuracy to PostgreSQL"
    nodes = {t[5] for t in trials}
    assert None not in nodes and len(nodes) == 2, \
        f"trials must have run on both Ray nodes, tune_as.node_id: {nodes}"
    reported = {row["trial_id"] for row in faults.reports(ray_cluster.temp_dir / "faults")}
    assert len(reported) == len(trials), f"the meet of tests/faults.py ran in every trial: {reported}"


def test_a_failed_trial_try_is_one_line_without_verbose() -> None:
    """Tune logs each failed try of a trial with its traceback (a lost node's ActorUnavailableError: 17
    lines); without --verbose it is one line naming the error (issue 70, case 11), with --verbose
    untouched."""
    import logging

    from ray.exceptions import ActorUnavailableError

    from tune_as.engine.cluster import TUNE_CONTROLLER, TrialErrorLine

    try:
        raise ActorUnavailableError("The actor is temporarily unavailable: the node died", b"\x00" * 16)
    except ActorUnavailableError as exc:
        lost = exc
    record = logging.getLogger(TUNE_CONTROLLER).makeRecord(
        TUNE_CONTROLLER, logging.ERROR, __file__, 1, "Trial task failed for trial %s", ("softmax_0001",),
        (type(lost), lost, lost.__traceback__))
    assert TrialErrorLine().filter(record) and record.exc_info is None
    line = logging.Formatter().format(record)
    assert "\n" not in line and line.startswith("Trial task failed for trial softmax_0001: "
                                                "ActorUnavailableError: "), line
    other = logging.LogRecord(TUNE_CONTROLLER, logging.ERROR, __file__, 1, "something else", (), None)
    assert TrialErrorLine().filter(other) and other.getMessage() == "something else"
