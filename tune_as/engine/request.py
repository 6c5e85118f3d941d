"""What a user asks of a search: one typed request, validated once, at the edge (before anything is written).

The CLI (tune_as.search) maps its arguments onto `SearchRequest`; the report's confirmation and the tests call
the engine with one directly. Defaults live here and in `tune_as.settings` (trial settings) only.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tune_as.errors import UserError
from tune_as.results.render import FORMATS as OUTPUT_FORMATS  # light: no rich until a table is drawn
from tune_as.settings import SEED_MAX

# Options whose value changes what a trial computes: a resumed search must keep them (tune_as.engine.plan).
RESULT_OPTIONS = ("task", "losses", "trials_per_loss", "max_epochs", "backbone", "encoder", "encode_precision", "max_length", "data_dir",
                  "max_train_samples", "max_eval_samples", "task_args", "search_space", "seed", "overrides",
                  "eval_every_steps", "grace_period", "reduction_factor", "asha", "asha_scope", "smoke", "confirm",
                  "confirm_top", "sampler", "warm_start", "race", "max_seeds", "margin", "baseline", "budget",
                  "seeds_per_trial")
# Options whose CLI flag is not "--" + the name with '-' (messages name the flag a user typed).
FLAGS = {"overrides": "--set", "task_args": "--task-arg", "asha": "--no-asha", "warm_start": "--no-warm-start",
         "checkpoint_interval_s": "--checkpoint-interval", "output_format": "--format",
         "dashboard": "--no-dashboard"}
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
# The registered tasks (tune_as.tasks.TASKS, which a test keeps equal to this), named here so that a mistyped
# --task is refused before torch, Ray and transformers are imported (in well under 2 s, not ~4 s).
TASK_NAMES = ("cifar10", "cifar100", "clinc_oos", "cola", "conll2003", "digits", "eurlex", "goemotions", "jsonl",
              "mnist", "mnli", "mrpc", "qnli", "qqp", "rte", "sighan2015", "sst2", "sst5", "wos46985")
SAMPLERS = ("tpe", "random")
MOST_PER_TRIAL = 64  # --seeds-per-trial: members of one population
MOST_EPOCHS = 1e6  # --budget and --max-epochs above this are a typo (1e300 printed a 300-digit trial count)


@dataclass(frozen=True)
class SearchRequest:
    task: str
    losses: tuple[str, ...] | None = None
    trials_per_loss: int | None = None  # None: the search space file's value
    max_epochs: float | None = None
    backbone: str | None = None
    encoder: str = "finetune"
    encode_precision: str = "fp32"  # a frozen encoder's arithmetic: fp32, or bf16 autocast (2-2.8x on AMX CPUs)
    max_length: int | None = None
    data_dir: Path | None = None
    max_train_samples: int | None = None
    max_eval_samples: int | None = None
    task_args: tuple[tuple[str, str], ...] = ()
    search_space: Path | None = None
    overrides: tuple[tuple[str, Any], ...] = ()  # --set KEY=VALUE, already typed (search_space.parse_overrides)
    seed: int = 0
    confirm: int = 0  # new seeds per loss for its selected setting, after the search
    confirm_top: int | None = None  # confirm only the K losses best on validation (and softmax); None: every loss
    race: bool = False  # confirm in rounds (3, 5, 7, ... seeds) until each verdict is decided or max_seeds
    max_seeds: int = 10  # with race: the most confirmation seeds a loss gets
    seeds_per_trial: int = 1  # confirmation seeds of one loss trained as one population (tune_as.training.population)
    margin: float = 0.5  # equivalence margin, in points of the metric (docs/verdicts.md)
    baseline: str | None = None  # the loss every verdict compares with (None: by the task's kind)
    budget: float | None = None  # trial-epochs for the whole answer (search and confirmation); None: no cap
    sampler: str = "tpe"  # each loss's Optuna sampler: "tpe", or "random" (uniform draws: a baseline)
    warm_start: bool = True  # each loss's first trial: the space's `paper` setting, else the loss's own defaults
    gpus_per_trial: float | None = None
    cpus_per_trial: float = 1.0
    max_concurrent: int | None = None
    eval_every_steps: int | None = None
    address: str | None = None
    storage_path: Path = Path("tune_as_results")
    mlflow_uri: str | None = None
    experiment: str | None = None
    name: str | None = None
    resume: bool = False
    max_failures: int = 2
    grace_period: float | None = None  # None: a third of the epochs (tune_as.engine.schedulers)
    reduction_factor: float = 3.0
    asha: bool = True
    asha_scope: str = "loss"  # "loss": brackets per loss; "search": one set for every loss (an ablation only)
    checkpoint_interval_s: float = 30.0  # a trial checkpoints at an evaluation at most this often (and at its end)
    dashboard_host: str = "127.0.0.1"
    dashboard: bool = True  # a local Ray's dashboard (--no-dashboard: ~2 s less to start, nothing to browse)
    smoke: bool = False
    cache_dir: Path | None = None
    verbose: int = 1
    output_format: str = "table"  # how the answer is printed: tune_as.results.render.FORMATS
    # the options the user typed (the CLI knows; a value equal to its default is still typed), None: a caller of
    # the engine's API, whose non-default values count as given
    typed: frozenset[str] | None = None

    def check(self) -> None:
        """Every check that needs nothing but the request; UserError names the option."""
        if self.task and self.task not in TASK_NAMES:
            raise UserError(f"unknown task {self.task!r}: expected one of {', '.join(TASK_NAMES)}")
        _positive("--trials-per-loss", self.trials_per_loss)
        _positive("--max-epochs", self.max_epochs)
        _positive("--cpus-per-trial", self.cpus_per_trial)
        _positive("--gpus-per-trial", self.gpus_per_trial, strict=False)
        _positive("--max-concurrent", self.max_concurrent)
        _positive("--max-failures", self.max_failures, strict=False)
        _positive("--grace-period", self.grace_period)
        _positive("--eval-every-steps", self.eval_every_steps)
        # --max-length and the sample caps are data settings: their rules live on tune_as.settings.DataSettings
        _positive("--checkpoint-interval", self.checkpoint_interval_s, strict=False)
        if not math.isfinite(self.reduction_factor) or self.reduction_factor <= 1:
            raise UserError(f"--reduction-factor: expected a number > 1, got {self.reduction_factor}")
        if self.asha_scope not in ("loss", "search"):
            raise UserError(f"--asha-scope: expected 'loss' or 'search', got {self.asha_scope!r}")
        if isinstance(self.confirm, bool) or not isinstance(self.confirm, int) or self.confirm < 0:
            raise UserError(f"--confirm: expected a non-negative integer (new seeds per loss), got {self.confirm!r}")
        if self.confirm_top is not None and (isinstance(self.confirm_top, bool) or not isinstance(self.confirm_top, int)
                                             or self.confirm_top < 1):
            raise UserError(f"--confirm-top: expected a positive integer (losses to confirm), got {self.confirm_top!r}")
        if self.confirm_top is not None and not self.confirm:
            raise UserError("--confirm-top: expected --confirm N too (it says how many losses to confirm), got "
                            "--confirm 0")
        if self.race and self.confirm:
            raise UserError(f"--race: expected either --race (rounds up to --max-seeds) or --confirm N (exactly N "
                            f"seeds), got both (--confirm {self.confirm})")
        if isinstance(self.max_seeds, bool) or not isinstance(self.max_seeds, int) or not 3 <= self.max_seeds <= 100:
            raise UserError(f"--max-seeds: expected an integer in [3, 100], got {self.max_seeds!r}")
        if (isinstance(self.seeds_per_trial, bool) or not isinstance(self.seeds_per_trial, int)
                or not 1 <= self.seeds_per_trial <= MOST_PER_TRIAL):
            raise UserError(f"--seeds-per-trial: expected an integer in [1, {MOST_PER_TRIAL}], got "
                            f"{self.seeds_per_trial!r}")
        if self.seeds_per_trial > 1 and not (self.race or self.confirm):
            raise UserError(f"--seeds-per-trial: expected it with --race or --confirm N (it trains confirmation "
                            f"seeds together), got --seeds-per-trial {self.seeds_per_trial} without either")
        if self.seeds_per_trial > 1 and self.eval_every_steps is not None:
            raise UserError("--seeds-per-trial: expected 1 with --eval-every-steps (a population's members report "
                            f"together once per epoch), got {self.seeds_per_trial}")
        if self.encode_precision != "fp32" and self.encoder != "frozen":
            raise UserError(f"--encode-precision: expected fp32 with --encoder {self.encoder} (only a frozen encoder "
                            f"computes features ahead), got {self.encode_precision}")
        if not math.isfinite(self.margin) or not 0 <= self.margin <= 100:
            raise UserError(f"--margin: expected points in [0, 100] (e.g. 0.5), got {self.margin}")
        _positive("--budget", self.budget)
        for name, value in (("--budget", self.budget), ("--max-epochs", self.max_epochs)):
            if value is not None and value > MOST_EPOCHS:
                raise UserError(f"{name}: expected at most {MOST_EPOCHS:g} trial-epochs (what a machine can train), "
                                f"got {value:g}")
        if self.confirm_top is not None and self.race:
            raise UserError("--confirm-top: expected it with --confirm N, got it with --race (a race drops "
                            "decided losses itself)")
        if self.confirm == 1:
            raise UserError("--confirm: expected 0 or at least 2 seeds (a paired interval needs 2), got 1")
        if self.output_format not in OUTPUT_FORMATS:
            raise UserError(f"--format: expected one of {', '.join(OUTPUT_FORMATS)}, got {self.output_format!r}")
        if self.sampler not in SAMPLERS:
            raise UserError(f"--sampler: expected one of {', '.join(SAMPLERS)}, got {self.sampler!r}")
        if not 0 <= self.seed <= SEED_MAX:
            raise UserError(f"--seed: expected an integer in [0, {SEED_MAX}], got {self.seed}")
        if self.losses is not None and not self.losses:
            raise UserError("--losses: expected comma-separated loss names, got none")
        if self.name is not None and not NAME_PATTERN.fullmatch(self.name):
            raise UserError(f"--name: expected one path segment of letters, digits, '.', '_' or '-' (at most 100, "
                            f"not starting with '.', '_' or '-'), got {self.name[:80]!r}")

    def given(self) -> dict[str, Any]:
        """The result options the user asked for explicitly: typed on the command line (`typed`), else those that
        differ from their defaults."""
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        return {k: getattr(self, k) for k in RESULT_OPTIONS
                if (k in self.typed if self.typed is not None else getattr(self, k) != defaults[k])}


def flag(option: str) -> str:
    """The CLI flag of a SearchRequest field, e.g. "overrides" -> "--set"."""
    return FLAGS.get(option, "--" + option.replace("_", "-"))


def _positive(name: str, value: float | None, minimum: float = 0.0, strict: bool = True) -> None:
    if value is not None and (not math.isfinite(value) or (value <= minimum if strict else value < minimum)):
        raise UserError(f"{name}: expected a number {'>' if strict else '>='} {minimum:g}, got {value}")
