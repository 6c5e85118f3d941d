"""`python -m tune_as.search --task TASK`: the CLI. It maps arguments onto a `SearchRequest` and calls
`tune_as.engine.run.run_search`. Defaults are SearchRequest's (shown here, owned there)."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import traceback
from pathlib import Path
from types import FrameType
from typing import Any

from tune_as.engine import head as ray_head
from tune_as.engine import interrupt
from tune_as.engine.request import OUTPUT_FORMATS, SAMPLERS, SearchRequest
from tune_as.errors import BUG, UserError
from tune_as.paths import OneLineParser


def D(name: str) -> Any:  # noqa: N802 - reads as a marker in the option table below
    """The default of a SearchRequest field: argparse shows it, the request owns it (one place)."""
    return SearchRequest.__dataclass_fields__[name].default


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog="python -m tune_as.search",
        description="Search loss hyper-parameters for a task with Ray Tune + Optuna + ASHA, tracked in MLflow.",
    )
    p.add_argument("--task", default=None,
                   help="task name (see docs/tasks.md), e.g. clinc_oos, eurlex, digits (with --resume: read from the "
                        "saved search)")
    p.add_argument("--losses", default=None,
                   help="comma-separated losses (default: every loss that applies to the task's kind)")
    p.add_argument("--trials-per-loss", type=int, default=None,
                   help="Optuna trials per loss (default: the search space file's value)")
    p.add_argument("--max-epochs", type=float, default=None, help="override the task's epochs (ASHA's max_t)")
    p.add_argument("--backbone", default=None,
                   help="HF model id or local path, or 'minilm' / 'tiny' (offline); default: the task's")
    p.add_argument("--encoder", choices=["finetune", "frozen"], default=D("encoder"),
                   help="finetune the backbone, or train a head on cached frozen features")
    p.add_argument("--encode-precision", choices=["fp32", "bf16"], default=D("encode_precision"),
                   help="with --encoder frozen: compute the features in fp32, or under bf16 autocast (2-2.8x faster "
                        "on CPUs with AMX/AVX-512 bf16; features within 0.003 of fp32, docs/tasks.md)")
    p.add_argument("--max-length", type=int, default=None, help="token length (default: the task's)")
    p.add_argument("--data-dir", type=Path, default=None,
                   help="local folder of train/validation/test.jsonl[.gz] or HF save_to_disk (default: HF hub)")
    p.add_argument("--max-train-samples", type=int, default=None, help="subsample the training split")
    p.add_argument("--max-eval-samples", type=int, default=None, help="subsample the validation and test splits")
    p.add_argument("--task-arg", action="append", default=[], metavar="KEY=VALUE",
                   help="task option, repeatable (the jsonl task: kind=, text_field=, label_field=, ...)")
    p.add_argument("--search-space", type=Path, default=None,
                   help="search space YAML (default: search_spaces/<task>.yaml)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="overrides",
                   help="override a fixed trial setting, repeatable: lr, batch_size, weight_decay, lr_warmup, "
                        "warmup_r, max_grad_norm, precision, skip_masked_rows (docs/search_spaces.md)")
    p.add_argument("--seed", type=int, default=D("seed"), help="seed for Optuna, data order and model init")
    p.add_argument("--confirm", type=_count, default=D("confirm"), metavar="N",
                   help="after the search, re-run each loss's selected setting with exactly N new seeds (no early "
                        "stopping): verdicts against the baseline and the best set, family-wise error 5%% "
                        "(default 0: single runs; --race decides the seeds instead)")
    p.add_argument("--confirm-top", type=int, default=None, metavar="K",
                   help="with --confirm: confirm only the K losses with the best validation in the search, and "
                        "softmax (the baseline of the paired differences); the others are shown as single runs "
                        "(default: every loss)")
    p.add_argument("--race", action="store_true",
                   help="confirm in rounds (3, 5, 7, ... new seeds) until each verdict is decided or --max-seeds; "
                        "error controlled across rounds (docs/verdicts.md)")
    p.add_argument("--max-seeds", type=int, default=D("max_seeds"), help="with --race: the most seeds per loss")
    p.add_argument("--seeds-per-trial", type=int, default=D("seeds_per_trial"), metavar="N",
                   help="train up to N confirmation seeds of one loss as one population in one trial: the same "
                        "runs, faster (frozen-feature tasks; docs/architecture.md, 'Populations'; default 1)")
    p.add_argument("--margin", type=float, default=D("margin"),
                   help="equivalence margin in points of the metric (default %(default)s): 'equivalent' means the "
                        "difference to the baseline is proven inside ±margin; at least one item of the test "
                        "split (a smaller margin is refused)")
    p.add_argument("--baseline", default=None,
                   help="the loss every verdict compares with (default: softmax, multilabel_softmax for "
                        "multi-label tasks)")
    p.add_argument("--budget", type=float, default=None, metavar="E",
                   help="trial-epochs for the whole answer, split by the engine: the first confirmation round is "
                        "reserved (at most a quarter of the budget; the losses best on validation first), a loss with nothing to tune gets one search trial, the losses with parameters get "
                        "the search trials the rest pays (unless --trials-per-loss says), later rounds take what is "
                        "left (default: no cap)")
    p.add_argument("--sampler", choices=list(SAMPLERS), default=D("sampler"),
                   help="each loss's Optuna sampler: tpe (default) or random (uniform draws, a baseline)")
    p.add_argument("--no-warm-start", action="store_true",
                   help="do not start each loss with its warm start (the search space's `paper` setting, else the "
                        "loss's own defaults where they lie in the searched range)")
    p.add_argument("--gpus-per-trial", type=float, default=None,
                   help="GPUs per trial (0.5 packs two trials per GPU; default 1 when the cluster has GPUs, else 0)")
    p.add_argument("--cpus-per-trial", type=float, default=D("cpus_per_trial"), help="CPUs per trial")
    p.add_argument("--max-concurrent", type=int, default=None,
                   help="cap on concurrent trials (default: what the cluster's resources allow, at most 8)")
    p.add_argument("--eval-every-steps", type=int, default=None,
                   help="evaluate every N optimizer steps (default: once per epoch)")
    p.add_argument("--address", default=os.environ.get("RAY_ADDRESS"),
                   help="Ray cluster address ('auto', HOST:6379 or ray://HOST:10001); default: a local Ray "
                        "(env RAY_ADDRESS)")
    p.add_argument("--storage-path", type=Path, default=D("storage_path"),
                   help="where Ray Tune keeps trial checkpoints and the Optuna study (shared storage on clusters)")
    p.add_argument("--mlflow-uri", default=os.environ.get("MLFLOW_TRACKING_URI"),
                   help="MLflow tracking URI (default: sqlite:///mlflow.db; env MLFLOW_TRACKING_URI)")
    p.add_argument("--experiment", default=None, help="MLflow experiment name (default: the task name)")
    p.add_argument("--name", default=None,
                   help="search name: its folder under --storage-path (default: <task>-<timestamp>; "
                        "with --resume: the latest search of the task)")
    p.add_argument("--resume", action="store_true", help="resume the search --name from its last state")
    p.add_argument("--max-failures", type=int, default=D("max_failures"), help="retries of a crashed trial from its checkpoint")
    p.add_argument("--grace-period", type=float, default=None,
                   help="ASHA grace period, in epochs (default: a third of the epochs, at least 1)")
    p.add_argument("--reduction-factor", type=float, default=D("reduction_factor"), help="ASHA reduction factor")
    p.add_argument("--no-asha", action="store_true", help="run every trial to the end (no early stopping)")
    p.add_argument("--asha-scope", choices=["loss", "search"], default=D("asha_scope"),
                   help="compare a trial with trials of its own loss (default) or with every trial of the search "
                        "(an unfair ablation, for benchmarks)")
    p.add_argument("--checkpoint-interval", type=float, default=D("checkpoint_interval_s"), dest="checkpoint_interval_s",
                   help="seconds between a trial's checkpoints (it always checkpoints at its end; 0: every evaluation)")
    p.add_argument("--dashboard-host", default=D("dashboard_host"),
                   help="bind the local Ray dashboard here (binding wider than loopback prints a warning)")
    p.add_argument("--no-dashboard", action="store_true",
                   help="start a local Ray without its dashboard (about 2 s sooner; nothing to browse)")
    p.add_argument("--verbose", action="store_const", const=2, default=D("verbose"),
                   help="Ray's per-trial progress table (one column per parameter) instead of one line per loss")
    p.add_argument("--format", choices=list(OUTPUT_FORMATS), default=D("output_format"), dest="output_format",
                   help="how the answer is printed: a table fitted to the terminal (default), markdown (as logged in "
                        "ranking.md), csv or json (for scripts)")
    p.add_argument("--debug", action="store_true",
                   help="print the traceback of a refused input too (an unexpected failure always prints one)")
    p.add_argument("--smoke", action="store_true",
                   help="tiny backbone, small data, few steps: the whole pipeline in well under a minute")
    return p


def _count(text: str) -> int:
    """A non-negative integer, for argparse (which then prints one line and exits 2 on anything else)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {text!r}")
    return value


def request_from_args(args: argparse.Namespace, typed: frozenset[str] | None = None) -> SearchRequest:
    from tune_as.space.overrides import parse_overrides

    if not args.task and not args.resume:
        raise UserError("--task: expected a task name (see docs/tasks.md), got none")
    losses = None
    if args.losses is not None:
        losses = tuple(x.strip() for x in args.losses.split(",") if x.strip())
    task_args = []
    for item in args.task_arg or []:
        if "=" not in item:
            raise UserError(f"--task-arg: expected KEY=VALUE, got {item!r}")
        key, value = item.split("=", 1)
        task_args.append((key.strip(), value.strip()))
    overrides = tuple(parse_overrides(args.overrides).items())
    switches = {FIELD_OF_DEST[k]: not v for k, v in vars(args).items() if k.startswith("no_")}  # --no-X: X off
    fields = {k: v for k, v in vars(args).items()
              if k not in ("losses", "task_arg", "overrides", "debug") and not k.startswith("no_")}
    return SearchRequest(**{**fields, **switches, "task": args.task or "", "losses": losses,
                            "task_args": tuple(task_args), "overrides": overrides, "typed": typed})


# argparse destinations whose SearchRequest field has another name
FIELD_OF_DEST = {"task_arg": "task_args", "no_asha": "asha", "no_warm_start": "warm_start", "no_dashboard": "dashboard"}


def typed_options(args: argparse.Namespace, argv: list[str] | None) -> frozenset[str]:
    """The SearchRequest fields of the options on the command line, whatever their value: parsed again with every
    default suppressed, so that only typed options are in the namespace (`--max-seeds 10` is typed although 10 is
    the default: a resume must compare it with the saved value)."""
    parser = build_parser()
    for action in parser._actions:  # noqa: SLF001 - argparse lists its actions nowhere public
        action.default = argparse.SUPPRESS
    return frozenset(FIELD_OF_DEST.get(dest, dest) for dest in vars(parser.parse_args(argv)))


class _Fitted(logging.Handler):
    """tune_as's own log lines (data notes, cache and encoding messages) on the current stderr, wrapped to the
    terminal's width."""

    def emit(self, record: logging.LogRecord) -> None:
        from tune_as.results.render import fit

        try:
            print(fit(self.format(record)), file=sys.stderr)
        except Exception:  # noqa: BLE001 - logging's own contract: a failed emit is reported, never raised
            self.handleError(record)


def _fit_log_lines() -> None:
    log = logging.getLogger("tune_as")
    if not any(isinstance(h, _Fitted) for h in log.handlers):  # main() may run many times in one process (tests)
        log.addHandler(_Fitted())
    log.propagate = False  # one copy of each line (not Python's last-resort handler too)
    log.setLevel(logging.WARNING)


def _sigterm_as_interrupt(signum: int, frame: FrameType | None) -> None:
    """SIGTERM (a scheduler or `kill`) stops the search like Ctrl-C: Ray Tune saves its state and stops the
    trials, the runs are closed as KILLED and the resume hint is printed."""
    global _TERMINATED  # noqa: PLW0603 - a signal handler can only talk to main() through module state
    if not _TERMINATED:  # Ray may have got the signal too: give up on it if it cannot stop the search
        interrupt.watch(143)
    _TERMINATED = True
    signal.raise_signal(signal.SIGINT)


_TERMINATED = False


def starting_line(r: SearchRequest) -> str:
    """What is about to run, from the request alone (printed at once: importing PyTorch, Ray Tune and MLflow, then
    starting Ray, take seconds before the search's own lines)."""
    from tune_as.results.render import fit

    if r.resume:
        latest = f"the latest {r.task} search" if r.task else "the latest search"
        what = f"resuming {r.name or latest}"
    else:
        losses = f"losses {', '.join(r.losses)}" if r.losses else "every loss of the task"
        confirm = (f", then racing up to {r.max_seeds} seeds per loss" if r.race
                   else f", then {r.confirm} seeds per loss" if r.confirm else "")
        what = f"{r.task}: a search of {losses}{confirm}"
    ray = "joining the Ray cluster of --address" if r.address else "starting a local Ray"  # (never its text)
    return fit(f"{what}; loading PyTorch, Ray Tune and MLflow, preparing the data, {ray}...")


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # --help (0) or a bad option (2, its line already printed)
        return int(exc.code or 0)
    try:  # what the arguments alone can refuse, before Ray, torch and transformers are imported
        request = request_from_args(args, typed_options(args, argv))
        request.check()
    except UserError as exc:
        if args.debug:
            traceback.print_exc()
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(starting_line(request), flush=True)  # before the heavy imports (seconds of them)
    try:  # a local Ray starts in its own process while this one imports (engine/head.py)
        head = ray_head.launch(request.address, request.dashboard, request.dashboard_host)
    except OSError as exc:  # no temporary folder to write its log in, or no process to start
        print(f"error: Ray: expected a local Ray to start on this machine, got {type(exc).__name__}: {exc}",
              file=sys.stderr)
        return 2
    try:
        return _search(args, request, head)
    finally:
        if head is not None:
            _leave(head)


def _leave(head: ray_head.Head) -> None:
    """Leave Ray, then stop the head: a driver still connected to a stopped head would wait for it (60 s)."""
    if "ray" in sys.modules:
        import ray

        ray.shutdown()
    head.stop()


def _search(args: argparse.Namespace, request: SearchRequest, head: ray_head.Head | None) -> int:
    from tune_as.engine.cluster import loopback_ray

    loopback_ray(args.address)
    from tune_as.engine.disk import EXIT_CODE as DISK_FULL
    from tune_as.engine.disk import DiskFull
    from tune_as.engine.resume import SearchFinished
    from tune_as.engine.run import NoResult, SearchInterrupted, run_search
    from tune_as.sync import KEPT
    from tune_as.tracking.tracker import WritesKept

    # MLflow logs its schema creation on the first use of an SQLite file at INFO ("Creating initial MLflow
    # database tables..."): the CLI prints its own lines, and an error stays one line. Warnings still show.
    logging.getLogger("mlflow").setLevel(logging.WARNING)
    _fit_log_lines()
    previous = signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
    code = 0
    try:
        run_search(request, head)
    except UserError as exc:
        if args.debug:
            traceback.print_exc()
        print(f"error: {exc}", file=sys.stderr)
        code = 2
    except SearchFinished as exc:
        print(str(exc))
    except NoResult as exc:  # the search ran, and no loss has a result: the parent run is FAILED
        print(f"error: {exc}", file=sys.stderr)
        code = 3
    except WritesKept as exc:  # the answer is printed and saved; MLflow lacks some of it, kept in the journal
        print(f"error: {exc}", file=sys.stderr)
        code = KEPT
    except SearchInterrupted as exc:
        print(interrupt.interrupted_line(str(exc)), file=sys.stderr)
        code = 130
    except DiskFull as exc:  # the storage path's disk filled up: stopped like an interruption, resumable
        print(f"error: {exc}\n{interrupt.interrupted_line(exc.hint)}", file=sys.stderr)
        code = DISK_FULL
    except KeyboardInterrupt:
        print(interrupt.interrupted_line(None), file=sys.stderr)
        code = 130
    except Exception:  # noqa: BLE001 - not bad input: a bug, shown as one
        traceback.print_exc()
        print(BUG, file=sys.stderr)
        code = 1
    finally:
        signal.signal(signal.SIGTERM, previous)
    return 143 if code == 130 and _TERMINATED else code


if __name__ == "__main__":
    raise SystemExit(main())
