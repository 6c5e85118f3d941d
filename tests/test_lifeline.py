"""A cluster's head lost under a search (tune_as/engine/lifeline.py), for real: a two-node `ray start` cluster
on this machine (tests/test_cluster_path.py), its head SIGKILLed mid-search, then started again and the search
resumed with the command it printed."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from test_cluster_path import _stop_session, started
from test_reliability import finish, runs, start_cli, stop, wait_for

from tune_as.engine.head import session_members
from tune_as.results.answer import AnswerRecord

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

EXITED_WITHIN_S = 15.0


def test_a_lost_cluster_head_ends_the_search_in_seconds_and_the_resume_completes_it(tmp_path: Path) -> None:
    """The head's processes SIGKILLed while a trial is certainly running (blocked after its first report,
    tests/faults.py): the driver, which Ray would keep 60 s and then end from C++ (exit 1, runs RUNNING, no
    line of ours), exits within seconds with the interrupted code, Ray's lost head named once, the resume line
    once, every run closed. With the head back, the printed command resumes it to the whole answer: every loss
    searched and confirmed on its 2 seeds, every run FINISHED."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"  # MLflow is not the subject: one writer, the driver
    with started(hooks={}) as cluster:
        faults_dir = cluster.temp_dir / "faults"
        proc = start_cli(tmp_path, uri, [
            "--losses", "softmax,as_softmax", "--trials-per-loss", "1", "--max-epochs", "1", "--confirm", "2",
            "--seeds-per-trial", "2", "--experiment", "lost-head", "--name", "lost-head"],
            env={**cluster.env(), "TUNE_AS_BLOCK_ONCE": "1"}, address=cluster.address)
        try:
            # a trial certainly mid-run: blocked after its first report, which the driver has logged
            wait_for(lambda: (faults_dir / "ready_to_kill").exists() or proc.poll() is not None, 300,
                     "a trial's first report")
            wait_for(lambda: any(c.data.metrics for c in runs(uri, "lost-head")[1])
                     or proc.poll() is not None, 120, "the trial's first result in MLflow")
            assert proc.poll() is None, finish(proc)[1][-3000:]
            head = cluster.nodes[0]
            lost = time.monotonic()
            for pid in session_members(head.pid):
                os.kill(pid, signal.SIGKILL)
            code, out = finish(proc, timeout=90)  # Ray's own wait for a lost GCS is 60 s
            took = time.monotonic() - lost
        finally:
            stop(proc)
        print(f"head SIGKILLed -> driver exited in {took:.1f} s")
        assert code == 130, out[-3000:]
        assert took < EXITED_WITHIN_S, f"{took:.1f} s to give up on a lost head:\n{out[-3000:]}"
        # the GCS's address as Ray resolved it: the machine's IP
        lost_line = [line for line in out.splitlines() if line.startswith("Ray: the cluster's head at ")]
        assert len(lost_line) == 1 and f":{cluster.gcs_port} stopped answering (" in lost_line[0], out[-3000:]
        assert out.count("resume with:") == 1, out[-3000:]
        for ray_voice in ("Traceback", "Failed to connect to GCS", "Tuner.restore"):
            assert ray_voice not in out, out[-3000:]
        parents, trials = runs(uri, "lost-head")
        assert [p.info.status for p in parents] == ["KILLED"]
        assert trials and {t.info.status for t in trials} <= {"KILLED", "FINISHED"}, \
            [t.info.status for t in trials]
        assert any(t.info.status == "KILLED" for t in trials)

        # the head back on its port; the second node, whose raylet belongs to the lost head's cluster, too
        head.wait()
        _stop_session(cluster.nodes[1])
        del cluster.nodes[:2]
        cluster.start_head()
        cluster.add_node('--resources={"node_b": 1}')
        hint = shlex.split(out.split("resume with:", 1)[1].strip().splitlines()[0])
        assert hint[:3] == ["python", "-m", "tune_as.search"] and "--address" in hint, hint
        env = {**os.environ, **cluster.env(), "TUNE_AS_CACHE": str(tmp_path / "cache")}  # as start_cli's
        resumed = subprocess.run([sys.executable, *hint[1:]], cwd=tmp_path, env=env, capture_output=True,
                                 text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    parents, trials = runs(uri, "lost-head")
    assert [p.info.status for p in parents] == ["FINISHED"]
    assert sorted(t.data.tags["tune_as.loss"] for t in trials) == ["as_softmax", "softmax"]
    assert {t.info.status for t in trials} == {"FINISHED"}, [t.info.status for t in trials]
    client = MlflowClient(uri)
    record = AnswerRecord.from_json(Path(client.download_artifacts(parents[0].info.run_id, "answer.json",
                                                                   str(tmp_path))).read_text())
    assert len(record.trials) == 2 and all(record.trials.values()), record.trials  # each ran its epoch
    assert record.race is not None and record.race.seeds == (1, 2) and len(record.rounds) == 1
    confirmations = client.search_runs([parents[0].info.experiment_id],
                                       "tags.`tune_as.role` = 'confirmation'", max_results=100)
    seeds = sorted((r.data.tags["tune_as.loss"], r.data.params["seed"], r.info.status) for r in confirmations)
    assert seeds == [(loss, seed, "FINISHED") for loss in ("as_softmax", "softmax") for seed in ("1", "2")]
