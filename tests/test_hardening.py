"""Issue 14 (hardening), with real processes: a local search listens on loopback only, owns its name while it
runs, stops on SIGTERM like on Ctrl-C, and resumes from `--resume --name N --storage-path P` alone (the
printed hint, verbatim), refusing a resume that would change what the trials compute."""

from __future__ import annotations

import ipaddress
import json
import os
import pickle
import shlex
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import optuna
import pytest
import ray  # noqa: F401 - puts Ray's vendored psutil on sys.path (imported where used)
from test_engine import Payload
from test_reliability import finish, runs, start_cli, stop, wait_for, write_space

from tune_as.engine import SearchRequest
from tune_as.engine.folder import claim, resume_hint
from tune_as.engine.plan import plan_search, state_of
from tune_as.errors import UserError, end_process, working_threads
from tune_as.search import build_parser, main


def test_a_search_name_is_claimed_by_one_process_at_a_time(tmp_path: Path) -> None:
    folder = tmp_path / "s1"
    holder = claim(folder, resume=False)
    with pytest.raises(UserError,
                       match="expected a new search name, but .* was just created by another process"):
        claim(folder, resume=False)  # mkdir is atomic: a second new search of this name loses
    with pytest.raises(UserError, match="s1 is running now"):
        claim(folder, resume=True)  # the folder's flock: no resume while it runs
    holder.close()
    claim(folder, resume=True).close()  # free again once its holder is gone


# a search on a cluster resumes on it (a resume without --address would start a local Ray)
@pytest.mark.parametrize("address", [None, "10.0.0.5:6379"], ids=["local", "cluster"])
def test_resume_hint_is_one_shell_command_that_works_from_any_folder(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch,
                                                                     address: str | None) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)  # the parser's default for --address
    uri = f"sqlite:///{tmp_path / 'my runs' / 'm.db'}?timeout=30&x=1"
    plan = plan_search(SearchRequest(task="digits", storage_path=Path("my results"), name="n1",
                                     mlflow_uri=uri, max_train_samples=64, cache_dir=tmp_path / "cache",
                                     address=address))
    hint = resume_hint(plan)
    assert shlex.split(hint)[:3] == ["python", "-m", "tune_as.search"]
    args = build_parser().parse_args(shlex.split(hint)[3:])
    assert (args.resume, args.name, args.mlflow_uri, args.address) == (True, "n1", uri, address)
    assert args.storage_path == tmp_path / "my results"  # absolute: the hint also works from another folder


def saved_search(tmp_path: Path) -> tuple[Path, list[str]]:
    """A search folder as a started search leaves it (its saved state; Ray's pickled `tuner.pkl` in the
    search's own Tune experiment, `search.<token>`), with modes that umask 022 gives, and the command line
    that resumes it."""
    storage, uri = tmp_path / "results", f"sqlite:///{tmp_path / 'm.db'}"
    plan = plan_search(SearchRequest(task="digits", storage_path=storage, name="s1", mlflow_uri=uri,
                                     smoke=True, cache_dir=tmp_path / "cache"))
    plan.experiment_dir.mkdir(parents=True)
    for folder in (plan.search_dir, plan.experiment_dir):
        folder.chmod(0o755)
    (plan.search_dir / "tune_as_search.json").write_text(json.dumps(state_of(plan)))
    (plan.experiment_dir / "tuner.pkl").write_bytes(pickle.dumps(Payload(tmp_path / "ran")))
    for path in (*plan.search_dir.iterdir(), *plan.experiment_dir.iterdir()):
        if path.is_file():
            path.chmod(0o644)
    return plan.search_dir, ["--resume", "--name", "s1", "--storage-path", str(storage), "--mlflow-uri", uri]


def _pickled(search_dir: Path) -> Path:
    """Ray's pickled state in the search's own Tune experiment (`saved_search`)."""
    (experiment,) = search_dir.glob("search.*")
    return experiment / "tuner.pkl"


def _other_user(path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("giving a file to another user needs root")
    os.chown(path, 4242, 4242)


TAMPERED = {  # how another user could have planted Ray's pickled state, and what the refusal names
    "folder writable by others": (lambda d: d.chmod(0o757), "s1 (mode 0o757: writable by others)"),
    "folder writable by the group": (lambda d: d.chmod(0o775), "s1 (mode 0o775: writable by the group)"),
    "state file writable by the group": (lambda d: _pickled(d).chmod(0o664),
                                         "tuner.pkl (mode 0o664: writable by the group)"),
    "state file of another user": (lambda d: _other_user(_pickled(d)), "tuner.pkl (owned by uid 4242,"),
    "experiment folder writable by others": (lambda d: _pickled(d).parent.chmod(0o757),
                                             "(mode 0o757: writable by others)"),
    "folder of another user": (lambda d: _other_user(d), "s1 (owned by uid 4242,"),
}


@pytest.mark.parametrize("case", sorted(TAMPERED))
def test_resume_refuses_a_search_folder_that_others_can_write_to(case: str, tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    folder, argv = saved_search(tmp_path)
    capsys.readouterr()  # what the search that made the folder printed
    tamper, where = TAMPERED[case]
    tamper(folder)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --resume: expected a search folder only you can "
                                               "write to (Ray unpickles the experiment state in it), "
                                               "got "), err
    assert where in err[0], err
    assert not (tmp_path / "ran").exists()


def test_resume_accepts_group_writable_files_in_a_folder_closed_to_others(tmp_path: Path) -> None:
    from tune_as.engine.state import check_ownership

    folder, _ = saved_search(tmp_path)
    _pickled(folder).chmod(0o664)  # umask 002 makes files like this
    _pickled(folder).parent.chmod(0o700)  # nobody else can reach them
    check_ownership(folder)
    _pickled(folder).parent.chmod(0o755)
    _pickled(folder).chmod(0o644)
    check_ownership(folder)
    claim(tmp_path / "new", resume=False).close()
    assert (tmp_path / "new").stat().st_mode & 0o777 == 0o700


def listening(root_pid: int) -> dict[int, list[str]]:
    """pid -> the addresses its TCP sockets listen on, for root_pid and every process below it."""
    import psutil

    root = psutil.Process(root_pid)
    pids = {root_pid} | {p.pid for p in root.children(recursive=True)}
    found: dict[int, list[str]] = {}
    for conn in psutil.net_connections(kind="inet"):
        if conn.status == psutil.CONN_LISTEN and conn.pid in pids:
            found.setdefault(conn.pid, []).append(conn.laddr.ip)
    return found


def is_loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    mapped = getattr(ip, "ipv4_mapped", None)  # "::ffff:127.0.0.1": an IPv6 socket bound to IPv4 loopback
    return (mapped or ip).is_loopback


def process_name(pid: int) -> str:
    import psutil

    return " ".join(psutil.Process(pid).cmdline())[:120]


SPACE = """task: digits
trials_per_loss: {trials}
fixed: {{epochs: {epochs}, batch_size: 64}}
losses:
  softmax: {{}}
"""
# Each changes what a trial computes: a resume must refuse it and name the flag the user typed.
CHANGED = [["--max-train-samples", "900"], ["--max-epochs", "5"], ["--backbone", "tiny"],
           ["--losses", "softmax,as_softmax"], ["--trials-per-loss", "3"], ["--set", "lr=0.5"],
           ["--seed", "7"]]


@pytest.mark.slow
def test_search_lifecycle_loopback_name_sigterm_and_resume_hint(tmp_path: Path, mlflow_server,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    faults = tmp_path / "faults"
    faults.mkdir()
    space = write_space(tmp_path, trials=2, epochs=3, text=SPACE)
    storage, uri, experiment = tmp_path / "results", mlflow_server.uri, "hard-life"
    args = ["--search-space", str(space), "--experiment", experiment, "--name", "life", "--max-concurrent",
            "1", "--no-asha"]
    # the worker blocks after its first report (tests/faults.py): the search is certainly running, no race
    search = start_cli(tmp_path, uri, args, env={"TUNE_AS_FAULT_DIR": str(faults), "TUNE_AS_BLOCK_ONCE": "1"},
                       dashboard=True)  # its sockets are checked too
    try:
        wait_for(lambda: (faults / "ready_to_kill").exists(), 300, "the first report of the search's trial")
        worker = int((faults / "ready_to_kill").read_text())

        # 14.2: every socket of the local Ray (GCS, raylet, agents, the trial's worker) on loopback
        sockets = listening(search.pid)
        wide = {process_name(pid): addrs for pid, addrs in sockets.items()
                if not all(map(is_loopback, addrs))}
        assert not wide, f"listening beyond loopback: {wide}"
        names = " ".join(process_name(pid) for pid in sockets)
        assert "gcs_server" in names and "raylet" in names and worker in sockets, sockets

        # 14.6: the name is taken while it runs, for a new search (refused as its plan is made: in this
        # process, as the CLI's main runs it) and for a resume (refused once it holds the folder's lock: a
        # process of its own)
        resume = start_cli(tmp_path, uri, ["--resume", "--name", "life"])
        assert main(["--task", "digits", "--storage-path", str(storage), "--mlflow-uri", uri, *args]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: --name: expected a new search name, but"), err
        code, out = finish(resume)
        assert code == 2 and "error: --resume: expected a search no other process is running, but life is " \
                             "running now" in out, out[-2000:]

        # SIGTERM (a scheduler, `kill`): trials stopped, runs KILLED, the resume hint, exit 143
        os.kill(search.pid, signal.SIGTERM)
        code, out = finish(search, timeout=180)
    finally:
        stop(search)
    assert code == 143, out[-3000:]
    assert "SIGTERM received" not in out, out[-3000:]  # no C++ stack dump
    hint = out.split("resume with:", 1)[1].strip().splitlines()[0]
    parents, children = runs(uri, experiment)
    assert len(parents) == 1 and parents[0].info.status == "KILLED"
    assert [c.info.status for c in children] == ["KILLED"]

    # 14.4: a resume that changes what trials compute is refused, naming the flag, before anything changes
    state = (storage / "life" / "tune_as_search.json").read_bytes()
    for change in [*CHANGED, ["--data-dir", str(tmp_path)]]:
        argv = ["--resume", "--name", "life", "--storage-path", str(storage), "--mlflow-uri", uri, *change]
        assert main(argv) == 2, change
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"error: --resume: {change[0]}: expected life's own "), err
        assert "it changes what the trials compute or how the answer is decided" in err[0], err
    # the tracking store is part of the search: another --mlflow-uri would split its runs over two stores
    other = f"sqlite:///{tmp_path / 'other.db'}"
    assert main(["--resume", "--name", "life", "--storage-path", str(storage), "--mlflow-uri", other]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --resume: --mlflow-uri: expected a store that holds "
                                               "life's runs"), err
    assert err[0].endswith("other.db does not exist; resume without it, or point it at the store its runs "
                           "were moved to"), err
    assert not (tmp_path / "other.db").exists()
    assert (storage / "life" / "tune_as_search.json").read_bytes() == state
    assert len(runs(uri, experiment)[1]) == 1

    # 14.4: the printed hint, verbatim, finishes the search (its name and storage path are all it needs)
    assert hint.startswith("python -m tune_as.search --resume --name life --storage-path "), hint
    code, out = run_hint(hint, tmp_path)
    assert code == 0, out[-3000:]
    parents, children = runs(uri, experiment)
    assert parents[0].info.status == "FINISHED"
    assert len(children) == 2 and all(c.info.status == "FINISHED" for c in children)
    study = optuna.load_study(study_name="digits-softmax",
                              storage=f"sqlite:///{storage / 'life' / 'optuna.db'}")
    assert sum(t.state.name == "COMPLETE" for t in study.trials) == 2
    assert json.loads((storage / "life" / "tune_as_search.json").read_text())["finished"] is True

    # 14.5: resuming the finished search changes nothing: exit 0, parent FINISHED, no new run (the hint's own
    # arguments, run by the CLI's main in this process: it ends as its plan is made, before Ray)
    assert main(shlex.split(hint)[3:]) == 0
    assert "has finished: nothing to resume" in capsys.readouterr().out
    parents, children = runs(uri, experiment)
    assert parents[0].info.status == "FINISHED" and len(children) == 2
    assert all(c.info.status == "FINISHED" for c in children)


def run_hint(hint: str, cwd: Path) -> tuple[int, str]:
    """Run a printed `python -m tune_as.search ...` command as a user would (this interpreter as `python`)."""
    argv = shlex.split(hint)
    assert argv[0] == "python", hint
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TUNE_AS_CACHE": str(cwd / "cache"),
           "RAY_USAGE_STATS_ENABLED": "0"}
    proc = subprocess.Popen([sys.executable, *argv[1:]], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    return finish(proc)


def test_the_loopback_switch_is_set_for_importing_ray_only() -> None:
    """The CLIs put Ray in its single-machine mode (every local server on 127.0.0.1) through Ray's documented
    switch, read when Ray is imported; the switch must not stay in the environment, where a `ray start` of a
    multi-node cluster started later by the same process (or a test after it) would refuse to run."""
    code = ("import os, sys; from tune_as.engine.cluster import SINGLE_MACHINE_SWITCH, loopback_ray; "
            "assert 'ray' not in sys.modules; loopback_ray(None); "
            "print('ray' in sys.modules, os.environ.get(SINGLE_MACHINE_SWITCH))")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert run.stdout.strip() == "True None", run.stdout + run.stderr


def test_a_loopback_address_of_a_ray_that_listens_on_loopback_only_is_joined_there() -> None:
    """`--address 127.0.0.1:PORT` of a Ray whose servers listen on loopback only (a local search's head, any
    head in Ray's single-machine mode): outside that mode `ray.init` swaps 127.0.0.1 for the machine's
    outbound IP, where nothing listens, and retries for ever (a search hung with Ray's warnings every 5 s).
    `loopback_only` tells that Ray from one that listens on every interface (a plain `ray start --head`, where
    the swap is harmless); the CLIs then join in the single-machine mode (tests/test_reliability.py's joined
    searches start without the switch)."""
    from tune_as.engine.cluster import _outbound_ip, loopback_only

    for address in (None, "auto", "local", "ray://127.0.0.1:10001", "10.1.2.3:6379", "127.0.0.1:notaport"):
        assert not loopback_only(address), address
    outbound = _outbound_ip()
    if outbound is None or outbound.startswith("127."):
        pytest.skip(f"this machine has no outbound IP other than loopback (got {outbound}): Ray swaps "
                    "nothing")
    for host, expected in (("127.0.0.1", True), ("0.0.0.0", False)):
        with socket.socket() as server:
            server.bind((host, 0))
            server.listen()
            port = server.getsockname()[1]
            assert loopback_only(f"127.0.0.1:{port}") is expected, host
            assert loopback_only(f"localhost:{port}") is expected, host


def test_a_cluster_search_gives_its_workers_the_tune_as_settings_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Joining a cluster, the driver's TUNE_AS_* variables (the trial hook and what it reads) go to the job's
    workers through Ray's runtime_env, and nothing else of its environment; a driver the Jobs API started
    forwards none (its job's runtime_env reaches the workers already, and Ray refuses a variable given
    twice)."""
    from tune_as.engine.cluster import JOB_CONFIG_ENV, trial_env

    for key in [k for k in os.environ if k.startswith("TUNE_AS_") or k == JOB_CONFIG_ENV]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("TUNE_AS_TRIAL_HOOK", "faults:hook")
    monkeypatch.setenv("TUNE_AS_FAULT_DIR", "/shared/faults")
    monkeypatch.setenv("NOT_TUNE_AS_X", "1")
    assert trial_env() == {"TUNE_AS_TRIAL_HOOK": "faults:hook", "TUNE_AS_FAULT_DIR": "/shared/faults"}
    monkeypatch.setenv(JOB_CONFIG_ENV, "{}")
    assert trial_env() == {}


END = """import atexit, sys
from pathlib import Path
from tune_as.errors import end_process
atexit.register(lambda: Path(sys.argv[1]).write_text("ran"))
print("printed before the end", end="")
end_process(3)
"""


def test_a_cli_ends_with_its_code_its_atexit_handlers_and_its_output(tmp_path: Path) -> None:
    """tune_as.errors.end_process (how `python -m tune_as.search` and `tune_as.report` end): the exit code,
    the registered atexit handlers and buffered output all kept."""
    marker = tmp_path / "atexit"
    run = subprocess.run([sys.executable, "-c", END, str(marker)], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONUNBUFFERED": ""})
    assert run.returncode == 3, run.stderr
    assert run.stdout == "printed before the end"
    assert marker.read_text() == "ran"


def test_a_working_thread_is_left_to_the_normal_exit() -> None:
    """end_process ends at once only when no thread is working: one that is (not a daemon) is what the normal
    exit waits for, so end_process raises SystemExit for it."""
    go = threading.Event()
    worker = threading.Thread(target=go.wait, name="a writer")
    worker.start()
    try:
        assert worker in working_threads()
        with pytest.raises(SystemExit) as ended:
            end_process(5)
        assert ended.value.code == 5
    finally:
        go.set()
        worker.join()
    assert worker not in working_threads()
    hold = threading.Event()
    daemon = threading.Thread(target=hold.wait, daemon=True)
    daemon.start()
    assert daemon.is_alive() and daemon not in working_threads()
    hold.set()


def test_a_failed_join_says_what_to_try() -> None:
    """engine.cluster.join_hints: `--address auto` with no Ray on the machine (Ray: "Could not find any
    running Ray instance") says where auto looks and that a search without --address starts its own; a refused
    join names token auth; a local start adds nothing to Ray's own reason."""
    from tune_as.engine.cluster import join_hints

    missing = ConnectionError("Could not find any running Ray instance.")
    auto = join_hints("auto", missing)
    assert "--address auto joins the Ray that `ray start` runs on this machine" in auto
    assert "without --address the search starts its own" in auto and "RAY_AUTH_MODE=token" in auto
    other = join_hints("10.0.0.1:6379", missing)
    assert "--address auto" not in other and \
        other.startswith(" (a cluster that answers but refuses the driver")
    assert "RAY_AUTH_MODE" not in join_hints("auto", RuntimeError("x")) and join_hints(None, missing) == ""
