"""A tracker's queue delivered by a thread of its own, off Ray Tune's event loop.

Tune runs the driver's callbacks on its one event loop: a write to MLflow there (an HTTP request, an SQLite
commit; seconds when a server is slow, up to its timeout when it is away) holds every trial's next result, and
Tune says so ("... may be a performance bottleneck"). With a `Writer` the callbacks only queue their
operations (data, in order, `MlflowTracker._enqueue`); this thread flushes them, and tries again every RETRY_S
while MLflow is away. The tracker's own lock keeps one flush at a time. `stop` ends the thread; the search's
final flush then runs on the caller's thread, bounded, as without a writer. Plain threading: a queue drained
by one thread is all this needs.
"""

from __future__ import annotations

import threading
from typing import Any

RETRY_S = 2.0  # while MLflow is away: how often the queue is tried again (a new operation tries it at once)


class Writer:
    """Flushes `tracker` (an MlflowTracker) on a daemon thread whenever it is woken, and every RETRY_S while
    operations wait. An unexpected exception (a bug, not an outage: outages keep operations queued) ends the
    thread and is raised again by `stop`, on the search's thread."""

    def __init__(self, tracker: Any) -> None:
        self.tracker = tracker
        self._wake = threading.Event()
        self._stopping = False
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="tune_as-mlflow", daemon=True)
        self.thread.start()

    def wake(self) -> None:
        self._wake.set()

    def _run(self) -> None:
        while not self._stopping:
            self._wake.wait(RETRY_S)
            self._wake.clear()
            try:
                if self.tracker.pending:
                    self.tracker.flush()
            except Exception as exc:  # noqa: BLE001 - handed to the search's thread by `stop`
                self.error = exc
                return

    def stop(self) -> None:
        """End the thread once its flush in progress returns; raise what ended it, if anything did."""
        self._stopping = True
        self._wake.set()
        self.thread.join()
        if self.error is not None:
            raise self.error
