"""Brute-force references for every loss: plain Python float64 loops over classes, one row at a time.

Written from the papers' equations, independently of the vectorized code in ``tune_as.losses``
(no torch here). Each reference takes one row of logits ``o`` (list of floats) and its target (a class
index, or a multi-hot list) and returns (loss, masked).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

Row = Sequence[float]


def lse(values: Sequence[float]) -> float:
    """log sum exp, stable; -inf for an empty or all -inf sequence."""
    finite = [v for v in values if v != -math.inf]
    if not finite:
        return -math.inf
    m = max(finite)
    return m + math.log(sum(math.exp(v - m) for v in finite))


def softmax(o: Row) -> list[float]:
    z = lse(o)
    return [math.exp(v - z) for v in o]


def ce(o: Row, t: int) -> float:
    return lse(o) - o[t]


def softmax_ref(o: Row, t: int) -> tuple[float, bool]:
    return ce(o, t), False


def t_softmax_ref(o: Row, t: int, tau: float) -> tuple[float, bool]:
    return ce([v / tau for v in o], t), False


def label_smoothing_ref(o: Row, t: int, eps: float) -> tuple[float, bool]:
    z = lse(o)
    loss = -(1 - eps) * (o[t] - z)
    for j, v in enumerate(o):
        if j != t:
            loss -= eps / (len(o) - 1) * (v - z)
    return loss, False


def _kept_ce(o: Row, t: int, kept: list[bool]) -> tuple[float, bool]:
    competitors = [j for j in range(len(o)) if j != t and kept[j]]
    if not competitors:
        return 0.0, True
    return lse([o[t]] + [o[j] for j in competitors]) - o[t], False


def as_softmax_ref(o: Row, t: int, delta: float) -> tuple[float, bool]:
    p = softmax(o)
    return _kept_ce(o, t, [not (p[t] - p[j] >= delta) for j in range(len(o))])


def as_variant_ref(o: Row, t: int, delta: float) -> tuple[float, bool]:
    return _kept_ce(o, t, [not (o[t] - o[j] >= delta) for j in range(len(o))])


def sparse_softmax_ref(o: Row, t: int, k: int) -> tuple[float, bool]:
    top = sorted(o, reverse=True)[:k]
    return lse(top) - o[t], False


def _fenchel_young(o: Row, t: int, p: list[float], alpha: float) -> float:
    """(p - e_t).z + H^T_alpha(p), with H^T_alpha(p) = (1 - sum p^alpha) / (alpha (alpha - 1))."""
    entropy = (1.0 - sum(q**alpha for q in p)) / (alpha * (alpha - 1.0))
    return sum(q * v for q, v in zip(p, o, strict=True)) - o[t] + entropy


def sparsemax_ref(o: Row, t: int) -> tuple[float, bool]:
    z = sorted(o, reverse=True)
    cumulative, support, total = 0.0, 0, 0.0
    for k, v in enumerate(z, start=1):  # k(z) = max{k : 1 + k z_(k) > sum_{j<=k} z_(j)}
        cumulative += v
        if 1.0 + k * v > cumulative:
            support, total = k, cumulative
    tau = (total - 1.0) / support
    return _fenchel_young(o, t, [max(v - tau, 0.0) for v in o], 2.0), False


def entmax15_ref(o: Row, t: int) -> tuple[float, bool]:
    lo, hi = max(o) / 2 - 1.0, max(o) / 2  # sum_i [z_i/2 - tau]_+^2 is 1 somewhere in [lo, hi]
    for _ in range(80):
        tau = (lo + hi) / 2
        if sum(max(v / 2 - tau, 0.0) ** 2 for v in o) >= 1.0:
            lo = tau
        else:
            hi = tau
    p = [max(v / 2 - lo, 0.0) ** 2 for v in o]
    p = [q / sum(p) for q in p]
    return _fenchel_young(o, t, p, 1.5), False


def am_softmax_ref(o: Row, t: int, s: float, m: float) -> tuple[float, bool]:
    return ce([s * (v - m) if j == t else s * v for j, v in enumerate(o)], t), False


def sm_softmax_ref(o: Row, t: int, m: float) -> tuple[float, bool]:
    return ce([v - m if j == t else v for j, v in enumerate(o)], t), False


def taylor_f(z: float, n: int) -> float:
    return sum(z**i / math.factorial(i) for i in range(n + 1))


def sm_taylor_softmax_ref(o: Row, t: int, m: float, n: int) -> tuple[float, bool]:
    f = [taylor_f(v - m if j == t else v, n) for j, v in enumerate(o)]
    return -math.log(f[t] / sum(f)), False


def taylor_softmax_ref(o: Row, t: int, n: int, backward: str) -> tuple[float, bool]:
    return sm_taylor_softmax_ref(o, t, 0.0, n)


def _su(o: Row, y: Sequence[float], neg_on: list[bool], pos_on: list[bool]) -> float:
    neg = [v for v, yy, on in zip(o, y, neg_on, strict=True) if yy < 0.5 and on]
    pos = [-v for v, yy, on in zip(o, y, pos_on, strict=True) if yy > 0.5 and on]
    return lse([0.0] + neg) + lse([0.0] + pos)


def multilabel_softmax_ref(o: Row, y: Sequence[float]) -> tuple[float, bool]:
    return _su(o, y, [True] * len(o), [True] * len(o)), False


def multilabel_as_softmax_ref(o: Row, y: Sequence[float], delta: float) -> tuple[float, bool]:
    p = softmax(o)
    pos = [q for q, yy in zip(p, y, strict=True) if yy > 0.5]
    neg = [q for q, yy in zip(p, y, strict=True) if yy < 0.5]
    p_pos_min, p_neg_max = min(pos, default=None), max(neg, default=0.0)  # see the module's empty-set rules
    neg_on = [p_pos_min is None or not (p_pos_min - q >= delta) for q in p]
    pos_on = [not (q - p_neg_max >= delta) for q in p]
    n_on = sum(on for on, yy in zip(neg_on, y, strict=True) if yy < 0.5)
    n_on += sum(on for on, yy in zip(pos_on, y, strict=True) if yy > 0.5)
    return _su(o, y, neg_on, pos_on), n_on == 0


def multilabel_t_softmax_ref(o: Row, y: Sequence[float], tau: float) -> tuple[float, bool]:
    return multilabel_softmax_ref([v / tau for v in o], y)


def multilabel_sparse_softmax_ref(o: Row, y: Sequence[float], k: int) -> tuple[float, bool]:
    neg = sorted((v for v, yy in zip(o, y, strict=True) if yy < 0.5), reverse=True)[:k]
    pos = [-v for v, yy in zip(o, y, strict=True) if yy > 0.5]
    return lse([0.0] + neg) + lse([0.0] + pos), False


def bce_ref(o: Row, y: Sequence[float]) -> tuple[float, bool]:
    def log_sigmoid(v: float) -> float:
        return -math.log1p(math.exp(-v)) if v >= 0 else v - math.log1p(math.exp(v))

    total = sum(-(yy * log_sigmoid(v) + (1 - yy) * log_sigmoid(-v)) for v, yy in zip(o, y, strict=True))
    return total / len(o), False


def as_speed_ref(o: Row, t: int | Sequence[float], delta: float, lam: float,
                 max_steps: int) -> tuple[float, bool]:
    if isinstance(t, int):
        return as_softmax_ref(o, t, delta)
    return multilabel_as_softmax_ref(o, t, delta)


REFERENCES: dict[str, Callable[..., tuple[float, bool]]] = {
    "softmax": softmax_ref,
    "t_softmax": t_softmax_ref,
    "label_smoothing": label_smoothing_ref,
    "as_softmax": as_softmax_ref,
    "as_speed": as_speed_ref,
    "as_variant": as_variant_ref,
    "sparse_softmax": sparse_softmax_ref,
    "sparsemax": sparsemax_ref,
    "entmax15": entmax15_ref,
    "am_softmax": am_softmax_ref,
    "taylor_softmax": taylor_softmax_ref,
    "sm_softmax": sm_softmax_ref,
    "sm_taylor_softmax": sm_taylor_softmax_ref,
    "multilabel_softmax": multilabel_softmax_ref,
    "multilabel_as_softmax": multilabel_as_softmax_ref,
    "multilabel_sparse_softmax": multilabel_sparse_softmax_ref,
    "multilabel_t_softmax": multilabel_t_softmax_ref,
    "bce": bce_ref,
}
