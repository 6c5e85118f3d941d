"""Raw splits from a local folder (JSON Lines or `save_to_disk`) or the Hugging Face hub, as plain columns."""

from __future__ import annotations

import gzip
import json
import os
import re
import sys
import urllib.parse
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import excerpt, first_line, tcp_unreachable

SUFFIXES = (".jsonl.gz", ".jsonl", ".json.gz", ".json")
# A fixed seed, independent of DataSettings.seed:
# every trial of every seed sees the same carved validation set.
CARVE_SEED = 20240521
SHARED_DATA_ENV = "TUNE_AS_SHARED_DATA"


def shared_data_root() -> Path:
    """The folder of local dataset copies (`<task>/<split>.jsonl.gz`) that a task with a `shared_copy` reads
    when no data_dir is given: $TUNE_AS_SHARED_DATA, else `shared/data` beside the checkout
    (`<repo>/../shared/data`, the layout of this project's machines; from an installed wheel that folder does
    not exist, so the hub is used)."""
    return Path(os.environ.get(SHARED_DATA_ENV) or Path(__file__).resolve().parents[3] / "shared" / "data")


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
    positions: where each row came from, 1-based: the line of a JSON Lines file (unit "line"), else the row
    of the dataset (unit "row"); kept through `take`, so errors after subsampling or carving still point
    at the right line.
    """

    origin: str
    columns: dict[str, list[Any]]
    class_names: dict[str, list[str]] = field(default_factory=dict)
    positions: list[int] = field(default_factory=list)
    unit: str = "row"

    def __post_init__(self) -> None:
        if not self.positions:
            self.positions = list(range(1, len(self) + 1))

    def __len__(self) -> int:
        return len(next(iter(self.columns.values()))) if self.columns else 0

    def where(self, i: int) -> str:
        """Row i for an error message: `path:line` for files, `origin row n` for datasets."""
        n = self.positions[i]
        return f"{self.origin}:{n}" if self.unit == "line" else f"{self.origin} row {n}"

    def has(self, candidates: Sequence[str]) -> bool:
        return any(name in self.columns for name in candidates)

    def field_name(self, candidates: Sequence[str]) -> str:
        for name in candidates:
            if name in self.columns:
                return name
        raise ValueError(
            f"{self.origin}: expected a field named {' or '.join(map(repr, candidates))}; "
            f"found fields {excerpt(sorted(self.columns))}"
        )

    def field(self, candidates: Sequence[str]) -> list[Any]:
        return self.columns[self.field_name(candidates)]

    def take(self, idx: Sequence[int] | np.ndarray, origin: str | None = None) -> RawSplit:
        cols = {k: [v[i] for i in idx] for k, v in self.columns.items()}
        return RawSplit(origin or self.origin, cols, self.class_names, [self.positions[i] for i in idx],
                        self.unit)


GZIP_MAGIC = b"\x1f\x8b"


# A \uD800-\uDFFF escape: JSON can spell a lone surrogate, which no UTF-8 text (or tokenizer) can hold.
SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


class _DuplicateField(ValueError):
    """A JSON object that names a field twice (json.loads would keep the last value silently)."""


def _unique_fields(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    row: dict[str, Any] = {}
    for key, value in pairs:
        if key in row:
            raise _DuplicateField(key)
        row[key] = value
    return row


def _json_line(path: Path, line_no: int, line: bytes) -> Any:
    where = f"{path}:{line_no}"
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as err:
        hint = (" (gzip data: name the file *.jsonl.gz)" if line_no == 1 and line.startswith(GZIP_MAGIC)
                else "")
        raise ValueError(f"{where}: expected UTF-8 text, got byte {line[err.start]:#04x} at column "
                         f"{err.start + 1}{hint}") from None
    try:
        value = json.loads(text, object_pairs_hook=_unique_fields)
    except json.JSONDecodeError as err:
        raise ValueError(f"{where}: expected one JSON object per line, got invalid JSON "
                         f"({err.msg} at column {err.colno})") from None
    except _DuplicateField as err:
        raise ValueError(f"{where}: expected each field once per JSON object, got {excerpt(err.args[0])} "
                         "twice") from None
    except ValueError:  # the one other ValueError json raises: int() of a number over Python's digit limit
        raise ValueError(f"{where}: expected numbers of at most {sys.get_int_max_str_digits()} digits, got a "
                         "longer one") from None
    except RecursionError:
        raise ValueError(f"{where}: expected one JSON object per line, got values nested too deeply to "
                         "read") from None
    if SURROGATE_ESCAPE.search(text):
        try:
            json.dumps(value, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError as err:
            code = ord(err.object[err.start])
            raise ValueError(f"{where}: expected Unicode text, got a lone surrogate \\u{code:04x} "
                             "(an unpaired \\uD800-\\uDFFF escape)") from None
    return value


MAX_LINE_BYTES = 16 * 2**20  # one example: EURLEX57K's longest law is 22 kB


def _read_lines(path: Path) -> list[tuple[int, Any]]:
    """(line number, parsed JSON value) of every non-blank line. A local file's problems become ValueErrors
    naming it: an OSError would reach the CLI as "expected a reachable Hugging Face hub"."""
    if not path.is_file():
        kind = "a folder" if path.is_dir() else "not a regular file"
        raise ValueError(f"{path}: expected a JSON Lines file, found {kind}")
    gzipped = path.name.endswith(".gz")
    values = []
    try:
        with open(path, "rb") as fh:
            head = fh.read(2)
        if gzipped and head and head != GZIP_MAGIC:  # (an empty file is reported as empty below)
            raise ValueError(f"{path}: expected gzip data (the name ends in .gz), got a file that is not "
                             f"gzip-compressed: name it without .gz")
        with gzip.open(path, "rb") if gzipped else open(path, "rb") as fh:
            # read in bounded pieces: a file's line is never held whole past MAX_LINE_BYTES (one 300 MB line
            # took the driver to 20 GB parsing it)
            for line_no, line in enumerate(iter(lambda: fh.readline(MAX_LINE_BYTES + 1), b""), 1):
                if len(line) > MAX_LINE_BYTES:
                    raise ValueError(f"{path}:{line_no}: expected lines of at most {MAX_LINE_BYTES // 2**20} "
                                     "MiB (one example each), got a longer one")
                if line_no == 1:
                    # a UTF-8 byte order mark (some editors write one)
                    line = line.removeprefix(b"\xef\xbb\xbf")
                if line.strip():
                    values.append((line_no, _json_line(path, line_no, line)))
    except (EOFError, gzip.BadGzipFile, zlib.error) as err:  # truncated or corrupt
        raise ValueError(f"{path}: expected complete gzip data, got {type(err).__name__}: {err} (a truncated "
                         f"or damaged file?)") from None
    except OSError as err:  # permission denied, I/O error, ...
        raise ValueError(f"{path}: expected a readable file, got {type(err).__name__}: "
                         f"{err.strerror or err}") from None
    return values


def read_jsonl(path: Path) -> RawSplit:
    """One split from a JSON Lines file, gzip-compressed when its name ends in .gz. Every record must be
    an object with the same fields as the first."""
    rows: list[dict[str, Any]] = []
    lines: list[int] = []
    for line_no, row in _read_lines(path):
        if not isinstance(row, dict):
            hint = (" (a JSON array: expected JSON Lines, one object per line)" if isinstance(row, list)
                    else "")
            raise ValueError(f"{path}:{line_no}: expected a JSON object, got {type(row).__name__}{hint}")
        if rows and set(row) != set(rows[0]):
            raise ValueError(f"{path}:{line_no}: expected the fields of line {lines[0]} "
                             f"{excerpt(sorted(rows[0]))}, got {excerpt(sorted(row))}")
        rows.append(row)
        lines.append(line_no)
    if not rows:
        raise ValueError(f"{path}: expected at least one JSON object, the file is empty")
    return RawSplit(str(path), {k: [r[k] for r in rows] for k in rows[0]}, positions=lines, unit="line")


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


def _load_from_disk(folder: Path) -> Any:
    import datasets

    try:
        return datasets.load_from_disk(str(folder))
    except Exception as err:
        # datasets fails in many types: OSError, JSONDecodeError, IndexError (empty split)
        raise ValueError(f"{folder}: expected a readable datasets.save_to_disk folder, got "
                         f"{type(err).__name__}: {first_line(err)}") from None


def _pick(available: Sequence[str], candidates: Sequence[str]) -> str | None:
    return next((c for c in candidates if c in available), None)


def _split_file(folder: Path, candidates: Sequence[str]) -> Path | None:
    """The file of a split: the first stem in `candidates` that has a file, which must be one file."""
    for stem in candidates:
        found = [folder / f"{stem}{suffix}" for suffix in SUFFIXES if (folder / f"{stem}{suffix}").exists()]
        if len(found) > 1:
            raise ValueError(f"{folder}: expected one file for {stem!r}, found {[p.name for p in found]}")
        if found:
            return found[0]
    return None


def load_folder(folder: Path, stems: dict[str, tuple[str, ...]]) -> dict[str, RawSplit]:
    """A local folder: `save_to_disk` output (a DatasetDict, or one Dataset = train) or
    `<split>.jsonl[.gz]`."""
    if not folder.is_dir():
        raise FileNotFoundError(f"data_dir: expected a folder, {folder} does not exist or is not a folder")
    if (folder / "state.json").exists():  # a single Dataset saved with save_to_disk: the training split
        out = {"train": _from_hf(_load_from_disk(folder), str(folder))}
    elif (folder / "dataset_dict.json").exists():
        dd = _load_from_disk(folder)
        out = {}
        for split, candidates in stems.items():
            name = _pick(list(dd.keys()), candidates)
            if name is not None:
                out[split] = _from_hf(dd[name], f"{folder} [{name}]")
    else:
        out = {}
        for split, candidates in stems.items():
            path = _split_file(folder, candidates)
            if path is not None:
                out[split] = read_jsonl(path)
    if "train" not in out:
        expected = ", ".join(f"{s}{SUFFIXES[0]}" for s in stems["train"])
        found = sorted(p.name for p in folder.iterdir())
        raise FileNotFoundError(f"{folder}: expected a training split ({expected}, or a save_to_disk "
                                f"folder); found {found}")
    return out

def hub_offline(timeout: float = 3.0) -> str | None:
    """Why the Hugging Face hub cannot be reached (and the hub's clients are put in offline mode, so that what
    is cached loads at once and what is not fails at once: they would retry for ~50 s, six lines of it), or
    None. Nothing is checked when HF_HUB_OFFLINE is set already, or once a hub client is imported
    (it read the mode)."""
    if os.environ.get("HF_HUB_OFFLINE") or "huggingface_hub" in sys.modules:
        return None
    url = urllib.parse.urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    host, port = url.hostname or "huggingface.co", url.port or (80 if url.scheme == "http" else 443)
    why = tcp_unreachable(host, port, timeout)
    if why is None:
        return None
    os.environ["HF_HUB_OFFLINE"] = os.environ["HF_DATASETS_OFFLINE"] = "1"
    return f"the hub unreachable ({host}:{port}: {why}), and this is not in its local cache"


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
        raise ValueError(f"{raw.origin}: expected at least 2 rows to carve a {name} split from, "
                         f"got {len(raw)}")
    order = np.random.default_rng(CARVE_SEED).permutation(len(raw))
    n_carved = max(1, round(fraction * len(raw)))
    carved, rest = np.sort(order[:n_carved]), np.sort(order[n_carved:])
    return raw.take(rest), raw.take(carved, f"{raw.origin} (carved {name})")


def subsample(n: int, limit: int | None, seed: int) -> np.ndarray:
    """Row indices: all rows, or a seeded random subset of `limit` rows kept in their original order."""
    if limit is None or limit >= n:
        return np.arange(n)
    return np.sort(np.random.default_rng(seed).permutation(n)[:limit])
