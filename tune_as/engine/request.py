"""What a user asks of a search: one typed request, checked at the edge (before anything is written).

Each field is declared once, here: its type (the annotation), default, help, unit, and whether it changes
results (`option(...)`, kept in the field's metadata). The CLI's options (tune_as.search.build_parser), the
options a resume compares (`RESULT_OPTIONS`) and the flag a message names (`flag`) derive from that. The
report's confirmation and the tests call the engine with a request directly. Defaults live here and in
`tune_as.settings` (trial settings).
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tune_as.errors import UserError
from tune_as.results.noise import CHOICES as NOISES
from tune_as.results.render import FORMATS as OUTPUT_FORMATS  # light: no rich until a table is drawn
from tune_as.settings import MIN_LENGTH, SEED_MAX

NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
# The registered tasks (tune_as.tasks.TASKS, which a test keeps equal to this), named here so that a mistyped
# --task is refused before torch, Ray and transformers are imported (in well under 2 s, not ~4 s).
TASK_NAMES = ("cifar10", "cifar100", "clinc_oos", "cola", "conll2003", "digits", "eurlex",
              "goemotions", "jsonl", "mnist", "mnli", "mrpc", "qnli", "qqp", "rte", "sighan2015",
              "sst2", "sst5", "wos46985")
# The registered losses (tune_as.losses.LOSSES, which a test keeps equal to this): a mistyped --losses or
# --baseline is refused before torch is imported, with the nearest name.
LOSS_NAMES = ("am_softmax", "as_softmax", "as_speed", "as_variant", "bce", "entmax15", "label_smoothing",
              "multilabel_as_softmax", "multilabel_softmax", "multilabel_sparse_softmax",
              "multilabel_t_softmax", "sm_softmax", "sm_taylor_softmax", "softmax", "sparse_softmax",
              "sparsemax", "t_softmax", "taylor_softmax")
# The tasks with no Hugging Face hub dataset nor data of their own (a test keeps this equal to the
# registry's): refused without --data-dir before anything starts (before, the data preparation found
# out after Ray had started).
NEEDS_DATA_DIR = ("jsonl",)
SAMPLERS = ("tpe", "random")
MOST_PER_TRIAL = 64  # --seeds-per-trial: members of one population
MOST_SEEDS = 100  # --max-seeds and --confirm: seeds per loss
MOST_EPOCHS = 1e6  # --budget and --max-epochs above this are a typo (1e300 printed a 300-digit trial count)


# Dataclass metadata rather than pydantic or attrs: the request is a frozen dataclass like every other
# settings type here, the metadata is a few lines, and it needs no new dependency.
@dataclass(frozen=True)
class Option:
    """How a SearchRequest field is offered and kept (its type and default are the field's own)."""

    help: str  # the CLI's help, verbatim (argparse's %-format: '%%' is a percent sign)
    result: bool  # it changes what a trial computes or what the answer says: saved, and compared on resume
    # its CLI flag, where not "--" + the name with '-' ("--no-" + that for a True switch)
    flag: str | None = None
    unit: str | None = None  # what a number counts, named in the help too
    choices: tuple[str, ...] | None = None
    metavar: str | None = None
    env: str | None = None  # an environment variable that gives the CLI's default
    const: Any = None  # a flag without a value that stores this (argparse's store_const)
    # the CLI's text -> value, where the annotation's type is not enough
    parse: Callable[[str], Any] | None = None
    cli: bool = True  # False: set through the engine's API only


def option(default: Any = dataclasses.MISSING, **how: Any) -> Any:
    """A SearchRequest field: its default, and `Option(**how)` (an unknown key fails at import)."""
    return dataclasses.field(default=default, metadata={"option": Option(**how)})


def _nearest(name: str, known: tuple[str, ...]) -> str:
    """' (did you mean X?)' for the closest known name, or nothing when none is close."""
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


def count(text: str) -> int:
    """A non-negative integer, for argparse (which then prints one line and exits 2 on anything else)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {text!r}")
    return value


@dataclass(frozen=True)
class SearchRequest:
    task: str = option(result=True,
                       help="task name (see docs/tasks.md), e.g. clinc_oos, eurlex, digits (with --resume: "
                            "read from the saved search)")
    losses: tuple[str, ...] | None = option(
        None, result=True,
        help="comma-separated losses (default: every loss that applies to the task's kind)")
    trials_per_loss: int | None = option(None, result=True, unit="trials",
                                         help="Optuna trials per loss "
                                              "(default: the search space file's value)")
    max_epochs: float | None = option(
        None, result=True, unit="epochs",
        help="override the task's epochs (ASHA's max_t; at least one batch of the training split)")
    backbone: str | None = option(
        None, result=True,
        help="HF model id or local path, or 'minilm' / 'tiny' (offline); default: the task's")
    encoder: str = option("finetune", result=True, choices=("finetune", "frozen"),
                          help="finetune the backbone, or train a head on cached frozen features")
    encode_precision: str = option(
        "fp32", result=True, choices=("fp32", "bf16"),
        help="with --encoder frozen: compute the features in fp32, or under bf16 autocast (2-2.8x faster on "
             "CPUs with AMX/AVX-512 bf16; features within 0.003 of fp32, docs/tasks.md)")
    max_length: int | None = option(None, result=True, unit="tokens",
                                    help="token length (default: the task's)")
    data_dir: Path | None = option(
        None, result=True,
        help="local folder of train/validation/test.jsonl[.gz] or HF save_to_disk (default: HF hub)")
    max_train_samples: int | None = option(None, result=True, help="subsample the training split")
    max_eval_samples: int | None = option(None, result=True, help="subsample the validation and test splits")
    task_args: tuple[tuple[str, str], ...] = option(
        (), result=True, flag="--task-arg", metavar="KEY=VALUE",
        help="task option, repeatable (the jsonl task: kind=, text_field=, label_field=, ...)")
    search_space: Path | None = option(None, result=True,
                                       help="search space YAML (default: search_spaces/<task>.yaml)")
    # (KEY, text) pairs, split and key-checked as the command line is read; typed once, when the search is
    # planned (tune_as.space.overrides.check_overrides)
    overrides: tuple[tuple[str, Any], ...] = option(
        (), result=True, flag="--set", metavar="KEY=VALUE",
        help="override a fixed trial setting, repeatable: lr, batch_size, weight_decay, lr_warmup, warmup_r, "
             "max_grad_norm, precision, skip_masked_rows (docs/search_spaces.md)")
    seed: int = option(0, result=True, help="seed for Optuna, data order and model init")
    confirm: int = option(
        0, result=True, unit="seeds", metavar="N", parse=count,
        help="after the search, re-run each loss's selected setting with exactly N new seeds (no early "
             "stopping): verdicts against the baseline and the best set, family-wise error 5%% (default 0: "
             "single runs; --race decides the seeds instead)")
    confirm_top: int | None = option(
        None, result=True, unit="losses", metavar="K",
        help="with --confirm: confirm only the K losses with the best validation in the search, and softmax "
             "(the baseline of the paired differences); the others are shown as single runs "
             "(default: every loss)")
    race: bool = option(False, result=True,
                        help="confirm in rounds (3, 5, 7, ... new seeds) until each verdict is decided or "
                             "--max-seeds; error controlled across rounds (docs/verdicts.md)")
    max_seeds: int = option(10, result=True, unit="seeds", help="with --race: the most seeds per loss")
    seeds_per_trial: int = option(
        1, result=True, unit="seeds", metavar="N",
        help="train up to N confirmation seeds of one loss as one population in one trial: the same runs, "
             "faster (frozen-feature tasks; docs/architecture.md, 'Populations'; default 1)")
    margin: float = option(
        0.5, result=True, unit="points",  # of the metric, as printed (docs/verdicts.md)
        help="equivalence margin in points of the metric (default %(default)s): 'equivalent' means the "
             "difference to the baseline is proven inside ±margin; at least one item of the test split (a "
             "smaller margin is refused)")
    noise: str = option(
        "moderated", result=True, choices=NOISES,
        help="the verdicts' noise model (docs/verdicts.md): 'moderated' (default) estimates each loss's "
             "noise with help from the others (the same seeds for every loss: a block design); 'per-loss' "
             "takes each comparison's own spread alone (the rule before 2026-12-07)")
    baseline: str | None = option(None, result=True,
                                  help="the loss every verdict compares with (default: softmax, "
                                       "multilabel_softmax for multi-label tasks)")
    budget: float | None = option(
        None, result=True, unit="trial-epochs", metavar="E",
        help="trial-epochs for the whole answer, split by the engine: the first confirmation round is "
             "reserved (at most a quarter of the budget; the losses best on validation first), a loss with "
             "nothing to tune gets one search trial, the losses with parameters get the search trials the "
             "rest pays (unless --trials-per-loss says), later rounds take what is left (default: no cap)")
    sampler: str = option("tpe", result=True, choices=SAMPLERS,
                          help="each loss's Optuna sampler: tpe (default) or random "
                               "(uniform draws, a baseline)")
    warm_start: bool = option(
        True, result=True,
        help="do not start each loss with its warm start (the search space's `paper` setting, else the "
             "loss's own defaults where they lie in the searched range)")
    gpus_per_trial: float | None = option(
        None, result=False, unit="GPUs",
        help="GPUs per trial (0.5 packs two trials per GPU; default 1 when the cluster has GPUs, else 0)")
    cpus_per_trial: float = option(1.0, result=False, unit="CPUs", help="CPUs per trial")
    max_concurrent: int | None = option(
        None, result=False, unit="trials",
        help="cap on concurrent trials (default: what the cluster's resources allow, followed as nodes "
             "join or leave, at most 8)")
    eval_every_steps: int | None = option(None, result=True, unit="optimizer steps",
                                          help="evaluate every N optimizer steps (default: once per epoch)")
    address: str | None = option(
        None, result=False, env="RAY_ADDRESS",
        help="Ray cluster address ('auto' on a node of the cluster, or HOST:6379, the head's GCS); default: "
             "a local Ray (env RAY_ADDRESS)")
    storage_path: Path = option(
        Path("tune_as_results"), result=False,
        help="where Ray Tune keeps trial checkpoints and the Optuna study (shared storage on clusters)")
    mlflow_uri: str | None = option(
        None, result=False, env="MLFLOW_TRACKING_URI",
        help="MLflow tracking URI (default: sqlite:///mlflow.db; env MLFLOW_TRACKING_URI)")
    experiment: str | None = option(None, result=False,
                                    help="MLflow experiment name (default: the task name)")
    name: str | None = option(None, result=False,
                              help="search name: its folder under --storage-path (default: "
                                   "<task>-<timestamp>; with --resume: the latest search of the task)")
    resume: bool = option(False, result=False, help="resume the search --name from its last state")
    max_failures: int = option(2, result=False, unit="retries",
                               help="retries of a crashed trial from its checkpoint")
    grace_period: float | None = option(  # None: tune_as.engine.schedulers decides
        None, result=True, unit="epochs",
        help="ASHA grace period, in epochs (default: a third of the epochs, at least 1)")
    reduction_factor: float = option(3.0, result=True, help="ASHA reduction factor")
    asha: bool = option(True, result=True, help="run every trial to the end (no early stopping)")
    asha_scope: str = option("loss", result=True, choices=("loss", "search"),
                             help="compare a trial with trials of its own loss (default) or with every trial "
                                  "of the search (an unfair ablation, for benchmarks)")
    checkpoint_interval_s: float = option(
        30.0, result=False, unit="seconds", flag="--checkpoint-interval",
        help="seconds between a trial's checkpoints (it always checkpoints at its end; 0: every evaluation)")
    dashboard_host: str = option(
        "127.0.0.1", result=False,
        help="bind the local Ray dashboard here (binding wider than loopback prints a warning)")
    dashboard: bool = option(True, result=False,
                             help="start a local Ray without its dashboard "
                                  "(about 2 s sooner; nothing to browse)")
    smoke: bool = option(False, result=True,
                         help="tiny backbone, small data, few steps: "
                              "the whole pipeline in well under a minute")
    cache_dir: Path | None = option(
        None, result=False, cli=False,  # tests and benchmarks point it at a folder of their own
        help="where prepared data and frozen features are cached "
             "(default: $TUNE_AS_CACHE, else ~/.cache/tune_as)")
    verbose: int = option(
        1, result=False, const=2,
        help="Ray's per-trial progress table (one column per parameter) instead of one line per loss")
    output_format: str = option(
        "table", result=False, flag="--format", choices=OUTPUT_FORMATS,
        help="how the answer is printed: a table fitted to the terminal (default), markdown (as logged in "
             "ranking.md), csv or json (for scripts)")
    typed: frozenset[str] | None = option(
        None, result=False, cli=False,
        help="the options the user typed (the CLI knows; a value equal to its default is still typed); None: "
             "a caller of the engine's API, whose non-default values count as given")

    def check(self) -> None:
        """Every check that needs nothing but the request; UserError names the option."""
        if self.task and self.task not in TASK_NAMES:
            raise UserError(f"unknown task {self.task!r}{_nearest(self.task, TASK_NAMES)}: expected one of "
                            f"{', '.join(TASK_NAMES)}")
        for name in self.losses or ():
            if name not in LOSS_NAMES:
                raise UserError(f"--losses: unknown loss {name!r}{_nearest(name, LOSS_NAMES)}; expected some "
                                f"of {', '.join(LOSS_NAMES)}")
        if self.baseline is not None and self.baseline not in LOSS_NAMES:
            raise UserError(f"--baseline: unknown loss {self.baseline!r}"
                            f"{_nearest(self.baseline, LOSS_NAMES)}; expected one of {', '.join(LOSS_NAMES)}")
        if self.task in NEEDS_DATA_DIR and self.data_dir is None:
            raise UserError("--data-dir: expected a folder of train/validation/test.jsonl[.gz] files for "
                            f"--task {self.task} (it has no Hugging Face hub dataset), got none")
        refuse_ray_client(self.address)
        _positive("--trials-per-loss", self.trials_per_loss)
        _positive("--max-epochs", self.max_epochs)
        _positive("--cpus-per-trial", self.cpus_per_trial)
        _positive("--gpus-per-trial", self.gpus_per_trial, strict=False)
        _positive("--max-concurrent", self.max_concurrent)
        _positive("--max-failures", self.max_failures, strict=False)
        _positive("--grace-period", self.grace_period)
        _positive("--eval-every-steps", self.eval_every_steps)
        # --max-length and the sample caps are data settings:
        # their rules live on tune_as.settings.DataSettings
        _positive("--checkpoint-interval", self.checkpoint_interval_s, strict=False)
        if not math.isfinite(self.reduction_factor) or self.reduction_factor <= 1:
            raise UserError(f"--reduction-factor: expected a number > 1, got {self.reduction_factor}")
        if self.asha_scope not in ("loss", "search"):
            raise UserError(f"--asha-scope: expected 'loss' or 'search', got {self.asha_scope!r}")
        if isinstance(self.confirm, bool) or not isinstance(self.confirm, int) or self.confirm < 0:
            raise UserError("--confirm: expected a non-negative integer (new seeds per loss), got "
                            f"{self.confirm!r}")
        if self.confirm_top is not None and (isinstance(self.confirm_top, bool)
                                             or not isinstance(self.confirm_top, int)
                                             or self.confirm_top < 1):
            raise UserError("--confirm-top: expected a positive integer (losses to confirm), got "
                            f"{self.confirm_top!r}")
        if self.confirm_top is not None and self.race:  # before the next: --confirm N is refused with --race
            raise UserError("--confirm-top: expected it with --confirm N, got it with --race (a race drops "
                            "decided losses itself)")
        if self.confirm_top is not None and not self.confirm:
            raise UserError("--confirm-top: expected --confirm N too (it says how many losses to confirm), "
                            "got --confirm 0")
        if self.race and self.confirm:
            raise UserError("--race: expected either --race (rounds up to --max-seeds) or --confirm N "
                            f"(exactly N seeds), got both (--confirm {self.confirm})")
        if (isinstance(self.max_seeds, bool) or not isinstance(self.max_seeds, int)
                or not 3 <= self.max_seeds <= MOST_SEEDS):
            raise UserError(f"--max-seeds: expected an integer in [3, {MOST_SEEDS}], got {self.max_seeds!r}")
        if self.confirm > MOST_SEEDS:
            raise UserError(f"--confirm: expected at most {MOST_SEEDS} new seeds per loss (as --max-seeds), "
                            f"got {self.confirm}")
        # DataSettings' rule, before any task
        if self.max_length is not None and (isinstance(self.max_length, bool)
                                            or not isinstance(self.max_length, int)
                                            or self.max_length < MIN_LENGTH):
            raise UserError(f"--max-length: expected an integer >= {MIN_LENGTH} (tokens), got "
                            f"{self.max_length!r}")
        if (isinstance(self.seeds_per_trial, bool) or not isinstance(self.seeds_per_trial, int)
                or not 1 <= self.seeds_per_trial <= MOST_PER_TRIAL):
            raise UserError(f"--seeds-per-trial: expected an integer in [1, {MOST_PER_TRIAL}], got "
                            f"{self.seeds_per_trial!r}")
        if self.seeds_per_trial > 1 and not (self.race or self.confirm):
            raise UserError("--seeds-per-trial: expected it with --race or --confirm N "
                            "(it trains confirmation seeds together), "
                            f"got --seeds-per-trial {self.seeds_per_trial} without either")
        if self.seeds_per_trial > 1 and self.eval_every_steps is not None:
            raise UserError("--seeds-per-trial: expected 1 with --eval-every-steps (a population's members "
                            f"report together once per epoch), got {self.seeds_per_trial}")
        if self.encode_precision != "fp32" and self.encoder != "frozen":
            raise UserError(f"--encode-precision: expected fp32 with --encoder {self.encoder} (only a frozen "
                            f"encoder computes features ahead), got {self.encode_precision}")
        if not math.isfinite(self.margin) or not 0 <= self.margin <= 100:
            raise UserError(f"--margin: expected points in [0, 100] (e.g. 0.5), got {self.margin}")
        _positive("--budget", self.budget)
        for name, value in (("--budget", self.budget), ("--max-epochs", self.max_epochs)):
            if value is not None and value > MOST_EPOCHS:
                raise UserError(f"{name}: expected at most {MOST_EPOCHS:g} trial-epochs (what a machine can "
                                f"train), got {value:g}")
        if self.trials_per_loss is not None and self.trials_per_loss > MOST_EPOCHS:  # 1e30 started a search
            raise UserError(f"--trials-per-loss: expected at most {MOST_EPOCHS:g} trials (what a machine can "
                            f"train), got {self.trials_per_loss:g}")
        if self.confirm == 1:
            raise UserError("--confirm: expected 0 or at least 2 seeds (a paired interval needs 2), got 1")
        if self.output_format not in OUTPUT_FORMATS:
            raise UserError(f"--format: expected one of {', '.join(OUTPUT_FORMATS)}, got "
                            f"{self.output_format!r}")
        if self.noise not in NOISES:
            raise UserError(f"--noise: expected one of {', '.join(NOISES)}, got {self.noise!r}")
        if self.sampler not in SAMPLERS:
            raise UserError(f"--sampler: expected one of {', '.join(SAMPLERS)}, got {self.sampler!r}")
        if not 0 <= self.seed <= SEED_MAX:
            raise UserError(f"--seed: expected an integer in [0, {SEED_MAX}], got {self.seed}")
        if self.losses is not None and not self.losses:
            raise UserError("--losses: expected comma-separated loss names, got none")
        if self.name is not None and not NAME_PATTERN.fullmatch(self.name):
            raise UserError("--name: expected one path segment of letters, digits, '.', '_' or '-' (at most "
                            f"100, not starting with '.', '_' or '-'), got {self.name[:80]!r}")

    def given(self) -> dict[str, Any]:
        """The result options the user asked for explicitly: typed on the command line (`typed`), else those
        that differ from their defaults."""
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        return {k: getattr(self, k) for k in RESULT_OPTIONS
                if (k in self.typed if self.typed is not None else getattr(self, k) != defaults[k])}


OPTIONS: dict[str, Option] = {f.name: f.metadata["option"] for f in dataclasses.fields(SearchRequest)}
# The CLI's --help, in groups a user looks for (a test keeps every CLI option in exactly one).
HELP_GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("what to search", ("task", "losses", "search_space", "overrides", "backbone", "encoder",
                        "encode_precision", "max_length", "data_dir", "max_train_samples", "max_eval_samples",
                        "task_args", "smoke")),
    ("how long", ("trials_per_loss", "max_epochs", "budget", "sampler", "warm_start", "seed", "asha",
                  "asha_scope", "grace_period", "reduction_factor", "eval_every_steps")),
    ("how sure", ("race", "max_seeds", "confirm", "confirm_top", "seeds_per_trial", "margin", "noise",
                  "baseline")),
    ("where it runs", ("address", "gpus_per_trial", "cpus_per_trial", "max_concurrent", "max_failures",
                       "checkpoint_interval_s", "dashboard", "dashboard_host", "resume")),
    ("where it records, what it prints", ("storage_path", "mlflow_uri", "experiment", "name", "output_format",
                                          "verbose")),
)
# Options whose value changes what a trial computes: a resumed search must keep them (tune_as.engine.plan).
RESULT_OPTIONS = tuple(name for name, o in OPTIONS.items() if o.result)


def flag(name: str) -> str:
    """The CLI flag of a SearchRequest field, e.g. "overrides" -> "--set", "asha" -> "--no-asha"."""
    switch_off = SearchRequest.__dataclass_fields__[name].default is True
    return OPTIONS[name].flag or ("--no-" if switch_off else "--") + name.replace("_", "-")


def refuse_ray_client(address: str | None) -> None:
    """A Ray Client address (`ray://HOST:PORT`) cannot run a search: through Ray Client, `Tuner.fit` runs
    Tune's controller in an actor on the cluster, where the callbacks that track every run in MLflow, draw the
    progress and keep the answer's runs do not reach this process (Ray documents Tune's controller moving
    there). Refused before anything starts, without echoing the address (it may hold a password)."""
    if address and address.strip().lower().startswith("ray://"):
        raise UserError("--address: expected 'auto' or HOST:PORT of a Ray cluster's GCS (the head's --port, "
                        "6379 by default), got a Ray Client address (ray://...): through Ray Client, Tune's "
                        "controller runs on the cluster, out of reach of this process's tracking and answer; "
                        "run the search on a node of the cluster with --address auto, or submit it there "
                        "with `ray job submit` (docs/cluster.md)")


def _positive(name: str, value: float | None, minimum: float = 0.0, strict: bool = True) -> None:
    if value is not None and (not math.isfinite(value) or (value <= minimum if strict else value < minimum)):
        raise UserError(f"{name}: expected a number {'>' if strict else '>='} {minimum:g}, got {value}")
