"""The local Ray head a search starts as its own process (tune_as/engine/head.py): it answers on loopback, it
is stopped with everything it started, it dies with a driver killed without warning, and a head that cannot
start says why in Ray's words. Real `ray start` processes, no Ray in this process."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from test_reliability import stop, wait_for

from tune_as.engine import head as ray_head
from tune_as.errors import UserError

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not sys.platform.startswith("linux"),
                                                   reason="the head is launched on Linux only")]


def answers(address: str) -> bool:
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5):
        return True


def test_a_head_answers_on_loopback_and_stops_with_everything_it_started() -> None:
    # launch() declines: pytest imported Ray
    head = ray_head.Head(dashboard=False, dashboard_host="127.0.0.1")
    try:
        address = head.wait_ready()
        assert address.startswith("127.0.0.1:") and answers(address)
        started = ray_head.session_members(head.proc.pid)
        assert len(started) >= 3, f"ray start, its GCS and its raylet, in the head's own session: {started}"
        assert os.getsid(0) != head.proc.pid, "the head is in a session of its own, not the caller's"
    finally:
        head.stop()
    assert ray_head.session_members(head.proc.pid) == []
    assert not head.log.exists()


def test_a_head_whose_dashboard_port_is_taken_moves_its_dashboard_and_lives() -> None:
    """Two searches on one machine (or a search beside a notebook's Ray) both want port 8265: `ray start`
    would not move on from it, its dashboard would die and take the head with it (`--block`)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            taken.bind(("127.0.0.1", ray_head.DASHBOARD_PORT))
            taken.listen()
        except OSError:
            pass  # something listens there already: the same case
        head = ray_head.Head(dashboard=True, dashboard_host="127.0.0.1")
        try:
            assert head.dashboard_port != ray_head.DASHBOARD_PORT
            head.wait_ready()

            def dashboard_answers() -> bool:
                assert head.proc.poll() is None, f"the head died: {head.output()}"
                try:
                    return answers(f"127.0.0.1:{head.dashboard_port}")
                except OSError:
                    return False
            wait_for(dashboard_answers, 120, "the dashboard on its own port")
        finally:
            head.stop()


def test_a_driver_killed_without_warning_takes_its_head_with_it(tmp_path: Path) -> None:
    """SIGKILL runs no handler in the driver: the kernel's parent-death signal stops the head, and the head
    stops every process it started."""
    code = ("import signal; from tune_as.engine import head; h = head.launch(None, False, '127.0.0.1'); "
            "print(h.proc.pid, h.wait_ready(), h.log, flush=True); signal.pause()")
    driver = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                              start_new_session=True)
    try:
        assert driver.stdout is not None
        pid, address, log = driver.stdout.readline().split()
        assert answers(address)
        assert ray_head.session_members(int(pid))
        assert not Path(log).exists(), \
            "the head's output file, removed once it answered: nothing left on a SIGKILL"
    finally:
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait()
    wait_for(lambda: not ray_head.session_members(int(pid)), 60,
             "the head's processes to end after its driver was killed")


def test_a_process_that_imported_ray_or_names_a_cluster_starts_no_head() -> None:
    import ray  # noqa: F401 - imported: its settings are read

    assert ray_head.launch(None, dashboard=False, dashboard_host="127.0.0.1") is None
    assert ray_head.launch("127.0.0.1:6379", dashboard=False, dashboard_host="127.0.0.1") is None


def test_a_head_that_cannot_start_says_why_in_rays_words(monkeypatch: pytest.MonkeyPatch) -> None:
    """Its GCS port is taken (by another program, between our choice of the port and Ray's start)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        monkeypatch.setattr(ray_head, "_free_port", lambda *_: port)
        head = ray_head.Head(dashboard=False, dashboard_host="127.0.0.1")
        try:
            with pytest.raises(UserError) as refused:
                head.wait_ready()
        finally:
            head.stop()
    message = str(refused.value)
    assert message.startswith("Ray: expected a local Ray to start on this machine, but `ray start` exited")
    assert "\n" not in message and str(port) in message, message


def test_a_port_taken_between_its_check_and_rays_start_is_taken_again_elsewhere(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Two searches starting together: another program takes the GCS port after it was found free and before
    `ray start` binds it (issue 70: exit 2 "address already in use"). The head starts again on new ports."""
    real = ray_head._free_port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        handed = iter([port])
        monkeypatch.setattr(ray_head, "_free_port", lambda *a: next(handed, None) or real(*a))
        head = ray_head.Head(dashboard=False, dashboard_host="127.0.0.1")
        try:
            address = head.wait_ready()
            assert address == f"127.0.0.1:{head.port}" and head.port != port
            assert head.starts_left == ray_head.PORT_TRIES - 2, "started twice"
        finally:
            head.stop()


def test_a_head_keeps_its_session_under_ray_tmpdir(monkeypatch: pytest.MonkeyPatch) -> None:
    """$RAY_TMPDIR, where a cluster's admin points Ray's session files (issue 70: they went to /tmp
    regardless). A short folder: Ray's socket paths under it must fit AF_UNIX's 107 bytes (pytest's tmp_path
    does not)."""
    import shutil
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="rt", dir="/tmp"))
    monkeypatch.setenv("RAY_TMPDIR", str(folder))
    head = ray_head.Head(dashboard=False, dashboard_host="127.0.0.1")
    try:
        head.wait_ready()
        assert list((folder / "ray" / "tune_as").glob("session_*")), sorted(folder.rglob("*"))[:5]
    finally:
        head.stop()
        shutil.rmtree(folder, ignore_errors=True)


def test_a_search_whose_head_cannot_start_says_why_once() -> None:
    """Through the path a search takes (cluster.init_ray): the head's own line, not wrapped in Ray's again."""
    code = ("import socket; from tune_as.engine import head, cluster; from tune_as.errors import UserError\n"
            "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(); port = s.getsockname()[1]\n"
            "head._free_port = lambda *_: port\n"
            "h = head.launch(None, False, '127.0.0.1')\n"
            "try:\n    cluster.init_ray(None, '127.0.0.1', head=h)\n"
            "except UserError as exc:\n    print(exc)\n"
            "finally:\n    h.stop()\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120).stdout
    assert out.startswith("Ray: expected a local Ray to start on this machine, but `ray start` exited"), out
    assert out.count("expected a local Ray") == 1, out


def test_a_head_that_dies_under_a_search_ends_it_at_once_with_the_resume_line() -> None:
    """One of Ray's processes dies (here: the GCS, killed): `ray start --block` ends the head, and the driver,
    which would wait 60 s on a Ray that is gone, gives the search up at once: its line, the resume line, exit
    130, as for a lost cluster head (tests/test_lifeline.py): an interruption to resume, not a bug."""
    code = ("import signal; from tune_as.engine import head, interrupt; "
            "h = head.launch(None, False, '127.0.0.1'); "
            "h.wait_ready(); interrupt.register(None, 'python -m tune_as.search --resume --name s'); "
            "print(h.proc.pid, flush=True); signal.pause()")
    driver = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, start_new_session=True)
    try:
        assert driver.stdout is not None
        pid = int(driver.stdout.readline())
        gcs = [p for p in ray_head.session_members(pid)
               if "gcs_server" in Path(f"/proc/{p}/cmdline").read_text()]
        assert gcs, "the head's GCS"
        os.kill(gcs[0], signal.SIGKILL)
        out, _ = driver.communicate(timeout=120)
    finally:
        stop(driver)
    assert driver.returncode == 130, out
    lines = out.strip().splitlines()
    assert lines[-2].startswith("the local Ray ended (`ray start` exited 1: ") and \
        "gcs_server" in lines[-2], out
    assert lines[-1] == "interrupted: trials stopped, MLflow runs marked KILLED; resume with:  " \
                        "python -m tune_as.search --resume --name s", out
    wait_for(lambda: not ray_head.session_members(pid), 60, "the rest of the head's processes to end")
