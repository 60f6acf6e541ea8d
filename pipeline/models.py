"""Backbones: torchvision ResNets with a configurable base width and an optional CIFAR stem.

Layer names follow torchvision (conv1, bn1, layer1..layer4), so the detection stage can hand
the same modules to torchvision's detection heads.
"""
from __future__ import annotations

from torch import nn
from torchvision.models.resnet import BasicBlock, Bottleneck, ResNet

ARCHS = {"resnet18": (BasicBlock, [2, 2, 2, 2]), "resnet50": (Bottleneck, [3, 4, 6, 3])}


class ResNetBackbone(ResNet):
    """ResNet without its classifier: images -> pooled features of size ``out_dim``.

    ``width`` is the channel count of the first stage (64 in the papers); ``cifar_stem``
    replaces the 7x7/2 conv + max-pool by a 3x3/1 conv, as is usual for 32 px images.
    """

    def __init__(self, arch: str = "resnet18", width: int = 64, cifar_stem: bool = False,
                 norm_layer=None):
        if arch not in ARCHS:
            raise ValueError(f"unknown backbone '{arch}' (known: {', '.join(ARCHS)})")
        block, layers = ARCHS[arch]
        nn.Module.__init__(self)  # ResNet.__init__ hard-codes width 64; build the stages here
        self._norm_layer = norm_layer or nn.BatchNorm2d
        self.inplanes, self.dilation, self.groups, self.base_width = width, 1, 1, 64
        if cifar_stem:
            self.conv1 = nn.Conv2d(3, width, kernel_size=3, stride=1, padding=1, bias=False)
            self.maxpool = nn.Identity()
        else:
            self.conv1 = nn.Conv2d(3, width, kernel_size=7, stride=2, padding=3, bias=False)
            self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.bn1 = self._norm_layer(width)
        self.relu = nn.ReLU(inplace=True)
        self.layer1 = self._make_layer(block, width, layers[0])
        self.layer2 = self._make_layer(block, width * 2, layers[1], stride=2)
        self.layer3 = self._make_layer(block, width * 4, layers[2], stride=2)
        self.layer4 = self._make_layer(block, width * 8, layers[3], stride=2)
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


def build_backbone(arch: dict) -> ResNetBackbone:
    """``arch`` = {"backbone", "width", "cifar_stem"}: the record stored in every checkpoint."""
    return ResNetBackbone(arch["backbone"], arch.get("width", 64), arch.get("cifar_stem", False))


def projection_head(in_dim: int, out_dim: int, mlp: bool) -> nn.Module:
    """v1: a linear layer; v2: a 2-layer MLP (hidden = in_dim, ReLU)."""
    if not mlp:
        return nn.Linear(in_dim, out_dim)
    return nn.Sequential(nn.Linear(in_dim, in_dim), nn.ReLU(inplace=True), nn.Linear(in_dim, out_dim))


class Encoder(nn.Module):
    """Backbone followed by a projection head; the backbone is what transfers."""

    def __init__(self, backbone: nn.Module, head: nn.Module):
        super().__init__()
        self.backbone = backbone
        self.head = head

    def forward(self, x):
        return self.head(self.backbone(x))
