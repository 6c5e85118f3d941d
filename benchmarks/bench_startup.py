"""How long a local search takes to say something and to start its first trial (issue 34, "Start-up").

    python benchmarks/bench_startup.py                      # 3 runs of a small digits search, this checkout
    python benchmarks/bench_startup.py --checkout ../before --runs 3

Each run launches `python -m tune_as.search --task digits --losses softmax,as_softmax --trials-per-loss 1
--max-epochs 1` as a new process (a fresh results folder and a new SQLite MLflow store each time: what a newcomer
meets) from --checkout (its own tune_as first on the path), and measures from the launch: the first line it
prints (stdout or stderr), and the start of its first trial (the earliest start time of the search's child runs
in MLflow, which the driver opens as Tune starts a trial), and the whole process. Printed per run and the
minimum; the load average is printed with each run (run it alone).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
COMMAND = ["--task", "digits", "--losses", "softmax,as_softmax", "--trials-per-loss", "1", "--max-epochs", "1"]


def one_run(checkout: Path, extra: list[str]) -> tuple[float, float, float]:
    """(first line, first trial, whole process) seconds after the launch."""
    from mlflow import MlflowClient

    with tempfile.TemporaryDirectory() as tmp:
        uri = f"sqlite:///{tmp}/mlflow.db"
        env = {**os.environ, "PYTHONPATH": str(checkout), "PYTHONUNBUFFERED": "1"}
        launch_wall, launch = time.time(), time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-m", "tune_as.search", *COMMAND, *extra, "--storage-path",
                                 f"{tmp}/results", "--mlflow-uri", uri], cwd=checkout, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        first: list[float] = []

        def read() -> None:
            assert proc.stdout is not None
            for _ in iter(proc.stdout.readline, b""):
                if not first:
                    first.append(time.perf_counter() - launch)

        reader = threading.Thread(target=read)
        reader.start()
        code = proc.wait(timeout=600)
        whole = time.perf_counter() - launch
        reader.join()
        if code != 0:
            sys.exit(f"bench_startup: the search exited {code}")
        client = MlflowClient(uri)
        runs = client.search_runs([e.experiment_id for e in client.search_experiments()],
                                  "tags.`tune_as.role` = 'trial'")
        trial = min(r.info.start_time for r in runs) / 1000 - launch_wall
        return first[0], trial, whole


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkout", type=Path, default=REPO)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("extra", nargs="*", help="more options for the search (e.g. --no-dashboard)")
    args = parser.parse_args()
    print(f"# bench_startup: {args.checkout.resolve()}; {' '.join(COMMAND + args.extra)}")
    print(f"{'run':>3} {'load':>5} {'first line s':>13} {'first trial s':>14} {'whole s':>8}")
    results = []
    for i in range(args.runs):
        load = os.getloadavg()[0]
        results.append(one_run(args.checkout.resolve(), args.extra))
        print(f"{i + 1:>3} {load:>5.2f} {results[-1][0]:>13.2f} {results[-1][1]:>14.2f} {results[-1][2]:>8.2f}",
              flush=True)
    best = [min(r[k] for r in results) for k in range(3)]
    print(f"min       {best[0]:>13.2f} {best[1]:>14.2f} {best[2]:>8.2f}")


if __name__ == "__main__":
    main()
