"""One searched parameter: the optuna distribution it is drawn from, and what the search can draw from it."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol

from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

OptunaDistribution = FloatDistribution | IntDistribution | CategoricalDistribution


class OptunaTrialLike(Protocol):
    def suggest_float(
        self, name: str, low: float, high: float, *, step: float | None = ..., log: bool = ...
    ) -> float: ...
    def suggest_int(self, name: str, low: int, high: int, *, step: int = ..., log: bool = ...) -> int: ...
    def suggest_categorical(self, name: str, choices: Any) -> Any: ...


@dataclass(frozen=True)
class Distribution:
    """One searched parameter: its name and the optuna distribution (validated by optuna) it is drawn from."""

    name: str
    dist: OptunaDistribution

    @property
    def type(self) -> str:
        return {FloatDistribution: "float", IntDistribution: "int",
                CategoricalDistribution: "categorical"}[type(self.dist)]

    def suggest(self, trial: OptunaTrialLike) -> Any:
        d = self.dist
        if isinstance(d, CategoricalDistribution):
            return trial.suggest_categorical(self.name, list(d.choices))
        if isinstance(d, IntDistribution):
            return trial.suggest_int(self.name, d.low, d.high, step=d.step, log=d.log)
        return trial.suggest_float(self.name, d.low, d.high, step=d.step, log=d.log)

    def contains(self, value: Any) -> bool:
        """Whether the search can draw `value` (optuna's own check is private)."""
        d = self.dist
        if isinstance(d, CategoricalDistribution):
            return value in d.choices
        if isinstance(value, bool) or not isinstance(value, int | float):
            return False
        if not d.low <= value <= d.high:
            return False
        return d.step is None or math.isclose(round((value - d.low) / d.step) * d.step + d.low, value,
                                              rel_tol=0, abs_tol=1e-9)

    def count(self) -> int | None:
        """How many values the search can draw, counted without listing them (step 1e-12: ~10^12); None for a
        continuous range."""
        d = self.dist
        if isinstance(d, CategoricalDistribution):
            return len(d.choices)
        return None if d.step is None else round((d.high - d.low) / d.step) + 1

    def values(self) -> list[Any] | None:
        """Every value the search can draw, in order; None for a continuous range."""
        d, n = self.dist, self.count()
        return list(d.choices) if isinstance(d, CategoricalDistribution) else (
            None if n is None else [d.low + i * (d.step or 0) for i in range(n)])

    def extremes(self) -> list[Any]:
        """The values that bound what the search can draw: every choice, or both ends of the range."""
        return (list(self.dist.choices) if isinstance(self.dist, CategoricalDistribution)
                else [self.dist.low, self.dist.high])
