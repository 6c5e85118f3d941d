"""The trial's training loop against a hand-written PyTorch loop doing the same work (issue 21).

    python benchmarks/bench_loop.py  # clinc_oos (frozen MiniLM features) and digits (CNN)
    python benchmarks/bench_loop.py --tasks digits --repeats 3 --epochs 2

Both loops train the same model (`tune_as.tasks.build_model`) on the same prepared data with AdamW (decay on
matrices only), the linear warm-up/decay schedule, gradient clipping at 1.0, batch 32, one thread, and
evaluate the validation split after every epoch (and the test split when validation improved). The
hand-written loop indexes the training tensors (widened once), uses the trial's optimizer (fused
AdamW; --plain-foreach: torch's default), calls the loss directly (`F.cross_entropy`; AS-Softmax's own
function), steps `LambdaLR` and never reads a number from the tensors while training. The trial loop is
`tune_as.training.trial.Trial.run`, exactly as a search runs it (no Ray: the reporter keeps the metrics).

Measured side by side in one process, alternating the two loops, the minimum over --repeats; printed per task
and loss: training seconds per epoch (evaluation excluded; the trial's own `train_seconds`, the hand loop
timed the same way), the ratio, and the whole run's seconds (evaluation included) with its ratio.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parent.parent
DATA = REPO.parent / "shared" / "data"
LOSSES = {"softmax": {}, "as_softmax": {"delta": 0.3}}
FUSED = True  # the trial's optimizer (fused AdamW); --plain-foreach times the hand loop with torch's default


def prepared(task_name: str, cache_dir: Path) -> tuple[Any, Any]:
    from tune_as.settings import DataSettings
    from tune_as.tasks import build_task, prepare

    task = build_task(task_name)
    if task_name == "digits":
        spec = DataSettings(task="digits", backbone="cnn", cache_dir=cache_dir)
    else:
        if not (DATA / task_name).is_dir():
            sys.exit(f"bench_loop: expected the real data in {DATA / task_name}, found none")
        spec = DataSettings(task=task_name, data_dir=DATA / task_name, backbone="minilm", encoder="frozen",
                            cache_dir=cache_dir)
    return task, prepare(task, spec)


def trial_loop(task: Any, data: Any, loss: str, params: dict[str, Any], epochs: int,
               seed: int) -> tuple[float, float]:
    from bench_efficiency import Collector  # the benchmarks' reporter that keeps metrics, no checkpoints

    from tune_as.training.trial import Trial

    config = {"loss": loss, "epochs": float(epochs), "batch_size": 32, "lr": 1e-3, "lr_warmup": 0.1,
              "max_grad_norm": 1.0, "seed": seed, **{f"loss.{k}": v for k, v in params.items()}}
    keep = Collector()
    trial = Trial(config, data, task, keep)
    tic = time.perf_counter()
    trial.run()
    wall = time.perf_counter() - tic
    return keep.reports[-1]["train_seconds"], wall


def _inputs(split: Any) -> dict[str, torch.Tensor]:
    """The split's model inputs, widened once (what a hand-written loop over cached tensors does)."""
    return split.batch(torch.arange(len(split)))


def plain_loop(task: Any, data: Any, loss: str, params: dict[str, Any], epochs: int,
               seed: int) -> tuple[float, float]:
    from tune_as.losses.as_softmax import as_softmax_loss
    from tune_as.tasks import build_model
    from tune_as.training.tools import lr_factor

    torch.manual_seed(seed)
    model = build_model(data, head="linear", seed=seed)
    train, val, test = (_inputs(s) for s in (data.train, data.validation, data.test))
    labels = train.pop("labels")
    n, batch = len(labels), 32
    steps_per_epoch = -(-n // batch)
    total = steps_per_epoch * epochs
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01},
                             {"params": no_decay, "weight_decay": 0.0}], lr=1e-3, fused=FUSED)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: lr_factor(step / total, 0.1))
    delta = params.get("delta")
    train_seconds, best = 0.0, -1.0
    wall = time.perf_counter()
    for epoch in range(epochs):
        tic = time.perf_counter()
        model.train()
        order = torch.randperm(n, generator=torch.Generator().manual_seed(seed * 1_000_003 + epoch))
        for start in range(0, n, batch):
            idx = order[start:start + batch]
            logits = model({k: v[idx] for k, v in train.items()})
            if delta is None:
                value = F.cross_entropy(logits, labels[idx])
            else:
                value = as_softmax_loss(logits, labels[idx], delta=delta).loss
            opt.zero_grad(set_to_none=True)
            value.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
        train_seconds += time.perf_counter() - tic
        model.eval()
        with torch.no_grad():
            acc = (model(val).argmax(1) == val["labels"]).float().mean().item()
            if acc > best:
                best = acc
                (model(test).argmax(1) == test["labels"]).float().mean().item()
    return train_seconds, time.perf_counter() - wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", nargs="+", default=["clinc_oos", "digits"])
    parser.add_argument("--losses", nargs="+", default=list(LOSSES), choices=list(LOSSES))
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--plain-foreach", action="store_true",
                        help="the hand-written loop with torch's default AdamW (foreach), "
                             "not the trial's fused one")
    parser.add_argument("--cache-dir", type=Path,
                        default=Path(os.environ.get("TUNE_AS_CACHE", ".tune_as_cache")))
    args = parser.parse_args()
    global FUSED
    FUSED = not args.plain_foreach
    torch.set_num_threads(1)
    print(f"bench_loop: one thread, batch 32, {args.epochs} epochs, min of {args.repeats} repeats, hand loop "
          f"AdamW {'fused (as the trial)' if FUSED else 'foreach (torch default)'}, "
          f"load average {os.getloadavg()[0]:.2f}")
    print(f"{'task':10} {'loss':11} {'plain s/epoch':>13} {'trial s/epoch':>13} {'ratio':>6} "
          f"{'plain run s':>11} {'trial run s':>11} {'ratio':>6}")
    for task_name in args.tasks:
        task, data = prepared(task_name, args.cache_dir)
        for loss in args.losses:
            plain: list[tuple[float, float]] = []
            ours: list[tuple[float, float]] = []
            for repeat in range(args.repeats):
                plain.append(plain_loop(task, data, loss, LOSSES[loss], args.epochs, repeat))
                ours.append(trial_loop(task, data, loss, LOSSES[loss], args.epochs, repeat))
            p_train, o_train = min(t for t, _ in plain), min(t for t, _ in ours)
            p_wall, o_wall = min(w for _, w in plain), min(w for _, w in ours)
            print(f"{task_name:10} {loss:11} {p_train / args.epochs:13.3f} {o_train / args.epochs:13.3f} "
                  f"{o_train / p_train:6.2f} {p_wall:11.2f} {o_wall:11.2f} {o_wall / p_wall:6.2f}",
                  flush=True)
    print(f"load average at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
