"""Fault injection for the reliability tests, plugged into trials through tune_as's trial hook
(TUNE_AS_TRIAL_HOOK=faults:hook, with this folder on PYTHONPATH). Inert unless TUNE_AS_FAULT_DIR is set.

After every report of a trial, in the worker:
- writes the worker's pid to `<dir>/pid_<trial id>`, and appends the report to `<dir>/reports.jsonl` (one JSON
  line: experiment, trial_id, loss, epoch): what a test reads to count the epochs every trial trained;
- with TUNE_AS_BLOCK_ONCE=1, blocks (forever) after the first report of the search, once: the test then
  SIGKILLs a worker that is certainly alive and certainly between two evaluation points (no sleep, no race);
- with TUNE_AS_BLOCK_IN=EXPERIMENT:K (e.g. confirm-2:3), blocks the same way, once, at the first report of the
  K-th trial to report in the Tune experiment EXPERIMENT (the order of first lines in reports.jsonl): its
  whole name, or its kind (`search`, `confirm`, `confirm-2`, ...: the name before its search's token,
  engine.state.new_token);
- with TUNE_AS_HOLD_UNTIL=PATH, holds the first report of the search, once, until PATH exists (a test does
  something to the search's world meanwhile, e.g. fills its disk), then lets the trial go on;
- with TUNE_AS_MEET=N, holds the first report of each of the first N trials until N trials have reported (they
  then certainly run at once: on a cluster of N one-CPU nodes, one on each); a trial still alone after
  MEET_TIMEOUT_S raises, so a search that cannot run N trials at once fails instead of hanging;
- with TUNE_AS_FAIL_AT_EPOCH=E, raises after a report at epoch >= E, at most TUNE_AS_FAIL_TIMES times per
  trial (default 1), only for loss TUNE_AS_FAIL_LOSS if set.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

from ray import tune

REPORTS = "reports.jsonl"


def reports(where: Path) -> list[dict[str, Any]]:
    """Every report the hook saw, in order."""
    path = where / REPORTS
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _block_once(where: Path) -> None:
    try:
        (where / "blocked").open("x").close()  # exclusive create: one trial of all the workers blocks
    except FileExistsError:
        return
    (where / "ready_to_kill").write_text(str(os.getpid()))
    threading.Event().wait()  # until the test kills this process


def _hold_once(where: Path, until: Path) -> None:
    try:
        (where / "held").open("x").close()  # exclusive create: one report of all the workers is held
    except FileExistsError:
        return
    (where / "holding").write_text(str(os.getpid()))
    while not until.exists():  # a condition the test makes true; a short wait between looks
        threading.Event().wait(0.05)


def kind(experiment: str) -> str:
    """A Tune experiment's name before its search's token: `confirm-2` of `confirm-2.0123abcd`
    (engine.state)."""
    return experiment.split(".", 1)[0]


def trial_order(where: Path, experiment: str) -> list[str]:
    """The trials of a Tune experiment (its name, or its kind: `kind`) in the order of their first report."""
    return list(dict.fromkeys(row["trial_id"] for row in reports(where)
                              if experiment in (row["experiment"], kind(row["experiment"]))))


def _kth_in(where: Path, experiment: str, k: int, trial_id: str) -> bool:
    order = trial_order(where, experiment)
    return len(order) >= k and order[k - 1] == trial_id


MEET_TIMEOUT_S = 300.0


def _meet(where: Path, experiment: str, trial_id: str, n: int) -> None:
    order = trial_order(where, experiment)
    if trial_id not in order[:n]:
        return
    deadline = time.monotonic() + MEET_TIMEOUT_S
    while len(trial_order(where, experiment)) < n:  # a condition the other trials make true
        if time.monotonic() > deadline:
            raise RuntimeError(f"TUNE_AS_MEET={n}: expected {n} trials running at once, got "
                               f"{len(trial_order(where, experiment))} after {MEET_TIMEOUT_S:g} s")
        threading.Event().wait(0.05)


def hook(metrics: dict[str, Any], loss: str) -> None:
    if not os.environ.get("TUNE_AS_FAULT_DIR"):
        return
    where = Path(os.environ["TUNE_AS_FAULT_DIR"])
    context = tune.get_context()
    trial_id, experiment = context.get_trial_id(), context.get_experiment_name()
    (where / f"pid_{trial_id}").write_text(str(os.getpid()))
    row = {"experiment": experiment, "trial_id": trial_id, "loss": loss, "epoch": metrics.get("epoch", 0.0)}
    # one short write in append mode: lines of workers never interleave
    with open(where / REPORTS, "a") as out:
        out.write(json.dumps(row) + "\n")
    if os.environ.get("TUNE_AS_BLOCK_ONCE"):
        _block_once(where)
    hold = os.environ.get("TUNE_AS_HOLD_UNTIL")
    if hold:
        _hold_once(where, Path(hold))
    meet = os.environ.get("TUNE_AS_MEET")
    if meet:
        _meet(where, experiment, trial_id, int(meet))
    block_in = os.environ.get("TUNE_AS_BLOCK_IN")
    if block_in:
        name, _, k = block_in.rpartition(":")
        if _kth_in(where, name, int(k), trial_id):
            _block_once(where)
    at, only = os.environ.get("TUNE_AS_FAIL_AT_EPOCH"), os.environ.get("TUNE_AS_FAIL_LOSS")
    if not at or metrics.get("epoch", 0) < float(at) or (only and only != loss):
        return
    done = len(list(where.glob(f"fault_{trial_id}_*")))
    if done < int(os.environ.get("TUNE_AS_FAIL_TIMES", "1")):
        (where / f"fault_{trial_id}_{done}").touch()
        raise RuntimeError(f"injected failure {done + 1} (TUNE_AS_FAIL_AT_EPOCH={at})")
