"""MlflowTracker against a real `mlflow server`: replayed results, driver restarts, outages, orphaned runs."""

from __future__ import annotations

from pathlib import Path

from conftest import free_port
from mlflow.tracking import MlflowClient

from tune_as import tracking
from tune_as.tracking import MlflowTracker

TAGS = {tracking.ROLE: "trial", tracking.LOSS: "softmax"}


def _tracker(uri: str, experiment: str, search_id: str = "s1") -> MlflowTracker:
    t = MlflowTracker(uri, experiment, search_id, final_flush_s=5)
    t.check_reachable()
    t.start_search(params={"task": "digits"}, tags={tracking.TASK: "digits"})
    return t


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
    assert second.search_ended("FINISHED")
    client = MlflowClient(mlflow_server.uri)
    (run,) = [r for r in client.search_runs([second.experiment_id]) if r.data.tags.get(tracking.ROLE) == "trial"]
    assert [m.step for m in client.get_metric_history(run.info.run_id, "val_accuracy")] == [1, 2, 3, 4]
    assert run.info.status == "FINISHED" and run.data.params["lr"] == "0.1"


def test_orphaned_run_of_a_killed_driver_is_closed_and_hidden(mlflow_server) -> None:
    killed = _tracker(mlflow_server.uri, "trk-orphan")
    killed.trial_started("lost", {"loss": "softmax"}, TAGS)  # Ray never saved this trial before the kill
    killed.trial_started("kept", {"loss": "softmax"}, TAGS)
    resumed = _tracker(mlflow_server.uri, "trk-orphan")
    resumed.trial_started("kept", {"loss": "softmax"}, TAGS)
    resumed.trial_ended("kept", "FINISHED")
    assert resumed.search_ended("FINISHED")
    client = MlflowClient(mlflow_server.uri)
    visible = [r for r in client.search_runs([resumed.experiment_id]) if r.data.tags.get(tracking.ROLE) == "trial"]
    assert [r.data.tags[tracking.TRIAL] for r in visible] == ["kept"]
    lost = client.get_run(killed.runs["lost"])
    assert lost.info.status == "KILLED" and lost.info.lifecycle_stage == "deleted"
    assert "killed driver" in lost.data.tags["tune_as.orphaned"]


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
    run = client.get_run(tracker.runs["t1"])
    assert run.info.status == "FINISHED"
    assert [m.value for m in client.get_metric_history(run.info.run_id, "val_accuracy")] == [0.5, 0.6]


def test_unreachable_database_fails_in_seconds_without_the_password() -> None:
    tracker = MlflowTracker(f"postgresql+psycopg2://u:pw123@127.0.0.1:{free_port()}/db", "x", "s")
    try:
        tracker.check_reachable()
    except tracking.UserError as exc:
        assert "pw123" not in str(exc) and "expected a reachable database" in str(exc)
    else:
        raise AssertionError("an unreachable database was accepted")
