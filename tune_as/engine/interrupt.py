"""When Ray cannot stop a search: a signal sent to the whole process group.

A terminal's Ctrl-C and a scheduler's SIGTERM (`timeout`, Slurm, Kubernetes) reach every process of the group:
the driver, and the local Ray it started (GCS, raylet, workers are its children, in its group). The driver
turns SIGTERM into Ray Tune's own graceful stop (tune_as.search), and Tune then saves its state and stops the
trials through Ray. That works when only the driver got the signal; when Ray's GCS got it too it is gone, and
the driver's next call into Ray blocks for 60 s, then Ray's core worker ends the process ("Failed to connect
to GCS"), leaving every MLflow run RUNNING.

`watch` therefore gives Ray's graceful stop `GRACE_S` seconds, and gives up at once when Ray's own GCS or
raylet (children of this process, found in /proc) have died. Giving up (`abandon`) closes every open MLflow
run as KILLED (bounded), prints the one resume line and exits with the signal's code, without calling Ray
again. A resume continues from Ray Tune's last saved experiment state, as after a killed driver
(tests/test_reliability.py).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

GRACE_S = 30.0  # for Ray's graceful stop when its processes are alive (measured: ~10 s on 2 loaded cores)
POLL_S = 0.2
CLOSE_S = 15.0  # for closing the MLflow runs before exiting anyway
RAY_SERVICES = ("gcs_server", "raylet")

_lock = threading.Lock()  # held by whoever ends the search: the main thread's normal end, or `abandon`
_session: dict[str, Any] = {}  # the running search's tracker and resume hint (`register`)
_over = threading.Event()  # the search ended its own way: a watchdog still waiting does nothing
noticed = threading.Event()  # Ray Tune's run got a SIGINT (engine.callbacks.NoticeInterrupt)


def register(tracker: Any, hint: str) -> None:
    """The search now running: what `abandon` closes and prints (engine.run, once its parent run is open)."""
    _session.update(tracker=tracker, hint=hint)
    _over.clear()
    noticed.clear()


def ending() -> None:
    """The main thread ends the search its own way (it closes the runs): a watchdog does nothing from now on.
    When `abandon` is already ending the process, this waits for its exit instead."""
    if not _lock.acquire(blocking=False):
        threading.Event().wait()  # abandon holds it and calls os._exit
    _over.set()


def ended() -> None:
    """The search's runs are closed (after `ending`): the next search of this process starts clean."""
    _session.clear()
    _lock.release()


def watch(code: int, grace_s: float = GRACE_S) -> threading.Thread:
    """Start the watchdog for a signal just received (`code`: the exit code it means, 130 or 143)."""
    services = _ray_services()
    thread = threading.Thread(target=_watch, args=(code, services, grace_s),
                              name="tune_as-interrupt", daemon=True)
    thread.start()
    return thread


def _watch(code: int, services: set[int], grace_s: float) -> None:
    deadline = time.monotonic() + grace_s
    why = f"Ray did not stop the search within {grace_s:g} s"
    while time.monotonic() < deadline:
        if _over.is_set():
            return
        if services and not all(_alive(pid) for pid in services):
            # Ray lost its own processes to the signal: there is nothing left to stop gracefully
            why = "Ray's own processes got the signal too"
            break
        time.sleep(POLL_S)
    abandon(code, why)


def interrupted_line(hint: str | None) -> str:
    """The one line an interrupted search ends with (the CLI's normal path and `abandon` alike)."""
    return (f"interrupted: trials stopped, MLflow runs marked KILLED; resume with:  {hint}" if hint else
            "interrupted before the search started: nothing to resume")


def abandon(code: int, why: str = "") -> None:
    """Close the open runs as KILLED, print the resume line, exit with `code` (never returns while it ends the
    process; returns at once when the main thread is already ending it)."""
    if _over.is_set() or not _lock.acquire(blocking=False):
        return
    if why:
        print(f"{why}: closing the runs without it", file=sys.stderr, flush=True)
    tracker, hint = _session.get("tracker"), _session.get("hint")
    if tracker is not None:
        tracker.final_flush_s = min(tracker.final_flush_s, CLOSE_S)
        tracker.search_ended("KILLED")
    print(interrupted_line(hint), file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(code)  # noqa: SLF001 - the main thread is blocked inside Ray: a normal exit would wait for it


def _ray_services() -> set[int]:
    """Process ids of the GCS and raylet that a local Ray started as this process's children (Linux /proc); an
    empty set elsewhere or when Ray runs on a cluster (then only the grace period applies)."""
    found: set[int] = set()
    proc = Path("/proc")
    if not proc.is_dir():
        return found
    me = os.getpid()
    for entry in proc.iterdir():
        if entry.name.isdigit():
            fields = _stat(int(entry.name))
            if fields is not None and fields[0] in RAY_SERVICES and fields[2] == me:
                found.add(int(entry.name))
    return found


def _stat(pid: int) -> tuple[str, str, int] | None:
    """(command name, state, parent pid) from /proc/<pid>/stat; None when the process is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    name = text[text.index("(") + 1: text.rindex(")")]
    state, ppid = text[text.rindex(")") + 2:].split()[:2]
    return name, state, int(ppid)


def _alive(pid: int) -> bool:
    fields = _stat(pid)
    return fields is not None and fields[1] not in ("Z", "X")  # a zombie has died (Ray has not reaped it yet)
