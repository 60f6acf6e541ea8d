"""pipeline.nets.models and .resnet: an unknown backbone and an embedding the 2-d sin-cos table
cannot fill are refused; the ResNet is torchvision's, weight for weight and feature for feature."""

import subprocess
import sys

import pytest
import torch
from torch import nn


def test_unknown_backbone_and_odd_embedding_are_refused():
    from pipeline.nets.models import ResNetBackbone, sincos_2d

    with pytest.raises(ValueError, match=r"unknown backbone 'resnet7' \(known: resnet18, .*vit_"):
        ResNetBackbone("resnet7")
    with pytest.raises(ValueError, match=r"embedding dim 6 must be a multiple of 4"):
        sincos_2d(2, 6)


def torchvision_backbone(arch, width, cifar_stem, norm_layer, zero_init_residual):
    """The reference: torchvision's own ResNet blocks and stage builder at this width and stem,
    without the classifier (the backbone the pipeline used before pipeline.nets.resnet)."""
    from torchvision.models.resnet import BasicBlock, Bottleneck, ResNet

    block, layers = {"resnet18": (BasicBlock, [2, 2, 2, 2]), "resnet50": (Bottleneck, [3, 4, 6, 3])}[arch]
    net = ResNet.__new__(ResNet)
    nn.Module.__init__(net)
    net._norm_layer = norm_layer or nn.BatchNorm2d
    net.inplanes, net.dilation, net.groups, net.base_width = width, 1, 1, 64
    if cifar_stem:
        net.conv1 = nn.Conv2d(3, width, kernel_size=3, stride=1, padding=1, bias=False)
        net.maxpool = nn.Identity()
    else:
        net.conv1 = nn.Conv2d(3, width, kernel_size=7, stride=2, padding=3, bias=False)
        net.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
    net.bn1 = net._norm_layer(width)
    net.relu = nn.ReLU(inplace=True)
    net.layer1 = net._make_layer(block, width, layers[0])
    net.layer2 = net._make_layer(block, width * 2, layers[1], stride=2)
    net.layer3 = net._make_layer(block, width * 4, layers[2], stride=2)
    net.layer4 = net._make_layer(block, width * 8, layers[3], stride=2)
    net.avgpool = nn.AdaptiveAvgPool2d(1)
    net.fc = nn.Identity()
    for mod in net.modules():
        if isinstance(mod, nn.Conv2d):
            nn.init.kaiming_normal_(mod.weight, mode="fan_out", nonlinearity="relu")
        elif isinstance(mod, (nn.BatchNorm2d, nn.GroupNorm)):
            nn.init.ones_(mod.weight)
            nn.init.zeros_(mod.bias)
    if zero_init_residual:
        for mod in net.modules():
            if isinstance(mod, Bottleneck):
                nn.init.zeros_(mod.bn3.weight)
            elif isinstance(mod, BasicBlock):
                nn.init.zeros_(mod.bn2.weight)
    return net


@pytest.mark.parametrize(
    "arch, width, cifar_stem, norm, zero_init_residual, size",
    [
        ("resnet18", 16, True, "bn", False, 32),
        ("resnet50", 8, False, "gn", True, 64),
        ("resnet18", 8, False, "bn", True, 48),
    ],
)
def test_the_resnet_is_torchvisions_weight_for_weight_and_feature_for_feature(
    arch, width, cifar_stem, norm, zero_init_residual, size
):
    from pipeline.nets.models import build_backbone, group_norm

    record = {"backbone": arch, "width": width, "cifar_stem": cifar_stem, "norm": norm}
    torch.manual_seed(3)
    ours = build_backbone(record, zero_init_residual=zero_init_residual)
    torch.manual_seed(3)
    theirs = torchvision_backbone(arch, width, cifar_stem, group_norm if norm == "gn" else None, zero_init_residual)
    mine, ref = ours.state_dict(), theirs.state_dict()
    assert list(mine) == list(ref)  # the checkpoint format: the same names in the same order
    assert all(torch.equal(mine[k], ref[k]) for k in ref)  # the same initial weights from the same seed
    x = torch.randn(4, 3, size, size)
    for mode in (True, False):  # training (BN batch statistics, running stats updated) and eval
        ours.train(mode), theirs.train(mode)
        assert torch.equal(ours(x), theirs(x))
    assert all(torch.equal(a, b) for a, b in zip(ours.state_dict().values(), theirs.state_dict().values()))


def test_a_resnet50s_names_and_shapes_are_torchvisions():
    """A width-64 ResNet-50 loads torchvision's own resnet50 weights (its classifier aside)."""
    import torchvision

    from pipeline.nets.models import build_backbone

    ours = build_backbone({"backbone": "resnet50", "width": 64})
    ref = {k: v.shape for k, v in torchvision.models.resnet50().state_dict().items() if not k.startswith("fc.")}
    assert {k: v.shape for k, v in ours.state_dict().items()} == ref


def test_the_pretraining_and_probe_stages_leave_torchvision_and_dynamo_unimported_through_a_step():
    """A pretraining or probe job's start-up imports torch and what the stage uses: not
    torchvision, whose ops.roi_align imports torch._dynamo (seconds of every job's start-up), and
    its optimizers' first step, zero_grad and state dict do not import torch._dynamo either
    (torch.optim's compile wrappers do)."""
    code = """
import sys, torch, pipeline.pretrain, pipeline.probe
from pipeline.methods.section import Pretrain
from pipeline.methods.build import build_optimizer
from pipeline.probe import LinearProbe
probe = LinearProbe(4, 2, {"lr": 0.1, "weight_decay": 0.0, "epochs": 1, "schedule": "cosine"}, False, 1)
probe.train_batch(torch.randn(8, 4), torch.randint(0, 2, (8,)))
for name in ("sgd", "lars", "adamw"):
    w = torch.nn.Parameter(torch.ones(3, 3))
    opt = build_optimizer(Pretrain(optimizer=name), [w])
    w.grad = torch.ones(3, 3)
    opt.step()
    opt.zero_grad()
    opt.load_state_dict(opt.state_dict())
print(sorted(m for m in ("torchvision", "torch._dynamo", "timm") if m in sys.modules))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
