"""Fault injection with real processes: the CLI as a subprocess (its own local Ray), a real `mlflow server`.

Each fault of the reliability issue is one test; the task is `digits` (real, offline, trains in seconds).
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import closing
from pathlib import Path

import faults
import optuna
import pytest
from conftest import MlflowServer, round_dir, search_experiment
from mlflow.entities import ViewType
from mlflow.tracking import MlflowClient

from tune_as.results import racing
from tune_as.results.answer import AnswerRecord

pytestmark = pytest.mark.slow

SPACE = """task: digits
trials_per_loss: {trials}
fixed: {{epochs: {epochs}, batch_size: 64}}
losses:
  softmax: {{}}
  as_softmax:
    params:
      delta: {{type: float, low: 0.1, high: 0.5}}
"""


def write_space(tmp: Path, trials: int, epochs: int, text: str = SPACE) -> Path:
    path = tmp / "digits.yaml"
    path.write_text(text.format(trials=trials, epochs=epochs))
    return path


TESTS = Path(__file__).resolve().parent


def start_cli(tmp: Path, uri: str, args: list[str], env: dict[str, str] | None = None,
              dashboard: bool = False, address: str | None = None) -> subprocess.Popen[str]:
    """The CLI in a session of its own: on its own local Ray, without the dashboard (no test here looks at it:
    ~2 s less per start), or joining the Ray at `address` (conftest's ray_head: the cluster path, and no Ray
    to start). That Ray listens on loopback only, in token mode: the CLI finds that out itself and joins it in
    Ray's single-machine mode (engine.cluster.loopback_only), as a user's `--address 127.0.0.1:PORT` would."""
    joining = {"RAY_AUTH_MODE": "token"} if address else {}
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", "TUNE_AS_CACHE": str(tmp / "cache"),
                "RAY_USAGE_STATS_ENABLED": "0", **joining, **(env or {})}
    if "TUNE_AS_FAULT_DIR" in full_env:  # tests/faults.py, plugged into every trial's reports
        full_env["TUNE_AS_TRIAL_HOOK"] = "faults:hook"
        full_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TESTS), full_env.get("PYTHONPATH")]))
    cmd = [sys.executable, "-m", "tune_as.search", "--task", "digits", "--storage-path", str(tmp / "results"),
           "--mlflow-uri", uri, "--cpus-per-trial", "1",
           *(["--address", address] if address else [] if dashboard else ["--no-dashboard"]), *args]
    return subprocess.Popen(cmd, cwd=tmp, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)


def finish(proc: subprocess.Popen[str], timeout: float = 400) -> tuple[int, str]:
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"search did not finish within {timeout}s:\n{out[-3000:]}")
    return proc.returncode, out


def stop(proc: subprocess.Popen[str]) -> None:
    """A CLI a test started, and every process of its session, gone (a test that failed leaves none
    running)."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.5)
    pytest.fail(f"timed out after {timeout}s waiting for {what}")


def processes_with(marker: str) -> list[str]:
    """The live processes whose environment holds `marker` (every process a CLI starts, its head's and its
    trials' workers too, inherits the TUNE_AS_CACHE that start_cli sets), as their command lines."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and marker.encode() in (entry / "environ").read_bytes():
                found.append(
                    (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:100])
        except OSError:  # ended while we looked, or not ours to read
            continue
    return found


def runs(uri: str, experiment: str) -> tuple[list, list]:
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        return [], []
    found = client.search_runs([exp.experiment_id], max_results=2000)
    return ([r for r in found if r.data.tags.get("tune_as.role") == "search"],
            [r for r in found if r.data.tags.get("tune_as.role") == "trial"])


def assert_logged_once(uri: str, run_id: str) -> list[float]:
    """Every evaluation point logged exactly once, in order; returns the epochs."""
    history = MlflowClient(uri).get_metric_history(run_id, "epoch")
    steps = [m.step for m in history]
    assert steps == list(range(1, len(steps) + 1)), f"steps duplicated or missing: {steps}"
    epochs = [m.value for m in sorted(history, key=lambda m: m.step)]
    assert epochs == sorted(epochs) and len(set(epochs)) == len(epochs), f"epoch count went back: {epochs}"
    return epochs


def test_trial_that_keeps_raising_is_retried_then_failed_others_finish(tmp_path: Path, mlflow_server) -> None:
    faults = tmp_path / "faults"
    faults.mkdir()
    space = write_space(tmp_path, trials=2, epochs=3)
    proc = start_cli(tmp_path, mlflow_server.uri, [
        "--search-space", str(space), "--experiment", "rel-raise", "--max-failures", "1", "--max-concurrent",
        "2", "--no-asha"],
        env={"TUNE_AS_FAULT_DIR": str(faults), "TUNE_AS_FAIL_AT_EPOCH": "1", "TUNE_AS_FAIL_TIMES": "9",
             "TUNE_AS_FAIL_LOSS": "softmax"})
    code, out = finish(proc)
    # the head's processes and the trials' workers (retried, failed, finished) end with the CLI, not after it
    assert not processes_with(str(tmp_path / "cache")), "a process the search started outlived it"
    assert code == 0, out[-3000:]
    parents, children = runs(mlflow_server.uri, "rel-raise")
    assert len(parents) == 1 and len(children) == 4
    by_loss = {loss: [c for c in children if c.data.tags["tune_as.loss"] == loss]
               for loss in ("softmax", "as_softmax")}
    for child in by_loss["softmax"]:
        assert child.info.status == "FAILED"
        assert "injected failure 2" in child.data.tags["tune_as.error"], "the retry should have failed too"
    assert all(c.info.status == "FINISHED" for c in by_loss["as_softmax"])
    attempts = sorted(p.name for p in faults.glob("fault_*"))
    assert len(attempts) == 4, f"each softmax trial: 1 try + 1 retry, got {attempts}"
    # one voice (issue 70, case 11): each failed try is one line of Tune's, not its 17-line traceback
    failed = [line for line in out.splitlines() if "Trial task failed for trial softmax_" in line]
    assert len(failed) == 4 and all("injected failure" in line for line in failed), failed
    assert "Traceback" not in out, out[-3000:]


def test_a_killed_worker_resumes_from_its_one_checkpoint_without_duplicates(tmp_path: Path, mlflow_server,
                                                                            ray_head: str) -> None:
    """Two trials that checkpoint at every evaluation (every 4 steps, `--checkpoint-interval 0`); the worker
    of one is killed (SIGKILL) while it blocks after the search's first report, mid-epoch (tests/faults.py).
    That trial resumes from its checkpoint (its evaluations never go back), one MLflow run per trial with each
    evaluation logged once; each trial keeps one checkpoint of the ~12 it wrote, and none keeps its weights
    once it ended."""
    fault_dir = tmp_path / "faults"
    fault_dir.mkdir()
    space = write_space(tmp_path, trials=1, epochs=3)
    proc = start_cli(tmp_path, mlflow_server.uri, [
        "--search-space", str(space), "--experiment", "rel-sigkill", "--name", "digits-kill-worker",
        "--eval-every-steps", "4", "--max-concurrent", "2", "--no-asha", "--checkpoint-interval", "0"],
        env={"TUNE_AS_FAULT_DIR": str(fault_dir), "TUNE_AS_BLOCK_ONCE": "1"}, address=ray_head)
    # the worker blocks after its first report (step 4, mid-epoch) until it is killed: no race with its exit
    wait_for(lambda: (fault_dir / "ready_to_kill").exists() or proc.poll() is not None, 240,
             "the first report of the search")
    assert (fault_dir / "ready_to_kill").exists(), f"the search ended first:\n{finish(proc)[1][-3000:]}"
    pid = (fault_dir / "ready_to_kill").read_text()
    (killed,) = [p.name.removeprefix("pid_") for p in fault_dir.glob("pid_*") if p.read_text() == pid]
    os.kill(int(pid), signal.SIGKILL)
    code, out = finish(proc)
    assert code == 0, out[-3000:]
    _, children = runs(mlflow_server.uri, "rel-sigkill")
    assert len(children) == 2, "a restored trial must not open a second MLflow run"
    for child in children:
        assert child.info.status == "FINISHED"
        assert assert_logged_once(mlflow_server.uri, child.info.run_id)[-1] == pytest.approx(3.0)
    epochs = [row["epoch"] for row in faults.reports(fault_dir) if row["trial_id"] == killed]
    assert len(epochs) > 2 and epochs == sorted(set(epochs)), \
        f"restarted, not restored from its checkpoint: {epochs}"
    search_dir = tmp_path / "results" / "digits-kill-worker"
    trial_dirs = [d for d in search_experiment(search_dir).iterdir()
                  if d.is_dir() and d.name.startswith(("softmax_", "as_softmax_"))]
    assert len(trial_dirs) == 2
    counts = {d.name: len(list(d.glob("checkpoint_*"))) for d in trial_dirs}
    assert max(counts.values()) == 1, counts
    assert_no_weights_left(search_dir)


def test_driver_sigkill_then_resume_completes_exactly_the_requested_trials(tmp_path: Path) -> None:
    """The driver is killed while MLflow is away (its SQLite store held locked by the test): Ray's persisted
    snapshot has 3 trials ended and the 4th blocked at its first report (tests/faults.py), MLflow at most the
    first trial's writes; the rest died with the driver's queue. The resume, given only the name, finishes
    exactly the 6 requested trials and delivers what the killed driver could not, from Ray's own record of
    each trial: one run per trial, FINISHED, with its whole history (an evaluation at each of its 2 epochs),
    logged once. Before the resume, the searcher's state is made one trial ahead of Ray's saved trials for one
    loss and one trial behind them for the other (each is what a kill inside Ray's copy of its state files can
    leave; together they test both in one resume): the trial the first loss lacks runs in a part of the
    search's own, and the second loss's trial Ray has is counted, never handed out again: each loss runs
    exactly its 3 trials."""
    fault_dir = tmp_path / "faults"
    fault_dir.mkdir()
    space = write_space(tmp_path, trials=3, epochs=2)
    db = tmp_path / "mlflow.db"
    uri, search_dir = f"sqlite:///{db}", tmp_path / "results" / "digits-kill"
    args = ["--search-space", str(space), "--experiment", "rel-resume", "--name", "digits-kill",
            "--max-concurrent", "1", "--no-asha"]
    proc = start_cli(tmp_path, uri, args,
                     env={"TUNE_AS_FAULT_DIR": str(fault_dir), "TUNE_AS_BLOCK_IN": "search:4"})
    try:
        wait_for(lambda: bool(runs(uri, "rel-resume")[1]) or proc.poll() is not None, 300,
                 "the first trial's run")
        with closing(sqlite3.connect(db, isolation_level=None, timeout=120)) as lock:
            lock.execute("BEGIN EXCLUSIVE")  # MLflow away: from here on the driver can only queue its writes
            ready = fault_dir / "ready_to_kill"
            wait_for(lambda: ready.exists() or proc.poll() is not None, 300,
                     "the fourth trial's first report")
            assert ready.exists(), f"the search ended (exit {proc.poll()}) before its fourth trial reported"
            blocked = faults.trial_order(fault_dir, "search")[3]
            wait_for(lambda: snapshot_shows(search_experiment(search_dir), blocked, ended=3)
                     and searcher_shows(search_experiment(search_dir), blocked), 120,
                     "Ray's persisted snapshot and searcher state to show three ended trials and the "
                     "blocked one")
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            lock.execute("ROLLBACK")
    finally:
        stop(proc)
    finished_before = sum(c.info.status == "FINISHED" for c in runs(uri, "rel-resume")[1])
    assert finished_before < 3, "MLflow should have missed the end of a trial Ray's snapshot has ended"
    # Ray copies a snapshot's files side by side, so a kill inside the copy can leave the searcher's state a
    # trial ahead of the trials Ray saved, or behind them (docs/architecture.md). Made so here. Behind: the
    # blocked 4th trial is not handed out yet in the searcher's state (its loss would get a 4th trial: the old
    # code ran 7). Ahead: the searcher asked Optuna for a trial of the other loss that Ray's saved trials
    # lack, and counts it; the resume runs it in a part of the search's own and closes the orphan in Optuna (a
    # resume of the old code ended "interrupted", as every later one).
    (state_file,) = search_experiment(search_dir).glob("searcher-state-*")
    saved = json.loads(state_file.read_text())
    assert sum(saved["suggested"].values()) == 4 and blocked in saved["live"], saved
    behind = saved["live"].pop(blocked)[0]
    saved["suggested"][behind] -= 1
    (lost,) = set(saved["suggested"]) - {behind}
    optuna_url = f"sqlite:///{search_dir / 'optuna.db'}"
    asked = optuna.load_study(study_name=f"digits-{lost}", storage=optuna_url).ask().number
    saved["suggested"][lost] += 1
    saved["live"]["lost-trial"] = [lost, asked]
    ahead = state_file.with_name(f".{state_file.name}.ahead")
    ahead.write_text(json.dumps(saved))
    os.replace(ahead, state_file)
    # the name (and where to find it) is all a resume needs: the rest comes from the saved search
    code, out = finish(start_cli(tmp_path, uri, ["--name", "digits-kill", "--resume"]))
    assert code == 0, out[-3000:]
    assert f"lacks 1 trial(s) of {lost}" in " ".join(out.split()), out[-3000:]
    parents, children = runs(uri, "rel-resume")
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert len(children) == 6 and len({c.data.tags["tune_as.trial_id"] for c in children}) == 6, \
        [(c.data.tags.get("tune_as.trial_id"), c.info.status) for c in children]
    assert all(c.info.status == "FINISHED" for c in children)
    for child in children:
        assert assert_logged_once(uri, child.info.run_id) == [1.0, 2.0], child.data.tags
    for loss in ("softmax", "as_softmax"):
        study = optuna.load_study(study_name=f"digits-{loss}", storage=optuna_url)
        assert sum(t.state.name == "COMPLETE" for t in study.trials) == 3, loss
        assert not [t for t in study.trials if t.state.name == "RUNNING"], loss
    assert optuna.load_study(study_name=f"digits-{lost}", storage=optuna_url).trials[asked].state.name == \
        "FAIL"
    assert_no_weights_left(search_dir)


def assert_no_weights_left(search_dir: Path) -> None:
    """Every trial of the search ended: none keeps its model and optimizer (only pmargin.npy and a marker)."""
    left = {p.relative_to(search_dir).as_posix(): p.stat().st_size
            for p in search_experiment(search_dir).glob("*/checkpoint_*/*")
            if p.name != "pmargin.npy" and p.stat().st_size > 0}
    assert not left, f"finished trials kept their weights: {left}"


# SIGTERM to the group is not tested here: when it kills the local raylet, Ray's core worker can end the
# driver (exit 1) before engine/interrupt.py closes the runs (1 CI run in 3 lost that race): a known limit,
# see docs/architecture.md; the fix is a local Ray outside the driver's process group.
@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130)], ids=["ctrl-c"])
def test_a_signal_to_the_process_group_stops_marks_runs_killed_and_prints_one_resume_line(
        tmp_path: Path, mlflow_server, sig: signal.Signals, code: int) -> None:
    """As a terminal's Ctrl-C and a scheduler's SIGTERM send it: to the whole process group, the local Ray's
    own processes included. The search ends within seconds (SIGTERM kills Ray's GCS: the driver gives up on
    Ray instead of waiting 60 s for it), every run is closed KILLED, one resume line, nothing of Ray's own
    hints."""
    space = write_space(tmp_path, trials=3, epochs=6)
    name = f"digits-{sig.name.lower()}"
    proc = start_cli(tmp_path, mlflow_server.uri, [
        "--search-space", str(space), "--experiment", f"rel-{name}", "--name", name, "--max-concurrent", "2"])
    wait_for(lambda: any(c.data.metrics for c in runs(mlflow_server.uri, f"rel-{name}")[1]), 300,
             "a first result")
    os.killpg(proc.pid, sig)
    code_seen, out = finish(proc, timeout=60)  # Ray's own wait for a lost GCS is 60 s: well before that
    assert code_seen == code, out[-3000:]
    assert out.count("resume with:") == 1 and f"--resume --name {name}" in out, out[-3000:]
    for ray_voice in ("Tuner.restore", "Failed to connect to GCS", "Traceback"):
        assert ray_voice not in out, out[-3000:]
    parents, children = runs(mlflow_server.uri, f"rel-{name}")
    assert parents[0].info.status == "KILLED"
    assert children and all(c.info.status in ("KILLED", "FINISHED") for c in children)
    assert any(c.info.status == "KILLED" for c in children)


def test_an_mlflow_outage_while_trials_start_report_and_end_loses_nothing(tmp_path: Path,
                                                                          ray_head: str) -> None:
    """The tracking server goes away while the first trial holds its first report (tests/faults.py), and comes
    back once 8 more evaluations (at least one trial started, reported and ended) were made without it:
    conditions on the trials' own reports, not a sleep (a search faster than the test's look cannot outrun it:
    17 evaluations follow the held one). Every write reaches MLflow, once, in order."""
    server = MlflowServer(tmp_path / "mlflow")
    server.root.mkdir()
    server.start()
    space = write_space(tmp_path, trials=3, epochs=3)  # 18 evaluations in all, one trial at a time
    fault_dir = tmp_path / "faults"
    fault_dir.mkdir()
    try:
        go = tmp_path / "go"
        proc = start_cli(tmp_path, server.uri, ["--search-space", str(space), "--experiment", "rel-outage",
                                                "--max-concurrent", "1", "--no-asha"],
                         env={"TUNE_AS_FAULT_DIR": str(fault_dir), "TUNE_AS_HOLD_UNTIL": str(go)},
                         address=ray_head)
        wait_for(lambda: (fault_dir / "holding").exists() or proc.poll() is not None, 300,
                 "the first trial's first report")
        wait_for(lambda: len(runs(server.uri, "rel-outage")[1]) >= 1, 300, "the first child run")
        server.stop()
        before = len(faults.reports(fault_dir))
        go.touch()
        wait_for(lambda: len(faults.reports(fault_dir)) >= before + 8 or proc.poll() is not None, 300,
                 "8 evaluations made while MLflow is away")
        restarted = MlflowServer(server.root)
        restarted.port, restarted.uri = server.port, server.uri
        restarted.start()
        server = restarted
        code, out = finish(proc)
        assert code == 0, out[-3000:]
        assert "MLflow unreachable" in out
        parents, children = runs(server.uri, "rel-outage")
        assert len(parents) == 1 and parents[0].info.status == "FINISHED"
        assert len(children) == 6 and all(c.info.status == "FINISHED" for c in children)
        for child in children:
            assert assert_logged_once(server.uri, child.info.run_id)[-1] == pytest.approx(3.0)
    finally:
        server.stop()


NAN_SPACE = """task: digits
trials_per_loss: {trials}
fixed: {{epochs: {epochs}, batch_size: 64}}
losses:
  softmax:
    params:
      lr: {{type: categorical, choices: [1.0e+6]}}
"""


def test_nan_loss_fails_the_trial_clearly_and_tells_the_searcher(tmp_path: Path, mlflow_server,
                                                                 ray_head: str) -> None:
    space = write_space(tmp_path, trials=2, epochs=2, text=NAN_SPACE)
    code, out = finish(start_cli(tmp_path, mlflow_server.uri, [
        "--search-space", str(space), "--experiment", "rel-nan", "--name", "digits-nan", "--max-failures",
        "3", "--format", "markdown"], address=ray_head))
    # no failure is silent: the loss is in the answer with why, the parent run FAILED, exit code 3
    assert code == 3, out[-3000:]
    assert "| - | softmax | no result: failed or diverged: non-finite training loss" in out, out[-3000:]
    assert "error: no loss has a result: every trial failed, diverged or was stopped early" in out
    assert "softmax                   0    0    0    2" in out, "the progress view counts them as failed"
    parents, children = runs(mlflow_server.uri, "rel-nan")
    assert parents[0].info.status == "FAILED"
    assert len(children) == 2
    for child in children:
        assert child.info.status == "FAILED"
        assert child.data.tags["tune_as.error"].startswith("non-finite training loss")
        assert "val_accuracy" not in child.data.metrics, "a diverged trial must not log a fake score"
    study = optuna.load_study(study_name="digits-softmax",
                              storage=f"sqlite:///{tmp_path / 'results' / 'digits-nan' / 'optuna.db'}")
    assert [t.state.name for t in study.trials] == ["FAIL", "FAIL"]


def persisted_trials(experiment_dir: Path) -> dict[str, tuple[str, int, Path | None]]:
    """Ray's last persisted snapshot of a Tune experiment, read as the plain JSON it is: trial id -> (status,
    iteration of its last result, the checkpoint folder it would be restored from). Empty while none is
    whole."""
    files = sorted(experiment_dir.glob("experiment_state-*.json"))
    try:
        state = json.loads(files[-1].read_text()) if files else {"trial_data": []}
    except ValueError:  # being written by Ray's syncer
        return {}
    trials = {}
    for trial_json, meta_json in state["trial_data"]:
        trial, last = json.loads(trial_json), json.loads(meta_json).get("last_result") or {}
        ckpt = last.get("checkpoint_dir_name")
        trials[trial["trial_id"]] = (trial["status"], int(last.get("training_iteration", 0)),
                                     experiment_dir / trial["relative_logdir"] / ckpt if ckpt else None)
    return trials


def snapshot_shows(experiment_dir: Path, running: str, ended: int) -> bool:
    """The persisted snapshot has `ended` TERMINATED trials and `running` RUNNING with a result, and every
    checkpoint it names is on disk."""
    trials = persisted_trials(experiment_dir)
    status, iteration, _ = trials.get(running, ("", 0, None))
    return (status == "RUNNING" and iteration >= 1
            and all(c is None or c.is_dir() for _, _, c in trials.values())
            and sum(s == "TERMINATED" for s, _, _ in trials.values()) == ended)


def searcher_shows(experiment_dir: Path, live: str) -> bool:
    """The persisted searcher state (the newest file) has trial `live` among its live trials: Ray copies it
    beside the experiment's snapshot, not with it, so a snapshot that shows a trial can come before the
    searcher's file."""
    newest = max(experiment_dir.glob("searcher-state-*"), default=None, key=str)
    try:
        return newest is not None and live in json.loads(newest.read_text()).get("live", {})
    except (OSError, ValueError):  # replaced while read
        return False


def test_resume_in_the_middle_of_a_racing_round_runs_no_seed_twice(
        tmp_path: Path, request: pytest.FixtureRequest, ray_head: str) -> None:
    """--race --max-seeds 5 on two losses: round 1 (3 seeds each, experiment `confirm.<token>`) leaves both
    undecided, round 2 (2 more seeds each, `confirm-2.<token>`) runs 4 runs, one at a time. The third run of
    round 2 blocks at its first report (mid-epoch): two runs of the round have ended, this one has not, the
    fourth has not started. Once Ray's persisted snapshot of the round shows that state, the driver is killed
    (SIGKILL; the search runs on the session's Ray, the cluster path: its job's workers go with it) and the
    search resumed: every (loss, seed) is trained to its end exactly once, in one run, and the answer is the
    race's on 5 seeds each: the same table, byte for byte, as the same race of the same name run again without
    a kill, beside it on the same Ray (the two drivers' Tune experiments are named by tokens of their own:
    engine.state.new_token). MLflow is away (its SQLite store held locked) from round 1's first report to the
    kill: the resume delivers every run of both rounds from Ray's record, round 1's as its finished experiment
    ends without a step of Tune. Before the resume, round 2's searcher state is made one run ahead of Ray's
    saved trials (what a kill inside Ray's copy of its state files can leave): the run it lacks runs once, in
    a part of the round's own. (A state behind Ray's trials is caught up before the restore, as the driver
    SIGKILL test shows for the search's, and tests/test_engine.py for a round's.)

    The test waits for the snapshot (a condition, not a sleep) because Ray persists it in a background thread:
    a driver killed in the moment between a trial's new checkpoint (Ray deletes the older one, num_to_keep=1)
    and the next persisted snapshot leaves a snapshot that names the deleted checkpoint, and Ray fails that
    trial's restore ("Could not recover from checkpoint ..."): docs/architecture.md, the known limit of a
    SIGKILL."""
    fault_dir = tmp_path / "faults"
    fault_dir.mkdir()
    space = write_space(tmp_path, trials=1, epochs=1)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"  # MLflow is not the subject: one writer, the driver
    args = ["--search-space", str(space), "--experiment", "rel-race", "--name", "race-kill",
            "--race", "--max-seeds", "5", "--max-concurrent", "1", "--max-train-samples", "300",
            "--max-eval-samples", "100", "--eval-every-steps", "2", "--checkpoint-interval", "0"]
    # the same race, never killed, runs beside it from the start (a folder, cache and store of its own): its
    # table is the one the killed and resumed race must print
    clean_dir = tmp_path / "clean"
    clean_dir.mkdir()
    clean_uri = f"sqlite:///{clean_dir / 'mlflow.db'}"
    # its name too: two drivers on one Ray node
    clean = start_cli(clean_dir, clean_uri, args, address=ray_head)
    request.addfinalizer(lambda: stop(clean))
    proc = start_cli(tmp_path, uri, args, address=ray_head,
                     env={"TUNE_AS_FAULT_DIR": str(fault_dir), "TUNE_AS_BLOCK_IN": "confirm-2:3"})
    ready = fault_dir / "ready_to_kill"
    wait_for(lambda: faults.trial_order(fault_dir, "confirm") or proc.poll() is not None, 400,
             "the first report of round 1")
    # MLflow away from round 1 on (its SQLite store held locked): what round 1 and 2 write dies with the
    # driver's queue, and the resume must deliver it from Ray's record, round 1's without a step of Tune
    # (every run ended)
    with closing(sqlite3.connect(tmp_path / "mlflow.db", isolation_level=None, timeout=120)) as lock:
        lock.execute("BEGIN EXCLUSIVE")
        wait_for(lambda: ready.exists() or proc.poll() is not None, 400, "the third run of round 2 to report")
        if not ready.exists():
            lock.execute("ROLLBACK")
            pytest.fail(f"the search ended (exit {proc.returncode}) without reaching round 2:\n"
                        f"{finish(proc)[1][-3000:]}")
        second = round_dir(tmp_path / "results" / "race-kill", 2)
        blocked = faults.trial_order(fault_dir, "confirm-2")[2]  # the one TUNE_AS_BLOCK_IN holds
        wait_for(lambda: snapshot_shows(second, blocked, ended=2) and searcher_shows(second, blocked), 120,
                 "Ray's persisted snapshot and searcher state of round 2 to show two ended runs and the "
                 "blocked one")
        os.killpg(proc.pid, signal.SIGKILL)
        first, _ = proc.communicate()
        lock.execute("ROLLBACK")
    assert "Confirmation round 2: 4 runs of 2 losses" in first, first[-3000:]
    ended_before = {r["trial_id"] for r in faults.reports(fault_dir)
                    if faults.kind(r["experiment"]) == "confirm-2"
                    and r["epoch"] >= 1.0}
    assert ended_before, "the kill should come after a run of round 2 ended"
    # Ray copies a snapshot's files side by side, so a kill inside the copy can leave the searcher's state a
    # trial ahead of the trials Ray saved (docs/architecture.md). Made so here: its file says a fourth run was
    # handed out, which Ray's saved trials lack; the searcher never hands it out again, and the resume runs it
    # in a part of the round's own, once (a resume of the old code ended "interrupted", and so did every later
    # one).
    (state_file,) = second.glob("searcher-state-*")
    handed = json.loads(state_file.read_text())["next"]
    assert handed == 3, f"the searcher should have handed out the blocked run last, got {handed} handed out"
    ahead = state_file.with_name(f".{state_file.name}.ahead")
    ahead.write_text(json.dumps({"next": handed + 1}))
    os.replace(ahead, state_file)

    code, out = finish(start_cli(tmp_path, uri, ["--name", "race-kill", "--resume", "--format", "markdown"],
                                 env={"TUNE_AS_FAULT_DIR": str(fault_dir)}, address=ray_head))
    assert code == 0, out[-3000:]
    client = MlflowClient(uri)
    found = client.search_runs([client.get_experiment_by_name("rel-race").experiment_id],
                               run_view_type=ViewType.ALL, max_results=1000)
    parents = [r for r in found if r.data.tags.get("tune_as.role") == "search"]
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    confirmations = [r for r in found if r.data.tags.get("tune_as.role") == "confirmation"]
    # a run the kill interrupted while it was opened has no params (the searcher issued its setting again)
    pair = {r.data.tags["tune_as.trial_id"]: (r.data.tags["tune_as.loss"], int(r.data.params.get("seed", -1)))
            for r in confirmations}
    # trained to the end: a report at epoch 1 (the last), before or after the kill, in any run of any round
    ended = [pair[r["trial_id"]] for r in faults.reports(fault_dir)
             if r["experiment"].startswith("confirm") and r["epoch"] >= 1.0]
    assert len(ended) == len(set(ended)) == 10, \
        f"a (loss, seed) trained to its end twice or never: {sorted(ended)}"
    finished = [r for r in confirmations if r.info.status == "FINISHED"
                and r.info.lifecycle_stage == "active"]
    others = [r for r in confirmations if r.info.run_id not in {f.info.run_id for f in finished}]
    state = sorted((pair[r.data.tags["tune_as.trial_id"]], r.data.tags["tune_as.trial_id"], r.info.status,
                    r.info.lifecycle_stage, r.data.tags.get("tune_as.orphaned", "")) for r in confirmations)
    assert sorted(pair[r.data.tags["tune_as.trial_id"]] for r in finished) == sorted(ended), \
        (f"each (loss, seed) in exactly one finished run; runs: {state}; reports: "
         f"{faults.reports(fault_dir)}; killed process: {first[-2500:]}; resumed: {out[-2500:]}")
    assert all(r.info.status == "KILLED" for r in others), "only orphans of the kill left over, closed"
    for run in finished:  # each with its whole history: evaluations every 2 steps up to its one epoch
        assert assert_logged_once(uri, run.info.run_id)[-1] == pytest.approx(1.0)
    assert "confirmation 10 in 10 runs" in out, out[-2000:]
    # the lost run ran in a part of its own
    assert "lacks 1 of its runs" in " ".join(out.split()), out[-3000:]

    # the answer: the race replayed on these results asks round 2 for seeds 4 and 5 of both losses, and
    # decides with 5 seeds each, as a search never killed would
    results: dict[str, dict[int, tuple[float, float | None]]] = {}
    for run in finished:
        loss, seed = pair[run.data.tags["tune_as.trial_id"]]
        results.setdefault(loss, {})[seed] = (run.data.metrics["best_val_accuracy"],
                                              run.data.metrics["test_accuracy"])
    seeds = sorted(results["softmax"])
    # the search's own verdict plan (its answer record): 100 test items, so the default margin is one item
    record = AnswerRecord.from_json(Path(client.download_artifacts(parents[0].info.run_id, "answer.json",
                                                                   str(tmp_path))).read_text())
    plan = record.race
    assert plan is not None and plan.seeds[:5] == tuple(seeds) and plan.max_seeds == 5
    assert (plan.margin_points, plan.resolution_points) == (1.0, 1.0)
    round_one = {loss: {s: v for s, v in by_seed.items() if s in seeds[:3]}
                 for loss, by_seed in results.items()}
    assert racing.decide(round_one, plan).next_seeds == {"softmax": tuple(seeds[3:]),
                                                         "as_softmax": tuple(seeds[3:])}
    answer = racing.decide(results, plan)
    assert answer.done and answer.seeds_used == {"softmax": 5, "as_softmax": 5}
    row = answer.row("as_softmax")
    word = row.verdict if row.verdict != "undecided" else f"undecided ({row.n} seeds)"
    assert f"| {word} |" in out and "looks at 3, 5 seeds, 2 taken" in out, out[-3000:]

    # and the table is the one the same race prints when nothing kills it, byte for byte
    (tmp_path / "k").mkdir()
    (tmp_path / "c").mkdir()
    killed_table = Path(client.download_artifacts(parents[0].info.run_id, "ranking.md", str(tmp_path / "k")))
    code, clean_out = finish(clean)
    assert code == 0, clean_out[-3000:]
    other = MlflowClient(clean_uri)
    (clean_parent,) = [r for r in other.search_runs([other.get_experiment_by_name("rel-race").experiment_id])
                       if r.data.tags.get("tune_as.search_id") == "race-kill"
                       and r.data.tags.get("tune_as.role") == "search"]
    clean_table = Path(other.download_artifacts(clean_parent.info.run_id, "ranking.md", str(tmp_path / "c")))
    assert clean_table.read_text() == killed_table.read_text()
