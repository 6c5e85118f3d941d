"""Checks of the places a user names, done before anything is written,
and the CLIs' one-line argument errors."""

from __future__ import annotations

import argparse
import importlib.util
import os
import tempfile
from pathlib import Path
from typing import NoReturn

from tune_as.errors import UserError, first_line
from tune_as.tracking.schema import sqlite_file

SQLITE_MAGIC = b"SQLite format 3\x00"


class OneLineParser(argparse.ArgumentParser):
    """argparse, with its errors as one `error: ...` line (like every other bad input), not usage + error."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {message} (--help lists the options)\n")


def resolved(path: Path, option: str) -> Path:
    """`path` made absolute with its links followed; a loop of links (Python raises RuntimeError for it) or an
    unreadable link is one UserError line naming the option."""
    try:
        return path.expanduser().resolve()
    except RuntimeError as exc:  # Python's word for a loop of links
        raise UserError(f"{option}: expected a path that resolves to a place, got {path} "
                        f"(a loop of symbolic links: {first_line(exc)})") from None
    except OSError as exc:
        raise UserError(f"{option}: expected a path that resolves to a place, got {path} "
                        f"({exc.strerror or first_line(exc)})") from None


def check_writable_folder(path: Path, option: str) -> None:
    """`path` must be (or be creatable as) a writable folder. os.access says yes to root everywhere (also in
    /proc or on a read-only mount), so a probe folder is made for real and removed at once:
    nothing is left behind."""
    probe = path
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        raise UserError(f"{option}: expected a folder (or a path that can become one), got {path} "
                        f"({probe} is a file)")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".tune_as-probe-", dir=probe))
    except OSError as exc:
        raise UserError(f"{option}: expected a writable place, got {path} ({probe}: "
                        f"{exc.strerror or first_line(exc)})") from None


def check_temp_dir() -> None:
    """Ray keeps its session files in $RAY_TMPDIR, else $TMPDIR (on Linux): a variable naming a folder that is
    missing or not writable made `ray start` fail with an unrelated authentication error, after the tracking
    store was written. Checked before anything is written, naming the variable."""
    for var in ("RAY_TMPDIR", "TMPDIR"):
        if var in os.environ:
            folder = Path(os.environ[var])
            if not folder.is_dir():
                raise UserError(f"${var}: expected a writable folder (Ray keeps its session files there), "
                                f"got {folder or repr('')}, which is not a folder")
            check_writable_folder(folder, f"${var}")
            return


def check_sqlite_file(path: Path, option: str) -> None:
    """An existing file named as an SQLite database must be one (its 16-byte header says so)."""
    try:
        with open(path, "rb") as f:
            head = f.read(len(SQLITE_MAGIC))
    except OSError as exc:
        raise UserError(f"{option}: expected a readable SQLite file, got {path} ({exc.strerror})") from None
    if head != SQLITE_MAGIC:
        raise UserError(f"{option}: expected an SQLite database (an Optuna study file) or a folder, "
                        f"got {path} (not an SQLite file)")


def check_tracking_store(uri: str) -> None:
    """A tracking store that keeps the search: not an in-memory database (lost at exit, while the resume hint
    would point at it), and an SQLite file this process can write (checked before anything is written)."""
    if not uri.startswith("sqlite:///"):
        return
    path = sqlite_file(uri)
    if path is None or ":memory:" in uri:  # also `file::memory:?...` and mode=memory URIs
        raise UserError(f"--mlflow-uri: expected a tracking store that outlives the search "
                        f"(its runs and the resume hint point at it), got {uri}")
    try:
        if path.exists():
            with open(path, "r+b"):  # a read-only file (for a non-root user) fails here, not after the folder
                pass
            if os.statvfs(path).f_flag & os.ST_RDONLY:  # a read-only mount (root included)
                raise OSError(30, "read-only file system")
            # SQLite writes its journal beside the file: a writable file in a folder this user cannot write
            # failed mid-search (a traceback per write) after the result folder was made
            if not os.access(path.parent, os.W_OK | os.X_OK):
                raise OSError(13, f"its folder {path.parent} is not writable")
        else:
            check_writable_folder(path.parent, "--storage-path")
    except OSError as exc:
        raise UserError(f"--mlflow-uri: expected an SQLite file this process can write, got {uri} "
                        f"({exc.strerror or first_line(exc)})") from None
    except UserError as exc:
        raise UserError(f"--mlflow-uri: expected an SQLite file in a writable folder, got {uri} "
                        f"({str(exc).split(': ', 1)[-1]})") from None


def absolute_sqlite(uri: str | None) -> str | None:
    """A relative SQLite tracking URI (the default `sqlite:///mlflow.db`) made absolute, so the saved state
    and the resume hint name the same database from any folder. Other URIs, and None
    (MLflow's env or default), stay."""
    from tune_as.tracking.client import DEFAULT_URI

    uri = uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_URI
    prefix = "sqlite:///"
    if uri.startswith(prefix) and not uri.startswith(prefix + "/") and ":memory:" not in uri:
        return prefix + str(resolved(Path(uri[len(prefix):]), "--mlflow-uri"))
    return uri


def shipped_spaces() -> Path:
    """The shipped search spaces: the repository keeps them in its top-level `search_spaces/` (the layout
    users know), and pyproject.toml maps that folder into the package as `tune_as.search_spaces`, so a wheel
    carries them and an editable install finds them where they are (importlib's own finders,
    no path arithmetic)."""
    spec = importlib.util.find_spec("tune_as.search_spaces")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    if not locations:
        raise RuntimeError("tune_as.search_spaces is not installed with tune_as: reinstall the package "
                           "(pip install tune_as, or pip install -e . in a checkout)")
    return Path(locations[0])
