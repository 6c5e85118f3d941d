"""Shared fixtures: real services, started for real on 127.0.0.1, stopped after the session."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

import pytest

REPO = Path(__file__).resolve().parent.parent

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


def _ray_in_single_machine_mode() -> None:
    """This process's Ray in Ray's single-machine mode, as a local search's driver
    (engine.cluster.loopback_ray: the switch is read when Ray is imported, so here, before any test imports
    it, and removed at once so that no process a test starts inherits it): the in-process searches join the
    session's head on loopback (`ray_local`); without it Ray swaps 127.0.0.1 for the machine's routable IP,
    where the head does not listen."""
    from unittest.mock import patch

    from tune_as.engine.head import AUTH_MODE, SINGLE_MACHINE_SWITCH, ensure_token

    # token authentication for the whole session, as a CLI sets it for its own (engine.head.launch): Ray reads
    # the mode at import and again when it connects; the processes the tests start inherit it, as a CLI's head
    # does
    os.environ.setdefault(AUTH_MODE, "token")
    # the token now, once, as a fresh machine's first search writes it (engine.head.ensure_token; safe when
    # two workers race): the heads the tests start find it, so none of them prints the first-search line
    ensure_token(os.environ)
    if "ray" in sys.modules:
        return
    with patch.dict(os.environ, {SINGLE_MACHINE_SWITCH: "0"}):
        import ray  # noqa: F401


_ray_in_single_machine_mode()


def _torch_on_a_share_of_the_cores() -> None:
    """Each pytest-xdist worker's own torch computations (the tests that train in-process) on its share of the
    cores: by default each worker's torch starts one thread per core, so two workers run 4 threads on 2 cores,
    and the threads of one parallel region wait for each other while the other worker holds their core. The
    tests of losses, populations, tasks, chunks and trials (634 tests, `-n 2`, 2026-12-05) took 141 and 174 s
    that way, and 25 s at one thread per worker (docs/benchmarks.md). The processes the tests start are not
    touched (a Ray trial's threads are its CPUs, set by Ray)."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        import torch

        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        torch.set_num_threads(max(1, cores // workers))


_torch_on_a_share_of_the_cores()


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _token(search_dir: Path) -> str:
    """The token a search saved in its state (engine.state.new_token): its Tune experiments' names carry
    it."""
    return str(json.loads((search_dir / "tune_as_search.json").read_text())["token"])


def search_experiment(search_dir: Path) -> Path:
    """A search's own Tune experiment (engine.state.search_experiment; its naming is pinned by a test of its
    own)."""
    from tune_as.engine import state

    return state.search_experiment(search_dir, _token(search_dir))


def round_dir(search_dir: Path, round_no: int = 1) -> Path:
    """Confirmation round `round_no`'s Tune experiment in a search's folder (engine.state.round_name)."""
    from tune_as.engine import state

    return search_dir / state.round_name(search_dir, _token(search_dir), round_no)


def shared_data(task: str) -> Path:
    """The real dataset folder from ../shared/data ($TUNE_AS_SHARED_DATA, as the tasks find it), or skip with
    the reason."""
    # imported here: the offline variables above must be set before tune_as (and so transformers) is imported
    from tune_as.tasks.sources import shared_data_root

    path = shared_data_root() / task
    if not path.is_dir():
        pytest.skip(f"real data for {task!r} not found at {path} (../shared/data is absent on this machine)")
    return path


# As docs/cluster.md starts it: without MLflow's job runner (seven huey consumer processes that tune_as never
# uses, ~28 CPU s at every server start on 2 cores: docs/benchmarks.md)
SERVER_ENV = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}


class MlflowServer:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.port = free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = root / "mlflow-server.log"

    def command(self) -> list[str]:
        return [
            sys.executable, "-m", "mlflow", "server",
            "--host", "127.0.0.1", "--port", str(self.port),
            "--backend-store-uri", f"sqlite:///{self.root / 'mlflow.db'}",
            "--artifacts-destination", str(self.root / "artifacts"),
            "--workers", "1",
        ]

    def ready_probe(self) -> urllib.request.Request:
        """The request whose 200 answer means the server is usable."""
        return urllib.request.Request(f"{self.uri}/health")

    def start(self, timeout: float = 180.0, env: dict[str, str] | None = None) -> None:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT,
                                         env={**(env or os.environ), **SERVER_ENV}, start_new_session=True)
        probe = self.ready_probe()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mlflow server exited early: {self.log.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(probe,
                                            timeout=max(1.0, min(30.0, deadline - time.monotonic()))) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.5)
        raise RuntimeError(f"mlflow server did not answer {probe.full_url} within {timeout}s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


S = TypeVar("S", bound=MlflowServer)


@contextmanager
def running(server: S) -> Iterator[S]:
    """The server started, and stopped however the block ends."""
    server.start()
    try:
        yield server
    finally:
        server.stop()


# fixtures that start a real service: the slow tier
SERVICES = ("mlflow_server", "ray_local", "ray_cluster", "ray_head")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A test that starts a real service (directly or through another fixture) belongs to the slow tier: the
    fast tier (`-m "not slow"`) is the one a developer runs after each change. Refused at collection, naming
    them."""
    unmarked = [item.nodeid for item in items if item.get_closest_marker("slow") is None
                and set(SERVICES) & set(getattr(item, "fixturenames", ()))]
    if unmarked:
        raise pytest.UsageError(f"expected @pytest.mark.slow on tests that start {', '.join(SERVICES)}, got "
                                f"none on: {', '.join(unmarked)}")


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MlflowServer]:
    """One real `mlflow server` (SQLite behind it) for the whole test session."""
    with running(MlflowServer(tmp_path_factory.mktemp("mlflow"))) as server:
        yield server


@pytest.fixture(scope="session")
def ray_local(ray_head: str) -> Iterator[None]:
    """Ray for the searches a test runs in this process: the test session joins `ray_head`, the Ray the CLIs
    the tests start join too (one Ray for the session: a second one, in-process, cost ~10 CPU s to start and
    ~2 CPU s a minute idle). It joins as a local search's driver joins its own head: on loopback, in token
    mode (Ray read both switches when this process imported it: `_ray_in_single_machine_mode`)."""
    import ray

    if not ray.is_initialized():
        ray.init(address=ray_head, _node_ip_address="127.0.0.1", log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="session")
def ray_head() -> Iterator[str]:
    """A Ray of this machine for the CLIs the tests start (`--address`, the cluster path): `ray start --head`
    as tune_as.engine.head starts a local search's own, without its dashboard, in token mode. A search that
    joins it skips starting a Ray of its own: 4-6 s of wall and ~10 CPU s each on 2 cores
    (docs/benchmarks.md). The searches' TUNE_AS_* settings reach its workers through each job's runtime_env
    (engine.cluster.trial_env); the fault hook's module (tests/faults.py) is on its workers' path. Its
    address, once it answers; stopped with the session. The in-process searches join it too (`ray_local`)."""
    from unittest.mock import patch

    from tune_as.engine.head import READY, START_TIMEOUT_S, Head

    tests = str(Path(__file__).resolve().parent)
    path = os.pathsep.join(filter(None, [tests, os.environ.get("PYTHONPATH")]))
    # the head's environment only
    with patch.dict(os.environ, {"PYTHONPATH": path, "RAY_AUTH_MODE": "token"}):
        head = Head(dashboard=False, dashboard_host="127.0.0.1")
    try:
        # not Head.wait_ready: its watch ends the process (the CLI's) at once if the head dies, pytest with it
        deadline = time.monotonic() + START_TIMEOUT_S
        while READY not in head.output(lines=1000):  # `ray start` says nothing a process could wait on
            if head.proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"`ray start --head` did not start: {head.output()}")
            time.sleep(0.1)
        yield head.address
    finally:
        head.stop()


@pytest.fixture()
def clean_dir(tmp_path: Path) -> Path:
    d = tmp_path / "work"
    d.mkdir()
    yield d
    shutil.rmtree(d, ignore_errors=True)
