"""`python -m tune_as.report --experiment TASK`: the report's command line (report.build does the work).

Reads the runs a search wrote, selects one setting per task x loss, writes the paper's Tables 6/2/3/4 and
Figures 1-4 into --out, prints the tables and logs them to a report run (docs/report.md); `--print FORMAT`
prints one search's answer again from its record; `--confirm N` re-runs each selected setting with new seeds.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from tune_as.engine.request import SearchRequest, refuse_ray_client
from tune_as.errors import UserError, cli_run, end_process
from tune_as.paths import OneLineParser
from tune_as.report.build import answer_text, build_report, show
from tune_as.results.render import FORMATS


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog="python -m tune_as.report",
        description="Select one setting per task x loss from a search's MLflow runs (best mean validation "
                    "metric), write the paper's Tables 6/2/3/4 and Figures 1-4, "
                    "optionally confirm with new seeds.")
    p.add_argument("--experiment", required=True, metavar="NAME[,NAME...]",
                   help="MLflow experiment: the task name, or the --experiment the search used "
                        "(comma-separated for several, one column per task)")
    p.add_argument("--search", default="", metavar="NAME[,NAME...]",
                   help="report only these searches (their --name, e.g. digits-20261125-153012; "
                        "default: every search of the experiment, each its own answer and column)")
    p.add_argument("--out", type=Path, default=Path("tune_as_report"),
                   help="folder for tables and figures (default: tune_as_report)")
    p.add_argument("--tracking-uri", default=os.environ.get("MLFLOW_TRACKING_URI", "sqlite:///mlflow.db"),
                   help="MLflow tracking URI (default: env MLFLOW_TRACKING_URI or sqlite:///mlflow.db)")
    p.add_argument("--print", dest="print_format", choices=FORMATS, default=None, metavar="FORMAT",
                   help="print one search's answer, replayed from its record, in FORMAT (table, markdown, "
                        "csv, json: numbers as numbers) on stdout, and write nothing else")
    p.add_argument("--confirm", type=int, default=0, metavar="N",
                   help="re-run each selected setting with N new seeds and compare with softmax")
    p.add_argument("--optuna-storage", type=Path, default=None, metavar="PATH",
                   help="the search's Optuna SQLite file, or its --storage-path (default: tune_as_results, "
                        "where the task's latest search of this experiment is found)")
    where = p.add_argument_group("where --confirm runs (task, data and settings come from the selected runs)")
    where.add_argument("--address", default=os.environ.get("RAY_ADDRESS"),
                       help="Ray cluster: 'auto' or HOST:PORT of its GCS (default: a local Ray)")
    where.add_argument("--storage-path", type=Path, default=Path("tune_as_results"),
                       help="folder for the confirmation runs' checkpoints (shared storage on clusters)")
    where.add_argument("--cpus-per-trial", type=float, default=1.0)
    where.add_argument("--gpus-per-trial", type=float, default=None)
    where.add_argument("--max-concurrent", type=int, default=None)
    return p


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # --help (0) or a bad option (2, its line already printed)
        return int(exc.code or 0)
    from tune_as.engine.cluster import loopback_ray

    loopback_ray(args.address)
    return cli_run(lambda: _report(args))


def _report(args: argparse.Namespace) -> int:
    refuse_ray_client(args.address)
    if args.confirm < 0 or args.confirm == 1:
        raise UserError(f"--confirm: expected 0 or at least 2 seeds (a paired interval needs 2), received "
                        f"{args.confirm}")
    experiments = [e.strip() for e in args.experiment.split(",") if e.strip()]
    searches = [n.strip() for n in args.search.split(",") if n.strip()]
    if args.print_format:
        print(answer_text(experiments, args.tracking_uri, searches, args.print_format), end="")
        return 0
    placement = SearchRequest(task="", address=args.address, storage_path=args.storage_path,
                              cpus_per_trial=args.cpus_per_trial, gpus_per_trial=args.gpus_per_trial,
                              max_concurrent=args.max_concurrent)
    report = build_report(experiments, args.out, args.tracking_uri, args.confirm, args.optuna_storage,
                          placement, searches)
    show(report)
    return 0


def cli() -> None:
    """`python -m tune_as.report` and `tune-as-report`: `main`, then the quick end of
    tune_as.errors.end_process."""
    end_process(main())


if __name__ == "__main__":
    cli()
