"""Populations against one-seed trials (issue 34): seconds per member-epoch, P = 1, 4, 10, 16, in one run.

    python benchmarks/bench_population.py                        # CPU, one thread, both works below
    python benchmarks/bench_population.py --work cnn             # the digits CNN only
    python benchmarks/bench_population.py --device cuda --sizes 1 4 10 16 64

Two works, on random inputs of their shapes (the cost does not depend on their values): "frozen", the
frozen-feature head of clinc_oos (MiniLM features 384 -> 512 -> 151 classes, 15,100 training rows, validation
3,100 and test 5,500 rows, batch 32), and "cnn", the digits CNN (tune_as.tasks.cnn.digits on 8x8 images, 10
classes, 1,078 training rows, validation 360 and test 359 rows, batch 64: the README's first command; its
population is tune_as.training.stacked_cnn). "solo" is `tune_as.training.trial.Trial` run once per seed, as a
confirmation round runs it today (one seed per trial; the Ray process around it not counted); "population P"
is `tune_as.training.population.Population` with P seeds. Each figure is the whole run (training and the
evaluations a trial makes) divided by the member-epochs it trained: wall seconds and CPU seconds (this
process's user + system time; on a GPU the CPU time is the host's share). The minimum over --repeats, measured
alternately in one process; the ratio is solo / population (> 1: the population is faster).
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SHAPE = {"feature_dim": 384, "classes": 151, "train": 15_100, "validation": 3_100, "test": 5_500}
DIGITS = {"image": (1, 8, 8), "classes": 10, "train": 1_078, "validation": 360, "test": 359}
BATCH = {"frozen": 32, "cnn": 64}
LOSSES = {"softmax": {}, "as_softmax": {"loss.delta": 0.3}}


class Quiet:
    """A reporter for both kinds of run: keeps nothing (the numbers are not the subject here)."""

    def wants_checkpoint(self, final: bool) -> bool:
        return False

    def report(self, *args: Any) -> None:
        return None


def frozen_data(train_rows: int | None) -> tuple[Any, Any]:
    from tune_as.settings import DataSettings
    from tune_as.tasks import PreparedData, Split, build_task

    g = torch.Generator().manual_seed(0)
    train_rows = train_rows or SHAPE["train"]
    dim, classes = SHAPE["feature_dim"], SHAPE["classes"]

    def split(rows: int) -> Split:
        return Split({"features": torch.randn(rows, dim, generator=g).half(),
                      "labels": torch.randint(0, classes, (rows,), generator=g)})

    names = tuple(f"intent_{i}" for i in range(classes))
    prepared = PreparedData("clinc_oos", "multiclass",
                            DataSettings("clinc_oos", backbone="minilm", encoder="frozen"),
                            split(train_rows), split(SHAPE["validation"]), split(SHAPE["test"]), names,
                            {"encoder": "frozen", "feature_dim": dim})
    for s in (prepared.train, prepared.validation, prepared.test):
        s.label_names = names
    return prepared, build_task("clinc_oos")


def cnn_data(train_rows: int | None) -> tuple[Any, Any]:
    from tune_as.settings import DataSettings
    from tune_as.tasks import PreparedData, Split, build_task

    g = torch.Generator().manual_seed(0)
    norm = (16.0, 0.3, 0.4)  # digits' grey levels 0..16, standardized as the task does

    def split(rows: int) -> Split:
        pixels = torch.randint(0, 17, (rows, *DIGITS["image"]), generator=g, dtype=torch.uint8)
        return Split({"pixels": pixels, "labels": torch.randint(0, DIGITS["classes"], (rows,), generator=g)},
                     pixel_norm=norm)

    names = tuple(str(i) for i in range(DIGITS["classes"]))
    info = {"encoder": "cnn", "cnn": "digits", "image_shape": DIGITS["image"], "backbone": "cnn"}
    prepared = PreparedData("digits", "multiclass", DataSettings("digits", backbone="cnn"),
                            split(train_rows or DIGITS["train"]), split(DIGITS["validation"]),
                            split(DIGITS["test"]), names, info)
    for s in (prepared.train, prepared.validation, prepared.test):
        s.label_names = names
    return prepared, build_task("digits")


WORKS = {"frozen": frozen_data, "cnn": cnn_data}


def timed(run: Callable[[], None], device: torch.device) -> tuple[float, float]:
    """(wall, CPU) seconds of run()."""
    if device.type == "cuda":
        torch.cuda.synchronize()
    t0, c0 = time.perf_counter(), time.process_time()
    run()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t0, time.process_time() - c0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", nargs="+", choices=sorted(WORKS), default=sorted(WORKS, reverse=True))
    parser.add_argument("--sizes", nargs="+", type=int, default=[1, 4, 10, 16])
    parser.add_argument("--losses", nargs="+", choices=sorted(LOSSES), default=sorted(LOSSES))
    parser.add_argument("--epochs", type=float, default=1.0)
    parser.add_argument("--train-rows", type=int, help="training rows (default: the work's)")
    parser.add_argument("--solo-seeds", type=int, default=2,
                        help="one-seed trials timed per repeat (default 2)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("--device: expected cpu, or cuda on a machine with a GPU; got cuda and no GPU is visible")

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {args.threads} thread(s)"
    for work in args.work:
        prepared, task = WORKS[work](args.train_rows)
        print(f"# bench_population {work}: {name}; load average {os.getloadavg()[0]:.2f}; torch "
              f"{torch.__version__}; {args.precision}; {args.epochs:g} epoch(s) of {len(prepared.train)} "
              f"rows, batch {BATCH[work]}", flush=True)
        print(f"{'loss':<11} {'run':<15} {'wall s/member-epoch':>20} {'CPU s/member-epoch':>19} "
              f"{'wall ratio':>11}", flush=True)
        for loss in args.losses:
            cfg = {"loss": loss, "epochs": args.epochs, "batch_size": BATCH[work], "lr": 1e-3,
                   "precision": args.precision, **LOSSES[loss]}
            best = measure(cfg, prepared, task, args, device)
            for key, (wall, cpu) in best.items():
                ratio = best["solo"][0] / wall
                print(f"{loss:<11} {key:<15} {wall:>20.4f} {cpu:>19.4f} {ratio:>10.2f}x", flush=True)


def measure(cfg: dict[str, Any], prepared: Any, task: Any, args: argparse.Namespace,
            device: torch.device) -> dict[str, tuple[float, float]]:
    """{run: (wall, CPU) seconds per member-epoch}, the minimum over the repeats."""
    from tune_as.training.population import Population
    from tune_as.training.trial import Trial

    def solo() -> None:
        for seed in range(args.solo_seeds):
            Trial({**cfg, "seed": seed}, prepared, task, Quiet()).run()

    def population(p: int) -> None:
        Population(cfg, range(100, 100 + p), prepared, task, Quiet(), device=device).run()

    runs: dict[str, Callable[[], None]] = {"solo": solo}
    members = {"solo": args.solo_seeds}
    for p in args.sizes:
        runs[f"population {p}"] = functools.partial(population, p)
        members[f"population {p}"] = p
    best: dict[str, tuple[float, float]] = {}
    runs["solo"]()  # warm-up: first-use costs (lazy imports, kernel set-up; CUDA's context)
    for _ in range(args.repeats):
        for key, run in runs.items():
            wall, cpu = timed(run, device)
            per = (wall / members[key] / args.epochs, cpu / members[key] / args.epochs)
            best[key] = min(best.get(key, per), per)
    return best

if __name__ == "__main__":
    main()
