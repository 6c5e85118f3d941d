"""Where a local search's first seconds go, phase by phase (issue 34, "Start-up"; docs/benchmarks.md).

    python benchmarks/startup_phases.py                 # the start-up search of bench_startup.py
    python benchmarks/startup_phases.py -- --task digits --losses softmax --trials-per-loss 1 --max-epochs 1

Runs the search CLI (`tune_as.search.main`) in this process with a line on stderr as each phase begins and ends:
wall seconds since this script started and the driver's own CPU seconds (its threads together). The phases are
the CLI's own functions, wrapped by name: the imports, the head's start (`Head.wait_ready`), `init_ray`, the
tracking store's opening (in its thread), Tune's first `fit` and the trials' starts (`on_trial_start`, the driver's
side of a trial's start). A fresh results folder and SQLite store each run (what a newcomer meets); run it alone.
bench_startup.py times the same search from outside the process, without wrappers.
"""

from __future__ import annotations

import functools
import sys
import tempfile
import time
from typing import Any

T0 = time.perf_counter()
DEFAULT = ["--task", "digits", "--losses", "softmax,as_softmax", "--trials-per-loss", "1", "--max-epochs", "1",
           "--no-dashboard"]


def stamp(what: str) -> None:
    print(f"[{time.perf_counter() - T0:6.2f} s wall, {time.process_time():5.2f} s driver CPU] {what}",
          file=sys.stderr, flush=True)


def wrap(owner: Any, name: str, label: str) -> None:
    inner = getattr(owner, name)

    @functools.wraps(inner)
    def stamped(*args: Any, **kwargs: Any) -> Any:
        stamp(f"{label} begins")
        try:
            return inner(*args, **kwargs)
        finally:
            stamp(f"{label} ends")

    setattr(owner, name, stamped)


def main() -> int:
    argv = sys.argv[sys.argv.index("--") + 1:] if "--" in sys.argv else DEFAULT
    stamp("started")
    from tune_as import search
    from tune_as.engine import head

    wrap(head.Head, "wait_ready", "the head's start (waited for)")
    plain_search = search._search

    def instrumented(*args: Any, **kwargs: Any) -> Any:
        stamp("the arguments are checked; imports begin")
        from tune_as.engine import cluster

        cluster.loopback_ray(None)  # what search._search does first: before anything imports Ray
        stamp("`import ray` done")
        from tune_as.engine import callbacks, run
        from tune_as.tracking import tracker

        stamp("the driver's imports done")
        wrap(cluster, "init_ray", "init_ray")
        wrap(tracker.MlflowTracker, "check_reachable", "the tracking store's opening")
        wrap(run, "_fit", "a Tuner's fit")
        wrap(callbacks.MlflowCallback, "on_trial_start", "on_trial_start")
        return plain_search(*args, **kwargs)

    search._search = instrumented
    with tempfile.TemporaryDirectory() as tmp:
        where = ["--storage-path", f"{tmp}/results", "--mlflow-uri", f"sqlite:///{tmp}/mlflow.db"]
        code = search.main([*argv, *where])
    stamp(f"the search returned {code}")
    return code


if __name__ == "__main__":
    sys.exit(main())
