"""Trials at a time: as many as the cluster's resources hold (at most MOST), followed while a search runs.

Ray's `ConcurrencyLimiter` takes one number. Sized once per Tuner from `ray.cluster_resources()`, a cluster
that grew (Ray's autoscaler, or a node joined with `ray start --address`) never gave a running search more
trials. `Following` is a ConcurrencyLimiter whose limit is read again from `ray.cluster_resources()` when Tune
asks for a trial, at most every RESIZE_S seconds (one GCS request), and handed on through Ray's public
`set_max_concurrency` (tune_as's searchers count their own live trials: engine.searcher). A node that leaves
lowers the limit: no new trial starts until fewer run. Ray Tune 2.60 has no option of its own for this
(`TuneConfig.max_concurrent_trials` is a fixed ConcurrencyLimiter too). `--max-concurrent N` fixes the limit.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import ray
from ray.tune.search import ConcurrencyLimiter, Searcher

MOST = 8  # without --max-concurrent: TPE is sequential, and trials at once learn nothing from each other
RESIZE_S = 5.0


def fits(total: Mapping[str, float], res: Mapping[str, float]) -> int:
    """Trials of `res` (a trial's "cpu", "gpu") that the resources `total` (Ray's names) hold: 1 to MOST."""
    n = total.get("GPU", 0.0) / res["gpu"] if res["gpu"] else total.get("CPU", 1.0) / res["cpu"]
    return max(1, min(MOST, int(n)))


def limited(searcher: Searcher, max_concurrent: int | None, res: Mapping[str, float]) -> ConcurrencyLimiter:
    """`searcher` with at most `max_concurrent` trials running, or (None) as many as the cluster holds now."""
    return ConcurrencyLimiter(searcher, max_concurrent) if max_concurrent else Following(searcher, res)


class Following(ConcurrencyLimiter):
    """A ConcurrencyLimiter whose limit follows the cluster's resources (the module's docstring)."""

    def __init__(self, searcher: Searcher, res: Mapping[str, float], resize_s: float = RESIZE_S) -> None:
        self.res, self.resize_s = dict(res), resize_s
        self.read_at = time.monotonic()
        super().__init__(searcher, fits(ray.cluster_resources(), self.res))

    def suggest(self, trial_id: str) -> dict[str, Any] | None:
        now = time.monotonic()
        # a time from another process (a resumed search's saved limiter) is read again at once
        if not 0 <= now - self.read_at < self.resize_s:
            self.read_at = now
            limit = fits(ray.cluster_resources(), self.res)
            if limit != self.max_concurrent:
                self.set_max_concurrency(limit)  # the limiter's own count, for a searcher that keeps none
                self.searcher.set_max_concurrency(limit)
        return super().suggest(trial_id)
