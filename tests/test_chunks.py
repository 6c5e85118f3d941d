"""Resumable frozen encoding (tune_as/tasks/chunks.py, featurize.encode_split): an encode stopped after some
chunks continues from them on the next prepare, with features bit-identical to an uninterrupted encode; a
damaged or foreign partial is discarded with one line; the progress counts resumed documents as done.
Generated data, the random-weight `tiny` backbone, batches of 8 rows and chunks of 16 so a 60-row split has
several of each."""

from __future__ import annotations

import logging
import random
import shutil
from collections.abc import Callable
from pathlib import Path

import fixtures_data as fx
import pytest
import torch

from tune_as.tasks import DataSettings, PreparedData, build_task, prepare
from tune_as.tasks import backbones as backbones_module
from tune_as.tasks import featurize as featurize_module
from tune_as.tasks.chunks import partial_dir

BATCH, CHUNK = 8, 16  # train: 60 rows = 4 chunks (16, 16, 16, 12) = 8 batches
LOAD_BACKBONE = backbones_module.load_backbone


class Interrupted(Exception):
    """Stands for Ctrl-C or a killed job in the middle of an encode."""


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(featurize_module, "ENCODE_BATCH", BATCH)
    monkeypatch.setattr(featurize_module, "ENCODE_CHUNK", CHUNK)


def token_rows(folder: Path) -> Path:
    """A token task's JSON Lines (words and IOB2 tags of varying length) for the ragged feature layout."""
    for seed, (split, n) in enumerate(zip(("train", "validation"), (60, 20), strict=True)):
        rng = random.Random(seed)
        rows = []
        for _ in range(n):
            words = fx.sentence(rng, rng.randint(2, 12)).split()
            rows.append({"tokens": words, "tags": [rng.choice(["O", "B-X", "I-X"]) for _ in words]})
        fx.write_jsonl(folder / f"{split}.jsonl.gz", rows)
    return folder


LAYOUTS = {  # (task name, task options, data writer): pooled sentence features, ragged word features
    "eurlex": ("eurlex", {}, fx.eurlex57k),
    "token": ("jsonl", {"kind": "token", "text_field": "tokens", "label_field": "tags"}, token_rows),
}


def frozen(layout: str, data_dir: Path, cache: Path) -> PreparedData:
    name, options, _ = LAYOUTS[layout]
    spec = DataSettings(name, data_dir=data_dir, backbone="tiny", encoder="frozen", max_length=32,
                        cache_dir=cache)
    return prepare(build_task(name, **options), spec)


def count_forwards(monkeypatch: pytest.MonkeyPatch, stop_after: int | None = None) -> list[int]:
    """Count the encoder's forward passes; with `stop_after`, raise Interrupted on the pass after that
    many."""
    forwards: list[int] = []

    def hooked(*_: object) -> None:
        if stop_after is not None and len(forwards) == stop_after:
            raise Interrupted
        forwards.append(1)

    def load(info: dict, seed: int) -> torch.nn.Module:
        encoder = LOAD_BACKBONE(info, seed)  # the real one, not an earlier call's wrapper
        encoder.register_forward_pre_hook(hooked)
        return encoder

    monkeypatch.setattr(backbones_module, "load_backbone", load)
    return forwards


def interrupted(layout: str, data_dir: Path, cache: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Run a prepare that stops in the first batch of train's third chunk; the partial folder it leaves."""
    count_forwards(monkeypatch, stop_after=2 * CHUNK // BATCH)
    with pytest.raises(Interrupted):
        frozen(layout, data_dir, cache)
    (folder,) = cache.glob("*.partial")
    return folder


def features(data: PreparedData, split: str) -> torch.Tensor:
    part = getattr(data, split)
    return part.ragged.features if part.ragged is not None else part.columns["features"]


def batches(data: PreparedData) -> int:
    """The encoder's forward passes for every split of `data`."""
    return sum(len(range(0, len(split), BATCH)) for split in (data.train, data.validation, data.test)
               if split)


def assert_bit_identical(a: PreparedData, b: PreparedData) -> None:
    assert (a.test is None) == (b.test is None)
    for split in ("train", "validation", "test") if a.test is not None else ("train", "validation"):
        assert torch.equal(features(a, split), features(b, split)), split
        if a.train.ragged is not None:
            assert torch.equal(getattr(a, split).ragged.offsets, getattr(b, split).ragged.offsets)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_an_interrupted_encode_resumes_from_its_chunks_bit_identical(
        layout: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    data_dir = LAYOUTS[layout][2](tmp_path / "data")
    whole = count_forwards(monkeypatch)
    one_shot = frozen(layout, data_dir, tmp_path / "one_shot")
    assert len(whole) == batches(one_shot) and len(one_shot.train) == 60  # train: 8 batches in 4 chunks

    cache = tmp_path / "cache"
    folder = interrupted(layout, data_dir, cache, monkeypatch)
    assert sorted(p.name for p in folder.iterdir()) == ["train-00000.safetensors", "train-00001.safetensors"]
    # no entry before the encode ends
    assert [p.name for p in cache.glob("*.pt") if "-frozen-" in p.name] == []

    resumed = count_forwards(monkeypatch)
    with caplog.at_level(logging.WARNING, logger="tune_as"):
        again = frozen(layout, data_dir, cache)
    assert len(resumed) == batches(one_shot) - 4  # the finished chunks' 4 batches are not encoded again
    assert [r.getMessage() for r in caplog.records if "resuming" in r.getMessage()] == [
        f"{LAYOUTS[layout][0]}: encoding train (tiny): resuming, 32 of 60 rows already encoded in {folder}"]
    assert_bit_identical(again, one_shot)
    assert not folder.exists() and (folder.parent / folder.name.removesuffix(".partial")).is_file()


def _truncate(folder: Path) -> None:
    path = folder / "train-00001.safetensors"
    path.write_bytes(path.read_bytes()[:100])


DAMAGE: dict[str, tuple[Callable[[Path], None], str]] = {
    "truncated": (_truncate, "train-00001.safetensors cannot be read: SafetensorError"),
    "a pickle": (lambda folder: torch.save({"rows": torch.zeros(3)}, folder / "train-00000.safetensors"),
                 "train-00000.safetensors cannot be read: SafetensorError"),
    "another chunk's rows": (lambda folder: shutil.copy(folder / "train-00000.safetensors",
                                                        folder / "train-00001.safetensors"),
                             "train-00001.safetensors encodes other rows than chunk 1 of this split"),
    "another chunk size": (lambda folder: None,
                           "train-00000.safetensors was written with chunk '16', expected '24'"),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_damaged_or_foreign_partial_is_discarded_with_one_line(damage: str, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    data_dir = fx.eurlex57k(tmp_path / "data")
    folder = interrupted("eurlex", data_dir, tmp_path / "cache", monkeypatch)
    spoil, why = DAMAGE[damage]
    spoil(folder)
    if damage == "another chunk size":  # what a chunk written by another version of tune_as looks like
        monkeypatch.setattr(featurize_module, "ENCODE_CHUNK", 24)
    forwards = count_forwards(monkeypatch)
    with caplog.at_level(logging.WARNING, logger="tune_as"):
        again = frozen("eurlex", data_dir, tmp_path / "cache")
    assert [r.getMessage() for r in caplog.records if "discarded" in r.getMessage()] == [
        f"{folder}: discarded the 2 encoded chunks of the train split there ({why}); encoding it from the "
        "start"]
    assert len(forwards) == batches(again)  # everything encoded again
    monkeypatch.setattr(featurize_module, "ENCODE_CHUNK", CHUNK)
    assert_bit_identical(again, frozen("eurlex", data_dir, tmp_path / "one_shot"))


def test_chunk_files_are_safetensors_with_their_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Data only (no pickle), each naming what it was encoded with."""
    from safetensors import safe_open

    folder = interrupted("eurlex", fx.eurlex57k(tmp_path / "data"), tmp_path / "cache", monkeypatch)
    with safe_open(str(folder / "train-00001.safetensors"), framework="pt") as fh:
        meta, rows = fh.metadata(), fh.get_tensor("rows")
        assert fh.get_tensor("features").dtype == torch.float16 and \
            fh.get_tensor("features").shape == (16, 128)
    assert {k: meta[k] for k in ("backbone", "max_length", "precision", "split", "documents", "chunk",
                                 "batch")} == {
        "backbone": "tiny", "max_length": "32", "precision": "fp32", "split": "train", "documents": "60",
        "chunk": "16", "batch": "8"}
    assert meta["entry"] == folder.name and rows.dtype == torch.int64 and len(rows) == 16
    assert folder == partial_dir(folder.with_name(meta["entry"].removesuffix(".partial")))  # beside its entry


def test_progress_counts_resumed_documents_as_done_but_not_in_the_rate(
        capsys: pytest.CaptureFixture[str]) -> None:
    from tune_as.tasks.featurize import track

    ticks = iter(range(0, 10_000, 20))  # a clock that moves 20 s per reading: no sleeping, no machine speed
    batches = [list(range(100))] * 9 + [list(range(40))]
    seen = list(track(batches, "eurlex: encoding train (minilm)", [len(b) for b in batches],
                      clock=lambda: float(next(ticks)), done=400))
    assert seen == batches
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[0] == "eurlex: encoding train (minilm): 600/1,340 docs, 5 docs/s, 2 min 28 s left"
    assert lines[-1] == \
        "eurlex: encoding train (minilm): 1,340 docs, 940 of them in 3 min 40 s (400 done before)"

