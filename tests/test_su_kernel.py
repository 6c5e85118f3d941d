"""tune_as.losses._su, the kernel of the four multi-label losses (Eq. 14, Eq. 18, top-k, temperature): its
loss and hand-derived backward against torch autograd through an independent masked-logsumexp reference, on
rows without positives, rows of positives only, -inf logits and fp32 at EURLEX57K's 4,271 labels; the
target rule (y > 0.5), exact zeros where nothing counts, and a backward that can run twice."""

from __future__ import annotations

import math

import pytest
import torch

from tune_as.losses import build_loss

LOSSES = {  # name -> hyper-parameters away from the defaults (each changes which terms count)
    "multilabel_softmax": {},
    "multilabel_t_softmax": {"tau": 0.5},
    "multilabel_as_softmax": {"delta": 0.1},
    "multilabel_sparse_softmax": {"k": 3},
}


def log1p_sum_exp(terms: torch.Tensor, on: torch.Tensor) -> torch.Tensor:
    """log(1 + sum over `on` of exp(terms)) per row, by logsumexp over [0, terms] (autograd's own
    backward)."""
    return torch.logsumexp(
        torch.cat([torch.zeros_like(terms[:, :1]), terms.masked_fill(~on, -torch.inf)], 1), 1)


def reference(name: str, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean over rows, differentiable in x: which terms count is decided here from the papers' rules
    (probabilities for Eq. 15-17, ranks for top-k), independently of the kernel's logit thresholds."""
    pos, hp = y > 0.5, LOSSES[name]
    neg_on, pos_on = ~pos, pos
    if name == "multilabel_t_softmax":
        x = x / hp["tau"]
    with torch.no_grad():
        if name == "multilabel_as_softmax":  # Eq. 15-17, with the module's empty-set rules
            p = torch.softmax(x, 1)
            # inf: no positive, keep negatives
            p_pos_min = p.masked_fill(~pos, torch.inf).amin(1, keepdim=True)
            p_neg_max = p.masked_fill(pos, 0.0).amax(1, keepdim=True)  # 0: no negative
            neg_on = neg_on & (~(p_pos_min - p >= hp["delta"]) | ~pos.any(1, keepdim=True))
            pos_on = pos_on & ~(p - p_neg_max >= hp["delta"])
        if name == "multilabel_sparse_softmax":  # the k highest negatives by rank
            ranks = x.masked_fill(pos, -torch.inf).argsort(1, descending=True).argsort(1)
            neg_on = neg_on & (ranks < hp["k"])
    return (log1p_sum_exp(x, neg_on) + log1p_sum_exp(-x, pos_on)).mean()


def inputs(n: int, c: int, seed: int,
           dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits (n, c) and multi-hot targets, ~30 % positive: row 0 without positives, row 1 all positive, row 2
    with a -inf negative (a padded class), row 3 with a negative at -1e4 (its term underflows)."""
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(n, c, generator=g, dtype=torch.float64) * 3).to(dtype)
    y = (torch.rand(n, c, generator=g) < 0.3).to(dtype)
    y[0], y[1] = 0.0, 1.0
    x[2, 0], y[2, 0] = -torch.inf, 0.0  # a padded class: its term is absent
    x[3, 1], y[3, 1] = -1e4, 0.0  # a far negative: its term underflows
    return x, y


def loss_and_grad(fn, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[no-untyped-def]
    z = x.clone().requires_grad_(True)
    out = fn(z)
    (grad,) = torch.autograd.grad(out, z)
    return out.detach(), grad


@pytest.mark.parametrize("c", [1, 2, 9, 300, 600])  # 600: the fused softmax path (FUSED_MIN_K)
@pytest.mark.parametrize("name", sorted(LOSSES))
def test_loss_and_backward_equal_autograd_of_the_reference(name: str, c: int) -> None:
    x, y = inputs(8, max(c, 4) if c > 1 else 4, seed=c)
    if c == 1:  # one class: every row is "no positive" or "all positive"
        x, y = x[:, :1].contiguous(), y[:, :1].contiguous()
        y[2:] = (torch.arange(6) % 2).double()[:, None]
    loss_fn = build_loss(name, **LOSSES[name])
    got = loss_and_grad(lambda z: loss_fn(z, y).loss, x)
    expected = loss_and_grad(lambda z: reference(name, z, y), x)
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12)
    if c > 2:  # -inf class: exactly 0; the all-positive row pushed up, the row without positives down
        grad = got[1]
        assert grad[2, 0] == 0.0 and grad[1].max() <= 0 < -grad[1].min() and \
            grad[0].min() >= 0 < grad[0].max()
        if name in ("multilabel_softmax", "multilabel_t_softmax"):  # no term dropped: every class moves
            assert grad[1].lt(0).all() and grad[0].gt(0).all()


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_float32_at_eurlex_size_matches_the_float64_reference(name: str) -> None:
    """(64, 4271), ~5 positives per row as EURLEX57K, logits up to +-60: fp32 loss and gradient stay exact."""
    g = torch.Generator().manual_seed(5)
    x64 = torch.randn(64, 4271, generator=g, dtype=torch.float64) * 20
    y = (torch.rand(64, 4271, generator=g) < 5 / 4271).double()
    y[0] = 0.0
    loss_fn = build_loss(name, **LOSSES[name])
    got = loss_and_grad(lambda z: loss_fn(z, y.float()).loss, x64.float())
    expected = loss_and_grad(lambda z: reference(name, z, y), x64)
    torch.testing.assert_close(got[0].double(), expected[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got[1].double(), expected[1], rtol=1e-4, atol=1e-9)


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_positives_are_targets_above_one_half_in_any_dtype(name: str) -> None:
    x, y = inputs(6, 7, seed=3)
    loss_fn = build_loss(name, **LOSSES[name])
    soft = y * 0.4 + 0.3  # 0 -> 0.3, 1 -> 0.7
    soft[4, 0], soft[5, 0] = 0.5, 0.5000001  # 0.5 is a negative, just above it a positive
    hard = (soft > 0.5).double()
    expected = loss_and_grad(lambda z: loss_fn(z, hard).loss, x)
    torch.testing.assert_close(loss_and_grad(lambda z: loss_fn(z, soft).loss, x), expected, rtol=0, atol=0)
    for target in (hard.bool(), hard.long(), hard.float()):
        torch.testing.assert_close(loss_and_grad(lambda z, t=target: loss_fn(z, t).loss, x), expected,
                                   rtol=0, atol=0)


@pytest.mark.parametrize("name", ["multilabel_softmax", "multilabel_as_softmax"])
def test_rows_where_nothing_counts_have_exactly_zero_loss_and_gradient(name: str) -> None:
    """fp32 logits +-200 around the truth (every term underflows), or no term at all (one class, -inf
    negative): loss and gradient exactly 0 and the row masked; the other rows are not."""
    y = torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.0, 0.0], [1.0, 1.0, 0.0], [0.0, 1.0, 0.0]])
    x = (400 * y - 200).requires_grad_(True)
    with torch.no_grad():
        x[1] = -torch.inf  # no positive, every negative absent
        x[3, :2] = torch.tensor([1.0, 0.5])  # a negative above its positive: this row counts (AS keeps both)
    out = build_loss(name)(x, y)
    out.loss.backward()
    assert x.grad is not None and not x.grad[:3].any() and x.grad[3, :2].abs().min() > 0
    assert int(out.n_masked) == 3
    assert float(out.loss.detach()) * 4 == \
        pytest.approx(math.log1p(math.e) + math.log1p(math.exp(-0.5)), rel=1e-6)


def test_backward_leaves_its_inputs_alone_and_runs_twice() -> None:
    x, y = inputs(5, 12, seed=8)
    x = x.float().requires_grad_(True)
    before = x.detach().clone()
    for name in sorted(LOSSES):
        x.grad = None
        loss = build_loss(name, **LOSSES[name])(x, y.float()).loss
        loss.backward(retain_graph=True)
        first = x.grad.clone()
        loss.backward()
        assert torch.equal(x.detach(), before) and torch.equal(x.grad, 2 * first), name
