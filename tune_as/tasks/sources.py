"""Raw splits from a local folder (JSON Lines or `save_to_disk`) or the Hugging Face hub, as plain columns."""

from __future__ import annotations

import gzip
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

SPLITS = ("train", "validation", "test")
SUFFIXES = (".jsonl.gz", ".jsonl", ".json.gz", ".json")
# A fixed seed, independent of DataSpec.seed: every trial of every seed sees the same carved validation set.
CARVE_SEED = 20240521


@dataclass(frozen=True)
class HubSource:
    """A Hugging Face hub dataset: `datasets.load_dataset(path, name)`."""

    path: str
    name: str | None = None

    def __str__(self) -> str:
        return self.path if self.name is None else f"{self.path} ({self.name})"


@dataclass
class RawSplit:
    """Columns of one split; `origin` names the file or dataset in error messages.

    class_names: for Hugging Face `ClassLabel` columns, the label names in the dataset's own order
    (the integer ids were already turned into these names).
    """

    origin: str
    columns: dict[str, list[Any]]
    class_names: dict[str, list[str]] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(next(iter(self.columns.values()))) if self.columns else 0

    def has(self, candidates: Sequence[str]) -> bool:
        return any(name in self.columns for name in candidates)

    def field_name(self, candidates: Sequence[str]) -> str:
        for name in candidates:
            if name in self.columns:
                return name
        raise ValueError(
            f"{self.origin}: expected a field named {' or '.join(map(repr, candidates))}; "
            f"found fields {sorted(self.columns)}"
        )

    def field(self, candidates: Sequence[str]) -> list[Any]:
        return self.columns[self.field_name(candidates)]

    def take(self, idx: Sequence[int] | np.ndarray, origin: str | None = None) -> RawSplit:
        cols = {k: [v[i] for i in idx] for k, v in self.columns.items()}
        return RawSplit(origin or self.origin, cols, self.class_names)


def read_jsonl(path: Path) -> RawSplit:
    opener = gzip.open if path.name.endswith(".gz") else open
    rows: list[dict[str, Any]] = []
    with opener(path, "rt", encoding="utf-8") as fh:
        for line_no, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{line_no}: expected one JSON object per line ({err})") from None
            if not isinstance(row, dict):
                raise ValueError(f"{path}:{line_no}: expected a JSON object, got {type(row).__name__}")
            rows.append(row)
    if not rows:
        raise ValueError(f"{path}: expected at least one JSON object, the file is empty")
    names = list(rows[0])
    for line_no, row in enumerate(rows, 1):
        if set(row) != set(names):
            raise ValueError(f"{path}: record {line_no} has fields {sorted(row)}, record 1 has {sorted(names)}")
    return RawSplit(str(path), {k: [r[k] for r in rows] for k in names})


def _from_hf(ds: Any, origin: str) -> RawSplit:
    """A `datasets.Dataset` as columns, ClassLabel ids replaced by their names (-1 = no label -> None)."""
    columns = ds.to_dict()
    class_names: dict[str, list[str]] = {}
    for name, feature in ds.features.items():
        inner = getattr(feature, "feature", None)
        if hasattr(feature, "names"):
            class_names[name] = list(feature.names)
            columns[name] = [None if v is None or v < 0 else feature.names[v] for v in columns[name]]
        elif inner is not None and hasattr(inner, "names"):
            class_names[name] = list(inner.names)
            columns[name] = [[inner.names[v] for v in row] for row in columns[name]]
    return RawSplit(origin, columns, class_names)


def _pick(available: Sequence[str], candidates: Sequence[str]) -> str | None:
    return next((c for c in candidates if c in available), None)


def load_folder(folder: Path, stems: dict[str, tuple[str, ...]]) -> dict[str, RawSplit]:
    """A local folder: `save_to_disk` output (a DatasetDict, or one Dataset = train) or `<split>.jsonl[.gz]`."""
    if not folder.is_dir():
        raise FileNotFoundError(f"data_dir: expected a folder, {folder} does not exist or is not a folder")
    if (folder / "state.json").exists():  # a single Dataset saved with save_to_disk: the training split
        import datasets

        out = {"train": _from_hf(datasets.load_from_disk(str(folder)), str(folder))}
    elif (folder / "dataset_dict.json").exists():
        import datasets

        dd = datasets.load_from_disk(str(folder))
        out = {}
        for split, candidates in stems.items():
            name = _pick(list(dd.keys()), candidates)
            if name is not None:
                out[split] = _from_hf(dd[name], f"{folder} [{name}]")
    else:
        out = {}
        for split, candidates in stems.items():
            files = [folder / f"{stem}{suffix}" for stem in candidates for suffix in SUFFIXES]
            path = next((p for p in files if p.exists()), None)
            if path is not None:
                out[split] = read_jsonl(path)
    if "train" not in out:
        expected = ", ".join(f"{s}{SUFFIXES[0]}" for s in stems["train"])
        found = sorted(p.name for p in folder.iterdir())
        raise FileNotFoundError(f"{folder}: expected a training split ({expected}, or a save_to_disk "
                                f"folder); found {found}")
    return out


def load_hub(source: HubSource, stems: dict[str, tuple[str, ...]]) -> dict[str, RawSplit]:
    import datasets

    dd = datasets.load_dataset(source.path, source.name)
    out = {}
    for split, candidates in stems.items():
        name = _pick(list(dd.keys()), candidates)
        if name is not None:
            out[split] = _from_hf(dd[name], f"{source} [{name}]")
    return out


def carve(raw: RawSplit, fraction: float, name: str) -> tuple[RawSplit, RawSplit]:
    """Split `raw` in two with CARVE_SEED: (rest, carved) with round(fraction * n) rows carved."""
    if len(raw) < 2:
        raise ValueError(f"{raw.origin}: expected at least 2 rows to carve a {name} split from, got {len(raw)}")
    order = np.random.default_rng(CARVE_SEED).permutation(len(raw))
    n_carved = max(1, round(fraction * len(raw)))
    carved, rest = np.sort(order[:n_carved]), np.sort(order[n_carved:])
    return raw.take(rest), raw.take(carved, f"{raw.origin} (carved {name})")


def subsample(n: int, limit: int | None, seed: int) -> np.ndarray:
    """Row indices: all rows, or a seeded random subset of `limit` rows kept in their original order."""
    if limit is None or limit >= n:
        return np.arange(n)
    return np.sort(np.random.default_rng(seed).permutation(n)[:limit])
