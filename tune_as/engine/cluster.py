"""Start or join Ray, and size trials to it. A local Ray binds loopback only; joining a cluster fails in
seconds when its address does not answer (ray.init would retry for minutes)."""

from __future__ import annotations

import signal
import sys
import threading
from typing import Any

import ray

from tune_as.errors import UserError, first_line, tcp_unreachable

LOOPBACK = ("127.0.0.1", "localhost", "::1")


def check_address(address: str) -> None:
    if address in ("auto", "local"):
        return
    hostport = address.split("://", 1)[-1]
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        raise UserError(f"--address: expected 'auto', HOST:PORT or ray://HOST:PORT, got {address!r}")
    reason = tcp_unreachable(host, int(port))
    if reason:
        raise UserError(f"--address: expected a reachable Ray cluster at {address}, got {reason}")


def init_ray(address: str | None, dashboard_host: str) -> None:
    if dashboard_host not in LOOPBACK:
        print(f"warning: --dashboard-host {dashboard_host} makes the Ray dashboard reachable beyond this machine; "
              "token authentication stays on", file=sys.stderr)
    if ray.is_initialized():
        return
    # Ray's core worker puts a C++ handler on SIGTERM that dumps a stack and aborts the driver: give the
    # process's own handler back (the CLI's stops the search like Ctrl-C), if it has one
    on_sigterm = signal.getsignal(signal.SIGTERM)
    try:
        ctx = ray.init(address=address, log_to_driver=False) if address else _init_local(dashboard_host)
    except Exception as exc:  # noqa: BLE001 - every failure to connect is the user's to fix
        raise UserError(f"--address: expected a reachable Ray cluster at {address!r}, got "
                        f"{type(exc).__name__}: {first_line(exc)[:300]}") from None
    finally:
        if callable(on_sigterm) and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, on_sigterm)
    url = getattr(ctx, "dashboard_url", None)
    if url:
        print(f"Ray dashboard: http://{url}  (token auth: the token is in ~/.ray/auth_token locally, or "
              "RAY_AUTH_TOKEN on a cluster; from a laptop: ssh -L 8265:127.0.0.1:8265 HEAD)")


def _init_local(dashboard_host: str) -> Any:
    """A local Ray whose servers (GCS, raylet, workers, dashboard agent, runtime-env agent, metrics) all listen
    on 127.0.0.1 only. Each binds loopback when the node's IP is 127.0.0.1, but `ray.init` swaps a loopback
    `_node_ip_address` for the machine's routable IP unless Ray's single-machine mode is on (its default on
    macOS and Windows; RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, read once, when Ray is imported). So that mode is
    on for this one call: the processes it starts get 127.0.0.1 on their command lines and keep it."""
    from ray._private import ray_constants

    cluster_mode = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        return ray.init(include_dashboard=True, dashboard_host=dashboard_host, log_to_driver=False,
                        _node_ip_address="127.0.0.1")
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = cluster_mode


def resources(cpus_per_trial: float, gpus_per_trial: float | None) -> dict[str, float]:
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    max_gpus = max((n["Resources"].get("GPU", 0.0) for n in nodes), default=0.0)
    gpus = gpus_per_trial if gpus_per_trial is not None else (1.0 if max_gpus >= 1 else 0.0)
    if gpus > max_gpus:
        raise UserError(f"--gpus-per-trial: expected at most {max_gpus:g} (the most GPUs on any node), got {gpus:g}")
    max_cpus = max((n["Resources"].get("CPU", 0.0) for n in nodes), default=0.0)
    if cpus_per_trial > max_cpus:
        raise UserError(f"--cpus-per-trial: expected at most {max_cpus:g} (the most CPUs on any node), got "
                        f"{cpus_per_trial:g}")
    return {"cpu": cpus_per_trial, "gpu": gpus}


def concurrency(max_concurrent: int | None, res: dict[str, float]) -> int:
    if max_concurrent:
        return max_concurrent
    total = ray.cluster_resources()
    fits = total.get("GPU", 0) / res["gpu"] if res["gpu"] else total.get("CPU", 1) / res["cpu"]
    return max(1, min(8, int(fits)))
