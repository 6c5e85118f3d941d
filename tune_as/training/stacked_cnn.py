"""P image CNNs (tune_as.tasks.cnn, without BatchNorm) as one program:
their convolutions one grouped convolution.

A population of the digits or mnist CNN (tune_as.training.population) stacks its members as `StackedFrozen`
stacks heads (tune_as.training.stacked), layer by layer of the solo model's trunk:

- Conv2d: member i's kernels (C_out, C_in, k, k) are slice i of one parameter (P, C_out, C_in, k, k), so that
  clipping and AdamW see per-member slices; the forward reshapes it to (P * C_out, C_in, k, k) for one
  `F.conv2d(groups=P)` over the members' channels in member-major blocks: input (B, P * C_in, H, W), block i
  member i's own batch. One grouped kernel instead of P small ones (issue 34: the P convolutions of a step
  launched as one).
- ReLU and MaxPool2d act per channel: unchanged on the stack.
- Flatten: (B, P * C, H, W) -> (P, B, C * H * W), each member's features in the solo order (C, H, W).
- Linear, then the task head: batched matrix products, as `StackedFrozen`'s (the Linear weights kept as the
  solo layer keeps them, (P, out, in), so that clipping sees a member's tensors as its solo model has them).
- Dropout after the flatten: each member's mask from its own generator, in the solo draw order and shape.

BatchNorm (its running statistics and batch statistics would need a per-member layer) and dropout on feature
maps are not stacked: `STACKABLE` names the topologies this covers, and the cifar ones keep solo trials.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tune_as.tasks.cnn import channels_last
from tune_as.training.loop import EVAL_ROWS
from tune_as.training.stacked import Stacked, member_masks

# tune_as.tasks.cnn topologies of Conv2d, ReLU, MaxPool2d, Flatten, Linear, Dropout
STACKABLE = ("digits", "mnist")


def stack_params(tensors: Sequence[Tensor]) -> nn.Parameter:
    return nn.Parameter(torch.stack([t.detach() for t in tensors]).contiguous())


class StackedCNN(Stacked):
    """P `tune_as.tasks.models.ImageClassifier`s of one CNN topology:
    pixels (P, B, C, H, W) -> logits (P, B, C)."""

    HEAD_TRANSPOSED = False  # the solo layout: the members' weights stay their solo trials' bit for bit (CPU)

    def __init__(self, members: Sequence[Any]) -> None:
        super().__init__()
        # per layer: conv (P, C_out, C_in, k, k) and (P, C_out); fc (P, out, in) and (P, out)
        self.conv_weight, self.conv_bias = nn.ParameterList(), nn.ParameterList()
        self.fc_weight, self.fc_bias = nn.ParameterList(), nn.ParameterList()
        self.program: list[tuple[str, Any]] = []  # (what, its argument), a solo trunk's layers in order
        flat = False
        for layers in zip(*(list(m.trunk) for m in members), strict=True):
            first, kinds = layers[0], {type(x) for x in layers}
            if len(kinds) != 1:
                raise ValueError(f"a population needs members of one architecture, "
                                 f"got {sorted(map(str, kinds))}")
            # an even kernel's "same" padding (tasks.cnn.SameConv2d.pad) is not in F.conv2d's
            # arguments: refused
            plain_padding = getattr(first, "pad", None) is None
            if isinstance(first, nn.Conv2d) and not flat and first.bias is not None and plain_padding:
                self.conv_weight.append(stack_params([x.weight for x in layers]))
                self.conv_bias.append(stack_params([x.bias for x in layers]))
                self.program.append(("conv", (first.stride, first.padding, first.dilation)))
            elif isinstance(first, nn.Linear) and flat and first.bias is not None:
                self.fc_weight.append(stack_params([x.weight for x in layers]))  # (P, out, in), as solo
                self.fc_bias.append(stack_params([x.bias for x in layers]))
                self.program.append(("linear", None))
            elif isinstance(first, nn.Dropout) and flat:
                self.program.append(("dropout", first.p))
            elif isinstance(first, nn.ReLU) or (isinstance(first, nn.Flatten | nn.MaxPool2d) and not flat):
                flat = flat or isinstance(first, nn.Flatten)
                self.program.append(("layer", first))
            else:
                raise ValueError(f"a population of CNNs stacks Conv2d, ReLU, MaxPool2d, Flatten, "
                                 f"then Linear, ReLU and Dropout layers; got {first}")
        self.stack_head([m.head for m in members])

    def solo_layout(self, stacked: dict[str, Tensor], member: int) -> list[Tensor]:
        """In the solo order: each layer's weight and bias, then the head's."""
        layers = [(f"conv_weight.{j}", f"conv_bias.{j}") for j in range(len(self.conv_weight))]
        layers += [(f"fc_weight.{j}", f"fc_bias.{j}") for j in range(len(self.fc_weight))]
        out = [stacked[name][member] for pair in layers for name in pair]
        return out + self.head_layout(stacked, member)

    def eval_rows(self, members: int) -> int:
        """A solo trial's evaluation batch shared among the members: activations grow with members x rows."""
        return max(1, EVAL_ROWS // members)

    def logits(self, batch: dict[str, Tensor], generators: Sequence[torch.Generator] | None = None,
               members: Tensor | None = None) -> Tensor:
        x = batch["pixels"]  # (P * B, C, H, W), member after member; or (B, C, H, W) shared
        if generators is None:
            return self(x, members=members)
        return self(x.reshape(self.size, -1, *x.shape[1:]), generators)

    def forward(self, x: Tensor, generators: Sequence[torch.Generator] | None = None,
                members: Tensor | None = None) -> Tensor:
        """x (P, B, C, H, W) (or (B, C, H, W), shared by every member) -> logits (P, B, C). `generators`: one
        per member, its dropout draws (training); None in evaluation.
        `members`: evaluate only these members."""
        params = [list(self.conv_weight), list(self.conv_bias), list(self.fc_weight), list(self.fc_bias)]
        if members is not None:
            params = [[p[members] for p in group] for group in params]
        conv_w, conv_b, fc_w, fc_b = (iter(group) for group in params)
        k = self.size if members is None else len(members)
        # (B, k * C, H, W), member-major blocks: the shared batch repeated, or each member's own batch
        x = x.repeat(1, k, 1, 1) if x.dim() == 4 else x.transpose(0, 1).reshape(x.shape[1], -1, *x.shape[3:])
        x = channels_last(x)  # as the solo model's (tune_as.tasks.cnn.channels_last)
        for what, arg in self.program:
            if what == "conv":
                w, b, (stride, padding, dilation) = next(conv_w), next(conv_b), arg
                if w.shape[2] == 1:
                    # one input channel per group: not the solo kernel (docstring); per member
                    x = torch.cat([F.conv2d(xi, wi, bi, stride, padding, dilation)
                                   for xi, wi, bi in zip(x.chunk(k, dim=1), w, b, strict=True)], dim=1)
                else:
                    x = F.conv2d(x, w.reshape(-1, *w.shape[2:]), b.reshape(-1), stride=stride,
                                 padding=padding, dilation=dilation, groups=k)
            elif what == "linear":
                x = torch.baddbmm(next(fc_b).unsqueeze(1), x, next(fc_w).transpose(1, 2))
            elif what == "dropout":
                if generators is not None:
                    x = x * member_masks(generators, x.shape[1], x.shape[2], arg, x.device)
            elif isinstance(arg, nn.Flatten):
                # (k, B, C * H * W): the solo order per member
                x = x.reshape(x.shape[0], k, -1).transpose(0, 1)
            else:
                x = arg(x)
        return self.head(x, members)
