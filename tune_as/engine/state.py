"""The state a search writes and reads back on `--resume`: JSON written atomically, never a pickle, and the check
that the search's folder is the user's own.

Reading a pickle runs whatever code it names, so a state file planted in a search folder would run in the driver.
tune_as's own state (the searcher's, the early-stopping brackets, the saved request) is therefore JSON. Ray Tune's
own experiment state (`tuner.pkl`, `experiment_state-*.json` with cloudpickled parts, `search_gen_state-*`) is
unpickled by Ray on every resume: that is why `check_ownership` refuses a folder someone else could have written to.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

from tune_as.errors import UserError, first_line

CONFIRM_DIR = "confirm"  # the confirmation runs' Tune experiment, inside the search's folder


def write_json(path: Path, state: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(state, indent=2))
    os.replace(tmp, path)  # atomic: a kill never leaves half a file


def read_json(path: Path, what: str) -> dict[str, Any]:
    """The JSON object `write_json` wrote; anything else (a pickle of an older tune_as, a damaged or planted file)
    is a UserError naming the file. Nothing in it is executed."""
    try:
        state = json.loads(Path(path).read_bytes())
    except (OSError, ValueError) as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise UserError(f"{path}: expected {what} tune_as writes (JSON), got {type(exc).__name__}: "
                        f"{first_line(exc)[:120]}; a search started by a tune_as that pickled it cannot be "
                        "resumed") from None
    if not isinstance(state, dict):
        raise UserError(f"{path}: expected {what} tune_as writes (JSON), got a JSON {type(state).__name__}")
    return state


def _refusal(path: Path, st: os.stat_result, uid: int, check_mode: bool) -> str | None:
    if st.st_uid != uid:
        return f"{path} (owned by uid {st.st_uid}, not by you, uid {uid})"
    if check_mode and st.st_mode & stat.S_IWOTH:
        return f"{path} (mode {st.st_mode & 0o777:#o}: writable by others)"
    if check_mode and st.st_mode & stat.S_IWGRP:
        return f"{path} (mode {st.st_mode & 0o777:#o}: writable by the group)"
    return None


def check_ownership(search_dir: Path) -> None:
    """Refuse to resume a search whose folder another user could have written to: with `os.stat`, the search
    folder (and its `confirm*` round folders) must be owned by this process's user and not writable by group or others,
    and every file directly in them owned by this user and, unless its folder is closed to group and others
    (no x bit: nobody else can reach it), not writable by group or others."""
    uid = os.getuid()
    # the confirmation rounds' experiments: confirm, confirm-2, ... (engine.run._confirm)
    folders = [search_dir, *sorted(p for p in search_dir.glob(CONFIRM_DIR + "*") if p.is_dir())]
    for folder in folders:
        st = os.stat(folder)
        reason = _refusal(folder, st, uid, check_mode=True)
        closed = not st.st_mode & (stat.S_IXGRP | stat.S_IXOTH)
        for path in sorted(p for p in folder.iterdir() if p.is_file()):
            reason = reason or _refusal(path, os.stat(path), uid, check_mode=not closed)
        if reason:
            raise UserError(f"--resume: expected a search folder only you can write to (Ray unpickles the "
                            f"experiment state in it), got {reason}; if you trust what is in it, make it yours "
                            f"(chown, chmod -R go-w {search_dir})")
