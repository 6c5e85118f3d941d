"""Forward+backward time and peak memory of every loss against F.cross_entropy, on the same inputs, in one run.

    python benchmarks/bench_losses.py                 # table: one ratio per loss and shape, one torch thread
    python benchmarks/bench_losses.py --json out.json # the same figures as JSON too

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
Multi-label losses get a multi-hot target (about 3 positives per row) and are also compared with
``multilabel_softmax``.
"""

from __future__ import annotations

import argparse
import json
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
BASELINE = "cross_entropy"


def multilabel_input(name: str) -> bool:
    return name != BASELINE and not LOSSES[name].kinds & {"multiclass", "token"}


def make_step(name: str, x: torch.Tensor, t: torch.Tensor, y: torch.Tensor) -> Callable[[], None]:
    if name == BASELINE:
        return lambda: F.cross_entropy(x, t).backward()
    loss_fn = build_loss(name)
    target = y if multilabel_input(name) else t
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


def bench_shape(names: list[str], n: int, c: int, args: argparse.Namespace) -> dict[str, dict[str, float]]:
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(n, c, generator=g) * 3).to(device, dtype).requires_grad_(True)
    t = torch.randint(0, c, (n,), generator=g).to(device)
    y = (torch.rand(n, c, generator=g) < min(0.5, 3 / c)).to(device, dtype)
    steps = {name: make_step(name, x, t, y) for name in [BASELINE, *names]}
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
        result[name] = {"time_us": stat(times[name]) * 1e6, "peak_mb": peak_bytes(step, [x, t, y]) / 2**20}
    for name in names:
        for ref in (BASELINE, "multilabel_softmax"):
            if ref == BASELINE or (multilabel_input(name) and ref in result):
                suffix = "" if ref == BASELINE else "_vs_multilabel_softmax"
                ratios = [a / b for a, b in zip(times[name], times[ref], strict=True)]
                ratio = min(times[name]) / min(times[ref]) if args.stat == "min" else statistics.median(ratios)
                result[name]["time_ratio" + suffix] = ratio
                result[name]["mem_ratio" + suffix] = result[name]["peak_mb"] / max(result[ref]["peak_mb"], 1e-9)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--losses", nargs="+", default=sorted(LOSSES), choices=sorted(LOSSES), metavar="LOSS")
    parser.add_argument("--shapes", nargs="+", default=[f"{n}x{c}" for n, c in SHAPES], metavar="NxC")
    parser.add_argument("--reps", type=int, default=0, help="timed repetitions (default: by size, 10 to 2000)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--stat", default="min", choices=["min", "median"], help="see the module docstring")
    parser.add_argument("--clock", default="wall", choices=["wall", "cpu"], help="see the module docstring")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON ('-' for stdout)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    results = {}
    print(f"# torch {torch.__version__}, {args.device}, {args.dtype}, {args.threads} threads, {args.clock} clock, {args.stat}")
    print(f"{'loss':26s} {'N x C':>11s} {'time':>10s} {'x CE':>6s} {'peak MB':>8s} {'x CE':>6s}")
    for shape in args.shapes:
        n, c = (int(v) for v in shape.lower().split("x"))
        res = bench_shape(args.losses, n, c, args)
        results[f"{n}x{c}"] = res
        for name, r in res.items():
            ratio_t, ratio_m = r.get("time_ratio", 1.0), r.get("mem_ratio", 1.0)
            line = f"{name:26s} {f'{n}x{c}':>11s} {r['time_us']:8.0f}us {ratio_t:6.2f} {r['peak_mb']:8.2f} {ratio_m:6.2f}"
            if "time_ratio_vs_multilabel_softmax" in r:
                line += f"   vs multilabel_softmax: time {r['time_ratio_vs_multilabel_softmax']:.2f}"
                line += f" mem {r['mem_ratio_vs_multilabel_softmax']:.2f}"
            print(line, flush=True)
    if args.json:
        meta = {"device": args.device, "dtype": args.dtype, "threads": args.threads, "clock": args.clock, "stat": args.stat}
        text = json.dumps({**meta, "torch": torch.__version__, "results": results}, indent=2)
        if args.json == "-":
            print(text)
        else:
            with open(args.json, "w") as fh:
                fh.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
