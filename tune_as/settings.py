"""The two kinds of settings, each typed and checked once, here.

- `DataSettings`: what is prepared once per search (task, data, backbone, encoder, sequence length, sample
  caps). It is the cache key of the prepared data (tune_as.tasks), so no trial can ask for other data: a
  search space may not set these per loss (refused when the file is loaded).
- `TrialSettings`: what may differ from trial to trial (optimizer, schedule, epochs, warm-up, loss parameters,
  seed). Ray hands the trainable a flat dict (`to_dict`): settings by name and loss hyper-parameters as
  `loss.<name>`; `from_dict` turns it back on the trainable's first line and refuses unknown keys.

Every rule about a field lives on the class that owns it (`DataSettings.problems`, `TrialSettings.problems`),
and `coerce_field` types a user's value (YAML or command-line text) by the field's annotation: the search
space, `--set` and the CLI's own options all go through these two functions.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

LOSS_PREFIX = "loss."
PRECISIONS = ("auto", "fp32", "bf16", "fp16")
ENCODERS = ("finetune", "frozen")  # fine-tune the backbone, or train a head on its cached features
ENCODE_PRECISIONS = ("fp32", "bf16")  # how a frozen encoder computes the features (bf16: autocast, measured)
DEFAULT_ENCODER = "finetune"
MIN_LENGTH = 4  # [CLS] + two tokens + [SEP]: shorter sequences cannot hold a sentence pair
SEED_MAX = 2**32 - 1


def _finite(value: Any) -> bool:
    return not isinstance(value, float) or math.isfinite(value)


def _check(rules: list[tuple[bool, str, Any]]) -> list[str]:
    return [f"{message}, got {got!r}" for ok, message, got in rules if not ok]


@dataclass(frozen=True)
class DataSettings:
    """Everything that changes the prepared tensors; its fields (less `cache_dir`) form the cache key.

    `data_dir=None` loads the task's Hugging Face hub dataset; a folder loads local files (see docs/tasks.md).
    `max_*_samples` take a seeded random subset (never the first rows: several datasets are sorted by label).
    """

    task: str
    data_dir: Path | None = None
    backbone: str = "minilm"
    encoder: str = DEFAULT_ENCODER
    max_length: int = 128
    max_train_samples: int | None = None
    max_eval_samples: int | None = None
    seed: int = 0
    encode_precision: str = "fp32"  # a frozen encoder's arithmetic (docs/tasks.md: bf16 within 0.003 of fp32)
    cache_dir: Path = Path(".tune_as_cache")

    def __post_init__(self) -> None:
        if self.data_dir is not None and not isinstance(self.data_dir, Path):
            object.__setattr__(self, "data_dir", Path(self.data_dir))
        if not isinstance(self.cache_dir, Path):
            object.__setattr__(self, "cache_dir", Path(self.cache_dir))
        problems = self.problems()
        if problems:
            raise ValueError(problems[0])

    def problems(self) -> list[str]:
        return _check([
            (self.encoder in ENCODERS, f"encoder: expected one of {ENCODERS}", self.encoder),
            (self.max_length >= MIN_LENGTH, f"max_length: expected an integer >= {MIN_LENGTH}",
             self.max_length),
            (self.max_train_samples is None or self.max_train_samples >= 1,
             "max_train_samples: expected none or an integer >= 1", self.max_train_samples),
            (self.max_eval_samples is None or self.max_eval_samples >= 1,
             "max_eval_samples: expected none or an integer >= 1", self.max_eval_samples),
            (0 <= self.seed <= SEED_MAX, f"seed: expected an integer in [0, {SEED_MAX}]", self.seed),
            (self.encode_precision in ENCODE_PRECISIONS,
             f"encode_precision: expected one of {ENCODE_PRECISIONS}", self.encode_precision),
        ])

    def key_fields(self) -> dict[str, Any]:
        """The cache key of the prepared data."""
        fields = dataclasses.asdict(self)
        del fields["cache_dir"]  # where the cache lives does not change what is in it
        if self.encode_precision == "fp32":  # the key of every cache written before this field existed
            del fields["encode_precision"]
        fields["data_dir"] = None if self.data_dir is None else str(self.data_dir.resolve())
        # The seed only changes the data through subsampling and the random `tiny` encoder's features:
        # otherwise every seed of a search shares one cache entry (no 80 s re-encode per seed).
        subsampled = self.max_train_samples is not None or self.max_eval_samples is not None
        if not subsampled and not (self.backbone == "tiny" and self.encoder == "frozen"):
            fields["seed"] = None
        return fields

    def to_params(self) -> dict[str, Any]:
        """What MLflow records of the data, beside each trial's settings (cache_dir is where, not what)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if f.name not in ("cache_dir", "seed")}


@dataclass(frozen=True)
class TrialSettings:
    loss: str
    epochs: float
    batch_size: int
    lr: float
    loss_params: dict[str, Any] = field(default_factory=dict)
    warmup_r: float = 0.0  # AS-Softmax warm-up: delta = 1 for the first r fraction of training
    skip_masked_rows: bool = False  # leave fully masked rows out of the backward pass (AS family only)
    lr_warmup: float = 0.1  # linear learning-rate warm-up, fraction of training
    weight_decay: float = 0.01
    max_grad_norm: float = 1.0
    seed: int = 0
    eval_every_steps: int | None = None  # None: evaluate once per epoch
    precision: str = "auto"  # auto: bf16 autocast on GPUs that support it, else fp32

    def __post_init__(self) -> None:
        problems = self.problems()
        if problems:
            raise ValueError(problems[0])

    def problems(self) -> list[str]:
        numbers = {"epochs": self.epochs, "lr": self.lr, "weight_decay": self.weight_decay,
                   "max_grad_norm": self.max_grad_norm, "warmup_r": self.warmup_r,
                   "lr_warmup": self.lr_warmup}
        return _check([
            *[(_finite(v), f"{k}: expected a finite number", v) for k, v in numbers.items()],
            (self.epochs > 0, "epochs: expected a number > 0", self.epochs),
            (self.batch_size >= 1, "batch_size: expected an integer >= 1", self.batch_size),
            (self.lr > 0, "lr: expected a number > 0", self.lr),
            (self.weight_decay >= 0, "weight_decay: expected a number >= 0", self.weight_decay),
            (self.max_grad_norm > 0, "max_grad_norm: expected a number > 0", self.max_grad_norm),
            (0.0 <= self.warmup_r < 1.0, "warmup_r: expected a number in [0, 1)", self.warmup_r),
            (0.0 <= self.lr_warmup < 1.0, "lr_warmup: expected a number in [0, 1)", self.lr_warmup),
            (self.precision in PRECISIONS, f"precision: expected one of {PRECISIONS}", self.precision),
            (self.eval_every_steps is None or self.eval_every_steps >= 1,
             "eval_every_steps: expected none or an integer >= 1", self.eval_every_steps),
            (0 <= self.seed <= SEED_MAX, f"seed: expected an integer in [0, {SEED_MAX}]", self.seed),
        ])

    @classmethod
    def from_dict(cls, config: dict[str, Any]) -> TrialSettings:
        """Build from Ray's flat dict; unknown keys are an error (a typo must not silently do nothing)."""
        loss_params = {k[len(LOSS_PREFIX):]: v for k, v in config.items() if k.startswith(LOSS_PREFIX)}
        plain = {k: v for k, v in config.items() if not k.startswith(LOSS_PREFIX)}
        unknown = sorted(set(plain) - set(TRIAL_FIELDS))
        if unknown:
            where = [k for k in unknown if k in DATA_FIELDS]
            hint = f" ({', '.join(where)}: data settings, fixed for the whole search)" if where else ""
            raise ValueError(f"unknown trial setting(s) {unknown}{hint}; "
                             f"expected some of {sorted(TRIAL_FIELDS)} or 'loss.<name>'")
        return cls(**plain, loss_params=loss_params)

    def to_dict(self) -> dict[str, Any]:
        """The flat form (inverse of from_dict)."""
        flat = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "loss_params"}
        flat.update({LOSS_PREFIX + k: v for k, v in self.loss_params.items()})
        return flat


# -- typing a user's value ----------------------------------------------------------------------------
EXPECTED = {float: "a float", int: "an integer", bool: "true or false", str: "a string"}
BOOLS = {"true": True, "false": False, "1": True, "0": False}


def coerce(value: Any, hint: Any) -> Any:
    """`value` (a YAML value or command-line text) as the type `hint` (float, int, bool, str, X | None, Any).

    Numeric text becomes a number: YAML 1.1 reads ``2e-5`` as a string. Raises ValueError saying what was
    expected.
    """
    args = typing.get_args(hint)
    if type(None) in args:
        if value is None or (isinstance(value, str) and value.strip().lower() in ("none", "null")):
            return None
        (inner,) = (a for a in args if a is not type(None))
        try:
            return coerce(value, inner)
        except ValueError:
            raise ValueError(f"{EXPECTED[inner]} or none") from None
    if hint not in EXPECTED:  # e.g. a loss hyper-parameter without a default: the loss judges the value
        return value
    if hint is str:
        if isinstance(value, str):
            return value
    elif hint is bool:
        if isinstance(value, bool):
            return value
        word = str(value).strip().lower() if isinstance(value, str | int) else ""
        if word in BOOLS:
            return BOOLS[word]
    elif isinstance(value, bool):
        pass  # True is an int to Python, not a number to a user
    elif isinstance(value, int) or (hint is float and isinstance(value, float)):
        return hint(value)
    elif isinstance(value, str):
        try:
            return hint(value.strip())
        except ValueError:
            pass
    raise ValueError(EXPECTED[hint])


# Field names and their annotations: what a search space, --set or MLflow params may name.
TRIAL_FIELDS: dict[str, Any] = {k: v for k, v in typing.get_type_hints(TrialSettings).items()
                                if k != "loss_params"}
DATA_FIELDS: dict[str, Any] = {k: v for k, v in typing.get_type_hints(DataSettings).items()
                               if k != "cache_dir"}
# Each field's default (none for the required ones): what `from_params` gives a field that was not logged.
DEFAULTS: dict[str, Any] = {f.name: f.default for cls in (DataSettings, TrialSettings)
                            for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING}


def coerce_finite(value: Any, hint: Any) -> Any:
    """`coerce`, and a non-finite float refused too: every value a user types goes through here."""
    typed = coerce(value, hint)
    if not _finite(typed):
        raise ValueError("a finite number")
    return typed


def coerce_field(name: str, value: Any) -> Any:
    """A user's value for the setting `name` as its field's type (trial settings first, then data settings).
    Raises ValueError "expected ..." (`coerce`'s words)."""
    hint = TRIAL_FIELDS.get(name, DATA_FIELDS.get(name))
    if hint is None:
        raise KeyError(name)
    return coerce_finite(value, hint)


# Stand-ins for the required fields, so that a few settings can be judged on their own.
_TRIAL_PROBE: dict[str, Any] = {"loss": "softmax", "epochs": 1.0, "batch_size": 1, "lr": 1e-3}


def trial_problem(settings: dict[str, Any]) -> str | None:
    """What TrialSettings' own rules say about some trial settings (data settings ignored), or None."""
    trial = {k: v for k, v in settings.items() if k in TRIAL_FIELDS}
    try:
        TrialSettings(**{**_TRIAL_PROBE, **trial})
    except (ValueError, TypeError) as exc:
        return str(exc).splitlines()[0]
    data = {k: v for k, v in settings.items() if k in DATA_FIELDS and k != "task"}
    try:
        DataSettings(task="x", **data)
    except (ValueError, TypeError) as exc:
        return str(exc).splitlines()[0]
    return None


def unused(params: dict[str, Any], uses_backbone: bool) -> set[str]:
    """The settings among a trial's flat `params` (data and trial settings, as MLflow logs them) that its
    task or loss ignores while they hold their default: a sequence length, an encoder and its precision on an
    image task (its CNN has no tokenizer and nothing to freeze), an encoder's precision unless it is frozen,
    the AS warm-up (`warmup_r`) and row skipping of a loss without them. MLflow need not log them:
    `from_params` gives a field that is absent its default, so the settings read back are the same. A value
    other than the default is kept (it says what was asked, and reads back as asked)."""
    from tune_as.losses import LOSSES

    ignored = set()
    if not uses_backbone:
        ignored |= {"max_length", "encoder", "encode_precision"}
    elif params.get("encoder", DEFAULT_ENCODER) != "frozen":
        ignored.add("encode_precision")
    loss = LOSSES.get(str(params.get("loss")))
    if loss is not None and not loss.supports_warmup:
        ignored.add("warmup_r")
    if loss is not None and not loss.supports_row_skipping:
        ignored.add("skip_masked_rows")
    return {k for k in ignored if k in params and params[k] == DEFAULTS[k]}


def from_params(params: dict[str, str]) -> tuple[DataSettings, TrialSettings]:
    """A child run's MLflow params (strings) back to its settings, each typed by its field's annotation (a
    loss hyper-parameter by the type of the loss's default, as the search space types it). Other params
    (git_commit, anything a newer version logs) are not settings and are left out."""
    from tune_as.losses import LOSSES

    loss = params["loss"]
    defaults = LOSSES[loss]().hparams() if loss in LOSSES else {}

    def typed(name: str, raw: str, hint: Any) -> Any:
        if raw == "None":
            return None
        return coerce(raw, hint)

    trial = {k: typed(k, v, hint) for k, v in params.items() if (hint := TRIAL_FIELDS.get(k)) is not None}
    for key, raw in params.items():
        if key.startswith(LOSS_PREFIX):
            name = key[len(LOSS_PREFIX):]
            default = defaults.get(name)
            trial[key] = typed(name, raw, Any if default is None else type(default))
    data = {k: typed(k, v, hint) for k, v in params.items()
            if (hint := DATA_FIELDS.get(k)) is not None and k not in TRIAL_FIELDS}
    return DataSettings(**data), TrialSettings.from_dict(trial)
