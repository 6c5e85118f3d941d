"""The state a search writes and reads back on `--resume`: JSON written atomically, never a pickle, and the
check that the search's folder is the user's own.

Reading a pickle runs whatever code it names, so a state file planted in a search folder would run in the
driver. tune_as's own state (the searcher's, the early-stopping brackets, the saved request) is therefore
JSON. Ray Tune's own experiment state (`tuner.pkl`, `experiment_state-*.json` with cloudpickled parts,
`search_gen_state-*`) is unpickled by Ray on every resume: that is why `check_ownership` refuses a folder
someone else could have written to.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import stat
from pathlib import Path
from typing import Any

from tune_as.errors import UserError, first_line

CONFIRM_DIR = "confirm"  # the confirmation runs' Tune experiment, inside the search's folder
SEARCH_DIR = "search"  # the search's own Tune experiment, inside its folder (`search_experiment`)
TOKEN = re.compile(r"[0-9a-f]{8}")  # a search's token (`new_token`), as its saved state must hold it


def new_token() -> str:
    """A new search's token, saved in its state: the name Ray knows its Tune experiments by. Ray stages an
    experiment's files on the driver's node in
    `<Ray session>/artifacts/<second it started>/<experiment name>/`: two searches on one cluster whose
    experiments shared one name (the user's --name, or `confirm`) and started within one second wrote one
    staging folder, and a resume read the other's half-written state (ray-project/ray#35006). Random, not
    derived from the name or the time: those are what two searches share."""
    return secrets.token_hex(4)


def search_experiment(search_dir: Path, token: str | None) -> Path:
    """The search's own Tune experiment: `<search folder>/search.<token>`; the folder itself for a search an
    older tune_as started (no token in its state), so that a resume continues it where it is."""
    return search_dir / f"{SEARCH_DIR}.{token}" if token else search_dir


def round_name(search_dir: Path, suffix: str, round_no: int) -> str:
    """The Tune experiment (a folder inside the search's) of confirmation round `round_no`:
    `confirm.<suffix>`, `confirm-2.<suffix>`, ..., the suffix the search's token (`new_token`: why), or its id
    where an older tune_as saved no token. A round an older tune_as named `confirm`, `confirm-2` keeps its
    folder, so a resume continues it."""
    older = CONFIRM_DIR if round_no == 1 else f"{CONFIRM_DIR}-{round_no}"
    return older if (search_dir / older).is_dir() else f"{older}.{suffix}"


def part_dir(search_dir: Path, experiment: Path, part: int) -> Path:
    """Part `part` of a Tune experiment of the search (1: the experiment itself): `<name>.part2`, ..., in the
    search's folder, for the trials its resumed Ray state lost (engine.run)."""
    return experiment if part == 1 else search_dir / f"{experiment.name}.part{part}"


def experiment_folders(search_dir: Path) -> list[Path]:
    """The search's folder, its own Tune experiment where it is a folder of its own (`search_experiment`),
    then its confirmation rounds' (`round_name`: engine.confirm), each with its parts (`<name>.part2`:
    engine.run, engine.confirm)."""
    return [search_dir, *sorted(p for p in search_dir.glob(SEARCH_DIR + ".*") if p.is_dir()),
            *sorted(p for p in search_dir.glob(CONFIRM_DIR + "*") if p.is_dir())]


def write_json(path: Path, state: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(state, indent=2))
    os.replace(tmp, path)  # atomic: a kill never leaves half a file


def read_json(path: Path, what: str) -> dict[str, Any]:
    """The JSON object `write_json` wrote; anything else (a pickle of an older tune_as, a damaged or planted
    file) is a UserError naming the file. Nothing in it is executed."""
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
    folder (and its `confirm*` round folders) must be owned by this process's user and not writable by group
    or others, and every file directly in them owned by this user and, unless its folder is closed to group
    and others (no x bit: nobody else can reach it), not writable by group or others."""
    uid = os.getuid()
    for folder in experiment_folders(search_dir):
        st = os.stat(folder)
        reason = _refusal(folder, st, uid, check_mode=True)
        closed = not st.st_mode & (stat.S_IXGRP | stat.S_IXOTH)
        for path in sorted(p for p in folder.iterdir() if p.is_file()):
            reason = reason or _refusal(path, os.stat(path), uid, check_mode=not closed)
        if reason:
            raise UserError(f"--resume: expected a search folder only you can write to (Ray unpickles the "
                            f"experiment state in it), got {reason}; if you trust what is in it, make it "
                            f"yours (chown, chmod -R go-w {search_dir})")


# -- the searchers' state (engine.searcher); pure so that --resume checks it before Ray or MLflow starts -----
SEARCHER_WHAT = "the searcher state"
# Ray's name for what Searcher.save writes (JSON inside, despite the name)
SEARCHER_FILES = "searcher-state-*.pkl"


def loss_searcher_state(saved: dict[str, Any], path: Path) -> dict[str, Any]:
    """PerLossSearcher's saved state, typed: suggestions per loss, live trials, exhausted losses, orphaned
    numbers."""
    try:
        return {"suggested": {str(loss): int(n) for loss, n in dict(saved["suggested"]).items()},
                "live": {str(t): (str(loss), int(number))
                         for t, (loss, number) in dict(saved["live"]).items()},
                # absent from a state written before they existed
                "exhausted": {str(loss) for loss in saved.get("exhausted", [])},
                "orphans": {str(loss): [int(n) for n in numbers]
                            for loss, numbers in dict(saved.get("orphans", {})).items()}}
    except (KeyError, TypeError, ValueError) as exc:
        raise UserError(f"{path}: expected {SEARCHER_WHAT} tune_as writes (JSON: suggestions per loss, live "
                        f"trials), got {type(exc).__name__}: {str(exc)[:120]}") from None


def fixed_searcher_state(saved: dict[str, Any], path: Path) -> tuple[int, set[str]]:
    """FixedConfigs' saved state: the index of the next config, the live trials (absent from older states)."""
    nxt, live = saved.get("next"), saved.get("live", [])
    if not isinstance(nxt, int) or isinstance(nxt, bool) or nxt < 0:
        raise UserError(f"{path}: expected {SEARCHER_WHAT} tune_as writes (JSON: the next config), got "
                        f"next={str(nxt)[:40]}")
    if not isinstance(live, list) or not all(isinstance(t, str) for t in live):
        raise UserError(f"{path}: expected {SEARCHER_WHAT} tune_as writes (JSON: the live trials' ids), got "
                        f"live={str(live)[:40]}")
    return nxt, set(live)


SCHEDULER_FILE = "scheduler.json"  # engine.schedulers.PerLossASHA's state, in the search's folder
SCHEDULER_WHAT = "the early-stopping state"


def _rungs_shape(rungs: Any) -> bool:
    """[[milestone, {trial: value}], ...] (engine.schedulers.Rungs.to_json); the milestones are checked
    against the search's settings when the scheduler loads it."""
    return isinstance(rungs, list) and all(
        isinstance(r, list) and len(r) == 2 and isinstance(r[0], (int, float)) and isinstance(r[1], dict)
        and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in r[1].values())
        for r in rungs)


def check_scheduler_state(search_dir: Path) -> None:
    """The early-stopping state's shape, on `--resume` before Ray starts (as check_searcher_states)."""
    path = search_dir / SCHEDULER_FILE
    if not path.is_file():
        return
    losses = read_json(path, SCHEDULER_WHAT).get("losses")
    bad = (f"losses={str(losses)[:40]}" if not isinstance(losses, dict) else
           next((f"{key}: {str(r)[:40]}" for key, r in losses.items()
                 if r is not None and not _rungs_shape(r)), ""))
    if bad:
        raise UserError(f"{path}: expected {SCHEDULER_WHAT} tune_as writes (JSON: per loss, the rungs of its "
                        f"early stopping), got {bad}")


def check_searcher_states(search_dir: Path) -> None:
    """The searcher state Ray would restore in the search's experiment and in each confirmation round's (the
    newest file, as `Searcher.restore_from_dir` picks it), read as the searchers read it: on `--resume`,
    before Ray starts, so that a damaged file is one line naming it, not a traceback from Ray's copy of it."""
    for folder in experiment_folders(search_dir):
        found = [str(p) for p in folder.glob(SEARCHER_FILES)]
        if found:
            path = Path(max(found))
            saved = read_json(path, SEARCHER_WHAT)
            if folder == search_dir or folder.name.startswith(SEARCH_DIR + "."):
                loss_searcher_state(saved, path)
            else:
                fixed_searcher_state(saved, path)
