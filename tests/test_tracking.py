"""MlflowTracker against a real `mlflow server`: replayed results, driver restarts, outages (told by exception
type), orphaned runs, deleted experiments, two processes opening a fresh SQLite file at once."""

from __future__ import annotations

import json
import logging
import os
import re
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Callable
from contextlib import closing
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from conftest import free_port
from mlflow.tracking import MlflowClient

from tune_as.errors import UserError
from tune_as.tracking import client as tracking
from tune_as.tracking import schema
from tune_as.tracking.client import OutageVoice
from tune_as.tracking.tracker import MlflowTracker

TAGS = {schema.ROLE: "trial", schema.LOSS: "softmax"}


def _tracker(uri: str, experiment: str, search_id: str = "s1") -> MlflowTracker:
    t = MlflowTracker(uri, experiment, search_id, final_flush_s=5)
    t.check_reachable()
    t.start_search(params={"task": "digits"}, tags={schema.TASK: "digits"})
    return t


@pytest.mark.slow
def test_replayed_results_are_logged_once_across_a_driver_restart(mlflow_server) -> None:
    first = _tracker(mlflow_server.uri, "trk-replay")
    first.trial_started("t1", {"loss": "softmax", "lr": 0.1}, TAGS)
    for step in (1, 2, 2, 1, 3):  # Ray replays results after a restore from checkpoint
        first.trial_result("t1", {"training_iteration": step, "val_accuracy": step / 10})
    # a new driver process (after SIGKILL + --resume) finds the run and its last step from MLflow
    second = _tracker(mlflow_server.uri, "trk-replay")
    assert second.parent_id == first.parent_id
    second.trial_started("t1", {"loss": "softmax", "lr": 0.1}, TAGS)
    second.trial_result("t1", {"training_iteration": 3, "val_accuracy": 0.3})
    second.trial_result("t1", {"training_iteration": 4, "val_accuracy": 0.4})
    second.trial_ended("t1", "FINISHED")
    assert second.search_ended("FINISHED") and second.experiment_id is not None
    client = MlflowClient(mlflow_server.uri)
    (run,) = [r for r in client.search_runs([second.experiment_id])
              if r.data.tags.get(schema.ROLE) == "trial"]
    assert [m.step for m in client.get_metric_history(run.info.run_id, "val_accuracy")] == [1, 2, 3, 4]
    assert run.info.status == "FINISHED" and run.data.params["lr"] == "0.1"


@pytest.mark.slow
def test_a_writer_delivers_off_the_callers_thread_in_order(mlflow_server) -> None:
    """With a writer (what the search's Tune callback starts), an event only queues its write: a flush in
    progress (a slow MLflow's: held here by another thread) never holds Tune's event loop; the writes then
    arrive in order, and the search's end delivers what is left."""
    tracker = _tracker(mlflow_server.uri, "trk-writer")
    tracker.start_writer()
    held, release = threading.Event(), threading.Event()

    def slow_flush() -> None:
        with tracker.lock:
            held.set()
            release.wait()

    threading.Thread(target=slow_flush, daemon=True).start()
    assert held.wait(timeout=60)

    def events() -> None:
        tracker.trial_started("t1", {"loss": "softmax", "lr": 0.1}, TAGS)
        for step in (1, 2, 3):
            tracker.trial_result("t1", {"training_iteration": step, "val_accuracy": step / 10})
        tracker.trial_ended("t1", "FINISHED")

    caller = threading.Thread(target=events, daemon=True)
    caller.start()
    caller.join(timeout=120)  # a bound for the failure only: the events return at once
    assert not caller.is_alive(), "an event waited for MLflow on the caller's thread"
    assert len(tracker.pending) == 5, "queued, not delivered, while the flush in progress holds the store"
    release.set()
    assert tracker.search_ended("FINISHED") and not tracker.pending and tracker.writer is None
    client = MlflowClient(mlflow_server.uri)
    (run,) = [r for r in client.search_runs([str(tracker.experiment_id)])
              if r.data.tags.get(schema.ROLE) == "trial"]
    assert [m.step for m in client.get_metric_history(run.info.run_id, "val_accuracy")] == [1, 2, 3]
    assert run.info.status == "FINISHED" and run.data.params["lr"] == "0.1"


@pytest.mark.slow
def test_a_driver_killed_between_a_results_metrics_and_its_tags_logs_no_step_twice(tmp_path: Path) -> None:
    """The SQLite store commits a batch's metrics, then its tags: a driver SIGKILLed in between leaves step
    2's metrics with the last-step tag still at 1 (the state is made here by hand; tests/test_reliability.py's
    racing resume met it for real). The resumed driver's replay of step 2 must not log it again."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"  # where the driver itself writes the database
    killed = _tracker(uri, "trk-torn")
    killed.trial_started("t1", {"loss": "softmax"}, TAGS)
    for step in (1, 2):
        killed.trial_result("t1", {"training_iteration": step, "val_accuracy": step / 10})
    run_id = killed.trials["t1"].run_id
    assert run_id is not None
    client = MlflowClient(uri)
    client.set_tag(run_id, schema.LAST_STEP, "1")
    resumed = _tracker(uri, "trk-torn")
    resumed.trial_started("t1", {"loss": "softmax"}, TAGS)
    for step in (2, 3):  # restored from the checkpoint of step 1
        resumed.trial_result("t1", {"training_iteration": step, "val_accuracy": step / 10})
    resumed.trial_ended("t1", "FINISHED")
    assert resumed.search_ended("FINISHED")
    assert [m.step for m in client.get_metric_history(run_id, "val_accuracy")] == [1, 2, 3]
    assert client.get_run(run_id).data.tags[schema.LAST_STEP] == "3"


@pytest.mark.slow
def test_orphaned_run_of_a_killed_driver_is_closed_and_hidden(mlflow_server) -> None:
    killed = _tracker(mlflow_server.uri, "trk-orphan")
    killed.trial_started("lost", {"loss": "softmax"}, TAGS)  # Ray never saved this trial before the kill
    killed.trial_started("kept", {"loss": "softmax"}, TAGS)
    resumed = _tracker(mlflow_server.uri, "trk-orphan")
    resumed.trial_started("kept", {"loss": "softmax"}, TAGS)
    resumed.trial_ended("kept", "FINISHED")
    assert resumed.search_ended("FINISHED") and resumed.experiment_id is not None
    client = MlflowClient(mlflow_server.uri)
    visible = [r for r in client.search_runs([resumed.experiment_id])
               if r.data.tags.get(schema.ROLE) == "trial"]
    assert [r.data.tags[schema.TRIAL] for r in visible] == ["kept"]
    lost = client.get_run(killed.trials["lost"].run_id)
    assert lost.info.status == "KILLED" and lost.info.lifecycle_stage == "deleted"
    assert "killed driver" in lost.data.tags["tune_as.orphaned"]


@pytest.mark.slow
def test_writes_during_an_outage_are_buffered_in_order(mlflow_server, tmp_path: Path) -> None:
    tracker = _tracker(mlflow_server.uri, "trk-outage")
    tracker.trial_started("t1", {"loss": "softmax"}, TAGS)
    good_uri = tracker.uri
    tracker.uri = f"http://127.0.0.1:{free_port()}"  # nothing listens there: the server is "away"
    tracker._client = MlflowClient(tracker.uri)
    tracker.trial_result("t1", {"training_iteration": 1, "val_accuracy": 0.5})
    tracker.trial_result("t1", {"training_iteration": 2, "val_accuracy": 0.6})
    tracker.trial_ended("t1", "FINISHED")
    assert len(tracker.pending) == 3 and tracker.outage_since is not None
    tracker.uri, tracker._client = good_uri, MlflowClient(good_uri)  # back
    assert tracker.search_ended("FINISHED") and not tracker.pending
    client = MlflowClient(mlflow_server.uri)
    run = client.get_run(tracker.trials["t1"].run_id)
    assert run.info.status == "FINISHED"
    assert [m.value for m in client.get_metric_history(run.info.run_id, "val_accuracy")] == [0.5, 0.6]


def test_unreachable_database_fails_in_seconds_without_the_password() -> None:
    tracker = MlflowTracker(f"postgresql+psycopg2://u:pw123@127.0.0.1:{free_port()}/db", "x", "s")
    try:
        tracker.check_reachable()
    except UserError as exc:
        assert "pw123" not in str(exc) and "expected a reachable database" in str(exc)
    else:
        raise AssertionError("an unreachable database was accepted")


# -- outages are told by exception type (what MLflow 3 raises, from real failures) --------------------------
class _Unavailable(BaseHTTPRequestHandler):
    """A real HTTP server in maintenance: 503 to everything, as a proxy in front of a restarting MLflow
    says."""

    def do_GET(self) -> None:
        self.send_response(503)
        self.end_headers()
        self.wfile.write(b"down for maintenance")

    do_POST = do_GET

    def log_message(self, *args: object) -> None:
        pass


def _raised(call: Callable[[], object]) -> BaseException:
    try:
        call()
    except Exception as exc:  # noqa: BLE001 - the exception is the subject
        return exc
    raise AssertionError("the call succeeded")


def test_a_stopped_server_and_a_503_are_outages(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # as tracking.open_client sets them for every tracker (without them MLflow retries for minutes): not left
    # to whichever test opened a tracker first
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
    refused = _raised(
        lambda: MlflowClient(f"http://127.0.0.1:{free_port()}").search_experiments(max_results=1))
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Unavailable)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        unavailable = _raised(lambda: MlflowClient(
            f"http://127.0.0.1:{server.server_address[1]}").search_experiments(max_results=1))
    finally:
        server.shutdown()
    assert tracking.is_outage(refused) and tracking.is_outage(unavailable)
    assert tracking.failure_reason(refused, "") == "Connection refused"


@pytest.mark.slow
def test_answers_are_not_outages_even_when_their_text_says_timeout(mlflow_server) -> None:
    client = MlflowClient(mlflow_server.uri)
    run_id = client.create_run(client.create_experiment("trk-answers")).info.run_id
    client.log_param(run_id, "on_error", "Timeout")
    # MLflow refuses to change a param
    changed = _raised(lambda: client.log_param(run_id, "on_error", "retry"))
    missing = _raised(lambda: client.get_run("0" * 32))
    assert "Timeout" in str(changed)  # the old text match took this for an outage and retried it forever
    assert not tracking.is_outage(changed) and not tracking.is_outage(missing)


@pytest.mark.slow
def test_a_locked_sqlite_store_is_an_outage(tmp_path: Path) -> None:
    client = tracking.open_client(f"sqlite:///{tmp_path / 'm.db'}")
    with closing(sqlite3.connect(tmp_path / "m.db", isolation_level=None)) as other_writer:
        other_writer.execute("BEGIN EXCLUSIVE")
        before = OutageVoice.dropped
        locked = _raised(lambda: client.create_experiment("x"))  # after MLflow's own 20 s busy timeout
    assert "database is locked" in str(locked) and tracking.is_outage(locked)
    # one voice (issue 70, case 12): MLflow's traceback of the locked database was kept out; the tracker says
    # the outage itself, once. A record of anything else still passes.
    assert OutageVoice.dropped > before
    other = logging.LogRecord("mlflow.store.db.utils", logging.ERROR, __file__, 1, "boom: %s",
                              (ValueError("not an outage"),), None)
    assert all(f.filter(other) for f in logging.getLogger("mlflow.store.db.utils").filters)


# -- a name the experiment holds already -----------------------------------------------------------------
def test_a_new_search_under_a_name_the_experiment_holds_is_refused(tmp_path: Path) -> None:
    """Without the refusal a second search of one name (another storage path, or its folder deleted) added its
    runs to the first one's parent run, and the report pooled the two searches as one."""
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    first = _tracker(uri, "trk-twice", "same")
    with pytest.raises(UserError) as info:
        MlflowTracker(uri, "trk-twice", "same").check_reachable(new=True)
    assert str(info.value).startswith("--name: expected a new search name, but MLflow experiment 'trk-twice'")
    assert f"holds a search named 'same' already (parent run {first.parent_id})" in str(info.value)
    MlflowTracker(uri, "trk-twice", "other").check_reachable(new=True)  # another name is new
    resumed = _tracker(uri, "trk-twice", "same")  # a resume finds the search's parent run
    assert resumed.parent_id == first.parent_id


# -- a deleted experiment -----------------------------------------------------------------------------------
@pytest.mark.slow
def test_a_deleted_experiment_is_one_line_that_says_how_to_restore_it(mlflow_server) -> None:
    client = MlflowClient(mlflow_server.uri)
    exp_id = client.create_experiment("trk-deleted")
    client.delete_experiment(exp_id)  # what the MLflow UI's delete does
    tracker = MlflowTracker(mlflow_server.uri, "trk-deleted", "s1")
    with pytest.raises(UserError, match="is deleted: expected an active or new experiment") as info:
        tracker.check_reachable()
    command = re.search(r"`(mlflow experiments restore [^`]+)`", str(info.value))
    assert command is not None
    # the command the line gives works as given
    subprocess.run([sys.executable, "-m", *command.group(1).split()], check=True, capture_output=True,
                   env={**os.environ, "MLFLOW_TRACKING_URI": mlflow_server.uri})
    restored = _tracker(mlflow_server.uri, "trk-deleted")
    assert restored.experiment_id == exp_id


# -- the first use of a fresh SQLite file --------------------------------------------------------------------
_OPEN_AT_ONCE = """
import sys
from tune_as.tracking.tracker import MlflowTracker
print("ready", flush=True)
sys.stdin.readline()  # the barrier: both processes are imported and wait here
MlflowTracker(sys.argv[1], "race", "s").check_reachable()
"""


@pytest.mark.slow
def test_two_processes_opening_a_fresh_sqlite_file_at_once(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'fresh.db'}"
    # files, not pipes: a full pipe would block a child
    logs = [tmp_path / f"opener{i}.log" for i in range(2)]
    procs = []
    for log in logs:
        with open(log, "w") as err:
            procs.append(subprocess.Popen([sys.executable, "-c", _OPEN_AT_ONCE, uri], stdin=subprocess.PIPE,
                                          stdout=subprocess.PIPE, stderr=err, text=True))
    for proc in procs:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    for proc in procs:  # release both together: each then migrates the fresh file, unless serialized
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
    codes = [proc.wait(timeout=600) for proc in procs]
    assert codes == [0, 0], [log.read_text()[-1500:] for log in logs]
    # the file is whole: a third opener finds the schema complete and can write
    client = tracking.open_client(uri)
    client.create_experiment("after-the-race")
    assert {e.name for e in client.search_experiments()} == {"Default", "after-the-race"}


def _away(tracker: MlflowTracker) -> str:
    """Point the tracker at a port where nothing listens (the server is "away"); returns the good URI."""
    good = tracker.uri
    tracker.uri = f"http://127.0.0.1:{free_port()}"
    tracker._client = MlflowClient(tracker.uri)
    return good


@pytest.mark.slow
def test_writes_mlflow_never_took_are_kept_in_the_folder_and_delivered_later(mlflow_server, tmp_path: Path,
                                                                          capsys) -> None:
    """MLflow away from a trial's second result to the end of the search: nothing is dropped. The writes (with
    the files they log) are kept in the search's folder, the search would exit 4 saying so, and `python -m
    tune_as.sync FOLDER` delivers them: the run's metrics in order, its artifact, its status, the parent's
    ranking and status. Delivering again is a no-op; a damaged journal is one line, exit 2."""
    from tune_as import sync
    from tune_as.tracking.tracker import JOURNAL, JOURNAL_FILES, WritesKept

    folder = tmp_path / "search"
    folder.mkdir()
    (folder / schema.SEARCH_STATE_FILE).write_text(json.dumps(
        {"search_id": "kept-1", "experiment": "trk-journal", "mlflow_uri": mlflow_server.uri}))
    tracker = MlflowTracker(mlflow_server.uri, "trk-journal", "kept-1", final_flush_s=0.5, journal_dir=folder)
    tracker.check_reachable()
    tracker.start_search(params={"task": "digits"}, tags={schema.TASK: "digits"})
    tracker.trial_started("t1", {"loss": "softmax", "lr": 0.1}, TAGS)
    tracker.trial_result("t1", {"training_iteration": 1, "val_accuracy": 0.5})
    _away(tracker)
    tracker.trial_result("t1", {"training_iteration": 2, "val_accuracy": 0.6})
    margins = tmp_path / "pmargin.npy"
    margins.write_bytes(b"margins")
    tracker.trial_ended("t1", "FINISHED", artifacts=[margins])
    tracker.trial_started("t2", {"loss": "softmax", "lr": 1.0}, TAGS)  # a run MLflow never saw created
    tracker.trial_ended("t2", "FAILED", error="RuntimeError: diverged")
    ranking = tmp_path / "ranking.md"
    ranking.write_text("| loss |\n")
    tracker.search_artifacts([ranking], {"compute_trial_epochs": 2.0}, {"tune_as.winner": "softmax"})
    assert not tracker.search_ended("FINISHED")
    kept = (folder / JOURNAL).read_text().splitlines()
    assert len(kept) == len(tracker.pending) == 7, kept
    assert sorted(p.name for p in (folder / JOURNAL_FILES).rglob("*") if p.is_file()) == \
        ["pmargin.npy", "ranking.md"]
    assert f"kept in {folder / JOURNAL}" in str(WritesKept(tracker))

    assert sync.main([str(folder)]) == 0
    assert capsys.readouterr().out.strip() == "7 kept writes delivered"
    assert not (folder / JOURNAL).exists() and not (folder / JOURNAL_FILES).exists()
    client = MlflowClient(mlflow_server.uri)
    by_trial = {r.data.tags[schema.TRIAL]: r for r in client.search_runs([str(tracker.experiment_id)])
                if schema.TRIAL in r.data.tags}
    one, two = by_trial["t1"], by_trial["t2"]
    assert [m.value for m in client.get_metric_history(one.info.run_id, "val_accuracy")] == [0.5, 0.6]
    assert one.info.status == "FINISHED" and [a.path for a in client.list_artifacts(one.info.run_id)] == \
        ["pmargin.npy"]
    assert two.info.status == "FAILED" and two.data.params["lr"] == "1.0" and \
        "diverged" in two.data.tags[schema.ERROR]
    parent = client.get_run(str(tracker.parent_id))
    assert parent.info.status == "FINISHED" and parent.data.tags["tune_as.winner"] == "softmax"
    assert [a.path for a in client.list_artifacts(parent.info.run_id)] == ["ranking.md"]

    assert sync.main([str(folder)]) == 0 and "no kept writes" in capsys.readouterr().out
    (folder / JOURNAL).write_text('{"op": "format_disk"}\n')
    assert sync.main([str(folder)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{JOURNAL}:1: expected a tracking write" in err, err
    assert sync.main([str(tmp_path / "nowhere")]) == 2 and \
        "expected a search's folder" in capsys.readouterr().err


def _kept_then_resumed(uri: str, experiment: str, folder: Path,
                       status: str) -> tuple[MlflowTracker, MlflowTracker]:
    """A search whose MLflow went away before trial t1's result and end (kept in `folder`'s journal) and
    ended `status`, and the tracker of its resume (reachable, not started)."""
    first = MlflowTracker(uri, experiment, experiment, final_flush_s=0.2, journal_dir=folder)
    first.check_reachable()
    first.start_search(params={"task": "digits"}, tags={schema.TASK: "digits"})
    first.trial_started("t1", {"loss": "softmax"}, TAGS)
    _away(first)
    first.trial_result("t1", {"training_iteration": 1, "val_accuracy": 0.5})
    first.trial_ended("t1", "FINISHED")
    assert not first.search_ended(status)
    resumed = MlflowTracker(uri, experiment, experiment, final_flush_s=5, journal_dir=folder)
    resumed.check_reachable()
    return first, resumed


@pytest.mark.slow
def test_a_resumed_search_delivers_the_kept_writes_first(mlflow_server, tmp_path: Path) -> None:
    """`--resume` of a search that kept writes: its tracker queues the journal before its own writes (leaving
    out the journal's end of the search: the resumed search ends its parent itself), and the journal is gone
    once everything is delivered."""
    from tune_as.tracking.tracker import JOURNAL

    first, resumed = _kept_then_resumed(mlflow_server.uri, "trk-resume-journal", tmp_path, "KILLED")
    assert (tmp_path / JOURNAL).is_file()
    assert resumed.start_search(params={}, tags={}) == first.parent_id
    assert resumed.replay(skip_search_end=True) == 2 and resumed.pending[0][1]["op"] == "result"
    resumed.trial_started("t2", {"loss": "softmax"}, TAGS)  # the resumed search's own writes come after
    resumed.trial_ended("t2", "FINISHED")
    assert resumed.search_ended("FINISHED") and not (tmp_path / JOURNAL).exists()
    client = MlflowClient(mlflow_server.uri)
    runs = {r.data.tags[schema.TRIAL]: r for r in client.search_runs([str(resumed.experiment_id)])
            if schema.TRIAL in r.data.tags}
    assert runs["t1"].info.status == "FINISHED" and runs["t1"].data.metrics["val_accuracy"] == 0.5
    assert client.get_run(str(first.parent_id)).info.status == "FINISHED"


@pytest.mark.slow
def test_a_kept_write_delivered_on_resume_is_no_trial_left_running(mlflow_server, tmp_path: Path) -> None:
    """Issue 70, case 5: `--resume` after exit 4 turned a FINISHED search KILLED (exit 130). The kept result
    of a trial the resumed driver never started was delivered before its kept end, and in between the trial
    counted as running (`unfinished`), which the search takes for an interruption. A replayed write is no
    running trial."""
    _, resumed = _kept_then_resumed(mlflow_server.uri, "trk-resume-running", tmp_path, "FINISHED")
    resumed.start_search(params={}, tags={})
    assert resumed.replay(skip_search_end=True) == 3  # t1's result and end, the orphans' check
    _, op = resumed.pending.popleft()
    assert op["op"] == "result"
    resumed._execute(op)  # delivered; its end is not yet
    assert resumed.unfinished() == [], "a trial of the journal counts as running"
    assert resumed.search_ended("FINISHED")
    client = MlflowClient(mlflow_server.uri)
    runs = [r for r in client.search_runs([str(resumed.experiment_id)]) if schema.TRIAL in r.data.tags]
    assert [r.info.status for r in runs] == ["FINISHED"]


def test_writes_that_cannot_be_kept_either_are_said_to_be_lost(tmp_path: Path) -> None:
    """The journal's folder cannot be written (here: a file where the folder should be; a full disk is the
    same OSError): one error, no traceback, and the exit-4 line says the writes are lost, not kept."""
    from tune_as.tracking.tracker import WritesKept

    (tmp_path / "search").write_text("a file, not a folder")
    tracker = MlflowTracker("http://127.0.0.1:5000", "e", "s", journal_dir=tmp_path / "search")
    tracker.pending.append(("end of search", {"op": "search_end", "status": "FINISHED"}))
    assert tracker.keep() is None and tracker.unkept is not None and "NotADirectoryError" in tracker.unkept
    message = str(WritesKept(tracker))
    assert message.startswith("MLflow: 1 writes could not be delivered to http://127.0.0.1:5000, and could "
                              "not be kept in the search's folder either (NotADirectoryError") and \
        message.endswith("lost")


def test_the_ui_line_opens_the_runs_table_of_the_experiment(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """MLflow 3.17 opens an experiment on its GenAI overview whatever its kind tag says: the printed address
    names the runs page, in the search's saved view; a store under the working folder is named as a person
    would type it."""
    monkeypatch.chdir(tmp_path)
    page = "#/experiments/7/runs?viewStateShareKey=digits-1"
    assert schema.ui_line("http://127.0.0.1:5000/", "7", "digits-1") == f"MLflow UI: http://127.0.0.1:5000/{page}"
    assert schema.ui_line(f"sqlite:///{tmp_path}/runs/m.db", "7", "digits-1").splitlines() == [
        "MLflow UI: mlflow ui --backend-store-uri sqlite:///runs/m.db",
        f"  then open http://127.0.0.1:5000/{page}"]
    assert schema.ui_line("sqlite:////elsewhere/m.db", "7", "digits-1").splitlines()[0].endswith(
        "sqlite:////elsewhere/m.db")
    assert schema.view_key("digits-1", grouped=True) == "digits-1-by-loss"


def test_headline_metrics_are_logged_again_in_percent_and_readers_see_the_fractions() -> None:
    """A person reads 93.21 where the answer says 93.21; the search and the report read the fractions they
    always read: `fractions` leaves out exactly what `with_percent` added."""
    result = {"best_val_accuracy": 0.9320588, "test_accuracy": 0.9, "best_val_macro_f1": 0.5,
              "val_accuracy": 0.91, "val_loss": 0.3, "epoch": 2.0, "error": None}
    shown = schema.with_percent(result)
    assert {k: v for k, v in shown.items() if k not in result} == {
        "best_val_accuracy_pct": 93.21, "test_accuracy_pct": 90.0, "best_val_macro_f1_pct": 50.0}
    assert schema.fractions(shown) == result
    assert schema.with_percent(shown) == shown  # a copy is never copied again
    assert [k for k in schema.with_percent({"val_loss": 0.3, "epoch": 1.0})] == ["val_loss", "epoch"]


def test_a_searchs_saved_views_show_loss_metric_in_percent_and_setting(tmp_path: Path) -> None:
    """The runs table's columns come from the experiment's saved views (MLflow's own JSON: a name, times, and
    the state as a string); a confirmed search adds its confirmation runs grouped by loss."""
    from tune_as.tracking import views

    client = MlflowClient(f"sqlite:///{tmp_path / 'm.db'}")
    experiment = client.create_experiment("views")
    views.save(client, experiment, "digits-1", "accuracy", confirmed=True)
    tags = client.get_experiment(experiment).tags
    assert sorted(tags) == [schema.VIEW_TAG_PREFIX + "digits-1", schema.VIEW_TAG_PREFIX + "digits-1-by-loss"]
    saved = json.loads(tags[schema.VIEW_TAG_PREFIX + "digits-1"])
    assert saved["name"] == "digits-1: runs, accuracy %" and isinstance(saved["createdAt"], int)
    state = json.loads(saved["state"])
    assert state["selectedColumns"] == ["metrics.`best_val_accuracy_pct`", "metrics.`test_accuracy_pct`",
                                        "tags.`tune_as.setting`", "tags.`tune_as.role`",
                                        "tags.`tune_as.stopped_early`"]
    assert state["searchFilter"] == "tags.`tune_as.search_id` = 'digits-1'"
    assert (state["orderByKey"], state["orderByAsc"]) == ("metrics.`best_val_accuracy_pct`", False)
    grouped = json.loads(json.loads(tags[schema.VIEW_TAG_PREFIX + "digits-1-by-loss"])["state"])
    assert grouped["groupBy"] == {"aggregateFunction": "average",
                                  "groupByKeys": [{"mode": "tag", "groupByData": "tune_as.loss"}]}
    assert grouped["searchFilter"].endswith("and tags.`tune_as.role` = 'confirmation'")
    assert list(views.states("digits-2", "f1", confirmed=False)) == ["digits-2"]


def test_the_database_file_of_a_store_uri() -> None:
    assert schema.sqlite_file("sqlite:////data/m.db") == Path("/data/m.db")
    assert schema.sqlite_file("sqlite:///m.db?mode=ro") == Path("m.db")
    assert schema.sqlite_file("sqlite:///:memory:") is None and schema.sqlite_file("sqlite:///") is None
    assert schema.sqlite_file("http://127.0.0.1:5000") is None and \
        schema.sqlite_file("postgresql://h/db") is None


def test_sync_refuses_a_saved_state_without_where_the_runs_are(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """tune_as.sync reads search_id, experiment and mlflow_uri of a saved state: another shape is one line,
    exit 2."""
    from tune_as import sync

    (tmp_path / schema.SEARCH_STATE_FILE).write_text(
        json.dumps({"search_id": 3, "experiment": "e", "mlflow_uri": None}))
    assert sync.main([str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: {tmp_path / schema.SEARCH_STATE_FILE}: search_id: expected a JSON string, got "
                   "'3' (the saved state is damaged: restore it)"], err
