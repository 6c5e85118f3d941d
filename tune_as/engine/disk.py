"""A full disk under the storage path ends the search cleanly: one line naming the folder, the runs closed
KILLED, the resume line (tune_as.search, exit `errors.DISK_FULL`).

Where the disk fills decides who sees it first: a worker persisting a trial's checkpoint (pyarrow's OSError),
the driver writing the searcher's study (SQLite's "disk is full"), the early-stopping rungs or Ray's
experiment state. A worker does not raise it (Ray would retry the trial from its checkpoint, and fail it, once
per `--max-failures`, each time with a traceback): it reports the error as its last result (`reported`), and
`StopOnFullDisk`, the first thing Tune hands a result to, stops the search with it. Whatever the driver meets
is judged the same way, by exception types along the cause chain (`no_space`), never by message text.
"""

from __future__ import annotations

import errno
import os
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ray import tune

from tune_as.engine import interrupt
from tune_as.errors import DISK_FULL, Ending

FULL = "storage_full"  # the key of a worker's last result when its storage filled up
ERRNOS = (errno.ENOSPC, errno.EDQUOT)


class DiskFull(Exception, Ending):
    """The storage path's file system took no more writes: the search stopped where it was (resumable)."""

    exit_code = DISK_FULL

    def __init__(self, reason: str, folder: Path | None = None, hint: str | None = None) -> None:
        self.reason, self.folder, self.hint = reason, folder, hint
        where = f" writing under {folder}" if folder else ""
        super().__init__(f"--storage-path: expected a file system with room for the search, got "
                         f"{reason!r}{where}; the search stopped where it was: "
                         "free space there, then resume it")

    def message(self) -> str:
        return f"error: {self}\n{interrupt.interrupted_line(self.hint)}"


def no_space(exc: BaseException | None) -> str | None:
    """Why `exc` means a full disk or an exhausted quota ("No space left on device"), found along its cause
    chain (`__cause__`, `__context__`, and a Ray task error's `cause`); None when it does not."""
    stack, seen = [exc], set()
    while stack:
        exc = stack.pop()
        if exc is None or id(exc) in seen:
            continue
        seen.add(id(exc))
        if isinstance(exc, DiskFull):
            return exc.reason
        if isinstance(exc, OSError) and exc.errno in ERRNOS:
            return os.strerror(exc.errno)
        if (isinstance(exc, sqlite3.OperationalError)
                and getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL):
            return os.strerror(errno.ENOSPC)
        cause = getattr(exc, "cause", None)  # ray.exceptions.RayTaskError keeps the worker's exception here
        stack += [exc.__context__, cause if isinstance(cause, BaseException) else None, exc.__cause__]
    return None


@contextmanager
def stopping(folder: Path, hint: str) -> Iterator[None]:
    """Whatever the block raises that means a full disk becomes `DiskFull`, naming `folder` and the resume
    line."""
    try:
        yield
    except Exception as exc:
        reason = no_space(exc)
        if reason is None:
            raise
        raise DiskFull(reason, folder, hint) from None


def reported(train: Callable[[], None]) -> None:
    """Run a trial's `train` in a worker; a full disk ends it with a last result that says so instead of an
    error."""
    try:
        train()
    except Exception as exc:
        reason = no_space(exc)
        if reason is None:
            raise
        tune.report({FULL: reason})


class StopOnFullDisk(tune.Stopper):
    """Stops the search at a worker's full-disk result (`reported`), before the scheduler, the searcher or the
    MLflow callback take it for a trial's result."""

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        if result.get(FULL):
            raise DiskFull(str(result[FULL]))
        return False

    def stop_all(self) -> bool:
        return False
