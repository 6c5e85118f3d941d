"""Trials at a time (tune_as/engine/concurrency.py): the rule, and a real cluster that grows mid-search."""

from __future__ import annotations

import time
from pathlib import Path

import faults
import pytest
from ray.tune.search import ConcurrencyLimiter
from test_cluster_path import started
from test_reliability import finish, runs, start_cli, stop, wait_for

from tune_as.engine.concurrency import MOST, fits, limited
from tune_as.engine.searcher import FixedConfigs
from tune_as.tracking import schema

CPU_TRIAL, GPU_TRIAL = {"cpu": 1.0, "gpu": 0.0}, {"cpu": 1.0, "gpu": 0.5}


@pytest.mark.parametrize(("total", "res", "expected"), [
    ({"CPU": 3.0}, CPU_TRIAL, 3),
    ({"CPU": 3.0}, {"cpu": 2.0, "gpu": 0.0}, 1),  # whole trials only
    ({"CPU": 0.5}, CPU_TRIAL, 1),  # at least one: Ray queues it until it fits
    ({"CPU": 64.0}, CPU_TRIAL, MOST),
    ({"CPU": 64.0, "GPU": 2.0}, GPU_TRIAL, 4),  # GPU trials are counted by GPUs
    ({"CPU": 64.0, "GPU": 2.0}, CPU_TRIAL, MOST),  # CPU trials by CPUs, GPUs or not
    ({}, CPU_TRIAL, 1),
], ids=["cpus", "whole", "one", "capped", "gpus", "cpu-trials", "empty"])
def test_a_cluster_holds_as_many_trials_as_fit(total: dict[str, float], res: dict[str, float],
                                               expected: int) -> None:
    assert fits(total, res) == expected


def test_max_concurrent_fixes_the_limit_whatever_the_cluster() -> None:
    searcher = FixedConfigs([{"loss": "softmax"}], "best_val_accuracy")
    chosen = limited(searcher, 3, CPU_TRIAL)
    assert type(chosen) is ConcurrencyLimiter and chosen.max_concurrent == 3
    assert searcher.max_concurrent == 3  # the searcher counts its own live trials against it


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_node_that_joins_mid_search_gets_a_trial(tmp_path: Path) -> None:
    """A one-node cluster (one CPU) runs a search of two one-CPU trials: the first holds at its first report
    (tests/faults.py) while a second node joins (`ray start --address`). The second trial then starts, on the
    new node, while the first still holds: with the limit read once (one trial at a time) it never did."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    release = tmp_path / "release"
    with started(nodes=1, hooks={}) as cluster:
        faults_dir = cluster.temp_dir / "faults"
        proc = start_cli(tmp_path, uri, [
            "--losses", "softmax,as_softmax", "--trials-per-loss", "1", "--max-epochs", "1",
            "--experiment", "grows", "--name", "grows"],
            env={**cluster.env(), "TUNE_AS_HOLD_UNTIL": str(release)}, address=cluster.address)
        try:
            wait_for(lambda: (faults_dir / "holding").exists() or proc.poll() is not None, 300,
                     "the first trial's first report")
            assert proc.poll() is None, finish(proc)[1][-3000:]
            cluster.add_node()
            joined = time.monotonic()
            (new_node,) = [n["node_id"] for n in cluster.alive_nodes() if not n["is_head_node"]]
            wait_for(lambda: len(faults.trial_order(faults_dir, "search")) == 2 or proc.poll() is not None,
                     180, "the second trial's first report, on the new node")
            print(f"node alive -> its trial's first report in {time.monotonic() - joined:.1f} s")
            release.touch()
            code, out = finish(proc)
        finally:
            release.touch()
            stop(proc)
    assert code == 0, out[-3000:]
    _, trials = runs(uri, "grows")
    nodes = sorted(t.data.tags[schema.NODE] for t in trials)
    assert len(nodes) == 2 and new_node in nodes and len(set(nodes)) == 2, (nodes, new_node)

