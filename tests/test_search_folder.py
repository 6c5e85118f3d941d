"""The search folder (`<storage-path>/<name>`) on real file systems: a disk that fills up under a running
search (a real tmpfs), and a folder copied elsewhere and resumed there. The CLI runs as a subprocess with its
own local Ray (tests/test_reliability.py's helpers); the task is `digits`, one trial of one epoch per loss."""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from conftest import round_dir
from mlflow.tracking import MlflowClient
from test_reliability import finish, runs, start_cli, wait_for, write_space

from tune_as.errors import DISK_FULL as EXIT_CODE
from tune_as.search import main as search

pytestmark = pytest.mark.slow


@contextmanager
def tmpfs(where: Path, size: str) -> Iterator[Path]:
    """A real tmpfs of `size` mounted at `where` (root only), unmounted however the block ends."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    where.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill(folder: Path) -> Path:
    """Write one file in `folder` until its file system says it is full."""
    filler = folder / "filler"
    with open(filler, "wb") as out, pytest.raises(OSError) as full:
        while True:
            out.write(bytes(1 << 20))
            out.flush()
    assert full.value.errno == errno.ENOSPC
    return filler


def test_a_disk_that_fills_up_under_the_search_ends_it_with_one_line_and_it_resumes(
        tmp_path: Path, mlflow_server, ray_head: str) -> None:
    """The first report of the search is held (tests/faults.py) while the test fills the storage path's tmpfs;
    the trial's next checkpoint then meets ENOSPC. The search ends at once: one error line naming the cause
    and the folder, the resume line, every run KILLED, exit 5, no traceback; freed, the resume line's search
    completes."""
    faults, go = tmp_path / "faults", tmp_path / "go"
    faults.mkdir()
    space = write_space(tmp_path, trials=1, epochs=1)
    with tmpfs(tmp_path / "disk", "32m") as disk:
        args = ["--storage-path", str(disk), "--experiment", "rel-full", "--name", "digits-full",
                "--max-concurrent", "1", "--no-asha", "--eval-every-steps", "4", "--checkpoint-interval", "0"]
        proc = start_cli(tmp_path, mlflow_server.uri, ["--search-space", str(space), *args],
                         env={"TUNE_AS_FAULT_DIR": str(faults), "TUNE_AS_HOLD_UNTIL": str(go)},
                         address=ray_head)
        wait_for(lambda: (faults / "holding").exists() or proc.poll() is not None, 240, "the first report")
        filler = fill(disk)
        go.touch()
        code, out = finish(proc, timeout=120)
        assert code == EXIT_CODE, out[-3000:]
        errors = [line for line in out.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and "No space left on device" in errors[0], out[-3000:]
        assert str(disk / "digits-full") in errors[0]
        assert out.count("resume with:") == 1 and "--resume --name digits-full" in out, out[-3000:]
        assert "Traceback" not in out and "Trial task failed" not in out, out[-3000:]
        parents, children = runs(mlflow_server.uri, "rel-full")
        assert [p.info.status for p in parents] == ["KILLED"]
        assert children and all(c.info.status == "KILLED" for c in children), \
            [c.info.status for c in children]

        filler.unlink()
        code, out = finish(start_cli(tmp_path, mlflow_server.uri, ["--resume", *args[:6]], address=ray_head))
        assert code == 0, out[-3000:]
        parents, children = runs(mlflow_server.uri, "rel-full")
        assert [p.info.status for p in parents] == ["FINISHED"]
        assert sorted(c.data.tags["tune_as.loss"] for c in children if c.info.status == "FINISHED") == \
            ["as_softmax", "softmax"]


def contents(folder: Path) -> dict[str, tuple[int, str]]:
    """Every file under `folder`: its modification time and a hash of its bytes."""
    return {p.relative_to(folder).as_posix(): (p.stat().st_mtime_ns, hashlib.md5(p.read_bytes()).hexdigest())
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_copied_search_resumes_in_the_copy_and_never_writes_to_the_original(
        tmp_path: Path, mlflow_server, capsys: pytest.CaptureFixture[str], ray_head: str) -> None:
    """A finished search and its SQLite store, both copied elsewhere, get its confirmation there (`--resume
    --confirm 2 --mlflow-uri <the copied store>`): it completes, and not one file of the original folder or
    store changes (root ignores a read-only mode, so mtimes and bytes are compared). A store that does not
    hold the search's runs is refused in one line, exit 2. An unfinished copy is refused in one line, exit 2:
    Ray Tune's pickled state names the original folder, and Ray would train its remaining trials there. A new
    search of the same name in a third folder, tracked in the copied store, is refused in one line, exit 2."""
    space = write_space(tmp_path, trials=1, epochs=1)
    name, first, second = "digits-copy", tmp_path / "first", tmp_path / "second"
    first_db, second_db = tmp_path / "stores" / "first.db", tmp_path / "moved" / "second.db"
    first_db.parent.mkdir()
    code, out = finish(start_cli(tmp_path, f"sqlite:///{first_db}", [
        "--search-space", str(space), "--experiment", "rel-copy", "--name", name, "--storage-path",
        str(first), "--max-concurrent", "1", "--no-asha"], address=ray_head))
    assert code == 0, out[-3000:]
    shutil.copytree(first, second, symlinks=True)
    shutil.copytree(first_db.parent, second_db.parent)
    (second_db.parent / "first.db").rename(second_db)
    original = contents(first), contents(first_db.parent)

    # the session's server holds no run of this search: not its store (refused as the resume's plan is made,
    # before Ray: the CLI's main in this process)
    capsys.readouterr()
    assert search(["--resume", "--name", name, "--storage-path", str(second), "--confirm", "2",
                   "--mlflow-uri", mlflow_server.uri]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"error: --resume: --mlflow-uri: expected a store that holds {name}'s runs") and \
        f"expected the parent run of search '{name}'" in line, line

    code, out = finish(start_cli(tmp_path, f"sqlite:///{second_db}", [
        "--resume", "--name", name, "--storage-path", str(second), "--confirm", "2"], address=ray_head))
    assert code == 0, out[-3000:]
    assert "Confirmation round 1: 4 runs of 2 losses" in out, out[-3000:]
    assert len(list(round_dir(second / name).glob("*/checkpoint_*"))) == 4
    assert (contents(first), contents(first_db.parent)) == original, \
        "resuming the copy wrote into the original"
    parents, trials = runs(f"sqlite:///{second_db}", "rel-copy")
    assert [p.info.status for p in parents] == ["FINISHED"] and len(trials) == 2
    client = MlflowClient(f"sqlite:///{second_db}")
    confirmations = client.search_runs([parents[0].info.experiment_id],
                                       "tags.`tune_as.role` = 'confirmation'")
    assert len(confirmations) == 4 and all(r.info.status == "FINISHED" for r in confirmations)

    # a new search under the name the store holds already (another storage path) would add its runs to that
    # search's parent run: refused in one line, exit 2, before its folder is made
    third = tmp_path / "third"
    code, out = finish(start_cli(tmp_path, f"sqlite:///{second_db}", [
        "--search-space", str(space), "--experiment", "rel-copy", "--name", name, "--storage-path",
        str(third), "--max-concurrent", "1", "--no-asha"], address=ray_head))
    assert code == 2 and "Traceback" not in out, out[-3000:]
    (line,) = [x for x in out.splitlines() if x.startswith("error:")]
    assert line.startswith("error: --name: expected a new search name, but MLflow experiment 'rel-copy'"), \
        line
    assert not (third / name).exists()

    state = second / name / "tune_as_search.json"
    state.write_text(state.read_text().replace('"finished": true', '"finished": false'))
    assert search(["--resume", "--name", name, "--storage-path", str(second),
                   "--mlflow-uri", f"sqlite:///{second_db}"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: --resume: ") and f"started, {first / name}, got {second / name}" in line, \
        line
    assert (contents(first), contents(first_db.parent)) == original
