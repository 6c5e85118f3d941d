"""Image classification: mnist, cifar10, cifar100 (Table 1 CNNs of the softmax-alternatives paper) and
sklearn's bundled 8x8 `digits`. Pixels stay uint8 in memory and are standardized per batch."""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..errors import first_line
from .base import Task, TaskDefaults
from .data import DataSettings, PreparedData, Split
from .labels import LabelMap
from .sources import HubSource, RawSplit


def to_chw(value: Any, where: str) -> np.ndarray:
    """One image (PIL image, HF {"bytes": ...} dict, or nested lists / array (H, W) or (H, W, C)) as
    (C, H, W); `where` names the row in errors."""
    try:
        if isinstance(value, dict) and value.get("bytes") is not None:
            from PIL import Image

            value = Image.open(io.BytesIO(value["bytes"]))
        array = np.asarray(value)  # a PIL image decodes here
    except (OSError, ValueError) as err:  # undecodable bytes (PIL's errors are OSErrors), ragged lists
        raise ValueError(f"{where}: expected an image, "
                         f"got {type(err).__name__}: {first_line(err)[:120]}") from None
    if array.ndim == 2:
        array = array[:, :, None]
    if array.ndim != 3 or array.dtype == object:
        raise ValueError(f"{where}: expected an image (H, W) or (H, W, C), "
                         f"got shape {array.shape} of {array.dtype}")
    return array.transpose(2, 0, 1)


@dataclass
class ImageClassification(Task):
    """`cnn` names the topology in cnn.CNNS; `scale` is the pixel maximum (255, or 16 for digits)."""

    fields: dict[str, tuple[str, ...]] = field(
        default_factory=lambda: {"image": ("image", "img"), "label": ("label",)})
    cnn: str = "mnist"
    scale: float = 255.0
    family = "image"
    uses_backbone = False

    def examples(self, raw: RawSplit, labels: LabelMap, split: str) -> dict[str, Any]:
        images = [to_chw(v, raw.where(i)) for i, v in enumerate(raw.field(self.fields["image"]))]
        shapes = {im.shape for im in images}
        if len(shapes) != 1:
            raise ValueError(f"{raw.origin}: expected images of one shape, found {sorted(shapes)[:4]}")
        y = self.label_ids(raw, labels, split)
        pixels = torch.from_numpy(np.stack(images).clip(0, 255).astype(np.uint8))
        return {"pixels": pixels, "labels": torch.tensor(y, dtype=torch.long)}

    def featurize(self, examples: dict[str, dict[str, Any]], labels: LabelMap, spec: DataSettings,
                  notes: tuple[str, ...]) -> PreparedData:
        train = examples["train"]["pixels"].float() / self.scale
        norm = (self.scale, float(train.mean()), float(train.std().clamp(min=1e-6)))  # train statistics only
        splits = {name: Split({"pixels": ex["pixels"], "labels": ex["labels"]}, pixel_norm=norm)
                  for name, ex in examples.items()}
        shape = tuple(examples["train"]["pixels"].shape[1:])
        info = {"encoder": "cnn", "cnn": self.cnn, "image_shape": shape, "backbone": "cnn"}
        return self.package(splits, labels, spec, info, notes)


@dataclass
class Digits(ImageClassification):
    """sklearn.datasets.load_digits (1797 real 8x8 images, 0..16 grey levels): no hub id, no splits, so
    test and validation are carved with a fixed seed (20% each, test first)."""

    def load_raw(self, data_dir: Path | None) -> dict[str, RawSplit]:
        if data_dir is not None:
            return super().load_raw(data_dir)
        from sklearn.datasets import load_digits

        bunch = load_digits()
        columns = {"image": list(bunch.images.astype(np.uint8)), "label": [int(v) for v in bunch.target]}
        return {"train": RawSplit("sklearn.datasets.load_digits", columns)}


def _cnn_defaults(epochs: int) -> TaskDefaults:
    # The softmax-alternatives paper gives no training settings: Adam-style lr 1e-3, batch 128 (documented).
    # max_length does not apply to images; 128 only keeps DataSettings(max_length=defaults.max_length) valid.
    return TaskDefaults(epochs, 128, 1e-3, 128, "cnn")


IMAGE_TASKS = {
    "mnist": ImageClassification("mnist", "multiclass", ("accuracy",), _cnn_defaults(20),
                                 HubSource("ylecun/mnist"), cnn="mnist"),
    "cifar10": ImageClassification("cifar10", "multiclass", ("accuracy",), _cnn_defaults(30),
                                   HubSource("uoft-cs/cifar10"), cnn="cifar10"),
    "cifar100": ImageClassification(
        "cifar100", "multiclass", ("accuracy",), _cnn_defaults(30), HubSource("uoft-cs/cifar100"),
        fields={"image": ("img", "image"), "label": ("fine_label", "label")}, cnn="cifar100"),
    "digits": Digits("digits", "multiclass", ("accuracy",), TaskDefaults(30, 64, 1e-3, 128, "cnn"), None,
                     carve=(("test", 0.2), ("validation", 0.2)), cnn="digits", scale=16.0),
}
