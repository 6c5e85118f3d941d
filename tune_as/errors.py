"""Errors a user can cause (the CLIs print them as one line and exit with code 2), and how a CLI process
ends."""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import socket
import sys
import threading
import traceback
from collections.abc import Callable
from typing import ClassVar, NoReturn

# Every exit code of the CLIs, named once; each outcome's type (an `Ending`) carries its own.
SUCCESS, BUG_CODE, BAD_INPUT, NO_RESULT, WRITES_KEPT, DISK_FULL = 0, 1, 2, 3, 4, 5
INTERRUPTED, TERMINATED = 130, 143  # Ctrl-C (SIGINT), SIGTERM: 128 + the signal, as shells report them

# Printed under the traceback of anything that is not bad input (exit code 1): the user's input was fine.
BUG = ("error: tune_as failed in a way it does not expect (a bug, not your input): please report it with the "
       "traceback above and the command you ran")


class Ending:
    """An outcome a CLI's work can end with besides success: its exit code and what it prints (`message`, on
    stderr unless `to_stdout`). `cli_run` is the one handler of every CLI; subclasses name their code here."""

    exit_code: ClassVar[int] = BUG_CODE
    to_stdout: ClassVar[bool] = False

    def message(self) -> str:
        return f"error: {self}"


class UserError(ValueError, Ending):
    """Bad input: the message names what was expected and what was received. Always one line: messages
    quoted from libraries (YAML, MLflow, Ray) are folded so the CLI's `error: ...` stays a single line."""

    exit_code = BAD_INPUT

    def __init__(self, message: str) -> None:
        super().__init__(re.sub(r"\s*\n\s*", " ", str(message)).strip())


def first_line(exc: BaseException) -> str:
    """What an exception says, for the "received" half of a message: its first line, else its type."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def clip(text: str, limit: int = 80) -> str:
    """`text` cut to `limit` characters, the last one an ellipsis when something was cut."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def excerpt(value: object, limit: int = 80) -> str:
    """`repr(value)`, clipped: a user's value quoted in a message stays short (a 1 MB label is not printed
    whole)."""
    return clip(repr(value[: limit + 1] if isinstance(value, str | bytes) else value), limit)


def tcp_unreachable(host: str, port: int, timeout: float = 5.0) -> str | None:
    """Why nothing answers at host:port (e.g. "Connection refused"), or None if something does. Used to fail
    in seconds where a client library would retry for minutes."""
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as exc:
        return exc.strerror or str(exc)
    return None


def cli_run(work: Callable[[], int], debug: bool = False) -> int:
    """The CLIs' one rule for how `work` ends: an `Ending` (bad input, no result, writes kept, a full disk, an
    interruption, ...) prints its message and returns its code (with `debug`, a bad input's traceback first);
    anything else is a bug, shown as one: its traceback, BUG, exit 1. A plain KeyboardInterrupt goes on up."""
    try:
        return work()
    except (Exception, KeyboardInterrupt) as exc:  # noqa: BLE001 - a bug is shown as one
        if isinstance(exc, Ending):
            if debug and isinstance(exc, UserError):
                traceback.print_exc()
            print(exc.message(), file=sys.stdout if exc.to_stdout else sys.stderr)
            return exc.exit_code
        if isinstance(exc, KeyboardInterrupt):
            raise
        traceback.print_exc()
        print(BUG, file=sys.stderr)
        return BUG_CODE


def end_process(code: int) -> NoReturn:
    """How a CLI process ends once `main` has returned: what it wrote is closed by then (MLflow flushed, Ray
    left, the local head stopped), so the atexit handlers run, the streams are flushed, and the process exits
    at once. Python's own teardown of the modules loaded (torch, Ray, MLflow) is skipped: it changes nothing a
    user can see and took 2.1 s of every search's end on a 2-core machine (docs/benchmarks.md). A thread still
    working (not a daemon) is left to the normal exit, which waits for it."""
    if working_threads():
        raise SystemExit(code)
    # CPython's own exit step, run here because os._exit
    # skips it (no public name runs the registered handlers)
    atexit._run_exitfuncs()  # noqa: SLF001
    for stream in (sys.stdout, sys.stderr):
        # a reader that went away, a stream closed by a handler
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)


def working_threads() -> list[threading.Thread]:
    """The threads other than the main one that Python's normal exit would wait for (alive, not daemons)."""
    return [t for t in threading.enumerate()
            if t is not threading.main_thread() and t.is_alive() and not t.daemon]
