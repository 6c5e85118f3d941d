"""Load: a long `--smoke` search (default 200 trials, 2 concurrent) through the real CLI.

Measures the driver's memory (RSS sampled every second) from its first trial result to the end, counts the
MLflow child runs, and splits wall time into trial time (train + eval, from the results) and overhead.

    python benchmarks/bench_load.py [--trials 200] [--concurrent 2] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mlflow.tracking import MlflowClient


def rss_bytes(pid: int) -> int:
    """Resident memory of a process (Linux /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise ProcessLookupError(pid)


DATA = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "clinc_oos"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=200)
    ap.add_argument("--concurrent", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tune_as_load_"))
    uri = f"sqlite:///{work / 'mlflow.db'}"
    cmd = [sys.executable, "-m", "tune_as.search", "--task", "clinc_oos", "--smoke", "--losses", "softmax,as_softmax",
           "--trials-per-loss", str(args.trials // 2), "--max-concurrent", str(args.concurrent), "--name", "load",
           "--storage-path", str(work / "results"), "--mlflow-uri", uri, "--experiment", "load"]
    if DATA.is_dir():
        cmd += ["--data-dir", str(DATA)]
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "TUNE_AS_CACHE": str(work / "cache")}
    start = time.monotonic()
    with open(work / "driver.log", "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        samples: list[tuple[float, int]] = []
        while proc.poll() is None:
            try:
                samples.append((time.monotonic() - start, rss_bytes(proc.pid)))
            except (OSError, ProcessLookupError):
                break
            time.sleep(1.0)
    wall = time.monotonic() - start
    if proc.returncode != 0:
        sys.exit(f"search failed (exit {proc.returncode}); log: {work / 'driver.log'}")
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("load")
    runs = client.search_runs([exp.experiment_id], max_results=5000)
    children = [r for r in runs if r.data.tags.get("tune_as.role") == "trial"]
    trial_busy = sum(r.data.metrics.get("train_seconds", 0) + r.data.metrics.get("eval_seconds", 0) for r in children)
    # growth over the run, after Ray, data and the first trials are up (the first minute)
    steady = [rss for t, rss in samples if t > 60] or [rss for _, rss in samples]
    growth = (max(steady) - steady[0]) / 2**20
    figures = {
        "trials_requested": args.trials, "child_runs": len(children),
        "finished": sum(r.info.status == "FINISHED" for r in children), "wall_s": round(wall, 1),
        "wall_per_trial_s": round(wall / max(1, len(children)), 2),
        "overhead_per_trial_s": round((wall * args.concurrent - trial_busy) / max(1, len(children)), 2),
        "driver_rss_start_mb": round(steady[0] / 2**20), "driver_rss_max_mb": round(max(steady) / 2**20),
        "driver_rss_growth_mb": round(growth, 1),
    }
    if args.json:
        print(json.dumps(figures))
        return
    for key, value in figures.items():
        print(f"{key:24s} {value}")
    ok = len(children) == args.trials and growth < 200
    print(f"\nexactly {args.trials} child runs and driver growth < 200 MB: {'PASS' if ok else 'FAIL'}")


if __name__ == "__main__":
    main()
