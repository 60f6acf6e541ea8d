"""Backbones: ResNets (pipeline.nets.resnet: torchvision's architecture and names, configurable
width, optional CIFAR stem, BN or GroupNorm) and ViTs (timm, imported when one is built: MoCo
v3's fixed 2D sin-cos position embedding and frozen random patch projection).
"""

from __future__ import annotations

import math
from functools import partial
from typing import TYPE_CHECKING, cast

import torch
from torch import nn

from pipeline.base.layout import VITS
from pipeline.nets.resnet import ResNetBackbone

if TYPE_CHECKING:
    from timm.models.vision_transformer import VisionTransformer  # imported when a ViT is built


def group_norm(channels: int) -> nn.GroupNorm:
    """GroupNorm with 32 groups (fewer for narrow layers): batch-independent normalisation."""
    return nn.GroupNorm(math.gcd(32, channels), channels)


def sincos_2d(grid: int, dim: int, temperature: float = 10000.0) -> torch.Tensor:
    """Fixed 2D sin-cos position embedding (1 x grid*grid x dim), as in MoCo v3."""
    if dim % 4 != 0:
        raise ValueError(f"embedding dim {dim} must be a multiple of 4 for 2D sin-cos")
    y, x = torch.meshgrid(
        torch.arange(grid, dtype=torch.float32), torch.arange(grid, dtype=torch.float32), indexing="ij"
    )
    omega = 1.0 / temperature ** (torch.arange(dim // 4, dtype=torch.float32) / (dim // 4))
    out_x, out_y = x.flatten()[:, None] * omega, y.flatten()[:, None] * omega
    return torch.cat([out_x.sin(), out_x.cos(), out_y.sin(), out_y.cos()], dim=1)[None]


def init_vit_as_moco_v3(vit: VisionTransformer) -> None:
    """MoCo v3's ViT initialisation (timm's differs): xavier-uniform Linear weights, the qkv
    weight as three separate Q, K, V matrices; zero biases; class token N(0, 1e-6); the patch
    projection xavier-uniform over its fan-in (3 p^2) and fan-out (embed_dim)."""
    for name, module in vit.named_modules():
        if isinstance(module, nn.Linear):
            if "qkv" in name:
                out_features, in_features = module.weight.shape
                bound = math.sqrt(6.0 / (out_features // 3 + in_features))
                nn.init.uniform_(module.weight, -bound, bound)
            else:
                nn.init.xavier_uniform_(module.weight)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
    if vit.cls_token is not None:  # global_pool="token": there is one
        nn.init.normal_(vit.cls_token, std=1e-6)
    proj = vit.patch_embed.proj
    bound = math.sqrt(6.0 / (3 * proj.kernel_size[0] * proj.kernel_size[1] + proj.out_channels))
    nn.init.uniform_(proj.weight, -bound, bound)
    nn.init.zeros_(proj.bias)


def feature_dim(backbone: nn.Module) -> int:
    """The size of a backbone's features (``out_dim``, set by build_backbone; torch types a
    module's attributes as Tensor | Module)."""
    return cast(int, backbone.out_dim)


def vit_backbone(arch: dict, freeze_patch_embed: bool = False) -> nn.Module:
    """timm ViT returning the class token, initialised as MoCo v3, with fixed sin-cos positions
    (a buffer, not a parameter). ``freeze_patch_embed``: the patch projection keeps its random
    init (requires_grad=False), MoCo v3's fix for training instability (its stop_grad_conv1)."""
    from timm.models.vision_transformer import VisionTransformer

    dim, depth, heads = VITS[arch["backbone"]]
    depth, heads = arch.get("depth") or depth, arch.get("heads") or heads
    patch, size = arch.get("patch_size", 16), arch.get("image_size", 224)
    vit = VisionTransformer(
        img_size=size,
        patch_size=patch,
        embed_dim=dim,
        depth=depth,
        num_heads=heads,
        num_classes=0,
        global_pool="token",
        norm_layer=partial(nn.LayerNorm, eps=1e-6),
    )
    init_vit_as_moco_v3(vit)
    grid = size // patch
    pos = torch.cat([torch.zeros(1, 1, dim), sincos_2d(grid, dim)], dim=1)  # class token: zeros
    del vit.pos_embed
    vit.register_buffer("pos_embed", pos)
    for p in vit.patch_embed.parameters():
        p.requires_grad_(not freeze_patch_embed)
    vit.out_dim = dim  # type: ignore[assignment]  # the backbones' feature size (feature_dim)
    return vit


def build_backbone(arch: dict, zero_init_residual: bool = False, freeze_patch_embed: bool = False) -> nn.Module:
    """``arch``: the record stored in every checkpoint, e.g. {"backbone": "resnet18",
    "width": 64, "cifar_stem": False, "norm": "bn"} or {"backbone": "vit_small",
    "patch_size": 16, "image_size": 224}. zero_init_residual (ResNets): an initialisation
    choice only, the architecture (and so the checkpoint format) is the same; so is
    freeze_patch_embed (ViTs), a training choice."""
    name = arch["backbone"]
    if name in VITS:
        return vit_backbone(arch, freeze_patch_embed)
    norm = group_norm if arch.get("norm", "bn") == "gn" else None
    return ResNetBackbone(
        name,
        arch.get("width", 64),
        arch.get("cifar_stem", False),
        norm_layer=norm,
        zero_init_residual=zero_init_residual,
    )
