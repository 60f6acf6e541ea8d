"""ResNets of configurable width, with an optional CIFAR stem and BN or GroupNorm: torchvision's
architecture, module names (conv1, bn1, layer1..layer4) and initialisation, so a checkpoint is
torchvision's format and the detection stage hands the same modules to torchvision's heads.

Written here rather than imported from torchvision because importing torchvision imports
torch._dynamo (its ops.roi_align), two seconds of every pretraining and probe job's start-up.
tests/test_models.py holds it to torchvision's blocks: the same weights from the same seed and
the same features.
"""

from __future__ import annotations

from typing import cast

import torch
from torch import nn

from pipeline.base.layout import VITS


def conv3x3(inplanes: int, planes: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(inplanes, planes, kernel_size=3, stride=stride, padding=1, bias=False)


def conv1x1(inplanes: int, planes: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(inplanes, planes, kernel_size=1, stride=stride, bias=False)


class BasicBlock(nn.Module):
    """Two 3x3 convolutions and a shortcut (ResNet-18/34)."""

    expansion = 1

    def __init__(self, inplanes: int, planes: int, stride: int, downsample: nn.Module | None, norm_layer) -> None:
        super().__init__()
        self.conv1 = conv3x3(inplanes, planes, stride)
        self.bn1 = norm_layer(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = conv3x3(planes, planes)
        self.bn2 = norm_layer(planes)
        self.downsample = downsample

    @property
    def last_norm(self) -> nn.Module:
        return self.bn2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += x if self.downsample is None else self.downsample(x)
        return self.relu(out)


class Bottleneck(nn.Module):
    """1x1 down, 3x3 (strided), 1x1 up to 4x the planes, and a shortcut (ResNet-50 and up; the
    stride on the 3x3, as torchvision's "ResNet v1.5")."""

    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int, downsample: nn.Module | None, norm_layer) -> None:
        super().__init__()
        self.conv1 = conv1x1(inplanes, planes)
        self.bn1 = norm_layer(planes)
        self.conv2 = conv3x3(planes, planes, stride)
        self.bn2 = norm_layer(planes)
        self.conv3 = conv1x1(planes, planes * self.expansion)
        self.bn3 = norm_layer(planes * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    @property
    def last_norm(self) -> nn.Module:
        return self.bn3

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        out += x if self.downsample is None else self.downsample(x)
        return self.relu(out)


ARCHS: dict[str, tuple[type[BasicBlock] | type[Bottleneck], list[int]]] = {
    "resnet18": (BasicBlock, [2, 2, 2, 2]),
    "resnet50": (Bottleneck, [3, 4, 6, 3]),
}


class ResNetBackbone(nn.Module):
    """ResNet without its classifier: images -> pooled features of size ``out_dim``.

    ``width`` is the channel count of the first stage (64 in the papers); ``cifar_stem``
    replaces the 7x7/2 conv + max-pool by a 3x3/1 conv, as is usual for 32 px images.
    """

    def __init__(
        self,
        arch: str = "resnet18",
        width: int = 64,
        cifar_stem: bool = False,
        norm_layer=None,
        zero_init_residual: bool = False,
    ):
        if arch not in ARCHS:
            raise ValueError(f"unknown backbone '{arch}' (known: {', '.join([*ARCHS, *VITS])})")
        super().__init__()
        block, layers = ARCHS[arch]
        norm_layer = norm_layer or nn.BatchNorm2d
        if cifar_stem:
            self.conv1 = nn.Conv2d(3, width, kernel_size=3, stride=1, padding=1, bias=False)
            self.maxpool: nn.Module = nn.Identity()
        else:
            self.conv1 = nn.Conv2d(3, width, kernel_size=7, stride=2, padding=3, bias=False)
            self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.bn1 = norm_layer(width)
        self.relu = nn.ReLU(inplace=True)
        self.inplanes = width
        self.layer1 = self._make_layer(block, width, layers[0], 1, norm_layer)
        self.layer2 = self._make_layer(block, width * 2, layers[1], 2, norm_layer)
        self.layer3 = self._make_layer(block, width * 4, layers[2], 2, norm_layer)
        self.layer4 = self._make_layer(block, width * 8, layers[3], 2, norm_layer)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Identity()
        self.out_dim = width * 8 * block.expansion
        self.stage_channels = [width * k * block.expansion for k in (1, 2, 4, 8)]
        for mod in self.modules():
            if isinstance(mod, nn.Conv2d):
                nn.init.kaiming_normal_(mod.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(mod, (nn.BatchNorm2d, nn.GroupNorm)):
                nn.init.ones_(mod.weight)
                nn.init.zeros_(mod.bias)
        if zero_init_residual:  # each block starts as the identity (torchvision's option)
            for mod in self.modules():
                if isinstance(mod, (BasicBlock, Bottleneck)):
                    nn.init.zeros_(cast(torch.Tensor, mod.last_norm.weight))

    def _make_layer(self, block, planes: int, blocks: int, stride: int, norm_layer) -> nn.Sequential:
        """One stage: ``blocks`` blocks, the first strided and projecting its shortcut where
        the shape changes (built before the block, as torchvision does: the same RNG draws)."""
        downsample = None
        if stride != 1 or self.inplanes != planes * block.expansion:
            downsample = nn.Sequential(
                conv1x1(self.inplanes, planes * block.expansion, stride), norm_layer(planes * block.expansion)
            )
        layers = [block(self.inplanes, planes, stride, downsample, norm_layer)]
        self.inplanes = planes * block.expansion
        layers += [block(self.inplanes, planes, 1, None, norm_layer) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))
