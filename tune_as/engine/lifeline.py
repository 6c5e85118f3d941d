"""A joined cluster's head, polled from the driver: losing it ends the search in seconds, as an interruption.

A search that joined a cluster (--address) has no process of the head's to wait on, as a local search has
(engine.head). When the head dies, the driver's next call into Ray blocks while Ray's core worker retries the
GCS for 60 s (Ray's `gcs_rpc_server_reconnect_timeout_s`); then Ray ends the process from C++ ("Failed to
connect to GCS within 60 seconds", exit 1): no line of tune_as's, no resume line, the runs left RUNNING.

`keep` polls the GCS's port with a TCP connect every POLL_S seconds from a daemon thread; after MISSES misses
in a row (a refused or timed-out connect) it gives the search up as the loss of a local head does
(`interrupt.abandon`): the runs closed KILLED, the resume line, exit INTERRUPTED. Once the head is back, a
resume continues from Ray Tune's last saved state. A connect, not a Ray call: Ray's own calls retry a lost
GCS, and no public one answers "is it there" at once. The address is Ray's public
`RuntimeContext.gcs_address` (what `--address auto` resolved to). The thread ends with Ray
(`ray.is_initialized`). A head that restarts in place (Ray's GCS fault tolerance, an external Redis) comes
back after the driver has given up: resume then.
"""

from __future__ import annotations

import threading
import time

from tune_as.engine import interrupt
from tune_as.errors import INTERRUPTED, tcp_unreachable

POLL_S = 1.0
MISSES = 3  # in a row: a head gone for ~3 s (Ray itself waits 60 s)
CONNECT_S = 1.0  # a live GCS on a private network accepts a connection in milliseconds


def keep() -> threading.Thread:
    """Start watching the GCS of the cluster this process has joined (after `ray.init(address=...)`)."""
    import ray

    host, port = str(ray.get_runtime_context().gcs_address).rsplit(":", 1)
    thread = threading.Thread(target=_watch, args=(host.strip("[]"), int(port)), name="tune_as-lifeline",
                              daemon=True)
    thread.start()
    return thread


def _watch(host: str, port: int) -> None:
    import ray

    missed = 0
    while ray.is_initialized():
        why = tcp_unreachable(host, port, timeout=CONNECT_S)
        missed = missed + 1 if why else 0
        if missed >= MISSES:
            # returns at once when the search is ending its own way
            interrupt.abandon(INTERRUPTED, f"Ray: the cluster's head at {host}:{port} stopped answering "
                                           f"({why}, {missed} times in a row)")
            return
        time.sleep(POLL_S)
