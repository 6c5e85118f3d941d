"""Full fine-tuning of MiniLM on real clinc_oos: softmax vs AS-Softmax vs AS-Speed, with and without row skipping.

    HF_HUB_OFFLINE=1 nice -n 5 python benchmarks/bench_finetune.py [--quick] [--seeds 0 1] [--epochs 3]
        [--train-samples 1510] [--eval-samples 1000] [--max-length 32] [--lr 1e-4] [--json out.json]

Every arm runs the real training loop (`tune_as.training.trial.Trial`, no Ray) on the same fixed training subset
(drawn once with seed 0), with the same epochs, batch, lr, max_length and seeds; the AS arms take the paper's
Table 6 setting (δ, r; λ, s) from search_spaces/clinc_oos.yaml. Arms are interleaved seed by seed, their order
rotated, so load from other processes on the shared machine hits every arm alike. The loop's optional
`PhaseTimer` splits the training time into probe (row skipping's gradient-free forward), forward, backward and
optimizer step; evaluation is timed by the loop (`eval_seconds`).

For the skipping arms, at every evaluation the benchmark also measures what dropout changes: over a few
training batches it runs the probe twice in train mode (two independent dropout draws, as the probe and the
gradient pass get) and reports the fraction of examples the first draw calls fully masked that the second
does not (a skipped example whose gradient would not have been zero). Its time is excluded from the figures.
Results: docs/bench_finetune.md. Goal (issue 12): as_softmax + skipping >= 1.5x faster than softmax in wall
clock to the same epochs, test accuracy within 0.5 point.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from tune_as.space.search_space import default_space_path, load_search_space
from tune_as.tasks import DataSettings, build_task, prepare
from tune_as.training.trial import PhaseTimer, Trial

REPO = Path(__file__).resolve().parent.parent
SPEEDUP_TARGET, MAX_LOSS_POINTS = 1.5, 0.5
PHASES = ("probe", "forward", "backward", "step")
# arm name -> (loss, skip_masked_rows)
ARMS: dict[str, tuple[str, bool]] = {
    "softmax": ("softmax", False), "as_softmax": ("as_softmax", False), "as_speed": ("as_speed", False),
    "as_softmax+skip": ("as_softmax", True), "as_speed+skip": ("as_speed", True),
}
DISAGREEMENT_BATCHES = 4


class Collector:
    """A `Reporter` keeping every evaluation; for skipping arms it also measures the probe's dropout disagreement."""

    def __init__(self) -> None:
        self.results: list[dict[str, Any]] = []
        self.trial: Trial | None = None
        self.masked = self.flipped = 0
        self.measure_seconds = 0.0

    def wants_checkpoint(self, final: bool) -> bool:
        return False  # nothing resumes here: no time spent saving

    def report(self, metrics: dict[str, Any], checkpoint_dir: Path | None) -> None:
        self.results.append(dict(metrics))
        if self.trial is not None and self.trial.cfg.skip_masked_rows:
            tic = time.perf_counter()
            self._disagreement(self.trial)
            self.measure_seconds += time.perf_counter() - tic

    def _disagreement(self, trial: Trial) -> None:
        """Two train-mode probes of the same batches at the searched δ; RNG restored so training is unchanged."""
        rng = torch.get_rng_state()
        gen = torch.Generator().manual_seed(len(self.results))
        trial.model.train()
        with torch.no_grad():
            for _ in range(DISAGREEMENT_BATCHES):
                idx = torch.randperm(trial.n_train, generator=gen)[: trial.cfg.batch_size]
                batch = trial.train_batches.get(idx)
                first, second = (trial.loss_fn.masked_examples(trial.model(batch).float(), batch["labels"])
                                 for _ in range(2))
                self.masked += int(first.sum())
                self.flipped += int((first & ~second).sum())
        trial.model.eval()
        torch.set_rng_state(rng)


def arm_configs(args: argparse.Namespace, kind: str) -> dict[str, dict[str, Any]]:
    space = load_search_space(default_space_path("clinc_oos"), kind)
    # trial settings only: the data (clinc_oos, minilm, fine-tuned, args.max_length) is prepared once, by main
    base = {"epochs": float(args.epochs), "batch_size": args.batch_size, "lr": args.lr}
    configs = {}
    for arm in args.arms:
        loss, skip = ARMS[arm]
        configs[arm] = {**base, **(space.losses[loss].paper_point() or {}), "loss": loss, "skip_masked_rows": skip}
    return configs


def run_one(config: dict[str, Any], data: Any, task: Any) -> dict[str, Any]:
    collector = Collector()
    trial = Trial(config, data, task, collector)
    trial.timer = PhaseTimer(trial.device)
    collector.trial = trial
    tic = time.perf_counter()
    trial.run()
    wall = time.perf_counter() - tic - collector.measure_seconds
    last = collector.results[-1]
    if "error" in last:
        raise RuntimeError(f"{config['loss']}: {last['error']}")
    train = last["train_seconds"]
    evals = sum(r["eval_seconds"] for r in collector.results)
    cumulative = [r["train_seconds"] for r in collector.results]
    phases = {p: trial.timer.seconds.get(p, 0.0) for p in PHASES}
    return {
        "wall": wall, "train": train, "eval": evals, "other": train - sum(phases.values()), **phases,
        "epoch_train": [b - a for a, b in zip([0.0, *cumulative[:-1]], cumulative, strict=True)],
        "optimizer_steps": last["optimizer_steps"], "backward_rows": last["backward_rows"],
        "samples_seen": last["samples_seen"], "masked_ratio": [r["masked_ratio"] for r in collector.results],
        "val": last["best_val_accuracy"] * 100, "test": last["test_accuracy"] * 100,
        "probe_masked": collector.masked, "probe_flipped": collector.flipped,
    }


def mean_std(values: list[float]) -> str:
    if len(values) < 2:
        return f"{values[0]:.2f}"
    return f"{statistics.mean(values):.2f} ± {statistics.stdev(values):.2f}"


def table(runs: dict[str, list[dict[str, Any]]]) -> str:
    mean = {arm: {k: statistics.mean(r[k] for r in rs) for k in ("wall", "train", "eval", "other",
                                                                  "optimizer_steps", "backward_rows",
                                                                  "samples_seen", *PHASES)}
            for arm, rs in runs.items()}
    ref = mean.get("softmax")
    head = ("| arm | wall s (train + eval) | s / epoch (train) | probe | forward | backward | step | other "
            "| optimizer steps | backward rows / samples | masked ratio per epoch | val acc % | test acc % "
            "| speed-up (wall) | speed-up (train) | skipped but unmasked in a 2nd draw |")
    lines = [head, "|" + " --- |" * (head.count("|") - 1)]
    for arm, rs in runs.items():
        m = mean[arm]
        epochs = [statistics.mean(e) for e in zip(*(r["epoch_train"] for r in rs), strict=True)]
        masked = [statistics.mean(e) for e in zip(*(r["masked_ratio"] for r in rs), strict=True)]
        probe_masked = sum(r["probe_masked"] for r in rs)
        flip = f"{sum(r['probe_flipped'] for r in rs) / probe_masked:.1%} of {probe_masked}" if probe_masked else "—"
        speed = (f"{ref['wall'] / m['wall']:.2f}×", f"{ref['train'] / m['train']:.2f}×") if ref else ("—", "—")
        lines.append(
            f"| {arm} | {m['wall']:.0f} ({m['train']:.0f} + {m['eval']:.0f}) | "
            f"{' / '.join(f'{e:.0f}' for e in epochs)} | {m['probe']:.0f} | {m['forward']:.0f} | "
            f"{m['backward']:.0f} | {m['step']:.0f} | {m['other']:.0f} | {m['optimizer_steps']:.0f} | "
            f"{m['backward_rows']:.0f} / {m['samples_seen']:.0f} | {' / '.join(f'{x:.2f}' for x in masked)} | "
            f"{mean_std([r['val'] for r in rs])} | {mean_std([r['test'] for r in rs])} | {speed[0]} | {speed[1]} | "
            f"{flip} |")
    return "\n".join(lines)


def verdict(runs: dict[str, list[dict[str, Any]]]) -> str:
    if "softmax" not in runs or "as_softmax+skip" not in runs:
        return "goal not judged (needs the softmax and as_softmax+skip arms)"
    wall = {a: statistics.mean(r["wall"] for r in runs[a]) for a in ("softmax", "as_softmax+skip")}
    test = {a: statistics.mean(r["test"] for r in runs[a]) for a in ("softmax", "as_softmax+skip")}
    speed, gap = wall["softmax"] / wall["as_softmax+skip"], test["softmax"] - test["as_softmax+skip"]
    ok = speed >= SPEEDUP_TARGET and gap <= MAX_LOSS_POINTS
    return (f"as_softmax+skip vs softmax: {speed:.2f}x wall (goal >= {SPEEDUP_TARGET}x), test accuracy "
            f"{-gap:+.2f} points (goal >= -{MAX_LOSS_POINTS}): {'MET' if ok else 'NOT MET'}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a few minutes: 160 train / 160 eval rows, 2 epochs, 1 seed")
    ap.add_argument("--data-dir", type=Path, default=REPO.parent / "shared" / "data" / "clinc_oos")
    ap.add_argument("--cache-dir", type=Path, default=Path(os.environ.get("TUNE_AS_CACHE", "~/.cache/tune_as")))
    ap.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--max-length", type=int, default=32)
    ap.add_argument("--train-samples", type=int, default=1510, help="fixed training subset (seed 0)")
    ap.add_argument("--eval-samples", type=int, default=None, help="validation and test subset (default: full)")
    ap.add_argument("--threads", type=int, help="torch threads (default: torch's choice)")
    ap.add_argument("--json", type=Path, help="also write every run's figures here")
    ap.add_argument("--merge", type=Path, nargs="+", help="only print the table of these --json files together "
                    "(arms run as parallel processes under the same load)")
    args = ap.parse_args(argv)
    if args.merge:
        merged = {arm: rs for f in args.merge for arm, rs in json.loads(f.read_text())["runs"].items()}
        print(table(merged))
        print(verdict(merged))
        return
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.quick:
        args.seeds, args.epochs, args.train_samples, args.eval_samples = args.seeds[:1], 2, 160, 160
    task = build_task("clinc_oos")
    data = prepare(task, DataSettings(task="clinc_oos", data_dir=args.data_dir, backbone="minilm", encoder="finetune",
                                  max_length=args.max_length, max_train_samples=args.train_samples,
                                  max_eval_samples=args.eval_samples, seed=0, cache_dir=args.cache_dir.expanduser()))
    print(f"clinc_oos: train {len(data.train)}, validation {len(data.validation or [])}, "
          f"test {len(data.test or [])}; "
          f"torch threads {torch.get_num_threads()}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
          flush=True)
    configs = arm_configs(args, task.kind)
    runs: dict[str, list[dict[str, Any]]] = {arm: [] for arm in args.arms}
    for i, seed in enumerate(args.seeds):
        order = args.arms[i % len(args.arms):] + args.arms[:i % len(args.arms)]
        for arm in order:
            result = run_one({**configs[arm], "seed": seed}, data, task)
            runs[arm].append(result)
            print(f"seed {seed} {arm}: wall {result['wall']:.0f} s, test {result['test']:.2f}%, backward rows "
                  f"{result['backward_rows']}/{result['samples_seen']}, masked {result['masked_ratio']}", flush=True)
    print(table(runs))
    print(verdict(runs))
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
