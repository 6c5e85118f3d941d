"""A local search's Ray, started as a process of its own at the CLI's first line (Linux).

`ray.init()` inside the driver costs seconds on the critical path, after the driver has imported PyTorch, Ray
Tune and MLflow (about 7 s of the 17 s before a first trial, docs/benchmarks.md), and it puts Ray's GCS,
raylet and workers in the driver's process group: a signal to the group (Ctrl-C in a terminal, `timeout`,
Slurm, Kubernetes) reaches them together with the driver, and Ray's core worker can end the driver before it
has closed its runs.

`ray start --head --block`, launched here before those imports, starts while the driver imports, in a session
of its own: a signal to the terminal's group reaches the driver alone, which stops its trials, closes its
runs, leaves Ray (`ray.shutdown`) and then stops the head (`stop`). The head dies with the driver however the
driver dies: the kernel sends it SIGTERM when its parent ends (PR_SET_PDEATHSIG), and `ray start --block`
stops every process it started on SIGTERM. Its servers bind 127.0.0.1 only (Ray's single-machine mode, as
`cluster.loopback_ray`). Its output goes to a temporary file, shown when it fails and removed when it is
stopped.

Elsewhere than Linux (no PR_SET_PDEATHSIG: a killed driver would leave a head behind) `launch` returns None
and the search starts Ray in-process, as before. Only the standard library is imported here: this runs before
Ray is."""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import BinaryIO

from tune_as.engine import interrupt
from tune_as.errors import INTERRUPTED, UserError

ANSI = re.compile(r"\x1b\[[0-9;]*m")  # `ray start` colours its lines even in a file
READY = "Ray runtime started."  # what `ray start` prints once its GCS and raylet answer
# cluster.SINGLE_MACHINE_SWITCH (not imported: light)
SINGLE_MACHINE_SWITCH = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
AUTH_MODE = "RAY_AUTH_MODE"
DASHBOARD_PORT = 8265  # Ray's default, taken when free
PORT_TRIES = 3  # `ray start`s on new ports when another program took one first
PORT_TAKEN = "already in use"  # in what `ray start` prints when a port it was given is taken
START_TIMEOUT_S = 180.0
KILLED_WITHIN_S = 10.0  # `stop` waits this long at most for its SIGKILLed processes to be gone
PR_SET_PDEATHSIG = 1
# where Ray looks for the token before ~/.ray/auth_token
TOKEN_ENV = ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")


def token_file() -> Path:
    """Where Ray reads its token when neither of TOKEN_ENV is set (Ray's own rule: the home folder's .ray)."""
    return Path.home() / ".ray" / "auth_token"


def ensure_token(environ: dict[str, str]) -> Path | None:
    """The token file, written now if a head in token mode (`environ`) would find no token; None if it would.

    Hand-written, not `ray get-auth-token --generate`: `ray start` refuses to start in token mode without a
    token (only an in-process `ray.init()` makes one), so a fresh machine's first local search failed; Ray's
    command would add a second Python that imports Ray (seconds) before the head, and it writes the file in
    place (another search starting at the same moment, or a test worker, could read half a token) and readable
    by everyone. The token has Ray's form (32 random bytes, hex). Written whole to a private temporary file
    beside it, then linked into place: the link fails if another process wrote one first, and that one is
    kept."""
    if environ.get(AUTH_MODE, "token").lower() != "token" or any(environ.get(name) for name in TOKEN_ENV):
        return None
    path = token_file()
    if path.exists():
        return None
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".auth_token.")  # mode 0600
    except OSError as exc:
        raise UserError(f"Ray's token: expected a writable home folder for {path} "
                        f"(HOME={os.environ.get('HOME')}), got {exc.strerror or exc}; set HOME to a writable "
                        "folder, or give the token in RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH") from None
    try:
        with os.fdopen(fd, "w") as out:
            out.write(secrets.token_hex(32))
        try:
            os.link(tmp, path)
        except FileExistsError:  # another search wrote it between the check and here: theirs is the token
            return None
    finally:
        os.unlink(tmp)
    return path


def _free_port(preferred: int = 0, host: str = "127.0.0.1") -> int:
    """`preferred` if nothing listens there, else a port the kernel finds free."""
    for port in ((preferred, 0) if preferred else (0,)):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            return int(sock.getsockname()[1])
    raise OSError(f"no free port on {host}")


def _die_with_parent(parent: int) -> None:
    """In the child, before `ray start` runs: SIGTERM when the driver ends; gone at once if it already has."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:
        os._exit(1)


def session_members(sid: int) -> list[int]:
    """The live processes of session `sid` (Linux's /proc): the head's session holds every process it started,
    the trials' workers too (each in a process group of its own)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = entry.joinpath("stat").read_text()
        except OSError:  # ended while we looked
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) ": state, ppid, pgrp, session, ...
        if int(fields[3]) == sid and fields[0] != "Z":
            found.append(int(entry.name))
    return found


class Head:
    """One `ray start --head --block` process (its session holds every Ray process it starts)."""

    def __init__(self, dashboard: bool, dashboard_host: str) -> None:
        self.stopping = False
        self.dashboard, self.dashboard_host = dashboard, dashboard_host
        self.starts_left = PORT_TRIES
        self._kept: BinaryIO | None = None  # the log, once it is removed (`wait_ready`)
        self.token_written: Path | None = None
        self._start()

    def _start(self) -> None:
        """`ray start` on ports free now: a port is checked free, released, then handed to Ray, and another
        program can take it in between (two searches starting together): `wait_ready` then starts again."""
        self.starts_left -= 1
        dashboard, dashboard_host = self.dashboard, self.dashboard_host
        self.port = _free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.dashboard_port = _free_port(DASHBOARD_PORT, dashboard_host) if dashboard else DASHBOARD_PORT
        fd, name = tempfile.mkstemp(prefix="tune_as_ray_head_", suffix=".log")
        self.log = Path(name)
        # --temp-dir: `ray start` records its address for a bare `ray.init()` in
        # <temp-dir>/ray_current_cluster; Ray's own folder would point other programs on this machine (and
        # `ray status`) at this search's Ray ($RAY_TMPDIR first, as Ray itself reads it; then the system's
        # temporary folder, $TMPDIR included)
        temp_dir = Path(os.environ.get("RAY_TMPDIR") or tempfile.gettempdir()) / "ray" / "tune_as"
        self.temp_dir, self._gcs_checked = temp_dir, 0.0
        command = [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block",
                   f"--port={self.port}", "--node-ip-address=127.0.0.1", f"--temp-dir={temp_dir}",
                   f"--ray-client-server-port={_free_port()}",  # not 10001: two searches on one machine
                   # no log monitor: it streams the workers' output to drivers, and ours joins with
                   # log_to_driver=False (the dashboard reads log files through its agent): 1.9-2.2 CPU s of
                   # the README's search, 0.8 of a one-trial search (docs/benchmarks.md)
                   "--include-log-monitor=false",
                   f"--include-dashboard={str(dashboard).lower()}", f"--dashboard-host={dashboard_host}",
                   # `ray start` does not move on from a taken dashboard port (ray.init does): its dashboard
                   # would die, and `--block` would end the whole head with it
                   f"--dashboard-port={self.dashboard_port}"]
        # token authentication, Ray's default for a new local cluster, unless the user chose otherwise
        # (`launch` puts the driver in the same mode); no drain on SIGTERM (Ray's default waits for leases to
        # return): the driver has ended its trials already
        env = {**os.environ, AUTH_MODE: os.environ.get(AUTH_MODE, "token"), SINGLE_MACHINE_SWITCH: "0",
               "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0"}
        # the path of a token written for this head (a fresh machine)
        self.token_written = ensure_token(env) or self.token_written
        parent = os.getpid()
        with os.fdopen(fd, "wb") as out:
            self.proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out,
                                         stderr=subprocess.STDOUT, env=env, start_new_session=True,
                                         preexec_fn=lambda: _die_with_parent(parent))

    def output(self, lines: int = 6) -> str:
        """The last `lines` lines `ray start` printed, on one line."""
        try:
            if self._kept is not None:
                self._kept.seek(0)
                text = self._kept.read().decode(errors="replace")
            else:
                text = self.log.read_text(errors="replace")
        except OSError:
            return ""
        kept = [ANSI.sub("", line).strip() for line in text.splitlines() if line.strip()]
        return " | ".join(kept[-lines:])

    def wait_ready(self, timeout: float = START_TIMEOUT_S) -> str:
        """The head's address once it has started; a UserError with Ray's own words if it could not start.
        Polled: `ray start` says nothing else that a process could wait on."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                if READY in self.log.read_text(errors="replace"):
                    # the file is removed now and read through an open handle: nothing is left behind however
                    # the driver ends (a SIGKILL runs no `stop`)
                    self._kept = self.log.open("rb")
                    self.log.unlink()
                    threading.Thread(target=self._watch, name="tune_as-ray-head", daemon=True).start()
                    return self.address
            except OSError:
                pass
            taken = self.proc.poll() is None and self.starts_left > 0 and self._gcs_port_taken()
            if taken:  # the GCS said so at once; `ray start` waits ~40 s on it before it exits saying so too
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
            if self.proc.poll() is not None:
                if self.starts_left > 0 and (taken or PORT_TAKEN in self.output(40).lower()):
                    self.log.unlink(missing_ok=True)
                    self._start()  # a port taken between the check and `ray start`: new ports
                    continue
                raise UserError(f"Ray: expected a local Ray to start on this machine, but `ray start` exited "
                                f"{self.proc.returncode}: {self.output()[-600:]}")
            if time.monotonic() > deadline:
                raise UserError(f"Ray: expected a local Ray to start within {timeout:g} s, got no answer: "
                                f"{self.output()[-600:]}")
            time.sleep(0.05)

    def _gcs_port_taken(self) -> bool:
        """Whether this start's GCS could not bind its port (its log, in the session folder `ray start` names
        by its process id, says "Address already in use"), read at most every 0.5 s."""
        now = time.monotonic()
        if now < self._gcs_checked + 0.5:
            return False
        self._gcs_checked = now
        for err in self.temp_dir.glob(f"session_*_{self.proc.pid}/logs/gcs_server.err"):
            with contextlib.suppress(OSError):
                if PORT_TAKEN in err.read_text(errors="replace").lower():
                    return True
        return False

    def _watch(self) -> None:
        """A head that ends before `stop` (one of its processes died: `--block` then ends them all, or someone
        killed it) leaves the driver waiting on a Ray that is gone (60 s, then Ray's core worker ends it, runs
        left RUNNING): the search is given up at once, its runs closed KILLED, with the resume line."""
        code = self.proc.wait()
        if not self.stopping:
            # what `ray start` left of its session
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            interrupt.abandon(INTERRUPTED,
                              f"the local Ray ended (`ray start` exited {code}: {self.output(2)[-300:]})")

    def stop(self) -> None:
        """The head ended at once: SIGKILL to its process group (`ray start`, GCS, raylet, agents) and to the
        rest of its session (the trials' workers, in groups of their own), and returns once they are gone:
        nothing the search started outlives the CLI (tests/test_reliability.py checks it). The driver has left
        Ray (`ray.shutdown`) and ended its trials before this, and a local head keeps nothing worth a graceful
        stop: `ray start`'s own stop on SIGTERM sends SIGTERM to each process and waits for it (1.7 s of every
        search's end on a 2-core machine) and leaves the same session folder behind. The log removed."""
        self.stopping = True
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        for pid in session_members(self.proc.pid):  # the workers
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        self.proc.wait()
        deadline = time.monotonic() + KILLED_WITHIN_S  # a SIGKILL is delivered when the process next runs
        while session_members(self.proc.pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        self.log.unlink(missing_ok=True)
        if self._kept is not None:
            self._kept.close()


def launch(address: str | None, dashboard: bool, dashboard_host: str) -> Head | None:
    """A head for a local search (no --address) on Linux, started now; None otherwise. None too where this
    process has imported Ray already (a caller that runs searches in-process, the tests): Ray read its
    settings, the token mode among them, at that import, so the driver could not be made to agree with a new
    head; Ray then starts in-process (or is the one already running there)."""
    if address or not sys.platform.startswith("linux") or "ray" in sys.modules:
        return None
    # the head and this driver, which reads the mode when it imports Ray (after this), must agree, or Ray
    # refuses the driver: token authentication unless the user chose a mode
    os.environ.setdefault(AUTH_MODE, "token")
    head = Head(dashboard, dashboard_host)
    if head.token_written is not None:
        # under the home folder always (token_file); `~` keeps the line within 100 columns
        print("Ray: wrote a new token to ~/.ray/auth_token (the dashboard asks for it; `ray get-auth-token`)",
              flush=True)
    return head
