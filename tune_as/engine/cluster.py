"""Start or join Ray, and size trials to it. A local Ray binds loopback only; joining a cluster fails in
seconds when its address does not answer, or answers but is no Ray (ray.init would retry for minutes)."""

from __future__ import annotations

import importlib
import logging
import os
import signal
import socket
import sys
import threading
import urllib.parse
from typing import Any

from tune_as.engine import lifeline
from tune_as.engine.head import Head
from tune_as.engine.request import refuse_ray_client
from tune_as.errors import UserError, excerpt, first_line
from tune_as.results.render import fit
from tune_as.tracking.client import redact_uri

LOOPBACK = ("127.0.0.1", "localhost", "::1")
# An HTTP/2 client's greeting (the connection preface and an empty SETTINGS frame). The GCS that `HOST:PORT`
# names is a gRPC server: it answers with a SETTINGS frame at once.
H2_GREETING = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
PROBE_TIMEOUT_S = 5.0


def check_address(address: str) -> None:
    """A UserError within seconds unless a gRPC server (a Ray GCS) answers at `address`; a Ray Client address
    is refused (request.refuse_ray_client). With TLS (RAY_USE_TLS) the plain-text probe cannot speak to it:
    only reachability is checked."""
    if address in ("auto", "local"):
        return
    refuse_ray_client(address)
    expected = "expected 'auto' or HOST:PORT"
    uri = address if "://" in address else f"//{address}"
    parts = urllib.parse.urlsplit(uri)
    if "@" in parts.netloc:  # Ray takes no credentials in its address: never echo or pass on a password
        raise UserError(f"--address: {expected}, without a user or password (a Ray cluster checks its token, "
                        f"RAY_AUTH_TOKEN), got {redact_uri(uri).removeprefix('//')}")
    try:
        host, port = parts.hostname, parts.port
    except ValueError:  # a port that is not a number
        host, port = None, None
    if not host or port is None:
        raise UserError(f"--address: {expected}, got {address!r}")
    answer: bytes | None = None  # None: nothing within the timeout
    try:
        with socket.create_connection((host, port), timeout=PROBE_TIMEOUT_S) as sock:
            if os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true"):
                return
            sock.sendall(H2_GREETING)
            answer = sock.recv(256)
    except TimeoutError:
        pass
    except OSError as exc:
        raise UserError(f"--address: expected a reachable Ray cluster at {address}, got "
                        f"{exc.strerror or exc}") from None
    if answer is not None and len(answer) >= 9 and answer[3] == 0x04:  # the server's first frame: SETTINGS
        return
    raise UserError(f"--address: expected a Ray cluster at {address} (its GCS, speaking gRPC over HTTP/2), "
                    f"got {_described(answer)}")


def _described(answer: bytes | None) -> str:
    if answer is None:
        return f"nothing that answered within {PROBE_TIMEOUT_S:g} s"
    if not answer:
        return "a server that closed the connection without answering"
    text = answer.decode("latin-1")
    first = text.strip().splitlines()[0] if text.strip() else text
    # an HTTP/1 server answers a status line, or (taking the greeting for HTTP/0.9) a bare HTML error page
    if text.startswith("HTTP/") or text.lstrip().lower().startswith(("<!doctype html", "<html")):
        return f"an HTTP/1 server (it answered {excerpt(first)})"
    return f"a server that answered {excerpt(answer, 40)}"


TUNE_CONTROLLER = "ray.tune.execution.tune_controller"  # the logger of Tune's "Trial task failed" records


class TrialErrorLine(logging.Filter):
    """Without --verbose: Tune's "Trial task failed" record, a traceback of 17 lines and more for each failed
    try (a lost node's ActorUnavailableError, a trial's own exception), as one line with the error's type and
    first line. Tune retries the trial up to --max-failures; MLflow keeps its error (tag tune_as.error)."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if exc is not None and str(record.msg).startswith("Trial task failed"):
            cause = getattr(exc, "cause", None) or exc  # a RayTaskError: the trial's own exception
            record.msg = (f"{record.getMessage()}: {type(cause).__name__}: {first_line(cause)[:200]} "
                          "(--verbose shows its traceback)")
            record.args, record.exc_info, record.exc_text = (), None, None
        return True


def init_ray(address: str | None, dashboard_host: str, quiet: bool = True, dashboard: bool = True,
             head: Head | None = None) -> None:
    """Ray for this process: joined at `address`, or at the local `head` the CLI started (engine.head), or
    started in this process. `quiet`: Ray's own log lines below ERROR (start-up, the token notice, Tune's
    "wrote the latest version", "total run time", its restore hint on an interruption: tune_as prints its own)
    stay out of the terminal; `--verbose` shows them."""
    if dashboard_host not in LOOPBACK:
        print(f"warning: --dashboard-host {dashboard_host} makes the Ray dashboard reachable beyond this "
              "machine; token authentication stays on", file=sys.stderr)
    import ray

    if ray.is_initialized():
        return
    # Ray's core worker puts a C++ handler on SIGTERM that dumps a stack and aborts the driver: give the
    # process's own handler back (the CLI's stops the search like Ctrl-C), if it has one
    on_sigterm = signal.getsignal(signal.SIGTERM)
    # a head that failed to start says so in its own words (a UserError: not wrapped again below)
    joined = head.wait_ready() if head is not None and not address else None
    controller = logging.getLogger(TUNE_CONTROLLER)
    if quiet and not any(isinstance(f, TrialErrorLine) for f in controller.filters):
        controller.addFilter(TrialErrorLine())
    try:
        level = logging.ERROR if quiet else logging.INFO
        if address:
            env = trial_env()
            ctx = ray.init(address=address, log_to_driver=False, logging_level=level,
                           runtime_env={"env_vars": env} if env else None)
            lifeline.keep()  # a head lost under the search ends it in seconds, not Ray's 60
        elif joined:  # the driver joins the CLI's head on loopback
            ctx = ray.init(address=joined, log_to_driver=False, logging_level=level,
                           _node_ip_address="127.0.0.1")
        else:
            ctx = _init_local(dashboard_host, level, dashboard)
    except (ConnectionError, TimeoutError, ValueError, RuntimeError, OSError) as exc:
        # Ray's own reason, whoever's it is: an address that does not answer, or a local start that failed (no
        # free port, a full or missing temp folder); anything else is not a known way to fail and
        # stays a traceback
        what = f"a reachable Ray cluster at {address}" if address else "a local Ray to start on this machine"
        raise UserError(f"{'--address' if address else 'Ray'}: expected {what}, but Ray failed: "
                        f"{type(exc).__name__}: {first_line(exc)[:300]}{join_hints(address, exc)}") from None
    finally:
        if callable(on_sigterm) and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, on_sigterm)
    url = getattr(ctx, "dashboard_url", None)
    if url:
        port = str(url).rsplit(":", 1)[-1]  # the port Ray bound (8265, or the next free one)
        print(fit(f"Ray dashboard: http://{url}  (from a laptop: ssh -L {port}:127.0.0.1:{port} HEAD)\n"
                  f"  token auth: the token is in ~/.ray/auth_token locally, RAY_AUTH_TOKEN on a cluster"))


def join_hints(address: str | None, exc: BaseException) -> str:
    """What to try when `ray.init(address)` failed, in parentheses ("" for a local start: Ray's reason says
    it). `auto` finds a Ray only where `ray start` runs one on this machine (Ray: "Could not find any running
    Ray instance"); a cluster whose GCS answered the probe (check_address) but refused the driver is most
    often token auth (Ray logs "InvalidAuthToken" from C++, not in the exception): a head started without
    RAY_AUTH_MODE=token."""
    hints = ["--address auto joins the Ray that `ray start` runs on this machine; without --address the "
             "search starts its own"] if address == "auto" else []
    if address and isinstance(exc, ConnectionError):
        hints.append("a cluster that answers but refuses the driver wants every process, the driver's too, "
                     "started with RAY_AUTH_MODE=token and the cluster's token: docs/cluster.md")
    return f" ({'; '.join(hints)})" if hints else ""


# Set by Ray's Jobs API in a driver it starts: that job's runtime_env is already every worker's (Ray refuses a
# variable given twice, by the job and by `ray.init`).
JOB_CONFIG_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"


def trial_env() -> dict[str, str]:
    """The driver's TUNE_AS_* settings (the trial hook, TUNE_AS_TRIAL_HOOK, and whatever it reads; the data
    folders) for the workers of a cluster it joins: a local head's workers inherit the driver's environment, a
    cluster's are started by their own node's raylet and get them only through the job's runtime_env. Empty
    where the Jobs API started this driver (its job's runtime_env, from which this environment came, reaches
    the workers already)."""
    if JOB_CONFIG_ENV in os.environ:
        return {}
    return {k: v for k, v in os.environ.items() if k.startswith("TUNE_AS_")}


def _init_local(dashboard_host: str, logging_level: int, dashboard: bool = True) -> Any:
    """A local Ray whose servers (GCS, raylet, workers, dashboard agent, runtime-env agent, metrics) all
    listen on 127.0.0.1 only. Each binds loopback when the node's IP is 127.0.0.1, but `ray.init` swaps a
    loopback `_node_ip_address` for the machine's routable IP unless Ray's single-machine mode is on (its
    default on macOS and Windows): the CLIs turn it on for their own process (`loopback_ray`) before Ray is
    imported. `address="local"`: a new instance even when a `ray start` cluster runs on this machine (without
    it `ray.init` joins that cluster: a search without --address would land on a cluster nobody named)."""
    import ray

    return ray.init(address="local", include_dashboard=dashboard, dashboard_host=dashboard_host,
                    log_to_driver=False, logging_level=logging_level,
                    _node_ip_address="127.0.0.1")


def resources(cpus_per_trial: float, gpus_per_trial: float | None) -> dict[str, float]:
    import ray

    nodes = [n for n in ray.nodes() if n.get("Alive")]
    max_gpus = max((n["Resources"].get("GPU", 0.0) for n in nodes), default=0.0)
    gpus = gpus_per_trial if gpus_per_trial is not None else (1.0 if max_gpus >= 1 else 0.0)
    if gpus > max_gpus:
        raise UserError(f"--gpus-per-trial: expected at most {max_gpus:g} (the most GPUs on any node), "
                        f"got {gpus:g}")
    max_cpus = max((n["Resources"].get("CPU", 0.0) for n in nodes), default=0.0)
    if cpus_per_trial > max_cpus:
        raise UserError(f"--cpus-per-trial: expected at most {max_cpus:g} (the most CPUs on any node), got "
                        f"{cpus_per_trial:g}")
    return {"cpu": cpus_per_trial, "gpu": gpus}


# Ray's documented switch for its single-machine mode, read once, when Ray is imported.
SINGLE_MACHINE_SWITCH = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def _outbound_ip() -> str | None:
    """The IP this machine reaches other hosts from, the one `ray.init` puts in place of a loopback address
    (Ray finds it the same way: a UDP socket's route, no packet sent); None without a route. Ray's own helper
    is not public API, so it is asked here in four lines."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            sock.connect(("8.8.8.8", 80))
        except OSError:
            return None
        return str(sock.getsockname()[0])


def loopback_only(address: str | None) -> bool:
    """Whether `address` (HOST:PORT) names a Ray on this machine that listens on loopback only: a loopback
    host whose port does not answer on the machine's outbound IP. A local search's head is one (engine.head),
    as is any `ray start` in Ray's single-machine mode. Outside that mode `ray.init` swaps the loopback
    address for the outbound IP and retries there for ever, printing Ray's warnings, so the driver must join
    in that mode too."""
    if not address or "://" in address or address in ("auto", "local"):
        return False
    try:
        parts = urllib.parse.urlsplit(f"//{address}")
        host, port = parts.hostname, parts.port
    except ValueError:
        return False  # check_address says what is wrong with it
    outbound = _outbound_ip()
    if host not in LOOPBACK or port is None or outbound is None or outbound.startswith("127."):
        return False
    try:
        with socket.create_connection((outbound, port), timeout=PROBE_TIMEOUT_S):
            return False
    except OSError:
        return True


def loopback_ray(address: str | None) -> None:
    """For a local Ray (no --address), or one at a loopback address that listens on loopback only
    (`loopback_only`), Ray's single-machine mode in this process, so that every server `_init_local` starts
    listens on 127.0.0.1, and the driver joins a loopback-only Ray where it listens. Ray reads the switch when
    it is imported: the CLIs call this before anything imports Ray; it is set for that import only and then
    removed, so that no process started later (a `ray start` of a multi-node cluster, which refuses that mode)
    inherits it. Where Ray is already imported, or another cluster is named, nothing changes."""
    if ("ray" in sys.modules or SINGLE_MACHINE_SWITCH in os.environ
            or (address and not loopback_only(address))):
        return
    os.environ[SINGLE_MACHINE_SWITCH] = "0"
    try:
        importlib.import_module("ray")
    finally:
        del os.environ[SINGLE_MACHINE_SWITCH]


def tune_environment(resume: bool = False) -> None:
    """Ray Tune's switches this engine needs, read by Tune when a run starts (not when it is imported), so
    they are set here, as a search starts, and never on import. A diverged trial ends with an error result
    that has no validation metric: Tune's strict check would reject it (the searcher and the callback read
    `error`). Trials checkpoint at most every --checkpoint-interval seconds and at their end, so short trials
    ending together would trip Tune's excessive-snapshot warning: off. Progress goes through our reporter
    (engine.progress), which Tune's newer output engine would ignore. Tune's default loggers are off for a new
    search, which passes the one it reads (engine.callbacks.common); a resume leaves them on, as
    `Tuner.restore` brings back the callbacks a search was started with, and one started before 2026-11-27 has
    no logger of its own (without Tune's, its resumed trials would write no result.json)."""
    os.environ.setdefault("TUNE_DISABLE_STRICT_METRIC_CHECKING", "1")
    if not resume:
        os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
    os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
