"""The typed trial configuration: Ray hands the trainable a flat dict, this turns it into a frozen dataclass.

Flat keys are what Optuna suggests, what Ray shows in its progress table and what MLflow records as params:
trainer settings by name (``lr``, ``warmup_r``, ...) and loss hyper-parameters as ``loss.<name>``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

LOSS_PREFIX = "loss."
PRECISIONS = ("auto", "fp32", "bf16", "fp16")
ENCODERS = ("finetune", "frozen")  # fine-tune the backbone, or train a head on its cached features
DEFAULT_ENCODER = "finetune"  # the one default, shared with tune_as.tasks.DataSpec


@dataclass(frozen=True)
class TrialConfig:
    task: str
    loss: str
    epochs: float
    batch_size: int
    lr: float
    max_length: int
    backbone: str
    encoder: str = DEFAULT_ENCODER
    loss_params: dict[str, Any] = field(default_factory=dict)
    warmup_r: float = 0.0  # AS-Softmax warm-up: delta = 1 for the first r fraction of training
    skip_masked_rows: bool = False  # leave fully masked rows out of the backward pass (AS family only)
    lr_warmup: float = 0.1  # linear learning-rate warm-up, fraction of training
    weight_decay: float = 0.01
    max_grad_norm: float = 1.0
    seed: int = 0
    eval_every_steps: int | None = None  # None: evaluate once per epoch
    precision: str = "auto"  # auto: bf16 autocast on GPUs that support it, else fp32
    data_dir: str | None = None
    max_train_samples: int | None = None
    max_eval_samples: int | None = None

    def __post_init__(self) -> None:
        checks = [
            (self.epochs > 0, "epochs must be > 0", self.epochs),
            (self.batch_size >= 1, "batch_size must be >= 1", self.batch_size),
            (self.lr > 0, "lr must be > 0", self.lr),
            (self.max_length >= 1, "max_length must be >= 1", self.max_length),
            (self.weight_decay >= 0, "weight_decay must be >= 0", self.weight_decay),
            (self.max_grad_norm > 0, "max_grad_norm must be > 0", self.max_grad_norm),
            (0.0 <= self.warmup_r < 1.0, "warmup_r must be in [0, 1)", self.warmup_r),
            (0.0 <= self.lr_warmup < 1.0, "lr_warmup must be in [0, 1)", self.lr_warmup),
            (self.precision in PRECISIONS, f"precision must be one of {PRECISIONS}", self.precision),
            (self.encoder in ENCODERS, f"encoder must be one of {ENCODERS}", self.encoder),
            (self.eval_every_steps is None or self.eval_every_steps >= 1, "eval_every_steps must be >= 1",
             self.eval_every_steps),
        ]
        for ok, message, got in checks:
            if not ok:
                raise ValueError(f"{message}, got {got!r}")

    @classmethod
    def from_dict(cls, config: dict[str, Any]) -> TrialConfig:
        """Build from Ray's flat dict; unknown keys are an error (a typo must not silently do nothing)."""
        names = {f.name for f in dataclasses.fields(cls)} - {"loss_params"}
        loss_params = {k[len(LOSS_PREFIX):]: v for k, v in config.items() if k.startswith(LOSS_PREFIX)}
        plain = {k: v for k, v in config.items() if not k.startswith(LOSS_PREFIX)}
        unknown = sorted(set(plain) - names)
        if unknown:
            raise ValueError(f"unknown trial config keys {unknown}; expected some of {sorted(names)} or 'loss.<name>'")
        return cls(**plain, loss_params=loss_params)

    def to_dict(self) -> dict[str, Any]:
        """The flat form (inverse of from_dict)."""
        flat = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "loss_params"}
        flat.update({LOSS_PREFIX + k: v for k, v in self.loss_params.items()})
        return flat
