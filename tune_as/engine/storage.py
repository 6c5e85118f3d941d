"""Where Ray Tune keeps a search's experiments: the local (or shared) file system, with every file whole.

Ray Tune writes an experiment's state (`experiment_state-*.json`, `search_gen_state-*`, the searcher's state)
on the driver's node, in a staging folder, and copies it to the storage path every few seconds; trials copy
their checkpoints the same way. The copy (`pyarrow.fs.copy_files`) writes each file in place: a driver killed
while it copied (SIGKILL, the OOM killer, a node lost) left a state file cut short in the search's folder, and
the resume failed to read it ("Failed to restore the run state ... EOFError"), after which Ray restarted the
experiment: a round's finished runs ran again, and the search ended "interrupted" (a failure of CI on
b29019a). pyarrow has no atomic local writes, and Ray takes the file system to write to
(`storage_filesystem`): `whole_files()` is the local one, writing every file under a hidden temporary name in
its folder and renaming it into place when complete (a rename within a folder is atomic on POSIX file systems,
NFS included). Listings never show those temporary names, so a copy left by a killed writer is never read
back, and `sweep` removes them.

A kill still leaves one snapshot's files from two moments (the new experiment state beside the previous
searcher state, say), as on Ray's cloud storage: each file is whole and Ray's own (engine.searcher.catch_up
brings the searcher's state up to the trials `saved_trials` reads; engine.run runs, in a part of its own, a
trial such a mix lost; docs/architecture.md). `check_whole` refuses a folder whose Ray state an older tune_as
left cut short, with one line, instead of letting Ray restart it.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import pickletools
import secrets
from pathlib import Path
from typing import Any

import pyarrow
import pyarrow.fs
from ray import tune
from ray.tune.experiment import Trial

from tune_as.errors import UserError

PARTIAL = ".tune_as-partial-"  # in the name of a file being written (`_WholeFile`): hidden from every listing
# the files of an experiment that Ray reads back on Tuner.restore (their names do not say what they hold:
# `search_gen_state-*.json` is a pickle, and tune_as's searchers save JSON as `searcher-state-*.pkl`)
RAY_STATE = ("experiment_state-*.json", "search_gen_state-*", "searcher-state-*", "tuner.pkl",
             "trainable.pkl")


class _WholeFile(io.FileIO):
    """A file written under a temporary name and renamed to its own when closed; a failed write removes it."""

    def __init__(self, path: str) -> None:
        folder, name = os.path.split(path)
        self.target, self.failed = path, False
        # mode "x" creates it 0o666 less the umask, as Ray's
        # own files were (a shared storage path stays readable)
        super().__init__(os.path.join(folder, f".{name}{PARTIAL}{secrets.token_hex(4)}"), "xb")

    def write(self, data: Any) -> int:
        # a raw file's write may write part of the data and say so (the file size limit, a disk filling up);
        # pyarrow's PythonFile takes no count back: all of it is written here, or the write raises
        view, done = memoryview(data).cast("B"), 0
        try:
            while done < len(view):
                done += super().write(view[done:])
            return done
        except BaseException:
            self.failed = True  # a full disk: the cut-short copy must not take the file's name
            raise

    def close(self) -> None:
        if self.closed:
            return
        try:
            super().close()
        except BaseException:
            self.failed = True
            raise
        finally:
            if self.failed:
                os.unlink(self.name)
            else:
                os.replace(self.name, self.target)


class WholeFilesHandler(pyarrow.fs.FileSystemHandler):
    """The local file system, for Ray Tune's storage: files appear whole or not at all (module docstring)."""

    def __init__(self) -> None:
        self.local = pyarrow.fs.LocalFileSystem()

    # pyarrow compares two PyFileSystems by their handlers' ==, `equals` is the handler's abstract
    # method: both
    def __eq__(self, other: object) -> bool:
        return isinstance(other, WholeFilesHandler)

    def __hash__(self) -> int:
        return hash(WholeFilesHandler)

    def equals(self, other: Any) -> bool:
        return isinstance(other, WholeFilesHandler)

    def get_type_name(self) -> str:
        return "local-whole-files"

    def normalize_path(self, path: str) -> str:
        return str(self.local.normalize_path(path))

    def get_file_info(self, paths: list[str]) -> list[pyarrow.fs.FileInfo]:
        return list(self.local.get_file_info(paths))

    def get_file_info_selector(self, selector: pyarrow.fs.FileSelector) -> list[pyarrow.fs.FileInfo]:
        return [info for info in self.local.get_file_info(selector) if PARTIAL not in info.base_name]

    def create_dir(self, path: str, recursive: bool) -> None:
        self.local.create_dir(path, recursive=recursive)

    def delete_dir(self, path: str) -> None:
        self.local.delete_dir(path)

    def delete_dir_contents(self, path: str, missing_dir_ok: bool = False) -> None:
        self.local.delete_dir_contents(path, missing_dir_ok=missing_dir_ok)

    def delete_root_dir_contents(self) -> None:
        raise OSError("tune_as never deletes the contents of the file system's root")

    def delete_file(self, path: str) -> None:
        self.local.delete_file(path)

    def move(self, src: str, dest: str) -> None:
        self.local.move(src, dest)

    def copy_file(self, src: str, dest: str) -> None:
        with self.local.open_input_stream(src) as source, self.open_output_stream(dest, None) as target:
            while chunk := source.read(1 << 24):
                target.write(chunk)

    def open_input_stream(self, path: str) -> pyarrow.NativeFile:
        return self.local.open_input_stream(path)

    def open_input_file(self, path: str) -> pyarrow.NativeFile:
        return self.local.open_input_file(path)

    def open_output_stream(self, path: str, metadata: Any) -> pyarrow.NativeFile:
        return pyarrow.PythonFile(_WholeFile(path), mode="w")

    def open_append_stream(self, path: str, metadata: Any) -> pyarrow.NativeFile:
        raise OSError(f"{path}: Ray Tune's storage is written whole, never appended to")


def whole_files() -> pyarrow.fs.PyFileSystem:
    """The file system every Tuner of tune_as stores to and restores from (its RunConfig, Tuner.restore)."""
    return pyarrow.fs.PyFileSystem(WholeFilesHandler())


def sweep(folder: Path) -> None:
    """Remove what killed writers left under temporary names in an experiment's folder (before a resume)."""
    for path in folder.rglob(f"*{PARTIAL}*"):
        path.unlink(missing_ok=True)


def restorable(experiment_dir: Path) -> bool:
    """Whether the experiment can be resumed (Tuner.can_restore): then with its leftover partial files removed
    and its Ray state checked whole (`check_whole`)."""
    if not tune.Tuner.can_restore(str(experiment_dir), storage_filesystem=whole_files()):
        return False
    sweep(experiment_dir)
    check_whole(experiment_dir)
    return True


def restored(experiment_dir: Path, trainable: Any) -> tune.Tuner:
    """The experiment resumed: its unfinished and errored trials continue (after `restorable`)."""
    return tune.Tuner.restore(str(experiment_dir), trainable, resume_unfinished=True, resume_errored=True,
                              storage_filesystem=whole_files())


@dataclasses.dataclass(frozen=True)
class SavedTrial:
    """A trial of an experiment as Ray's saved state holds it: its id, whether it ended (TERMINATED: a restore
    does not run it again; an errored one runs again, as `restored` asks), and its config."""

    trial_id: str
    ended: bool
    config: dict[str, Any]


def saved_trials(experiment_dir: Path) -> list[SavedTrial]:
    """The trials of a restorable experiment, as `Tuner.restore` will restore them (Ray's public
    ExperimentAnalysis reads the same newest experiment state), in the order they were created."""
    analysis = tune.ExperimentAnalysis(str(experiment_dir), storage_filesystem=whole_files())
    return [SavedTrial(str(t.trial_id), t.status == Trial.TERMINATED, dict(t.config))
            for t in analysis.trials]


def check_whole(experiment_dir: Path) -> None:
    """Refuse, with one line, an experiment whose Ray state is cut short (a driver killed while an older
    tune_as copied it): Ray would fail to read it and restart the experiment, running its finished trials
    again. Ray reads the newest file of each kind (the name's time stamp), as checked here.

    A pickle is read as opcodes only (pickletools.genops parses, never builds objects or imports): whole when
    its STOP opcode ends the file. JSON is parsed."""
    for pattern in RAY_STATE:
        path = max(experiment_dir.glob(pattern), default=None)  # the newest, as Ray picks it
        if path is not None and not _whole(path):
            raise UserError(f"{path}: expected Ray Tune's saved state, got a file cut short (a driver "
                            "killed while Ray copied it): this search cannot be resumed; "
                            "start it again with a new --name")


def _whole(path: Path) -> bool:
    data = path.read_bytes()
    if not data.startswith(b"\x80"):  # not a pickle (protocol 2 and later begin with PROTO): JSON
        try:
            json.loads(data)
        except ValueError:  # an empty file too
            return False
        return True
    try:
        ops = list(pickletools.genops(data))
    except ValueError:  # a truncated stream: "pickle exhausted before seeing STOP" and kin
        return False
    last, _, at = ops[-1] if ops else (None, None, None)
    return last is not None and last.name == "STOP" and at is not None and at + 1 == len(data)
