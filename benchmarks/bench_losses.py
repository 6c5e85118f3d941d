"""Forward+backward time and peak memory of every loss against F.cross_entropy, on the same inputs,
in one run.

    python benchmarks/bench_losses.py                 # table: one ratio per loss and shape, one torch thread
    python benchmarks/bench_losses.py --json out.json # the same figures as JSON too
    python benchmarks/bench_losses.py --multilabel    # every multi-label loss against bce at EURLEX57K's size

``--multilabel``: the baseline is ``bce`` instead of ``F.cross_entropy``, the losses are every loss that takes
multi-hot targets (``as_speed`` included, with a multi-hot target), the shape is (1024, 4271) (EURLEX57K's
4,271 labels) with about 5 positives per row (``--positives``), and AS-Speed's Eq. 19 schedule is reported
too: the rows the loss masks on that batch, the accumulation steps the schedule then picks, and what
``observe`` plus ``cycle_start`` cost per micro-batch.

Time: repetitions are interleaved (the baseline, then every loss, in turn), so that load from other
processes hits every loss alike. ``--stat min`` (default) reports the fastest repetition of each and
their ratio: on a shared machine the least-disturbed run is the best estimate of the cost.
``--stat median`` reports medians and the median over repetitions of the per-repetition ratio. ``--clock cpu``
times with the process CPU clock instead of the wall clock. One torch thread by default (what a 1-CPU
trial gets; with two threads on a loaded machine a tiny loss waits on the pool). Peak memory: the most
bytes held at once by the tensors created during one forward+backward (the returned gradient included),
tracked per storage through a ``TorchDispatchMode`` (buffers internal to one kernel are not seen); on
CUDA ``torch.cuda.max_memory_allocated``. No profiler: the CPU profiler (kineto) logs every session's
start and stop to stderr ("USDT ... profiler_start"), whatever KINETO_LOG_LEVEL below 6 says.
Multi-label losses get a multi-hot target (about 3 positives per row unless ``--positives``) and are also
compared with ``multilabel_softmax``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import weakref
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from tune_as.losses import LOSSES, build_loss

SHAPES = [(32, 151), (4096, 9), (2048, 5201), (512, 30522)]
CROSS_ENTROPY = "cross_entropy"
EURLEX_SHAPE = (1024, 4271)  # EURLEX57K: 4,271 EUROVOC labels, about 5 per document
MULTILABEL = sorted(name for name, cls in LOSSES.items() if "multilabel" in cls.kinds)


def multilabel_input(name: str, args: argparse.Namespace) -> bool:
    if name == CROSS_ENTROPY:
        return False
    return (args.multilabel and "multilabel" in LOSSES[name].kinds
            or not LOSSES[name].kinds & {"multiclass", "token"})


def make_step(name: str, x: torch.Tensor, t: torch.Tensor, y: torch.Tensor,
              args: argparse.Namespace) -> Callable[[], None]:
    if name == CROSS_ENTROPY:
        return lambda: F.cross_entropy(x, t).backward()
    loss_fn = build_loss(name)
    target = y if multilabel_input(name, args) else t
    return lambda: loss_fn(x, target).loss.backward()


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


class StorageTracker(TorchDispatchMode):
    """Bytes held by the storages that ops create while active: now (``live``) and at most (``peak``).
    A storage counts once (views and in-place results share it) and stops counting when it is freed."""

    def __init__(self, existing: list[torch.Tensor]) -> None:
        super().__init__()
        self.live = self.peak = 0
        self.known = weakref.WeakSet(t.untyped_storage() for t in existing)

    def _freed(self, nbytes: int) -> None:
        self.live -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.untyped_storage() not in self.known:
                storage = t.untyped_storage()
                self.known.add(storage)
                self.live += storage.nbytes()
                weakref.finalize(storage, self._freed, storage.nbytes())
        self.peak = max(self.peak, self.live)
        return out


def peak_bytes(step: Callable[[], None], inputs: list[torch.Tensor]) -> int:
    x = inputs[0]
    x.grad = None
    if x.device.type == "cuda":
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        step()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base
    with StorageTracker(inputs) as tracker:
        step()
    return tracker.peak


def accumulation(x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
    """AS-Speed's Eq. 19 schedule on this batch: rows masked, the steps it picks after one micro-batch
    (from 1), and the time of one ``observe`` + ``cycle_start`` (the schedule's own cost per micro-batch;
    best of 200)."""
    loss_fn = build_loss("as_speed")
    acc = loss_fn.make_accumulator()
    assert acc is not None
    with torch.no_grad():
        out = loss_fn(x, y)
    acc.observe(out.n_rows, out.n_masked)
    steps = acc.cycle_start()
    times = []
    for _ in range(200):
        start = time.perf_counter()
        acc.observe(out.n_rows, out.n_masked)
        acc.cycle_start()
        times.append(time.perf_counter() - start)
    return {"n_rows": int(out.n_rows), "n_masked": int(out.n_masked), "steps": steps, "lam": acc.lam,
            "max_steps": acc.max_steps, "schedule_us": min(times) * 1e6}


def bench_inputs(n: int, c: int, args: argparse.Namespace) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Logits (n, c) randn x 3 (requires grad), class targets (n,), multi-hot targets (n, c); seeded."""
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(n, c, generator=g) * 3).to(device, dtype).requires_grad_(True)
    t = torch.randint(0, c, (n,), generator=g).to(device)
    y = (torch.rand(n, c, generator=g) < min(0.5, args.positives / c)).to(device, dtype)
    return x, t, y


def bench_shape(names: list[str], n: int, c: int, args: argparse.Namespace) -> dict[str, dict[str, float]]:
    device = torch.device(args.device)
    x, t, y = inputs = bench_inputs(n, c, args)
    steps = {name: make_step(name, x, t, y, args) for name in dict.fromkeys([args.baseline, *names])}
    reps = args.reps or max(10, min(2000, int(2e8 / (n * c))))  # tiny shapes: many cheap repetitions
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    times: dict[str, list[float]] = {name: [] for name in steps}
    for rep in range(reps + 3):
        for name, step in steps.items():
            x.grad = None
            sync(device)
            start = clock()
            step()
            sync(device)
            if rep >= 3:  # warm-up
                times[name].append(clock() - start)
    stat = min if args.stat == "min" else statistics.median
    result = {}
    for name, step in steps.items():
        result[name] = {"time_us": stat(times[name]) * 1e6, "peak_mb": peak_bytes(step, list(inputs)) / 2**20}
    for name in steps:
        for ref in (args.baseline, "multilabel_softmax"):
            if ref == args.baseline or (multilabel_input(name, args) and ref in result):
                suffix = "" if ref == args.baseline else "_vs_multilabel_softmax"
                ratios = [a / b for a, b in zip(times[name], times[ref], strict=True)]
                ratio = (min(times[name]) / min(times[ref]) if args.stat == "min"
                         else statistics.median(ratios))
                result[name]["time_ratio" + suffix] = ratio
                result[name]["mem_ratio" + suffix] = (result[name]["peak_mb"]
                                                      / max(result[ref]["peak_mb"], 1e-9))
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--multilabel", action="store_true",
                        help="multi-label losses against bce (see above)")
    parser.add_argument("--losses", nargs="+", choices=sorted(LOSSES), metavar="LOSS",
                        help="default: every loss (--multilabel: every multi-label loss)")
    parser.add_argument("--shapes", nargs="+", metavar="NxC",
                        help="default: four shapes (--multilabel: 1024x4271)")
    parser.add_argument("--positives", type=float,
                        help="mean positive labels per row (default 3; --multilabel: 5)")
    parser.add_argument("--reps", type=int, default=0,
                        help="timed repetitions (default: by size, 10 to 2000)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--stat", default="min", choices=["min", "median"], help="see the module docstring")
    parser.add_argument("--clock", default="wall", choices=["wall", "cpu"], help="see the module docstring")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON ('-' for stdout)")
    args = parser.parse_args(argv)
    args.baseline = "bce" if args.multilabel else CROSS_ENTROPY
    args.losses = args.losses or (MULTILABEL if args.multilabel else sorted(LOSSES))
    args.shapes = args.shapes or [f"{n}x{c}" for n, c in ([EURLEX_SHAPE] if args.multilabel else SHAPES)]
    args.positives = args.positives or (5.0 if args.multilabel else 3.0)
    torch.set_num_threads(args.threads)
    results = {}
    base = "bce" if args.multilabel else "CE"
    print(f"# torch {torch.__version__}, {args.device}, {args.dtype}, {args.threads} threads, "
          f"{args.clock} clock, {args.stat}; baseline {args.baseline}; "
          f"multi-hot targets: ~{args.positives:g} positives per row; "
          f"load average {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    print(f"{'loss':26s} {'N x C':>11s} {'time':>10s} {'x ' + base:>6s} {'peak MB':>8s} {'x ' + base:>6s}")
    for shape in args.shapes:
        n, c = (int(v) for v in shape.lower().split("x"))
        res = bench_shape(args.losses, n, c, args)
        results[f"{n}x{c}"] = res
        for name, r in res.items():
            ratio_t, ratio_m = r.get("time_ratio", 1.0), r.get("mem_ratio", 1.0)
            line = (f"{name:26s} {f'{n}x{c}':>11s} {r['time_us']:8.0f}us {ratio_t:6.2f} "
                    f"{r['peak_mb']:8.2f} {ratio_m:6.2f}")
            if "time_ratio_vs_multilabel_softmax" in r:
                line += f"   vs multilabel_softmax: time {r['time_ratio_vs_multilabel_softmax']:.2f}"
                line += f" mem {r['mem_ratio_vs_multilabel_softmax']:.2f}"
            print(line, flush=True)
        if args.multilabel and "as_speed" in args.losses:
            x, _, y = bench_inputs(n, c, args)
            a = res["as_speed (schedule)"] = accumulation(x, y)
            print(f"as_speed schedule (Eq. 19, lam {a['lam']:g}, max_steps {a['max_steps']}): "
                  f"{a['n_masked']} of {a['n_rows']} rows masked -> {a['steps']} step(s); "
                  f"observe + cycle_start {a['schedule_us']:.1f}us")
    print(f"# load average at the end: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    if args.json:
        meta = {"device": args.device, "dtype": args.dtype, "threads": args.threads, "clock": args.clock,
                "stat": args.stat}
        text = json.dumps({**meta, "torch": torch.__version__, "results": results}, indent=2)
        if args.json == "-":
            print(text)
        else:
            with open(args.json, "w") as fh:
                fh.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
