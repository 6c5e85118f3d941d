"""`python -m tune_as.search --task TASK`: the CLI. It maps arguments onto a `SearchRequest` and calls
`tune_as.engine.run.run_search`. Every option but --debug is a SearchRequest field, derived from its
declaration (type, default, help, flag: tune_as.engine.request); argparse shows the defaults, the request owns
them."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import os
import signal
import sys
import typing
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any, TextIO, TypeVar

from tune_as.engine import head as ray_head
from tune_as.engine import interrupt
from tune_as.engine.request import HELP_GROUPS, OPTIONS, SearchRequest, flag
from tune_as.errors import INTERRUPTED, SUCCESS, TERMINATED, UserError, cli_run, end_process
from tune_as.paths import OneLineParser
from tune_as.results.render import MACHINE_FORMATS

T = TypeVar("T")

def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog="python -m tune_as.search", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Which loss wins on a task, and with which settings: search each loss's\n"
                    "parameters (Ray Tune, Optuna, early stopping per loss), confirm with new\n"
                    "seeds, answer with controlled claims.",
        epilog=EXAMPLES)
    hints = typing.get_type_hints(SearchRequest)
    fields = {field.name: field for field in dataclasses.fields(SearchRequest)}
    for title, names in HELP_GROUPS:
        group = p.add_argument_group(title)
        for name in names:
            group.add_argument(flag(name), dest=name, **_argument(fields[name], hints[name]))
    p.add_argument("--debug", action="store_true",
                   help="print the traceback of a refused input too "
                        "(an unexpected failure always prints one)")
    return p


EXAMPLES = """examples:
  python -m tune_as.search --task digits --trials-per-loss 2 --race
  python -m tune_as.search --task clinc_oos --encoder frozen --race
  python -m tune_as.search --resume --name digits-20261207-153012
docs/search.md has every option; docs/verdicts.md the statistics of the answer."""


def _argument(field: dataclasses.Field[Any], hint: Any) -> dict[str, Any]:
    """argparse's keywords for a SearchRequest field, from its annotation, default and `Option`."""
    o = OPTIONS[field.name]
    default = None if field.default is dataclasses.MISSING else field.default
    if o.env:
        default = os.environ.get(o.env, default)
    shown = {"default": default, "help": o.help}
    if o.const is not None:
        return {**shown, "action": "store_const", "const": o.const}
    if hint is bool:  # a switch: --x turns a False default on, --no-x a True one off
        return {**shown, "action": "store_false" if default else "store_true"}
    if default == ():  # repeatable, KEY=VALUE pairs split by request_from_args
        return {**shown, "action": "append", "default": [], "metavar": o.metavar}
    kind = next((a for a in typing.get_args(hint) if a is not type(None)), hint)  # X | None -> X
    kind = o.parse or (kind if kind in (int, float, Path) else None)  # str (and losses' comma list) stay text
    return {**shown, "type": kind, "choices": o.choices, "metavar": o.metavar}


def request_from_args(args: argparse.Namespace, typed: frozenset[str] | None = None) -> SearchRequest:
    from tune_as.space.overrides import parse_overrides

    if not args.task and not args.resume:
        raise UserError("--task: expected a task name (see docs/tasks.md), got none")
    losses = None
    if args.losses is not None:
        losses = tuple(x.strip() for x in args.losses.split(",") if x.strip())
    task_args = []
    for item in args.task_args or []:
        if "=" not in item:
            raise UserError(f"--task-arg: expected KEY=VALUE, got {item!r}")
        key, value = item.split("=", 1)
        task_args.append((key.strip(), value.strip()))
    overrides = tuple(parse_overrides(args.overrides).items())
    fields = {k: v for k, v in vars(args).items() if k != "debug"}
    return SearchRequest(**{**fields, "task": args.task or "", "losses": losses,
                            "task_args": tuple(task_args), "overrides": overrides, "typed": typed})


def typed_options(args: argparse.Namespace, argv: list[str] | None) -> frozenset[str]:
    """The SearchRequest fields of the options on the command line, whatever their value: parsed again with
    every default suppressed, so that only typed options are in the namespace (`--max-seeds 10` is typed
    although 10 is the default: a resume must compare it with the saved value)."""
    parser = build_parser()
    for action in parser._actions:  # noqa: SLF001 - argparse lists its actions nowhere public
        action.default = argparse.SUPPRESS
    return frozenset(vars(parser.parse_args(argv)))


class _Fitted(logging.Handler):
    """tune_as's own log lines (data notes, cache and encoding messages) on the current stderr, wrapped to the
    terminal's width."""

    def emit(self, record: logging.LogRecord) -> None:
        from tune_as.results.render import fit

        try:
            print(fit(self.format(record)), file=sys.stderr)
        except Exception:  # noqa: BLE001 - logging's own contract: a failed emit is reported, never raised
            self.handleError(record)


def _fit_log_lines() -> None:
    log = logging.getLogger("tune_as")
    # main() may run many times in one process (tests)
    if not any(isinstance(h, _Fitted) for h in log.handlers):
        log.addHandler(_Fitted())
    log.propagate = False  # one copy of each line (not Python's last-resort handler too)
    log.setLevel(logging.WARNING)


def _sigterm_as_interrupt(signum: int, frame: FrameType | None) -> None:
    """SIGTERM (a scheduler or `kill`) stops the search like Ctrl-C: Ray Tune saves its state and stops the
    trials, the runs are closed as KILLED and the resume hint is printed."""
    global _TERMINATED  # noqa: PLW0603 - a signal handler can only talk to main() through module state
    if not _TERMINATED:  # Ray may have got the signal too: give up on it if it cannot stop the search
        interrupt.watch(TERMINATED)
    _TERMINATED = True
    signal.raise_signal(signal.SIGINT)


_TERMINATED = False


def starting_line(r: SearchRequest) -> str:
    """What is about to run, from the request alone (printed at once: importing PyTorch, Ray Tune and MLflow,
    then starting Ray, take seconds before the search's own lines)."""
    from tune_as.results.render import fit

    if r.resume:
        latest = f"the latest {r.task} search" if r.task else "the latest search"
        what = f"resuming {r.name or latest}"
    else:
        losses = f"losses {', '.join(r.losses)}" if r.losses else "every loss of the task"
        confirm = (f", then racing up to {r.max_seeds} seeds per loss" if r.race
                   else f", then {r.confirm} seeds per loss" if r.confirm else "")
        what = f"{r.task}: a search of {losses}{confirm}"
    ray = "joining the Ray cluster of --address" if r.address else "starting a local Ray"  # (never its text)
    return fit(f"{what}; loading PyTorch, Ray Tune and MLflow, preparing the data, {ray}...")


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # --help (0) or a bad option (2, its line already printed)
        return int(exc.code or 0)
    # what the arguments alone can refuse, before Ray, torch and transformers are imported
    code, request = _attempt(lambda: _checked(request_from_args(args, typed_options(args, argv))), args.debug)
    if request is None:
        return code
    if request.output_format in MACHINE_FORMATS:  # the answer alone on stdout (`| jq`): the rest to stderr
        answer_to = sys.stdout
        with contextlib.redirect_stdout(sys.stderr):
            return _run(args, request, answer_to)
    return _run(args, request, sys.stdout)


def _attempt(work: Callable[[], T], debug: bool = False) -> tuple[int, T | None]:
    """`work()`'s value with SUCCESS, or the exit code `cli_run` gives its failure (having printed it) and
    None."""
    done: list[T] = []

    def run() -> int:
        done.append(work())
        return SUCCESS
    code = cli_run(run, debug=debug)
    return code, done[0] if done else None


def _checked(request: SearchRequest) -> SearchRequest:
    request.check()
    return request


def _launch(request: SearchRequest) -> ray_head.Head | None:
    try:
        return ray_head.launch(request.address, request.dashboard, request.dashboard_host)
    except OSError as exc:  # no temporary folder to write its log in, or no process (no home: a UserError)
        raise UserError(f"Ray: expected a local Ray to start on this machine, got {type(exc).__name__}: "
                        f"{exc}") from None


def _run(args: argparse.Namespace, request: SearchRequest, answer_to: TextIO) -> int:
    """The search the request asks for, its answer printed on `answer_to`; the exit code."""
    print(starting_line(request), flush=True)  # before the heavy imports (seconds of them)
    # a local Ray starts in its own process while this one imports (engine/head.py)
    code, launched = _attempt(lambda: (_launch(request),))
    if launched is None:
        return code
    (head,) = launched
    try:
        return _search(args, request, head, answer_to)
    finally:
        if head is not None:
            _leave(head)


def _leave(head: ray_head.Head) -> None:
    """Leave Ray, then stop the head: a driver still connected to a stopped head would wait for it (60 s)."""
    if "ray" in sys.modules:
        import ray

        ray.shutdown()
    head.stop()


def _search(args: argparse.Namespace, request: SearchRequest, head: ray_head.Head | None,
            answer_to: TextIO) -> int:
    from tune_as.engine.cluster import loopback_ray

    loopback_ray(args.address)
    from tune_as.engine.run import run_search

    # MLflow logs its schema creation on the first use of an SQLite file at INFO ("Creating initial MLflow
    # database tables..."): the CLI prints its own lines, and an error stays one line. Warnings still show.
    logging.getLogger("mlflow").setLevel(logging.WARNING)
    _fit_log_lines()
    previous = signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
    try:  # how it ends: errors.cli_run, the outcomes' own codes (tune_as.errors)
        code, _ = _attempt(lambda: run_search(request, head, answer_to), args.debug)
    except KeyboardInterrupt:  # Ctrl-C outside Ray Tune's own handling
        print(interrupt.interrupted_line(None), file=sys.stderr)
        code = INTERRUPTED
    finally:
        signal.signal(signal.SIGTERM, previous)
    return TERMINATED if code == INTERRUPTED and _TERMINATED else code


def cli() -> None:
    """`python -m tune_as.search` and `tune-as-search`: `main`, then the quick end of
    tune_as.errors.end_process."""
    end_process(main())


if __name__ == "__main__":
    cli()
