"""The journal: tracking writes that could not be delivered, kept in the search's folder.

What a tracker (tune_as.tracking.tracker) still has queued when a search ends goes into
`tracking_journal.jsonl` (one JSON operation a line, whole or not at all) with the files those writes log
moved beside it; `--resume` and `python -m tune_as.sync` queue it again first (`replay`). Operations are
idempotent, so a write delivered twice changes nothing.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any

from tune_as.errors import WRITES_KEPT, Ending, UserError, first_line

log = logging.getLogger("tune_as.tracking.tracker")  # the tracker's voice: one logger for its lines
JOURNAL = "tracking_journal.jsonl"  # in the search's folder: writes not delivered, one JSON operation a line
JOURNAL_FILES = "tracking_journal_files"  # the files those writes log
OPERATIONS = ("start", "result", "end", "artifacts", "orphans", "search_end")


class WritesKept(Exception, Ending):
    """A search that finished with tracking writes MLflow did not take: they are in its journal."""

    exit_code = WRITES_KEPT

    def __init__(self, tracker: Any) -> None:
        folder, lost = (tracker.journal_dir,
                        f"MLflow: {len(tracker.pending)} writes could not be delivered to {tracker.shown}")
        if folder is None or tracker.unkept:
            super().__init__(f"{lost}, and could not be kept in the search's folder either "
                             f"({tracker.unkept or 'no folder'}): they are lost")
        else:
            super().__init__(f"{lost}; they are kept in {folder / JOURNAL}: "
                             f"`python -m tune_as.sync {folder}` delivers them once MLflow answers "
                             "(so does --resume)")


def keep(tracker: Any) -> Path | None:
    """Write what is still queued to the journal (its staged files moved beside it), or remove a journal
    with nothing left in it. The journal's path, or None when nothing is kept."""
    if tracker.journal_dir is None:
        return None
    path = tracker.journal_dir / JOURNAL
    files = tracker.journal_dir / JOURNAL_FILES
    if not tracker.pending:
        path.unlink(missing_ok=True)
        shutil.rmtree(files, ignore_errors=True)
        return None
    lines = []
    try:
        for what, op in tracker.pending:
            staged = op.get("staged")
            if staged is not None and Path(staged).parent != files:
                files.mkdir(exist_ok=True)
                moved = files / Path(staged).name
                shutil.move(staged, moved)
                op["staged"] = str(moved)
            kept = {**op, "staged": Path(op["staged"]).name} if staged is not None else op
            lines.append(json.dumps({"what": what, **kept}))
        partial = path.with_suffix(".partial")
        partial.write_text("\n".join(lines) + "\n")
        partial.replace(path)  # whole or not at all
    except OSError as exc:  # a full disk, a folder gone: said, never a traceback over the search's answer
        tracker.unkept = f"{type(exc).__name__}: {first_line(exc)[:200]}"
        log.error("MLflow: %d writes could not be kept in %s either (%s)", len(tracker.pending), path,
                  tracker.unkept)
        return None
    return path


def replay(tracker: Any, skip_search_end: bool = False) -> int:
    """Queue the journal's writes first (a resumed search ends its parent run itself: `skip_search_end`); the
    journal stays until `keep` after the next flush rewrites or removes it. The number of writes queued."""
    if tracker.journal_dir is None or not (tracker.journal_dir / JOURNAL).is_file():
        return 0
    files = tracker.journal_dir / JOURNAL_FILES
    ops = []
    for n, line in enumerate((tracker.journal_dir / JOURNAL).read_text().splitlines(), 1):
        try:
            op = json.loads(line)
            if not isinstance(op, dict) or op.get("op") not in OPERATIONS:
                raise ValueError(f"operation {op.get('op') if isinstance(op, dict) else op!r}")
            what = str(op.pop("what", op["op"]))
        except ValueError as exc:
            raise UserError(f"{tracker.journal_dir / JOURNAL}:{n}: expected a tracking write that tune_as "
                            f"kept (JSON), got {first_line(exc)[:200]}") from None
        if op.get("staged") is not None:
            op["staged"] = str(files / Path(op["staged"]).name)
        if not (skip_search_end and op["op"] == "search_end"):
            ops.append((what, op))
    tracker.pending.extendleft(reversed(ops))
    return len(ops)
