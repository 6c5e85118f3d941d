"""Containers the trainer sees: the cache-key `DataSettings`, a `Split` that hands out batches,
`PreparedData`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from tune_as.settings import DataSettings


@dataclass
class Ragged:
    """Per-word rows of varying length stored flat (frozen token tasks): row i is
    values[offsets[i]:offsets[i+1]]."""

    features: Tensor  # (M, H) float16
    labels: Tensor  # (M,) int64
    offsets: Tensor  # (N + 1,) int64

    def pad(self, idx: Tensor) -> tuple[Tensor, Tensor]:
        starts, ends = self.offsets[idx], self.offsets[idx + 1]
        width = max(int((ends - starts).max()), 1) if len(idx) else 1
        feats = torch.zeros(len(idx), width, self.features.shape[1])
        labels = torch.full((len(idx), width), -100, dtype=torch.long)
        for row, (a, b) in enumerate(zip(starts.tolist(), ends.tolist(), strict=True)):
            feats[row, : b - a] = self.features[a:b].float()
            labels[row, : b - a] = self.labels[a:b]
        return feats, labels  # (B, W, H), (B, W)


@dataclass
class Split:
    """One split as tensors. `batch(idx)` returns what the model needs plus "labels".

    columns: per-row tensors (first dim N). Compact dtypes on disk and in the Ray object store
    (int32 ids, float16 features, uint8 pixels) are widened in `batch`.
    lengths: token counts; when set, `seq_columns` are trimmed to the longest row of the batch and an
    "attention_mask" is built. pixel_norm: (scale, mean, std) turning uint8 pixels into standardized floats.
    meta: per-row Python values the metrics need (gold tag strings, source/target sentences).
    label_names: the class names (token metrics turn predicted ids back into tags / characters).
    """

    columns: dict[str, Tensor]
    lengths: Tensor | None = None
    seq_columns: tuple[str, ...] = ()
    ragged: Ragged | None = None
    pixel_norm: tuple[float, float, float] | None = None
    meta: dict[str, list[Any]] = field(default_factory=dict)
    label_names: tuple[str, ...] = ()

    def __len__(self) -> int:
        if self.ragged is not None:
            return len(self.ragged.offsets) - 1
        return len(next(iter(self.columns.values())))

    def _width(self, idx: Tensor) -> int | None:
        if self.lengths is None:
            return None
        return max(int(self.lengths[idx].max()), 1) if len(idx) else 1

    def labels(self, idx: Tensor) -> Tensor:
        """The labels of rows `idx`, trimmed exactly as `batch(idx)` trims them."""
        idx = idx.long()
        if self.ragged is not None:
            return self.ragged.pad(idx)[1]
        labels = self.columns["labels"][idx]
        width = self._width(idx)
        if width is not None and "labels" in self.seq_columns:
            labels = labels[:, :width]
        return labels if labels.is_floating_point() else labels.long()

    def batch(self, idx: Tensor) -> dict[str, Tensor]:
        idx = idx.long()
        out: dict[str, Tensor] = {}
        if self.ragged is not None:
            out["features"], out["labels"] = self.ragged.pad(idx)
        width = self._width(idx)
        for name, column in self.columns.items():
            value = column[idx]
            if width is not None and name in self.seq_columns:
                value = value[:, :width]
            out[name] = _widen(value)
        if width is not None and self.lengths is not None:
            out["attention_mask"] = (torch.arange(width) < self.lengths[idx, None]).long()  # (B, T)
        if self.pixel_norm is not None:
            scale, mean, std = self.pixel_norm
            out["pixels"] = (out["pixels"].float() / scale - mean) / std
        return out

    def widened(self, device: torch.device, max_bytes: int) -> Split | None:
        """This split as its batches need it (columns widened, pixels standardized), once, on `device`: a
        batch of the result is then only an index. None where every batch needs work of its own (trimming to
        its longest row, ragged rows) or where the widened columns would take more than `max_bytes`."""
        if self.lengths is not None or self.ragged is not None:
            return None
        wide = {"float16": 4, "uint8": 4 if self.pixel_norm else 1}
        size = sum(c.numel() * wide.get(str(c.dtype).removeprefix("torch."), 8)
                   for c in self.columns.values())
        if size > max_bytes:
            return None
        columns = {k: v.to(device) for k, v in self.batch(torch.arange(len(self))).items()}
        return Split(columns, meta=self.meta, label_names=self.label_names)


def _widen(x: Tensor) -> Tensor:
    if x.dtype == torch.float16:
        return x.float()
    if x.dtype in (torch.int8, torch.int16, torch.int32, torch.uint8):
        return x if x.dtype == torch.uint8 else x.long()
    return x


@dataclass
class PreparedData:
    """What `Task.prepare` returns: picklable (tensors and small Python values only)."""

    task: str
    kind: str
    spec: DataSettings
    train: Split
    validation: Split
    test: Split | None
    label_names: tuple[str, ...]
    # what build_model needs: backbone path / tiny config / feature size / CNN name
    model_info: dict[str, Any]
    notes: tuple[str, ...] = ()  # what was done to the data that a user should know (carved splits, ...)
    task_options: dict[str, Any] = field(default_factory=dict)  # build_task(task, **task_options) rebuilds it
    # what in the data would mislead a comparison (rows shared with train, empty texts): one line each,
    # printed when the data is prepared, kept so the engine can tag the search with it
    warnings: list[str] = field(default_factory=list)

    @property
    def num_labels(self) -> int:
        return len(self.label_names)
