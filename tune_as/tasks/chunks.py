"""Resumable frozen encoding: the finished chunks of an encode,
kept beside the cache entry until it is written.

`featurize.encode_split` encodes a split in chunks of whole batches, in the order an uninterrupted encode uses
(so the features are bit-identical), and hands each finished chunk to a `Partial`, which writes it atomically
(temp file + rename) as `<split>-<index>.safetensors` into `<cache entry>.partial/`. An encode that was
interrupted (Ctrl-C, a killed job, a full disk) continues on the next `prepare` from the chunks there;
`preparation.prepare` removes the folder once the entry is saved.

A chunk file holds three tensors: `rows` (int64, the split's row ids it encodes, in encode order), `counts`
(int64, features per row: 1 for a pooled sentence, the labelled words of a token-task row) and `features`
(float16, (sum(counts), H)); its metadata holds the key it belongs to (`ChunkKey`). safetensors is data only:
a planted file cannot run code. A chunk that cannot be read, or whose key, rows or shapes are not this
encode's, makes the split's chunks untrusted: they are all deleted, with one logged line saying why.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

log = logging.getLogger(__name__)
FORMAT = "tune_as encoded chunk"
VERSION = "1"  # bump when the chunk layout changes: older chunks are then discarded, not misread
TENSORS = ("rows", "counts", "features")


@dataclass(frozen=True)
class ChunkKey:
    """What a chunk must have been encoded with to be reused: the same entry (its name holds the hash of the
    data files, task and settings), encoder, length, precision, split, split size, chunk and batch size,
    width."""

    entry: str
    backbone: str
    max_length: int
    precision: str
    split: str
    documents: int
    chunk: int
    batch: int
    hidden: int

    def metadata(self) -> dict[str, str]:
        fields = {k: str(v) for k, v in dataclasses.asdict(self).items()}
        return {"format": FORMAT, "version": VERSION, **fields}


@dataclass(frozen=True)
class Chunk:
    rows: Tensor  # (n,) int64
    counts: Tensor  # (n,) int64
    features: Tensor  # (sum(counts), H) float16


class Untrusted(ValueError):
    """A chunk file this encode cannot reuse; the message says why."""


def partial_dir(entry: Path) -> Path:
    """The folder of finished chunks beside a cache entry."""
    return entry.with_name(entry.name + ".partial")


def remove(folder: Path) -> None:
    """Drop a partial folder (its entry is written, or it is stale)."""
    shutil.rmtree(folder, ignore_errors=True)


@dataclass(frozen=True)
class Partial:
    """The chunks of one split's encode in `folder`, under `key`."""

    folder: Path
    key: ChunkKey

    def path(self, index: int) -> Path:
        return self.folder / f"{self.key.split}-{index:05d}.safetensors"

    def save(self, index: int, chunk: Chunk) -> None:
        from safetensors.torch import save_file

        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.path(index)
        tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
        save_file({name: getattr(chunk, name).contiguous() for name in TENSORS}, str(tmp),
                  metadata=self.key.metadata())
        os.replace(tmp, path)  # atomic: a chunk file is whole or absent

    def load(self, expected: list[tuple[Tensor, Tensor]]) -> dict[int, Chunk]:
        """The finished chunks found, by index; `expected` gives each chunk's (rows, counts). Any chunk that
        does not fit discards all of this split's chunks, with one line saying why."""
        files = sorted(self.folder.glob(f"{self.key.split}-*.safetensors"))
        found: dict[int, Chunk] = {}
        try:
            for path in files:
                index, chunk = self._read(path, expected)
                found[index] = chunk
        except Untrusted as exc:
            for path in files:
                path.unlink(missing_ok=True)
            log.warning("%s: discarded the %d encoded chunks of the %s split there (%s); "
                        "encoding it from the start", self.folder, len(files), self.key.split, exc)
            return {}
        return found

    def _read(self, path: Path, expected: list[tuple[Tensor, Tensor]]) -> tuple[int, Chunk]:
        from safetensors import safe_open

        suffix = path.stem.rpartition("-")[2]
        index = int(suffix) if suffix.isdigit() else -1
        if not 0 <= index < len(expected) or path != self.path(index):
            raise Untrusted(f"{path.name}: expected chunk files {self.path(0).name} to "
                            f"{self.path(len(expected) - 1).name}")
        try:
            with safe_open(str(path), framework="pt") as fh:
                metadata = fh.metadata() or {}
                names = set(fh.keys())
                tensors = {name: fh.get_tensor(name) for name in TENSORS if name in names}
        except Exception as exc:  # noqa: BLE001 - whatever breaks the read (truncated header, bad JSON, ...)
            raise Untrusted(f"{path.name} cannot be read: {type(exc).__name__}") from None
        wanted = self.key.metadata()
        wrong = [k for k in wanted if metadata.get(k) != wanted[k]]
        if wrong:
            k = wrong[0]
            raise Untrusted(f"{path.name} was written with {k} {metadata.get(k)!r}, expected {wanted[k]!r}")
        if names != set(TENSORS):
            raise Untrusted(f"{path.name} holds tensors {sorted(names)}, expected {sorted(TENSORS)}")
        chunk = Chunk(**tensors)
        rows, counts = expected[index]
        if not (torch.equal(chunk.rows, rows) and torch.equal(chunk.counts, counts)):
            raise Untrusted(f"{path.name} encodes other rows than chunk {index} of this split")
        shape = (int(counts.sum()), self.key.hidden)
        if chunk.features.dtype != torch.float16 or tuple(chunk.features.shape) != shape:
            raise Untrusted(f"{path.name} holds features {chunk.features.dtype} "
                            f"{tuple(chunk.features.shape)}, expected torch.float16 {shape}")
        return index, chunk
