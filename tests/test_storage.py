"""Ray Tune's storage for a search (tune_as.engine.storage): a writer killed or failing mid-file leaves no
file cut short under a real name, and a resume refuses Ray state that an older writer left cut short."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow.fs
import pytest

from tune_as.engine import storage
from tune_as.errors import UserError

KILLED_MID_FILE = textwrap.dedent("""
    import os, signal, sys
    import pyarrow.fs
    from tune_as.engine import storage
    fs = storage.whole_files() if sys.argv[1] == "whole" else pyarrow.fs.LocalFileSystem()
    out = fs.open_output_stream(sys.argv[2])
    out.write(b"x" * 1_000_000)
    out.flush()
    os.kill(os.getpid(), signal.SIGKILL)  # the driver killed while Ray copies the file
""")


def killed_writer(kind: str, target: Path) -> None:
    proc = subprocess.run([sys.executable, "-c", KILLED_MID_FILE, kind, str(target)], capture_output=True,
                          text=True, check=False, timeout=120)
    assert proc.returncode == -9, proc.stderr


@pytest.mark.parametrize("kind", ["local", "whole"])
def test_a_writer_killed_mid_file_leaves_the_name_empty_only_with_whole_files(
        kind: str, tmp_path: Path) -> None:
    target = tmp_path / "search_gen_state-2026-11-29_05-34-17.json"
    killed_writer(kind, target)
    if kind == "local":  # what Ray's own copy left in CI on b29019a: the name holds a file cut short
        assert target.stat().st_size == 1_000_000
        return
    assert not target.exists()
    left = [p.name for p in tmp_path.iterdir()]
    assert len(left) == 1 and storage.PARTIAL in left[0]  # the killed copy, under its temporary name
    listed = storage.whole_files().get_file_info(pyarrow.fs.FileSelector(str(tmp_path), recursive=True))
    assert listed == []  # never read back by a resume (Ray lists the folder to copy it down)
    storage.sweep(tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_a_failed_write_takes_no_name_and_leaves_no_partial_file(tmp_path: Path) -> None:
    """A write past the file size limit fails as a full disk does (EFBIG; ENOSPC alike): the copy is
    removed."""
    script = textwrap.dedent("""
        import resource, signal, sys
        from tune_as.engine import storage
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
        try:
            with storage.whole_files().open_output_stream(sys.argv[1]) as out:
                out.write(b"x" * 100_000)
        except OSError as exc:
            print("failed:", exc)
    """)
    proc = subprocess.run([sys.executable, "-c", script, str(tmp_path / "tuner.pkl")], capture_output=True,
                          text=True, check=False, timeout=120)
    assert proc.returncode == 0 and "failed:" in proc.stdout, proc.stdout + proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_folder_copied_as_ray_copies_it_arrives_whole_with_the_users_permissions(tmp_path: Path) -> None:
    source, dest = tmp_path / "staging", tmp_path / "storage"
    (source / "trial_0001" / "checkpoint_000000").mkdir(parents=True)
    files = {"experiment_state-x.json": b"{}",
             "trial_0001/checkpoint_000000/weights.safetensors": os.urandom(3 << 20),
             "trial_0001/result.json": b'{"epoch": 1}\n', "empty": b""}
    for name, data in files.items():
        (source / name).write_bytes(data)
    fs = storage.whole_files()
    fs.create_dir(str(dest))
    # as Ray uploads
    pyarrow.fs.copy_files(str(source), str(dest), destination_filesystem=fs, chunk_size=1 << 20)
    assert {str(p.relative_to(dest)): p.read_bytes() for p in dest.rglob("*") if p.is_file()} == files
    umask = os.umask(0)
    os.umask(umask)
    assert (dest / "empty").stat().st_mode & 0o777 == 0o666 & ~umask
    fs.copy_file(str(dest / "empty"), str(dest / "copy"))
    assert (dest / "copy").read_bytes() == b""
    shipped = pickle.loads(pickle.dumps(fs))  # Ray ships the file system to the trials' workers
    assert shipped.equals(fs) and shipped.type_name == "py::local-whole-files"


def test_a_resume_refuses_ray_state_cut_short_in_its_newest_file_only(tmp_path: Path) -> None:
    state = pickle.dumps({"counter": 3, "finished": False,
                          "name:ConcurrencyLimiter": {"live": ["a", "b"]}}, 5)
    (tmp_path / "tuner.pkl").write_bytes(state)
    (tmp_path / "experiment_state-2026-11-29_05-34-17.json").write_text(json.dumps({"trial_data": []}))
    storage.check_whole(tmp_path)
    for cut in range(len(state)):  # a pickle cut short anywhere is seen, without unpickling it
        (tmp_path / "tuner.pkl").write_bytes(state[:cut])
        with pytest.raises(UserError,
                           match="tuner.pkl: expected Ray Tune's saved state, got a file cut short"):
            storage.check_whole(tmp_path)
    (tmp_path / "tuner.pkl").write_bytes(state + b"x")  # bytes past STOP: not the file Ray wrote either
    with pytest.raises(UserError):
        storage.check_whole(tmp_path)
    (tmp_path / "tuner.pkl").write_bytes(state)
    # CI's case: a pickle, named .json
    (tmp_path / "search_gen_state-2026-11-29_05-34-17.json").write_bytes(b"")
    with pytest.raises(UserError,
                       match=r"search_gen_state-2026-11-29_05-34-17\.json: .* new --name$") as info:
        storage.check_whole(tmp_path)
    assert "\n" not in str(info.value)
    # a resume since then wrote a newer state of its own: Ray reads that one, so the folder resumes
    (tmp_path / "search_gen_state-2026-11-29_05-34-31.json").write_bytes(state)
    (tmp_path / "searcher-state-2026-11-29_05-34-31.pkl").write_text('{"next": 3}')  # tune_as's JSON
    storage.check_whole(tmp_path)
    (tmp_path / "experiment_state-2026-11-29_05-34-31.json").write_text('{"trial_data": [')
    with pytest.raises(UserError, match="experiment_state-2026-11-29_05-34-31.json"):
        storage.check_whole(tmp_path)
