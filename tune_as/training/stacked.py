"""P models of one architecture as one program: stacked weights (P, ...), per-member dropout,
clipping and AdamW.

A population trains P seeds of one setting at once (tune_as.training.population). Its members must stay
independent runs: member i is the run a solo trial with seed i makes. What that takes, and why it is written
here rather than taken from torch:

- The frozen-feature head (tune_as.tasks.models.FrozenClassifier: dropout, Linear, GELU, dropout, linear or
  cosine head) becomes batched matrix products over the member dimension. `torch.func.vmap` would do the
  products, but its dropout draws one mask for the whole stack from the global generator; here each member
  draws its masks from a generator of its own, in the order and shapes a solo trial draws them (on the CPU,
  `F.dropout` is `bernoulli_(1 - p)` then a scale: the same numbers from the same generator state). The image
  CNNs without BatchNorm stack the same way, their convolutions grouped (tune_as.training.stacked_cnn).
- `torch.nn.utils.clip_grad_norm_` has one norm for all parameters it is given; a member's norm must be its
  own (taken as clip_grad_norm_ takes it: its per-tensor kernel on the member's tensors in the solo order).
- `torch.optim.AdamW` keeps one step count per parameter tensor; under AS-Speed's accumulation, or when a
  cycle's every row was masked, members step at different times, so each has its own count and a member that
  does not step this time does not move (its momentum and weight decay included). The update itself is torch's
  (its functional `adamw`, fused, on each member's slices), so it is the solo trial's kernel.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.optim.adamw import adamw

from tune_as.tasks.models import DROPOUT, CosineHead, FrozenClassifier
from tune_as.training.loop import EVAL_ROWS

CLIP_EPS = 1e-6  # torch.nn.utils.clip_grad_norm_'s: coefficient max_norm / (norm + 1e-6)


def column(values: Tensor, like: Tensor) -> Tensor:
    """(P,) values shaped to broadcast over a stacked tensor (P, ...)."""
    return values.reshape(-1, *([1] * (like.dim() - 1)))


def member_masks(generators: Sequence[torch.Generator], batch: int, width: int, p: float,
                 device: torch.device) -> Tensor:
    """(P, batch, width) dropout masks, member i's drawn from generators[i] as a solo trial's `F.dropout`
    draws its mask (`bernoulli_(1 - p)`, then the scale 1 / (1 - p))."""
    mask = torch.empty(len(generators), batch, width, device=device)
    for i, g in enumerate(generators):
        mask[i].bernoulli_(1.0 - p, generator=g)
    return mask.div_(1.0 - p)


class Stacked(nn.Module):
    """What the stacked models share: the task head (linear or cosine, see tasks.models) stacked, the
    weight-decay rule, and `logits(batch, ...)`, the one call a population makes."""

    # the head's weights (P, H, C), transposed: the batched products read them without a copy per call (the
    # solo layout (P, C, H) through a transposed view costs the frozen head's step 0.6 ms more at P = 10,
    # measured); False: the solo layout, whose gradients (and so clipping norms) are the solo trial's
    # bit for bit
    HEAD_TRANSPOSED: ClassVar[bool] = True
    w2: nn.Parameter
    b2: nn.Parameter | None

    def stack_head(self, heads: Sequence[Any]) -> None:
        kinds = {type(h) for h in heads}
        if len(kinds) != 1:
            raise ValueError(f"a population needs members of one architecture, "
                             f"got heads {sorted(map(str, kinds))}")
        self.cosine = isinstance(heads[0], CosineHead)
        weights = [h.weight.detach() for h in heads]  # (C, H) each
        self.w2 = nn.Parameter(
            torch.stack([w.T if self.HEAD_TRANSPOSED else w for w in weights]).contiguous())
        bias = [] if self.cosine else [h.bias.detach() for h in heads]
        self.b2 = nn.Parameter(torch.stack(bias)) if bias else None

    @property
    def size(self) -> int:
        return int(self.w2.shape[0])

    def decays(self, name: str) -> bool:
        """Whether the parameter `name` gets weight decay: a solo trial's rule (matrices and kernels yes,
        biases no), on a member's slice."""
        return self.get_parameter(name).dim() > 2

    def eval_rows(self, members: int) -> int:
        """Rows per evaluation batch for `members` members at once."""
        return EVAL_ROWS

    def head(self, h: Tensor, members: Tensor | None) -> Tensor:
        """(k, B, H) features -> (k, B, C) logits through each member's head
        (`members`: theirs; None: all)."""
        w2: Tensor = self.w2
        b2: Tensor | None = self.b2
        if members is not None:
            w2, b2 = w2[members], (b2[members] if b2 is not None else None)
        if self.cosine:  # a class's weights normalized: a column of (k, H, C)
            w2 = F.normalize(w2, dim=1 if self.HEAD_TRANSPOSED else 2)
        w2 = w2 if self.HEAD_TRANSPOSED else w2.transpose(1, 2)  # (k, H, C)
        if self.cosine:
            return F.normalize(h, dim=-1) @ w2
        assert b2 is not None
        return torch.baddbmm(b2.unsqueeze(1), h, w2)

    def solo_layout(self, stacked: dict[str, Tensor], member: int) -> list[Tensor]:
        """Member `member`'s slices of `stacked` (a tensor per parameter name: the parameters, or their
        gradients) as its solo model's parameters: in their order and shapes."""
        raise NotImplementedError

    def head_layout(self, stacked: dict[str, Tensor], member: int) -> list[Tensor]:
        """`solo_layout` of the head (its weight (C, H), then its bias if it has one): a solo model's last."""
        weight = stacked["w2"][member]
        return ([weight.T if self.HEAD_TRANSPOSED else weight]
                + ([stacked["b2"][member]] if "b2" in stacked else []))

    def logits(self, batch: dict[str, Tensor], generators: Sequence[torch.Generator] | None = None,
               members: Tensor | None = None) -> Tensor:
        """Training (`generators` given, one per member): the batch holds each member's rows, member after
        member, -> (P, B, C), each member's dropout drawn from its generator. Evaluation: the batch is shared
        by `members` (None: all) -> (k, B, C)."""
        raise NotImplementedError


class StackedFrozen(Stacked):
    """P `FrozenClassifier`s (same feature size, classes and head kind) as one module:
    x (P, B, D) -> (P, B, C)."""

    def __init__(self, members: Sequence[FrozenClassifier]) -> None:
        super().__init__()
        linear: list[Any] = [m.trunk[1] for m in members]
        if not all(isinstance(x, nn.Linear) for x in linear):
            raise ValueError("a population of frozen-feature heads needs FrozenClassifier members")
        self.stack_head([m.head for m in members])
        self.w1 = nn.Parameter(torch.stack([x.weight.detach().T for x in linear]).contiguous())  # (P, D, H)
        self.b1 = nn.Parameter(torch.stack([x.bias.detach() for x in linear]))  # (P, H)

    def solo_layout(self, stacked: dict[str, Tensor], member: int) -> list[Tensor]:
        return [stacked["w1"][member].T, stacked["b1"][member], *self.head_layout(stacked, member)]

    def logits(self, batch: dict[str, Tensor], generators: Sequence[torch.Generator] | None = None,
               members: Tensor | None = None) -> Tensor:
        x = batch["features"]
        if generators is None:
            return self(x, members=members)
        x = x.reshape(self.size, -1, x.shape[-1])
        return self(x, self.draw_masks(generators, x.shape[1], x.shape[2]))

    def forward(self, x: Tensor, masks: Sequence[Tensor] | None = None,
                members: Tensor | None = None) -> Tensor:
        """x (P, B, D) (or (B, D), shared by every member) -> logits (P, B, C). `masks`: the two dropout masks
        (P, B, D) and (P, B, H), already scaled by 1 / (1 - p); None in evaluation. `members`: evaluate only
        these members (their weights), x then has their count in its first dim (or none)."""
        w1: Tensor = self.w1
        b1: Tensor = self.b1
        if members is not None:
            w1, b1 = w1[members], b1[members]
        if x.dim() == 2:
            x = x.expand(w1.shape[0], *x.shape)
        if masks is not None:
            x = x * masks[0]
        h = F.gelu(torch.baddbmm(b1.unsqueeze(1), x, w1))
        if masks is not None:
            h = h * masks[1]
        return self.head(h, members)

    def draw_masks(self, generators: Sequence[torch.Generator], batch: int, feature_dim: int) -> list[Tensor]:
        """The two dropout masks of one training forward, in a solo trial's order (input, then hidden)."""
        return [member_masks(generators, batch, width, DROPOUT, self.w1.device)
                for width in (feature_dim, self.w1.shape[2])]


def member_norms(per_member: Sequence[Sequence[Tensor]]) -> Tensor:
    """(P,) the 2-norm of each member's gradient, as clip_grad_norm_ takes it: each tensor's norm by torch's
    own kernel (`_foreach_norm`, clip_grad_norm_'s), given in the solo model's order and layout, then the norm
    of those; on the CPU the solo trial's numbers bit for bit, where the layouts match."""
    n = len(per_member[0])
    norms = torch._foreach_norm([g for member in per_member for g in member], 2.0)
    return torch.stack([torch.linalg.vector_norm(torch.stack(norms[i * n:(i + 1) * n]))
                        for i in range(len(per_member))])


def clip_members(model: Stacked, max_norm: float, stepping: Tensor | None) -> None:
    """clip_grad_norm_ member by member, for the members that step now (`stepping` (P,) bool; None: all); the
    others' gradients (still accumulating) are left as they are."""
    grads = {name: p.grad for name, p in model.named_parameters() if p.grad is not None}
    norms = member_norms([model.solo_layout(grads, i) for i in range(model.size)])
    coef = (max_norm / (norms + CLIP_EPS)).clamp_(max=1.0)
    if stepping is not None:
        coef = torch.where(stepping, coef, torch.ones_like(coef))
    for g in grads.values():
        g.mul_(column(coef, g))


class StackedAdamW:
    """torch.optim.AdamW (fused: the solo trial's optimizer and kernel) over stacked parameters, with a step
    count per member: `step(members)` updates those members' slices of every stacked tensor, through torch's
    functional `adamw` on views, and leaves the others (their momentum and weight decay included)
    untouched."""

    def __init__(self, groups: Sequence[tuple[Sequence[nn.Parameter], float]], lr: float,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8) -> None:
        self.groups = [(list(params), float(wd)) for params, wd in groups]
        self.lr, self.betas, self.eps = lr, betas, eps
        stacked = [p for ps, _ in self.groups for p in ps]
        self.size = int(stacked[0].shape[0])
        self.moments = {id(p): (torch.zeros_like(p), torch.zeros_like(p)) for p in stacked}
        # one step count per (parameter, member), float32 on the device as AdamW(fused=True) keeps it
        self.steps = {id(p): [torch.zeros((), dtype=torch.float32, device=p.device) for _ in range(self.size)]
                      for p in stacked}

    @torch.no_grad()
    def step(self, members: Sequence[int]) -> None:
        beta1, beta2 = self.betas
        for params, wd in self.groups:
            live = [p for p in params if p.grad is not None]
            if not live or not members:
                continue
            views = [(p[i], p.grad[i], self.moments[id(p)][0][i], self.moments[id(p)][1][i],  # type: ignore[index]
                      self.steps[id(p)][i]) for p in live for i in members]
            ps, gs, ms, vs, steps = (list(x) for x in zip(*views, strict=True))
            adamw(ps, gs, ms, vs, [], steps, fused=True, amsgrad=False, beta1=beta1, beta2=beta2, lr=self.lr,
                  weight_decay=wd, eps=self.eps, maximize=False)

    def state_dict(self) -> dict[str, object]:
        ids = [id(p) for ps, _ in self.groups for p in ps]
        return {"steps": [torch.stack(self.steps[k]) for k in ids],
                "moments": [t.clone() for k in ids for t in self.moments[k]]}

    def load_state_dict(self, saved: dict[str, object]) -> None:
        ids = [id(p) for ps, _ in self.groups for p in ps]
        for k, steps in zip(ids, saved["steps"], strict=True):  # type: ignore[call-overload]
            for mine, value in zip(self.steps[k], steps, strict=True):
                mine.copy_(value)
        moments = iter(saved["moments"])  # type: ignore[call-overload]
        for k in ids:
            for t in self.moments[k]:
                t.copy_(next(moments))
