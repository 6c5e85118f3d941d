"""What `--resume` may do: read a search folder's saved state, restore the saved request with this call's
runtime options, and refuse what would change the answer (each refusal says why), or say that a finished
search has nothing to resume."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tune_as.engine.request import RESULT_OPTIONS, SearchRequest, flag
from tune_as.engine.state import TOKEN, check_ownership, check_scheduler_state, check_searcher_states
from tune_as.errors import SUCCESS, Ending, UserError, first_line
from tune_as.paths import absolute_sqlite
from tune_as.tracking import schema


def read_state(search_dir: Path, check: Callable[[Any, Path], None] | None = None) -> dict[str, Any] | None:
    """The search's saved state, checked whole for a resume (`check_saved`), or with `check` for what a caller
    needs of it (tune_as.sync: `check_deliverable`)."""
    check = check or check_saved
    path = search_dir / schema.SEARCH_STATE_FILE
    if not path.is_file():
        return None
    try:
        state = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise UserError(f"{path}: expected the search's saved state (JSON), got "
                        f"{first_line(exc)[:200]}") from None
    check(state, path)
    return dict(state)


def _fits(annotation: str, value: Any) -> bool:
    """Whether a JSON value can be a SearchRequest field of this annotation (a string: the module's
    annotations are postponed). Tuples are saved as lists; task_args and overrides as [name, value] pairs."""
    for kind in annotation.split(" | "):
        if (kind == "None" and value is None
                or kind == "bool" and isinstance(value, bool)
                or kind == "int" and isinstance(value, int) and not isinstance(value, bool)
                or kind == "float" and isinstance(value, (int, float)) and not isinstance(value, bool)
                or kind in ("str", "Path") and isinstance(value, str)
                or kind == "tuple[str, ...]" and isinstance(value, list)
                and all(isinstance(v, str) for v in value)
                or kind.startswith("tuple[tuple[str,") and isinstance(value, list)
                and all(isinstance(v, list) and len(v) == 2 and isinstance(v[0], str) for v in value)):
            return True
    return False


def check_saved(state: Any, path: Path) -> None:
    """A saved state validated like user input (issue 32): a file of the wrong shape, or a saved option of the
    wrong type or out of its range, is one line naming the key, before anything is resumed (it was a
    traceback, or Ray restarting the experiment)."""
    def damaged(where: str, expected: str, got: Any) -> UserError:
        return UserError(f"{path}: {where}: expected {expected}, got {str(got)[:80]!r} (the saved state is "
                         "damaged: restore it, or start a new search)")

    if not isinstance(state, dict):
        raise damaged("the file", "a JSON object", type(state).__name__)
    for key, kind in (("task", str), ("request", dict), ("fingerprint", str), ("losses", list)):
        if not isinstance(state.get(key), kind):
            raise damaged(key, f"a JSON {dict([(str, 'string'), (dict, 'object'), (list, 'list')])[kind]}",
                          state.get(key))
    if not all(isinstance(loss, str) for loss in state["losses"]):
        raise damaged("losses", "a list of loss names", state["losses"])
    token = state.get("token")  # a folder's name: never a path (absent from a state an older tune_as wrote)
    if token is not None and not (isinstance(token, str) and TOKEN.fullmatch(token)):
        raise damaged("token", "8 hexadecimal digits (the name of the search's Tune experiments)", token)
    fields = SearchRequest.__dataclass_fields__
    for key, value in state["request"].items():
        if key not in RESULT_OPTIONS:
            raise damaged(f"request.{key}", "one of the options a search saves", key)
        if not _fits(str(fields[key].type), value):
            raise damaged(f"request.{key}", f"a value of type {fields[key].type}", value)
    try:
        restored = SearchRequest(**{**state["request"], "task": state["task"]})
        restored.check()
    except UserError as exc:
        raise UserError(f"{path}: request: {exc} (the saved state is damaged: restore it, or start a new "
                        "search)") from None


def check_deliverable(state: Any, path: Path) -> None:
    """What delivering kept writes reads of a saved state (tune_as.sync): where the search's runs are."""
    for key, kinds in (("search_id", (str,)), ("experiment", (str,)), ("mlflow_uri", (str, type(None)))):
        if not isinstance(state, dict) or not isinstance(state.get(key), kinds):
            raise UserError(
                f"{path}: {key}: expected a JSON {'object' if not isinstance(state, dict) else 'string'}, "
                f"got {str(state.get(key) if isinstance(state, dict) else type(state).__name__)[:80]!r} "
                "(the saved state is damaged: restore it)")


class SearchFinished(Exception, Ending):
    """`--resume` of a search that has finished, with nothing new asked: the CLI says so and exits 0."""

    exit_code, to_stdout = SUCCESS, True

    def message(self) -> str:
        return str(self)


def _why_fixed(key: str, saved: dict[str, Any]) -> str:
    """Why a result option cannot change when a search resumes."""
    if key in ("confirm", "max_seeds") and saved.get("race"):
        return (f"the race's looks and the alpha each spends were fixed for --max-seeds "
                f"{saved.get('max_seeds')} before its first seed (more seeds, or a fixed number, after a "
                "look would break its error control)")
    if key == "confirm":
        return (f"its verdicts were planned for {saved.get('confirm')} seeds; more seeds after its answer "
                "would be a second look at the same comparison (docs/verdicts.md)")
    return "it changes what the trials compute or how the answer is decided"


def check_unfinished(state: dict[str, Any], r: SearchRequest, name: str) -> None:
    """SearchFinished when the saved search has finished and this resume asks for nothing new (called once
    every refusal has had its say: a changed space is refused, not called finished)."""
    if state.get("finished") and r.confirm == state["request"].get("confirm", 0):
        raise SearchFinished(f"{name} has finished: nothing to resume (its runs are left as they are; "
                             f"`python -m tune_as.report --experiment {state.get('experiment')} "
                             f"--search {name}` prints its answer)")


def check_in_place(state: dict[str, Any], search_dir: Path) -> None:
    """Refuse to resume an unfinished search whose folder was moved or copied: Ray Tune's pickled state (the
    search algorithm's experiment, the searcher's study) names the folder it was started in, and Ray would
    write the trials still to run there, outside this folder. A finished search only gets new confirmation
    rounds, made here. A state saved before the folder was recorded is not checked."""
    made = state.get("folder")
    if made and Path(made) != search_dir and not state.get("finished"):
        raise UserError(f"--resume: expected the search folder where {search_dir.name} was started, {made}, "
                        f"got {search_dir}: Ray Tune's saved state names {made} and would write the trials "
                        f"still to run there, not here; resume it with --storage-path {Path(made).parent} "
                        "(move the folder back first if it was moved)")


def _check_moved_store(uri: str, shown: str, state: dict[str, Any], name: str, experiment: str) -> None:
    """Another --mlflow-uri on resume is the same store moved (a copied SQLite file, a server at a new
    address) only if it holds this search's runs (its parent run, found by the search's tag, as `tune_as.sync`
    finds it); else the resumed search would split its runs over two stores. Nothing is created: an SQLite
    file must exist."""
    from tune_as.tracking.tracker import MlflowTracker

    file = schema.sqlite_file(uri)
    why = f"{file} does not exist" if file is not None and not file.is_file() else None
    if why is None:
        try:
            MlflowTracker(uri, experiment, str(state.get("search_id", name))).attach()
        except UserError as exc:
            why = first_line(exc)
    if why is not None:
        raise UserError(f"--resume: --mlflow-uri: expected a store that holds {name}'s runs (it was started "
                        f"with {state['mlflow_uri']}; a moved store must hold its parent run), got {shown}: "
                        f"{why}; resume without it, or point it at the store its runs were moved to")


# Options whose default changed when they were added: a search saved before them keeps what it ran with.
BEFORE_OPTIONS = {"noise": "per-loss"}


def restore_request(r: SearchRequest, state: dict[str, Any], name: str) -> SearchRequest:
    """The saved request with this process's runtime options; refuse a changed option that changes results."""
    defaults = {f.name: f.default for f in dataclasses.fields(SearchRequest) if f.name in RESULT_OPTIONS}
    # an option added since the search was saved: what that
    # search did before the option existed, else its default
    saved = {**defaults, **BEFORE_OPTIONS, **state["request"]}
    saved = {k: list(v) if isinstance(v, tuple) else v for k, v in saved.items()}  # as JSON has them
    for key, value in r.given().items():
        old = saved.get(key)
        mine = str(value) if isinstance(value, Path) else (list(map(list, value))
                                                          if key in ("task_args", "overrides")
                                                          else (list(value) if key == "losses" else value))
        if key == "task" or mine == old:
            continue
        if key == "confirm" and not saved.get("race") and not old:
            continue  # a search without confirmation may get one after the fact: its first look at new seeds
        raise UserError(f"--resume: {flag(key)}: expected {name}'s own {old!r} (or nothing), got {mine!r}: "
                        f"{_why_fixed(key, saved)}; resume without it, or start a new search")
    if r.task and r.task != state["task"]:  # "": no --task given (the CLI's value when resuming)
        raise UserError(f"--resume: {name} is a {state['task']} search, got --task {r.task}")
    fields = {**saved, "task": state["task"]}
    fields["losses"] = tuple(fields["losses"]) if fields["losses"] else None
    fields["task_args"] = tuple(tuple(x) for x in fields["task_args"])
    fields["overrides"] = tuple(tuple(x) for x in fields["overrides"])
    for key in ("data_dir", "search_space"):
        fields[key] = Path(fields[key]) if fields[key] else None
    if r.confirm:  # a search without confirmation gets one (checked above)
        fields["confirm"] = r.confirm

    experiment = r.experiment or state.get("experiment")
    from tune_as.tracking.client import redact_uri

    given = redact_uri(absolute_sqlite(r.mlflow_uri) or "") if r.mlflow_uri else None
    if given and state.get("mlflow_uri") and given != state["mlflow_uri"]:
        _check_moved_store(str(absolute_sqlite(r.mlflow_uri)), given, state, name, str(experiment))
    uri = r.mlflow_uri or state.get("mlflow_uri")
    if uri and not r.mlflow_uri and state.get("mlflow_uri_redacted"):
        raise UserError(f"--resume: {name} tracked to {uri}; pass --mlflow-uri again (or set "
                        "MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD): a password is never saved")
    return dataclasses.replace(r, **fields, experiment=experiment, mlflow_uri=uri)


def latest_search(storage: Path, task: str | None) -> str | None:
    found = [folder / schema.SEARCH_STATE_FILE for folder, state in schema.search_states(storage)
             if task is None or state.get("task") == task]
    return max(found, key=lambda p: p.stat().st_mtime).parent.name if found else None


def resumed(r: SearchRequest, storage: Path) -> tuple[SearchRequest, dict[str, Any], str]:
    """The search `--resume` continues (--name, else the latest under `storage`): its folder checked before
    anything in it is read (Ray's resume unpickles its state), its saved request restored with this call's
    runtime options. (request, saved state, name)."""
    name = r.name or latest_search(storage, r.task or None)
    if name is None:
        raise UserError(f"--resume: expected a previous {r.task or ''} search under {storage}, found none")
    if (storage / name).is_dir():
        check_ownership(storage / name)
    state = read_state(storage / name)
    if state is None:
        raise UserError(f"--resume: expected a search to resume at {storage / name}, found nothing there")
    check_searcher_states(storage / name)
    check_scheduler_state(storage / name)
    return restore_request(r, state, name), state, name


def check_same_search(state: dict[str, Any], fingerprint: str, losses: list[str], r: SearchRequest,
                      search_dir: Path) -> None:
    """The resumed search is the saved one: the same search space and losses, something left to do, and the
    folder where it was saved."""
    name = search_dir.name
    if state["fingerprint"] != fingerprint or state["losses"] != losses:
        raise UserError(f"--resume: the search space of {name} changed since it started (expected "
                        f"fingerprint {state['fingerprint']} for losses {state['losses']}, got {fingerprint} "
                        f"for {losses}); start a new search instead")
    check_unfinished(state, r, name)
    check_in_place(state, search_dir)
