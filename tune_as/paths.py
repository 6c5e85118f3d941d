"""Checks of the places a user names, done before anything is written, and the CLIs' one-line argument errors."""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path
from typing import NoReturn

from tune_as.errors import UserError, first_line

SQLITE_MAGIC = b"SQLite format 3\x00"


class OneLineParser(argparse.ArgumentParser):
    """argparse, with its errors as one `error: ...` line (like every other bad input), not usage + error."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {message} (--help lists the options)\n")


def check_writable_folder(path: Path, option: str) -> None:
    """`path` must be (or be creatable as) a writable folder. os.access says yes to root everywhere (also in /proc
    or on a read-only mount), so a probe folder is made for real and removed at once: nothing is left behind."""
    probe = path
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        raise UserError(f"{option}: expected a folder (or a path that can become one), got {path} ({probe} is a file)")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".tune_as-probe-", dir=probe))
    except OSError as exc:
        raise UserError(f"{option}: expected a writable place, got {path} ({probe}: "
                        f"{exc.strerror or first_line(exc)})") from None


def check_sqlite_file(path: Path, option: str) -> None:
    """An existing file named as an SQLite database must be one (its 16-byte header says so)."""
    try:
        with open(path, "rb") as f:
            head = f.read(len(SQLITE_MAGIC))
    except OSError as exc:
        raise UserError(f"{option}: expected a readable SQLite file, got {path} ({exc.strerror})") from None
    if head != SQLITE_MAGIC:
        raise UserError(f"{option}: expected an SQLite database (an Optuna study file) or a folder, got {path} "
                        f"(not an SQLite file)")
