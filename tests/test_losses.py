"""tune_as.losses: every registered loss against a brute-force reference, gradcheck, special cases,
bf16 autocast, ignore_index and hypothesis properties. Parametrized over LOSSES: a new loss is tested
automatically (and fails until tests/reference_losses.py has a reference for it)."""

from __future__ import annotations

import inspect
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from reference_losses import REFERENCES, softmax

from tune_as.losses import KINDS, LOSSES, LossOutput, build_loss
from tune_as.losses.accumulation import AdaptiveAccumulation

NAMES = sorted(LOSSES)
# A non-default, non-trivial setting per loss (losses missing here run with their defaults).
HPARAMS: dict[str, dict] = {
    "t_softmax": {"tau": 0.5},
    "label_smoothing": {"eps": 0.2},
    "as_softmax": {"delta": 0.3},
    "as_speed": {"delta": 0.2, "lam": 0.5, "max_steps": 2},
    "as_variant": {"delta": 1.5},
    "sparse_softmax": {"k": 3},
    "am_softmax": {"s": 8.0, "m": 0.35},
    "taylor_softmax": {"n": 4, "backward": "finite"},
    "sm_softmax": {"m": 0.6},
    "sm_taylor_softmax": {"m": 0.6, "n": 4},
    "multilabel_as_softmax": {"delta": 0.05},
    "multilabel_sparse_softmax": {"k": 3},
    "multilabel_t_softmax": {"tau": 0.5},
}
# The capabilities, declared on the class (docs/losses.md): the AS-Softmax family proper.
AS_FAMILY = {"as_softmax", "as_speed", "multilabel_as_softmax"}
# (logit scale, dtype, tolerance): "large" runs fp32 where p_t underflows and exp would overflow.
CASES = {"normal": (3.0, torch.float64, 1e-9), "ties": (1.0, torch.float64, 1e-9),
         "large": (60.0, torch.float32, 2e-4)}


def make(name: str, **override: object):
    return build_loss(name, **{**HPARAMS.get(name, {}), **override})


def int_kind(name: str) -> bool:
    return bool(LOSSES[name].kinds & {"multiclass", "token"})


def inputs(name: str, n: int, c: int, case: str = "normal",
           seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits (n, c) and a target: class indices with one ignored row, or multi-hot rows (one empty, one
    full)."""
    scale, dtype, _ = CASES[case]
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, c, generator=g, dtype=torch.float64) * scale
    if case == "ties":
        x = torch.randint(-2, 3, (n, c), generator=g).double()
    if int_kind(name):
        t = torch.randint(0, c, (n,), generator=g)
        if case == "ties":  # the target tied with the top logit
            t[0] = int(x[0].argmax())
        t[-1] = -100
    else:
        t = (torch.rand(n, c, generator=g) < 0.3).double()
        t[0], t[-1] = 0.0, 1.0
    return x.to(dtype), t


def reference(name: str, x: torch.Tensor, t: torch.Tensor,
              **override: object) -> tuple[list[float], list[bool]]:
    """Per-row reference (loss, masked); ignored rows give (nan, False)."""
    ref, hp = REFERENCES[name], {**HPARAMS.get(name, {}), **override}
    rows = [
        (math.nan, False) if tt == -100 else ref(o, tt, **hp)
        for o, tt in zip(x.double().tolist(), t.tolist(), strict=True)
    ]
    return [r[0] for r in rows], [r[1] for r in rows]


def test_registry_contract() -> None:
    """File stem = registry key; kinds, capabilities, hparams() names = build_loss keywords, accumulator."""
    root = Path(__file__).resolve().parent.parent / "tune_as" / "losses"
    x, t = torch.randn(3, 4), torch.zeros(3, dtype=torch.long)
    for name, cls in LOSSES.items():
        assert (root / f"{name}.py").is_file() and cls.name == name
        assert cls.kinds and cls.kinds <= KINDS
        assert cls.needs_cosine_head == (name == "am_softmax")
        assert cls.supports_warmup == cls.supports_row_skipping == (name in AS_FAMILY), name
        loss_fn = build_loss(name)
        assert isinstance(loss_fn, torch.nn.Module)
        params = set(inspect.signature(cls.__init__).parameters) - {"self"}
        assert set(loss_fn.hparams()) == params
        assert build_loss(name, **loss_fn.hparams()).hparams() == loss_fn.hparams()
        acc = loss_fn.make_accumulator()
        assert (acc is None) == (name != "as_speed")
        if name not in AS_FAMILY:  # a capability the loss lacks is an error, never a silent no-op
            with pytest.raises(TypeError, match=f"loss '{name}' has no warm-up"):
                loss_fn.set_warmup(True)
            with pytest.raises(TypeError, match=f"loss '{name}' masks no rows"):
                loss_fn.masked_examples(x, t)
    acc = build_loss("as_speed", lam=1.5, max_steps=3).make_accumulator()
    assert isinstance(acc, AdaptiveAccumulation) and (acc.lam, acc.max_steps) == (1.5, 3)
    assert LOSSES["as_speed"].kinds == KINDS


@pytest.mark.parametrize(
    ("name", "hparams", "message"),
    [
        ("nope", {}, "expected one of ["),
        ("as_softmax", {"delta": 1.5}, "delta must be in [0, 1], got 1.5"),
        ("as_softmax", {"detla": 0.3}, "unknown ['detla']"),
        ("as_speed", {"lam": 0.0}, "lam must be in (0, 16], got 0.0"),
        ("as_speed", {"max_steps": 0}, "max_steps must be an integer in [1, 64], got 0"),
        ("t_softmax", {"tau": -1}, "tau must be in (0, 100], got -1"),
        ("label_smoothing", {"eps": 1.0}, "eps must be in [0, 1), got 1.0"),
        ("sparse_softmax", {"k": 2.5}, "k must be an integer in [1, 100000], got 2.5"),
        ("taylor_softmax", {"n": 3}, "n must be an even integer in [2, 16], got 3"),
        ("taylor_softmax", {"backward": "exact"}, "backward must be one of ['finite', 'inf'], got 'exact'"),
        ("am_softmax", {"s": float("nan")}, "s must be in (0, 128], got nan"),
        ("multilabel_as_softmax", {"delta": "0.3"}, "delta must be a number, got '0.3'"),
    ],
)
def test_build_loss_rejects_bad_input(name: str, hparams: dict, message: str) -> None:
    with pytest.raises(ValueError) as err:
        build_loss(name, **hparams)
    assert message in str(err.value)


def test_delta_is_settable_and_validated() -> None:
    for name in sorted(AS_FAMILY):
        loss_fn = build_loss(name, delta=0.3)
        loss_fn.delta = 0.2
        assert loss_fn.delta == loss_fn.hparams()["delta"] == 0.2
        with pytest.raises(ValueError, match=r"delta must be in \[0, 1\], got -0.1"):
            loss_fn.delta = -0.1


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(AS_FAMILY))
def test_warmup_is_cross_entropy_and_keeps_the_searched_delta(name: str) -> None:
    x, t = inputs(name, 40, 9, seed=3)
    x = x * 2  # confident rows: many are masked at delta = 0
    loss_fn = build_loss(name, delta=0.0)
    masked_at_0 = int(loss_fn(x, t).n_masked)
    loss_fn.set_warmup(True)
    assert loss_fn.delta == 1.0 and loss_fn.hparams()["delta"] == 0.0  # in use / searched
    warm = loss_fn(x, t)
    plain = "softmax" if int_kind(name) else "multilabel_softmax"
    assert int(warm.n_masked) == 0 < masked_at_0
    torch.testing.assert_close(warm.loss, build_loss(plain)(x, t).loss)
    ignored = t == -100 if int_kind(name) else torch.zeros(len(x), dtype=torch.bool)  # no counted row: True
    assert torch.equal(loss_fn.masked_examples(x, t), ignored)
    loss_fn.set_warmup(False)
    assert loss_fn.delta == 0.0 and int(loss_fn(x, t).n_masked) == masked_at_0


def test_as_variant_margin_is_not_warmed_up() -> None:
    """delta' is a logit margin, not AS-Softmax's delta: warm-up (delta = 1) must never touch it."""
    loss_fn = build_loss("as_variant", delta=2.5)
    assert not loss_fn.supports_warmup
    with pytest.raises(TypeError):
        loss_fn.set_warmup(True)
    assert loss_fn.delta == 2.5


class _Silent:
    """A trial reporter that keeps nothing (these tests read the trial's own state)."""

    def wants_checkpoint(self, final: bool) -> bool:
        return False

    def report(self, metrics: dict, checkpoint_dir: Path | None) -> None: ...


@pytest.mark.slow
def test_the_trainer_warms_up_only_losses_that_support_it(tmp_path: Path) -> None:
    """A trial with warmup_r > 0 sets delta = 1 on as_softmax and leaves as_variant's delta' alone."""
    from tune_as.tasks import DataSettings, build_task, prepare
    from tune_as.training.trial import Trial

    task = build_task("digits")
    data = prepare(task, DataSettings(task="digits", cache_dir=tmp_path))
    seen = {}
    for loss, delta in (("as_variant", 2.5), ("as_softmax", 0.2)):
        config = {"loss": loss, "epochs": 1.0, "batch_size": 64, "lr": 1e-3,
                  "warmup_r": 0.5, "loss.delta": delta}
        trial = Trial(config, data, task, _Silent())
        trial.apply_schedules()  # progress 0: inside the warm-up
        seen[loss] = trial.loss_fn.delta
        trial.evaluate(data.validation)  # evaluation uses the searched delta
        seen[loss, "eval"] = trial.loss_fn.delta
    assert seen == {"as_variant": 2.5, ("as_variant", "eval"): 2.5, "as_softmax": 1.0,
                    ("as_softmax", "eval"): 0.2}


@pytest.mark.parametrize("name", NAMES)
def test_only_a_loss_that_declares_masks_rows_reports_masked_rows(name: str) -> None:
    """The trainer reads the masked count only where `masks_rows` is declared: every other loss must return
    the shared zero count (never a count it would be wrong to ignore), and a declared one masks a certain
    row."""
    from tune_as.losses._base import zero_count

    _, t = inputs(name, 40, 7)
    hot = t.double() if t.dim() == 2 else torch.nn.functional.one_hot(t.clamp(min=0), 7).double()
    certain = (400.0 * hot - 200.0).float()  # fp32 logits +-200 around the truth: exp(-200) underflows to 0
    loss_fn = make(name, **({"delta": 0.0} if "delta" in HPARAMS.get(name, {}) else {}))
    outs = [loss_fn(*inputs(name, 40, 7, case)) for case in sorted(CASES)] + [loss_fn(certain, t)]
    if LOSSES[name].masks_rows:
        assert int(outs[-1].n_masked) > 0, f"{name} declares masks_rows but masked no row of certain logits"
    else:
        assert all(out.n_masked is zero_count(out.loss.device) for out in outs)


SKIPPING = sorted(name for name, cls in LOSSES.items() if cls.supports_row_skipping)


def skipping_inputs(name: str, kind: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Confident fp64 logits, so that rows are masked at small delta: multiclass (30, 9) with ignored rows,
    token (10, 3, 9) with ignored positions and one example of ignored positions only, or multi-label."""
    g = torch.Generator().manual_seed(11)
    x = torch.randn(30, 9, generator=g, dtype=torch.float64) * 6
    if kind == "multilabel":
        return x, (torch.rand(30, 9, generator=g) < 0.3).double()
    t = x.argmax(dim=1)  # mostly the top class: confident and right
    wrong = torch.rand(30, generator=g) < 0.3
    t[wrong] = torch.randint(0, 9, (int(wrong.sum()),), generator=g)
    t[[4, 17]] = -100
    if kind == "token":
        x, t = x.reshape(10, 3, 9), t.reshape(10, 3)
        t[7] = -100  # an example with no counted position
    return x, t


@pytest.mark.parametrize("delta", [0.0, 0.05, 0.3, 0.8, 1.0])
@pytest.mark.parametrize(
    ("name", "kind"), [(n, k) for n in SKIPPING for k in sorted(LOSSES[n].kinds)]
)
def test_masked_examples_match_the_reference_the_count_and_the_gradient(name: str, kind: str,
                                                                        delta: float) -> None:
    x, t = skipping_inputs(name, kind)
    loss_fn = build_loss(name, delta=delta)
    got = loss_fn.masked_examples(x, t)
    assert got.dtype == torch.bool and got.shape == (x.shape[0],)
    # Brute force: an example is masked iff each of its counted rows is (vacuously true without one).
    rows_x, rows_t = x.reshape(-1, 9), t.reshape(x.shape[0] * (3 if kind == "token" else 1), -1).squeeze(1)
    _, ref_masked = reference(name, rows_x, rows_t, delta=delta)
    per_row = [m or (kind != "multilabel" and int(tt) == -100)
               for m, tt in zip(ref_masked, rows_t, strict=True)]
    expected = torch.tensor(per_row).reshape(x.shape[0], -1).all(dim=1)
    assert torch.equal(got, expected)
    assert 0 < int(got.sum()) < x.shape[0] or delta > 0.3  # the data has both kinds of examples
    # The same rows as n_masked, and exactly those have loss 0 and gradient 0.
    z = x.clone().requires_grad_(True)
    out = loss_fn(z, t)
    out.loss.backward()
    assert not z.grad[got].any() and z.grad[~got].abs().sum(dim=tuple(range(1, x.dim()))).gt(0).all()
    for i in range(x.shape[0]):
        one = loss_fn(x[i : i + 1], t[i : i + 1])
        assert (int(one.n_masked) == int(one.n_rows)) == bool(got[i]), i
        assert (float(one.loss) == 0.0) >= bool(got[i])
    kept = loss_fn(x[~got], t[~got])  # skipping the masked examples: the same mean once rescaled
    torch.testing.assert_close(kept.loss * kept.n_rows / out.n_rows, out.loss)
    assert int(out.n_masked) - int(kept.n_masked) == int(out.n_rows) - int(kept.n_rows)


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("c", [2, 5, 151, 5201])
@pytest.mark.parametrize("name", NAMES)
def test_matches_brute_force_reference(name: str, c: int, case: str) -> None:
    n = 4 if c < 5201 else 3
    x, t = inputs(name, n, c, case, seed=c)
    ref_loss, ref_masked = reference(name, x, t)
    counted = [i for i in range(n) if not int_kind(name) or int(t[i]) != -100]
    out = make(name)(x, t)
    assert isinstance(out, LossOutput) and out.loss.dtype == x.dtype and out.loss.dim() == 0
    assert out.n_rows.dtype == out.n_masked.dtype == torch.int64 and out.n_rows.dim() == 0
    assert int(out.n_rows) == len(counted)
    assert int(out.n_masked) == sum(ref_masked[i] for i in counted)
    tol = CASES[case][2]
    expected = sum(ref_loss[i] for i in counted) / len(counted)
    assert math.isclose(float(out.loss), expected, rel_tol=tol, abs_tol=tol), (float(out.loss), expected)
    for i in counted:  # row by row, so that one wrong row cannot hide in the mean
        row = float(make(name)(x[i : i + 1], t[i : i + 1]).loss)
        assert math.isclose(row, ref_loss[i], rel_tol=tol, abs_tol=tol), (i, row, ref_loss[i])


@pytest.mark.parametrize("delta", [0.0, 0.05, 0.3, 0.6, 1.0])
@pytest.mark.parametrize("name", ["as_softmax", "multilabel_as_softmax"])
def test_as_softmax_masking_matches_reference(name: str, delta: float) -> None:
    """Many confident rows, so that rows are masked at small delta; counts and losses match the reference."""
    x, t = inputs(name, 40, 9, seed=3)
    x = x * 2
    losses, masked = reference(name, x, t, delta=delta)
    counted = [i for i in range(40) if name != "as_softmax" or int(t[i]) != -100]
    out = build_loss(name, delta=delta)(x, t)
    assert int(out.n_masked) == sum(masked[i] for i in counted)
    assert (int(out.n_masked) > 0) if delta <= 0.3 else (delta < 1.0 or int(out.n_masked) == 0)
    expected = sum(losses[i] for i in counted) / len(counted)
    assert math.isclose(float(out.loss), expected, rel_tol=1e-9, abs_tol=1e-12)


@pytest.mark.parametrize("name", NAMES)
def test_gradcheck_float64(name: str) -> None:
    x, t = inputs(name, 4, 5, seed=1)
    x.requires_grad_(True)
    loss_fn = make(name)
    assert torch.autograd.gradcheck(lambda z: loss_fn(z, t).loss, (x,), atol=1e-7, rtol=1e-5)


@pytest.mark.parametrize("name", NAMES)
def test_members_are_each_the_loss_of_their_own_rows(name: str) -> None:
    """`forward_members` (a population's one call for P members) against the brute-force reference, member by
    member: each member's loss and counts its own (member 1 ignores more rows than the others), the gradient
    of a weighted sum each member's own gradient times its weight, and gradcheck through the grouped
    kernels."""
    members, n, c = 3, 6, 9
    xs, ts = zip(*(inputs(name, n, c, seed=10 + i) for i in range(members)), strict=True)
    x, t = torch.stack(xs).requires_grad_(True), torch.stack(ts)
    if int_kind(name):
        t[1, :3] = -100
    loss_fn = make(name)
    out = loss_fn.forward_members(x, t)
    assert out.loss.shape == out.n_rows.shape == out.n_masked.shape == (members,)
    for i in range(members):
        ref_loss, ref_masked = reference(name, x[i].detach(), t[i])
        counted = [r for r in range(n) if not int_kind(name) or int(t[i, r]) != -100]
        assert int(out.n_rows[i]) == len(counted)
        assert int(out.n_masked[i]) == sum(ref_masked[r] for r in counted)
        expected = sum(ref_loss[r] for r in counted) / len(counted)
        assert math.isclose(float(out.loss[i].detach()), expected, rel_tol=1e-9, abs_tol=1e-9), (i, out.loss)
    weights = torch.tensor([1.0, 0.5, 2.0], dtype=x.dtype)
    (out.loss * weights).sum().backward()
    for i in range(members):
        xi = x[i].detach().clone().requires_grad_(True)
        (loss_fn(xi, t[i]).loss * weights[i]).backward()
        torch.testing.assert_close(x.grad[i], xi.grad, rtol=1e-9, atol=1e-12)
    z = x.detach().clone().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda v: loss_fn.forward_members(v, t).loss, (z,), atol=1e-7, rtol=1e-5)


@pytest.mark.parametrize("name", ["softmax", "as_softmax", "multilabel_softmax", "bce"])
def test_one_member_is_a_member_too(name: str) -> None:
    """P = 1: (1,) tensors, as for any P (a population of one seed), equal to the plain call."""
    x, t = inputs(name, 6, 9, seed=4)
    out, plain = make(name).forward_members(x[None], t[None]), make(name)(x, t)
    assert out.loss.shape == out.n_rows.shape == out.n_masked.shape == (1,)
    assert float(out.loss) == pytest.approx(float(plain.loss), rel=1e-12) and \
        int(out.n_rows) == int(plain.n_rows)


def test_members_need_a_leading_member_dimension() -> None:
    with pytest.raises(ValueError, match=r"expected logits \(P, N, C\) with target \(P, N\) "
                                         r"or \(P, N, C\), got logits \(4, 5\) and target \(4,\)"):
        build_loss("softmax").forward_members(torch.randn(4, 5), torch.zeros(4, dtype=torch.long))


@pytest.mark.parametrize("name", NAMES)
def test_float32_gradient_matches_float64(name: str) -> None:
    x64, t = inputs(name, 8, 151, seed=2)
    grads = []
    for dtype in (torch.float32, torch.float64):
        x = x64.to(dtype).requires_grad_(True)
        make(name)(x, t.to(dtype) if t.is_floating_point() else t).loss.backward()
        grads.append(x.grad.double())
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize(
    ("name", "hparams", "equal_to", "equal_hparams"),
    [
        ("as_softmax", {"delta": 1.0}, "softmax", {}),
        ("as_speed", {"delta": 0.3}, "as_softmax", {"delta": 0.3}),
        ("sparse_softmax", {"k": 151}, "softmax", {}),
        ("t_softmax", {"tau": 1.0}, "softmax", {}),
        ("label_smoothing", {"eps": 0.0}, "softmax", {}),
        ("sm_softmax", {"m": 0.0}, "softmax", {}),
        ("am_softmax", {"s": 1.0, "m": 0.0}, "softmax", {}),
        ("as_variant", {"delta": 100.0}, "softmax", {}),
        ("sm_taylor_softmax", {"m": 0.0, "n": 6}, "taylor_softmax", {"n": 6}),
        ("multilabel_as_softmax", {"delta": 1.0}, "multilabel_softmax", {}),
        ("multilabel_sparse_softmax", {"k": 151}, "multilabel_softmax", {}),
        ("multilabel_t_softmax", {"tau": 1.0}, "multilabel_softmax", {}),
    ],
)
def test_special_cases(name: str, hparams: dict, equal_to: str, equal_hparams: dict) -> None:
    x, t = inputs(name, 16, 151, seed=4)
    values = []
    for n, hp in ((name, hparams), (equal_to, equal_hparams)):
        z = x.clone().requires_grad_(True)
        out = build_loss(n, **hp)(z, t)
        out.loss.backward()
        values.append((out.loss, z.grad, out.n_rows))
    torch.testing.assert_close(values[0], values[1], rtol=1e-10, atol=1e-12)


def test_label_smoothing_is_torch_label_smoothing_with_paper_weights() -> None:
    """Paper: target 1 - eps, others eps / (C - 1); PyTorch's eps' / C for all gives it with eps' = eps C /
    (C - 1)."""
    x, t = inputs("softmax", 16, 10, seed=5)
    ours = build_loss("label_smoothing", eps=0.27)(x, t).loss
    torch.testing.assert_close(ours, F.cross_entropy(x, t, label_smoothing=0.27 * 10 / 9))


def test_taylor_inf_backward_is_taylor_softmax_minus_onehot() -> None:
    x, t = inputs("taylor_softmax", 5, 7, seed=6)
    x.requires_grad_(True)
    finite = build_loss("taylor_softmax", n=4)(x, t)
    inf = build_loss("taylor_softmax", n=4, backward="inf")(x, t)
    torch.testing.assert_close(finite.loss, inf.loss)
    inf.loss.backward()
    expected = torch.zeros_like(x)
    for i in range(4):  # the last row is ignored
        f = [sum(v**j / math.factorial(j) for j in range(5)) for v in x[i].tolist()]
        for c in range(7):
            expected[i, c] = (f[c] / sum(f) - (c == int(t[i]))) / 4
    torch.testing.assert_close(x.grad, expected)
    assert not torch.allclose(torch.autograd.grad(finite.loss, x)[0], x.grad)


@pytest.mark.parametrize("name", NAMES)
def test_bf16_autocast_gives_finite_fp32_loss(name: str) -> None:
    torch.manual_seed(0)
    head = torch.nn.Linear(16, 151)
    feats = torch.randn(2, 5, 16) * 4
    kind = "token" if int_kind(name) else "multilabel"
    target = torch.randint(0, 151, (2, 5)) if kind == "token" else (torch.rand(10, 151) < 0.05).float()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = head(feats)
        assert logits.dtype == torch.bfloat16
        out = make(name)(logits if kind == "token" else logits.reshape(10, 151), target)
    assert out.loss.dtype == torch.float32 and torch.isfinite(out.loss)
    out.loss.backward()
    assert torch.isfinite(head.weight.grad).all() and head.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("name", [n for n in NAMES if int_kind(n)])
def test_token_kind_equals_flattened_multiclass_without_ignored(name: str) -> None:
    x, _ = inputs(name, 12, 6, seed=7)
    t = torch.randint(0, 6, (12,))
    t[[1, 5, 6]] = -100
    token = make(name)(x.reshape(3, 4, 6), t.reshape(3, 4))
    keep = t != -100
    flat = make(name)(x[keep], t[keep])
    torch.testing.assert_close(tuple(token), tuple(flat))
    assert int(token.n_rows) == 9


@pytest.mark.parametrize("name", NAMES)
def test_wrong_kind_or_shape_is_a_value_error(name: str) -> None:
    loss_fn = build_loss(name)
    x = torch.randn(4, 5)
    wrong = torch.zeros(4, 5) if "multilabel" not in loss_fn.kinds else torch.zeros(4, dtype=torch.long)
    if loss_fn.kinds != KINDS:
        with pytest.raises(ValueError, match="supports"):
            loss_fn(x, wrong)
    with pytest.raises(ValueError, match=r"got logits \(4, 5\) and target \(3,\)"):
        loss_fn(x, torch.zeros(3, dtype=torch.long))


def test_as_softmax_leaves_logits_alone_and_supports_retain_graph() -> None:
    x, t = inputs("as_softmax", 8, 30, seed=8)
    x = x.float().requires_grad_(True)
    before = x.detach().clone()
    loss = build_loss("as_softmax", delta=0.2)(x, t).loss
    loss.backward(retain_graph=True)
    first = x.grad.clone()
    loss.backward()
    assert torch.equal(x.detach(), before) and torch.equal(x.grad, 2 * first)


def test_all_rows_ignored_gives_zero_loss_and_zero_gradient() -> None:
    for name in [n for n in NAMES if int_kind(n)]:
        x = torch.randn(2, 3, 5, requires_grad=True)
        out = make(name)(x, torch.full((2, 3), -100))
        out.loss.backward()
        assert float(out.loss.detach()) == 0.0 and int(out.n_rows) == 0 and not x.grad.any(), name


# ---- hypothesis properties ---------------------------------------------------------------------------

logit_values = st.one_of(st.floats(-30, 30, allow_nan=False), st.sampled_from([0.0, 1.0, -1.0, 5.0]))


@st.composite
def batches(draw: st.DrawFn, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    n, c = draw(st.integers(1, 4)), draw(st.integers(2, 7))
    x = torch.tensor(draw(st.lists(logit_values, min_size=n * c, max_size=n * c)), dtype=torch.float64)
    if int_kind(name):
        t = torch.tensor(draw(st.lists(st.integers(0, c - 1), min_size=n, max_size=n)))
    else:
        t = torch.tensor(draw(st.lists(st.sampled_from([0.0, 1.0]), min_size=n * c,
                                       max_size=n * c))).reshape(n, c)
    if name.startswith("taylor") or name.startswith("sm_taylor"):
        x = x / 10  # f^n grows as z^n: keep the test about the property, not fp overflow
    return x.reshape(n, c), t


PADDING_CHANGES_LOSS = {"taylor_softmax", "sm_taylor_softmax", "label_smoothing", "bce"}  # by definition


@pytest.mark.parametrize("name", NAMES)
def test_properties(name: str) -> None:
    @settings(max_examples=25, deadline=None)
    @given(data=st.data())
    def check(data: st.DataObject) -> None:
        x, t = data.draw(batches(name))
        loss_fn = make(name)
        out = loss_fn(x, t)
        assert torch.isfinite(out.loss) and out.loss >= -1e-12  # finite, non-negative
        assert 0 <= int(out.n_masked) <= int(out.n_rows)
        perm = torch.randperm(x.shape[1],
                              generator=torch.Generator().manual_seed(data.draw(st.integers(0, 99))))
        tp = perm.argsort()[t] if int_kind(name) else t[:, perm]
        torch.testing.assert_close(loss_fn(x[:, perm], tp).loss, out.loss)  # class order does not matter
        if name not in PADDING_CHANGES_LOSS:  # a -inf class (never the target) is inert
            pad = torch.full_like(x[:, :1], -torch.inf)
            tpad = t if int_kind(name) else torch.cat([t, torch.zeros_like(t[:, :1])], dim=1)
            torch.testing.assert_close(loss_fn(torch.cat([x, pad], dim=1), tpad).loss, out.loss)
        if int_kind(name):  # ignored rows: neither their logits nor their gradient count
            t2 = t.clone()
            t2[0] = -100
            z = x.clone().requires_grad_(True)
            a = loss_fn(z, t2)
            a.loss.backward()
            b = loss_fn(torch.cat([x[:1] + 7.0, x[1:]]), t2)
            torch.testing.assert_close(a.loss, b.loss)
            assert int(a.n_rows) == x.shape[0] - 1 and not z.grad[0].any()

    check()


@settings(max_examples=40, deadline=None)
# delta is compared in the working precision: a delta below the resolution of p_t (~1e-16) acts as 0.
@given(data=st.data(), d1=st.sampled_from([0.0]) | st.floats(1e-9, 1), d2=st.floats(1e-9, 1))
def test_as_softmax_loss_grows_with_delta_and_masked_rows_have_no_gradient(data: st.DataObject, d1: float,
                                                                           d2: float) -> None:
    x, t = data.draw(batches("as_softmax"))
    lo, hi = sorted((d1, d2))
    z = x.clone().requires_grad_(True)
    out = build_loss("as_softmax", delta=lo)(z, t)
    assert out.loss <= build_loss("as_softmax", delta=hi)(x, t).loss + 1e-12  # fewer drops at larger delta
    out.loss.backward()
    p = torch.tensor([softmax(row) for row in x.tolist()], dtype=torch.float64)
    kept = (p.gather(1, t[:, None]) - p < lo).scatter(1, t[:, None], True)  # the target is always kept
    masked_rows = kept.sum(dim=1) == 1
    assert int(out.n_masked) == int(masked_rows.sum())
    assert not z.grad[masked_rows].any()


@pytest.mark.parametrize("name", sorted(n for n, cls in LOSSES.items() if "multiclass" in cls.kinds))
def test_predicted_class_is_the_most_probable_under_the_loss_own_probabilities(name: str) -> None:
    """class_scores' argmax = the argmax of the loss's own class probabilities, computed by brute force: for
    the Taylor family f^n(z_j) / sum_i f^n(z_i) (Eq. 4, no margin at prediction), for every other loss the
    logits' order (softmax, sparsemax, entmax, cosine logits all increase with the logit). Rows with a large
    negative logit are where the two differ: f^2(-10) = 41 > f^2(1) = 2.5."""
    from reference_losses import taylor_f

    g = torch.Generator().manual_seed(3)
    x = torch.randn(40, 7, generator=g, dtype=torch.float64) * 4
    x[:10] = x[:10].clamp(-3.0, 3.0)
    x[:10, 0] = -10.0  # a large negative logit: the most probable class under f^n for even n (n <= 10)
    loss_fn = build_loss(name)
    n = loss_fn.hparams().get("n")
    predicted = loss_fn.class_scores(x).argmax(dim=1).tolist()
    for row, got in zip(x.tolist(), predicted, strict=True):
        probs = [taylor_f(v, int(n)) for v in row] if "taylor" in name else row
        assert got == max(range(len(row)), key=probs.__getitem__), (name, row)
    if "taylor" in name:
        assert predicted[:10] == [0] * 10  # the logits' argmax would never be class 0 there


@pytest.mark.slow
def test_the_trainer_predicts_taylor_classes_by_taylor_probabilities(tmp_path: Path) -> None:
    """Evaluation scores a Taylor-trained model by f^n(z): a head whose logit for the true class is far below
    the others (f^2 large) is right, not wrong."""
    from tune_as.tasks import DataSettings, build_task, prepare
    from tune_as.training.trial import Trial

    task = build_task("digits")
    data = prepare(task, DataSettings(task="digits", cache_dir=tmp_path))
    config = {"loss": "sm_taylor_softmax", "epochs": 1.0, "batch_size": 64, "lr": 1e-3, "loss.m": 0.6,
              "loss.n": 2}
    trial = Trial(config, data, task, _Silent())
    labels = data.validation.columns["labels"].long()

    def negated_one_hot(batch: dict) -> torch.Tensor:  # logit -20 for the true class, 0 elsewhere
        return -20.0 * F.one_hot(batch["labels"], 10).float()

    trial.model.forward = negated_one_hot  # type: ignore[method-assign]
    scores, _, _ = trial.evaluate(data.validation)
    assert len(labels) > 0 and scores["accuracy"] == 1.0
