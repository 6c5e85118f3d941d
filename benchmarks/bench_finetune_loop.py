"""Fine-tuning: the trial's loop against a plain PyTorch loop doing the same work, on a GPU (or the CPU).

    python benchmarks/bench_finetune_loop.py --device cuda          # MiniLM-L6's shape, 4,096 rows, batch 32
    python benchmarks/bench_finetune_loop.py --layers 2 --rows 256  # a quick CPU check

The model is all-MiniLM-L6-v2's architecture (BERT, 6 layers, hidden 384, 12 heads, vocabulary 30,522) with
random weights, built by `tune_as.tasks.build_model` (a cost measure needs no trained weights, and none can be
downloaded on a machine without the hub); the rows are random token ids with clinc_oos-like lengths (8 to 32
tokens), 151 classes. Both loops: batch 32, one epoch, AdamW (fused; decay on matrices only), the linear
warm-up/decay schedule, clipping at 1.0, the precision the trial picks (bf16 autocast on a GPU that has it,
fp32 on the CPU), batches trimmed to their longest row, the same order. The trial is
`tune_as.training.trial.Trial.run` as a search runs it (no Ray), evaluating its 256 validation rows at the
epoch's end; the plain loop does the same evaluation and never reads a number from the GPU while it trains.
Printed: seconds per epoch (whole run, synchronized), the minimum over --repeats, alternating the loops.
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

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

CLASSES, VOCAB = 151, 30_522
MINILM = {"hidden_size": 384, "num_attention_heads": 12, "intermediate_size": 1536, "vocab_size": VOCAB,
          "max_position_embeddings": 512, "pad_token_id": 0}


class Quiet:
    def wants_checkpoint(self, final: bool) -> bool:
        return False

    def report(self, *args: Any) -> None:
        return None


def data(rows: int, layers: int) -> tuple[Any, Any]:
    from tune_as.settings import DataSettings
    from tune_as.tasks import PreparedData, Split, build_task

    g = torch.Generator().manual_seed(0)

    def split(n: int) -> Split:
        lengths = torch.randint(8, 33, (n,), generator=g)
        ids = torch.randint(5, VOCAB, (n, 32), generator=g)
        ids[torch.arange(32)[None, :] >= lengths[:, None]] = 0
        columns = {"input_ids": ids.int(), "token_type_ids": torch.zeros(n, 32, dtype=torch.int32),
                   "labels": torch.randint(0, CLASSES, (n,), generator=g)}
        return Split(columns, lengths=lengths, seq_columns=("input_ids", "token_type_ids"))

    names = tuple(f"intent_{i}" for i in range(CLASSES))
    info = {"encoder": "finetune", "backbone": "tiny", "hidden_size": 384,
            "tiny_config": dict(MINILM, num_hidden_layers=layers)}
    prepared = PreparedData("clinc_oos", "multiclass", DataSettings("clinc_oos", backbone="minilm"),
                            split(rows), split(256), None, names, info)
    for s in (prepared.train, prepared.validation):
        s.label_names = names
    return prepared, build_task("clinc_oos")


def trial_loop(prepared: Any, task: Any, cfg: dict[str, Any]) -> None:
    from tune_as.training.trial import Trial

    Trial(cfg, prepared, task, Quiet()).run()


def plain_loop(prepared: Any, task: Any, cfg: dict[str, Any], device: torch.device) -> None:
    from tune_as.settings import TrialSettings
    from tune_as.tasks import build_model
    from tune_as.training.tools import autocast_for, epoch_order, lr_factor

    settings = TrialSettings.from_dict(cfg)
    torch.manual_seed(settings.seed)
    model = build_model(prepared, "linear", settings.seed).to(device)
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and "norm" not in n.lower()]
    rest = [p for n, p in model.named_parameters() if not (p.ndim >= 2 and "norm" not in n.lower())]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": settings.weight_decay},
                                   {"params": rest, "weight_decay": 0.0}], lr=settings.lr, fused=True)
    autocast = autocast_for(settings, device)[0]
    train, n, b = prepared.train, len(prepared.train), settings.batch_size
    steps = (n + b - 1) // b
    model.train()
    order = epoch_order(n, settings.seed, 0)
    for k, start in enumerate(range(0, n, b)):
        batch = {key: v.to(device, non_blocking=True)
                 for key, v in train.batch(order[start:start + b]).items()}
        for group in optimizer.param_groups:
            group["lr"] = settings.lr * lr_factor(k / steps, settings.lr_warmup)
        with autocast:
            logits = model(batch)
        F.cross_entropy(logits.float(), batch["labels"]).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), settings.max_grad_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    model.eval()
    with torch.no_grad(), autocast:
        val = prepared.validation
        batch = {key: v.to(device) for key, v in val.batch(torch.arange(len(val))).items()}
        task.score([task.predict(model(batch).float()).cpu()], val)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("--device: expected cpu, or cuda on a machine with a GPU; got cuda and no GPU is visible")
    if device.type == "cpu" and torch.cuda.is_available():
        sys.exit("--device cpu: the trial picks the GPU when one is visible; "
                 "set CUDA_VISIBLE_DEVICES= to compare")
    prepared, task = data(args.rows, args.layers)
    cfg = {"loss": "softmax", "epochs": 1.0, "batch_size": 32, "lr": 5e-5, "seed": 0}
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"# bench_finetune_loop: {name}; load average {os.getloadavg()[0]:.2f}; torch {torch.__version__}; "
          f"BERT {args.layers} layers, hidden 384; {args.rows} rows, batch 32, lengths 8-32", flush=True)

    def timed(run: Any) -> float:
        if device.type == "cuda":
            torch.cuda.synchronize()
        tic = time.perf_counter()
        run()
        if device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - tic

    runs = {"trial": lambda: trial_loop(prepared, task, cfg),
            "plain": lambda: plain_loop(prepared, task, cfg, device)}
    runs["plain"]()  # warm-up: kernels, autotuning, allocator
    best = {k: float("inf") for k in runs}
    for _ in range(args.repeats):
        for key, run in runs.items():
            best[key] = min(best[key], timed(run))
    for key, seconds in best.items():
        print(f"{key:<6} {seconds:8.3f} s/epoch  {args.rows / seconds:9.0f} rows/s", flush=True)
    print(f"trial / plain: {best['trial'] / best['plain']:.3f}", flush=True)


if __name__ == "__main__":
    main()
