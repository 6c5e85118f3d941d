"""Time `Task.prepare` for clinc_oos with the offline MiniLM encoder in frozen mode: cold (tokenize + encode
every split, write the cache) vs warm (read the cache), the path every Ray trial takes.

    HF_HUB_OFFLINE=1 python benchmarks/bench_data.py [--data-dir ../shared/data/clinc_oos] [--warm-runs 5]

Prints one JSON line and a Markdown table row. Target: warm >= 20x faster than cold.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

from tune_as.tasks import DataSettings, build_task, prepare

REPO = Path(__file__).resolve().parent.parent


def run(data_dir: Path, max_length: int, warm_runs: int, backbone: str) -> dict[str, float | int | str]:
    task = build_task("clinc_oos")
    load_before = os.getloadavg()[0]  # other processes on the machine slow the cold path down: report it
    with tempfile.TemporaryDirectory() as cache:
        spec = DataSettings("clinc_oos", data_dir=data_dir, backbone=backbone, encoder="frozen",
                        max_length=max_length, cache_dir=Path(cache))
        start = time.perf_counter()
        data = prepare(task, spec)
        cold = time.perf_counter() - start
        warm = []
        for _ in range(warm_runs):
            start = time.perf_counter()
            again = prepare(task, spec)
            warm.append(time.perf_counter() - start)
        assert torch.equal(data.train.columns["features"], again.train.columns["features"])
        cache_bytes = sum(p.stat().st_size for p in Path(cache).iterdir())
    rows = len(data.train) + len(data.validation) + (len(data.test) if data.test is not None else 0)
    warm_median = statistics.median(warm)
    return {"task": "clinc_oos", "backbone": backbone, "max_length": max_length, "rows": rows,
            "cold_s": round(cold, 2), "warm_median_s": round(warm_median, 3), "speedup": round(cold / warm_median, 1),
            "cache_mb": round(cache_bytes / 1e6, 1), "torch_threads": torch.get_num_threads(),
            "cpus": os.cpu_count() or 0, "loadavg_1min": f"{load_before:.1f} -> {os.getloadavg()[0]:.1f}"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default_data = Path(os.environ.get("TUNE_AS_SHARED_DATA", REPO.parent / "shared" / "data")) / "clinc_oos"
    parser.add_argument("--data-dir", type=Path, default=default_data)
    parser.add_argument("--max-length", type=int, default=64)
    parser.add_argument("--warm-runs", type=int, default=5)
    parser.add_argument("--backbone", default="minilm")
    args = parser.parse_args()
    result = run(args.data_dir, args.max_length, args.warm_runs, args.backbone)
    print(json.dumps(result))
    print(f"| {result['task']} | {result['backbone']} frozen | {result['rows']} | {result['cold_s']} s | "
          f"{result['warm_median_s']} s | {result['speedup']}x | {result['cache_mb']} MB |")


if __name__ == "__main__":
    main()
