"""Image CNNs in plain torch (no torchvision here): the softmax-alternatives paper's Table 1 topologies.

Conv[KxK, n] = stride 1, "same" padding, then ReLU (the paper names no activation); MaxPool[2x2, s] uses the
stride the table prints (2 for MNIST, 1 for the CIFAR nets, so their maps shrink by one pixel per pool and
the final FC is wide: about 78M weights for CIFAR-100). The table's last FC is the task head (linear or
cosine, see models.py); each builder returns (trunk, trunk output width).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

Shape = tuple[int, int, int]  # (channels, height, width)


class SameConv2d(nn.Conv2d):
    """Conv[KxK] with "same" padding, stride 1. For an even K torch's `padding="same"` pads asymmetrically
    (left and top (K-1)//2, right and bottom the rest) and warns at every process's first call that it copies
    the input to do so; this pads the same way with F.pad, without the warning (CIFAR-100's 2x2 convolutions).
    Its parameters are a Conv2d's, named alike."""

    def __init__(self, c_in: int, c_out: int, k: int) -> None:
        super().__init__(c_in, c_out, k, padding=k // 2 if k % 2 else 0)
        low = (k - 1) // 2
        self.pad = (low, k - 1 - low, low, k - 1 - low) if k % 2 == 0 else None

    def forward(self, x: Tensor) -> Tensor:
        return super().forward(x if self.pad is None else nn.functional.pad(x, self.pad))


def conv(c_in: int, c_out: int, k: int, bn: bool = False) -> list[nn.Module]:
    layers: list[nn.Module] = [SameConv2d(c_in, c_out, k)]
    return layers + ([nn.BatchNorm2d(c_out)] if bn else []) + [nn.ReLU()]


def pool(stride: int, dropout: float = 0.0) -> list[nn.Module]:
    return [nn.MaxPool2d(2, stride)] + ([nn.Dropout(dropout)] if dropout else [])


def stack(c_in: int, plan: list[tuple[int, int, int]], bn: bool = False) -> tuple[list[nn.Module], int]:
    """plan: (repeats, kernel, channels) groups; returns the layers and the last channel count."""
    layers: list[nn.Module] = []
    for repeats, k, c_out in plan:
        for _ in range(repeats):
            layers += conv(c_in, c_out, k, bn)
            c_in = c_out
    return layers, c_in


def channels_last(x: Tensor) -> Tensor:
    """Images (B, C, H, W) in channels-last memory: the CPU's oneDNN convolutions then keep that layout, and
    max pooling over small maps is ~10x faster than on (B, C, H, W) memory (the digits CNN's 8x8 maps:
    0.06-0.09 against 0.9 ms a call on one thread, a training step 5.2 against 6.9 ms; docs/benchmarks.md).
    The values and their logical order are unchanged. One channel is already "channels-last" to torch, which
    then keeps the first convolution's output in the other layout; its strides are set to say which is
    meant."""
    if x.dim() != 4:
        raise ValueError(f"channels_last: expected images (B, C, H, W), got shape {tuple(x.shape)}")
    _, c, h, w = x.shape
    if c > 1:
        return x.contiguous(memory_format=torch.channels_last)
    return x.contiguous().as_strided(x.shape, (c * h * w, 1, w * c, c))


def flat_size(features: nn.Module, shape: Shape) -> int:
    with torch.no_grad():
        size = int(features.eval()(torch.zeros(1, *shape)).numel())
    features.train()
    return size


def mnist(shape: Shape) -> tuple[nn.Module, int]:
    a, c = stack(shape[0], [(4, 3, 64)])
    b, c = stack(c, [(3, 3, 64)])
    d, c = stack(c, [(3, 3, 64)])
    features = nn.Sequential(*a, *pool(2), *b, *pool(2), *d, *pool(2), nn.Flatten())
    fc = [nn.Linear(flat_size(features, shape), 256), nn.ReLU()]
    return nn.Sequential(*features, *fc), 256


def cifar10(shape: Shape) -> tuple[nn.Module, int]:
    layers: list[nn.Module] = []
    c = shape[0]
    for width, dropout in ((32, 0.2), (64, 0.3), (128, 0.4)):
        block, c = stack(c, [(2, 3, width)], bn=True)
        layers += block + pool(1, dropout)
    features = nn.Sequential(*layers, nn.Flatten())
    fc = [nn.Linear(flat_size(features, shape), 128), nn.BatchNorm1d(128), nn.ReLU(), nn.Dropout(0.5)]
    return nn.Sequential(*features, *fc), 128


def cifar100(shape: Shape) -> tuple[nn.Module, int]:
    plans = [  # conv groups, each followed by MaxPool[2x2,1] + Dropout(0.5)
        [(1, 3, 384)],
        [(1, 1, 384), (1, 2, 384), (2, 2, 640)],
        [(1, 3, 640), (3, 2, 768), (1, 1, 768), (2, 2, 896)],
        [(1, 3, 896), (2, 2, 1024)],
        [(1, 1, 1024), (1, 2, 1152)],
        [(1, 1, 1152)],
    ]
    layers: list[nn.Module] = []
    c = shape[0]
    for plan in plans:
        block, c = stack(c, plan)
        layers += block + pool(1, 0.5)
    features = nn.Sequential(*layers, nn.Flatten())
    return features, flat_size(features, shape)


def digits(shape: Shape) -> tuple[nn.Module, int]:
    """sklearn's 8x8 digits (not in the paper): two conv groups, one pool, FC[128]."""
    a, c = stack(shape[0], [(2, 3, 32)])
    b, c = stack(c, [(1, 3, 64)])
    features = nn.Sequential(*a, *pool(2), *b, nn.Flatten())
    fc = [nn.Linear(flat_size(features, shape), 128), nn.ReLU(), nn.Dropout(0.2)]
    return nn.Sequential(*features, *fc), 128


CNNS: dict[str, Callable[[Shape], tuple[nn.Module, int]]] = {
    "mnist": mnist, "cifar10": cifar10, "cifar100": cifar100, "digits": digits,
}
