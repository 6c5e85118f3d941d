"""Fault injection for the reliability tests, plugged into trials through tune_as's trial hook
(TUNE_AS_TRIAL_HOOK=faults:hook, with this folder on PYTHONPATH). Inert unless TUNE_AS_FAULT_DIR is set.

After every report of a trial, in the worker:
- writes the worker's pid to `<dir>/pid_<trial id>`;
- with TUNE_AS_BLOCK_ONCE=1, blocks (forever) after the first report of the search, once: the test then
  SIGKILLs a worker that is certainly alive and certainly between two evaluation points (no sleep, no race);
- with TUNE_AS_FAIL_AT_EPOCH=E, raises after a report at epoch >= E, at most TUNE_AS_FAIL_TIMES times per
  trial (default 1), only for loss TUNE_AS_FAIL_LOSS if set.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

from ray import tune


def hook(metrics: dict[str, Any], loss: str) -> None:
    if not os.environ.get("TUNE_AS_FAULT_DIR"):
        return
    where = Path(os.environ["TUNE_AS_FAULT_DIR"])
    trial_id = tune.get_context().get_trial_id()
    (where / f"pid_{trial_id}").write_text(str(os.getpid()))
    if os.environ.get("TUNE_AS_BLOCK_ONCE") and not (where / "blocked").exists():
        (where / "blocked").touch()
        (where / "ready_to_kill").write_text(str(os.getpid()))
        threading.Event().wait()  # until the test kills this process
    at, only = os.environ.get("TUNE_AS_FAIL_AT_EPOCH"), os.environ.get("TUNE_AS_FAIL_LOSS")
    if not at or metrics.get("epoch", 0) < float(at) or (only and only != loss):
        return
    done = len(list(where.glob(f"fault_{trial_id}_*")))
    if done < int(os.environ.get("TUNE_AS_FAIL_TIMES", "1")):
        (where / f"fault_{trial_id}_{done}").touch()
        raise RuntimeError(f"injected failure {done + 1} (TUNE_AS_FAIL_AT_EPOCH={at})")
