"""Deliver the tracking writes a search kept because MLflow did not take them (its folder's
`tracking_journal.jsonl`, tune_as.tracking.tracker):

    python -m tune_as.sync tune_as_results/digits-20261126-041906
    # a URI saved without its password
    python -m tune_as.sync FOLDER --mlflow-uri https://user:pw@mlflow.example

Exit codes: 0 delivered (or nothing was kept), 2 bad input (no search folder, a damaged journal, MLflow that
cannot be used), 4 some writes are still kept (MLflow went away again: run it again later)."""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

from tune_as.errors import WRITES_KEPT, UserError, cli_run
from tune_as.paths import OneLineParser


def build_parser() -> OneLineParser:
    p = OneLineParser(prog="python -m tune_as.sync", description=__doc__.split("\n\n")[0])
    p.add_argument("folder", type=Path, help="the search's folder (STORAGE_PATH/NAME)")
    p.add_argument("--mlflow-uri", default=None,
                   help="the tracking URI (default: the search's own, as saved; "
                        "needed when it held a password)")
    p.add_argument("--wait", type=float, default=60.0, metavar="SECONDS",
                   help="how long to keep retrying while MLflow does not answer (default 60)")
    return p


def deliver(folder: Path, uri: str | None, wait: float) -> tuple[int, int]:
    """(writes delivered, writes still kept) for the search in `folder`."""
    from tune_as.engine.resume import check_deliverable, read_state
    from tune_as.tracking.tracker import JOURNAL, MlflowTracker

    state = read_state(folder, check_deliverable)
    if state is None:
        raise UserError(f"{folder}: expected a search's folder (with its tune_as_search.json), got none")
    if not (folder / JOURNAL).is_file():
        return 0, 0
    if uri is None and state.get("mlflow_uri_redacted"):
        raise UserError(f"--mlflow-uri: expected the tracking URI with its password (the search saved "
                        f"{state['mlflow_uri']} without it), got none")
    tracker = MlflowTracker(uri or state.get("mlflow_uri"), str(state["experiment"]), str(state["search_id"]),
                            final_flush_s=wait, journal_dir=folder)
    tracker.attach()
    queued = tracker.replay()
    tracker.flush(deadline=time.monotonic() + wait)
    tracker.keep()
    return queued - len(tracker.pending), len(tracker.pending)


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    logging.getLogger("mlflow").setLevel(logging.WARNING)
    return cli_run(lambda: _report(args.folder, *deliver(args.folder, args.mlflow_uri, args.wait)))


def _report(folder: Path, delivered: int, kept: int) -> int:
    if kept:
        print(f"error: {kept} writes are still kept in {folder} (MLflow did not take them): run this again "
              "once it answers", file=sys.stderr)
        return WRITES_KEPT
    print(f"{delivered} kept writes delivered" if delivered else f"{folder}: no kept writes to deliver")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
