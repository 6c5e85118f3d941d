"""The search's folder: claimed by one process at a time, its saved state written atomically, and the command
that resumes it."""

from __future__ import annotations

import fcntl
import shlex
from pathlib import Path
from typing import IO, Any

from tune_as.engine.plan import SearchPlan
from tune_as.engine.state import write_json
from tune_as.errors import UserError
from tune_as.tracking import schema
from tune_as.tracking.client import redact_uri


def claim(search_dir: Path, resume: bool) -> IO[str]:
    """Create (or, resuming, open) the search's folder and hold its lock for this process's lifetime: two
    processes can never run one search. mkdir is atomic, so of two new searches of one name one gets exit 2.
    A new folder is closed to other users (700): a resume unpickles Ray's state from it (engine.state)."""
    try:
        search_dir.mkdir(mode=0o700, parents=True, exist_ok=resume)
    except FileExistsError:
        raise UserError(f"--name: expected a new search name, but {search_dir} was just created by another "
                        "process") from None
    handle = open(search_dir / schema.NAME_LOCK, "a+")  # noqa: SIM115 - held until the process exits
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        raise UserError(f"--resume: expected a search no other process is running, but {search_dir.name} is "
                        "running now (its folder is locked)") from None
    return handle


def write_state(search_dir: Path, state: dict[str, Any]) -> None:
    write_json(search_dir / schema.SEARCH_STATE_FILE, state)


def resume_hint(plan: SearchPlan) -> str:
    """The command that resumes this search, to paste in a shell as is (from any folder: the path is
    absolute), on the cluster it ran on (an address holds no password: `cluster.check_address`)."""
    storage = shlex.quote(str(plan.search_dir.parent))
    hint = f"python -m tune_as.search --resume --name {plan.name} --storage-path {storage}"
    if plan.request.address:
        hint += f" --address {shlex.quote(plan.request.address)}"
    uri = plan.request.mlflow_uri
    if uri and redact_uri(uri) == uri:  # a URI with a password is not printed: pass it again
        hint += f" --mlflow-uri {shlex.quote(uri)}"
    return hint
