"""The search engine: the only package (with the CLIs) that imports Ray.

    request (SearchRequest, validated once) -> plan (no Ray: task, space, base TrialSettings, data)
      -> run (one Tuner: PerLossSearcher + PerLossASHA, MlflowCallback) -> confirmation -> ranking

Modules: request, plan, searcher, schedulers, callbacks, cluster, run, ranking (docs/architecture.md).
"""

from tune_as.engine.request import SearchRequest

__all__ = ["SearchRequest"]
