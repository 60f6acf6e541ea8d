"""Photometric augmentation recipes, batched with per-sample randomness (kornia).

The geometric part (random resized crop + flip) is fused with decoding in the loader; what
is here runs on the training device on uint8 NCHW batches and returns normalised floats.
"""

from __future__ import annotations

import kornia.augmentation as K
import torch
from torch import nn

# Statistics of the embedded dataset are close enough to ImageNet's for normalisation.
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


def _blur_kernel(crop_size: int) -> int:
    k = max(3, int(0.1 * crop_size))  # ~10% of the image side, as in the papers
    return k if k % 2 == 1 else k + 1


def _jitter(brightness, contrast, saturation, hue, p: float, scale: float) -> K.ColorJitter:
    """A recipe's colour jitter at ``scale`` times its strengths (hue at most 0.5: a full turn)."""
    s = scale
    return K.ColorJitter(brightness * s, contrast * s, saturation * s, min(hue * s, 0.5), p=p)


def recipe(name: str, crop_size: int, jitter_scale: float = 1.0) -> nn.Module:
    """The photometric part of each paper's augmentation (the official code's parameters):

    ``v1`` (MoCo v1): grayscale p=0.2, then colour jitter 0.4/0.4/0.4/0.4 always.
    ``v2`` (aug+ of MoCo v2 / SimCLR): jitter (0.4, 0.4, 0.4, 0.1) p=0.8, grayscale p=0.2,
    Gaussian blur sigma 0.1-2 p=0.5. ``v3a``/``v3b``: the two asymmetric views of MoCo v3
    (BYOL's recipe): jitter (0.4, 0.4, 0.2, 0.1) p=0.8, grayscale p=0.2, then blur p=1.0 (a)
    or blur p=0.1 + solarize (threshold 0.5) p=0.2 (b). ``cifar``: the MoCo CIFAR-10 demo's
    (moco colab-notebook branch): v2 without the blur. ``none``: normalisation only.
    kornia draws every parameter per sample; the jitter order is drawn once per batch.
    ``jitter_scale`` multiplies every jitter strength: 2 turns v2's (0.4, 0.4, 0.4, 0.1) into
    SimCLR's strength 1.0 (0.8, 0.8, 0.8, 0.2), which keeps colour from identifying an image."""
    k = _blur_kernel(crop_size)
    jitter = _jitter(0.4, 0.4, 0.2, 0.1, p=0.8, scale=jitter_scale)
    if name == "v3a":
        ops = [jitter, K.RandomGrayscale(p=0.2), K.RandomGaussianBlur((k, k), sigma=(0.1, 2.0), p=1.0)]
    elif name == "v3b":
        ops = [
            jitter,
            K.RandomGrayscale(p=0.2),
            K.RandomGaussianBlur((k, k), sigma=(0.1, 2.0), p=0.1),
            K.RandomSolarize(thresholds=0.0, additions=0.0, p=0.2),
        ]
    elif name == "v1":
        ops = [K.RandomGrayscale(p=0.2), _jitter(0.4, 0.4, 0.4, 0.4, p=1.0, scale=jitter_scale)]
    elif name == "v2":
        ops = [
            _jitter(0.4, 0.4, 0.4, 0.1, p=0.8, scale=jitter_scale),
            K.RandomGrayscale(p=0.2),
            K.RandomGaussianBlur((k, k), sigma=(0.1, 2.0), p=0.5),
        ]
    elif name == "cifar":
        ops = [_jitter(0.4, 0.4, 0.4, 0.1, p=0.8, scale=jitter_scale), K.RandomGrayscale(p=0.2)]
    elif name == "none":
        ops = []
    else:
        raise ValueError(f"unknown augmentation recipe '{name}' (v1, v2, v3a, v3b, cifar, none; v3 = v3a + v3b)")
    return Photometric(ops)


def view_recipes(name: str, crop_size: int, jitter_scale: float = 1.0) -> tuple[nn.Module, nn.Module]:
    """The augmentation of each of the two views (identical recipes except for v3)."""
    if name == "v3":
        return recipe("v3a", crop_size, jitter_scale), recipe("v3b", crop_size, jitter_scale)
    aug = recipe(name, crop_size, jitter_scale)
    return aug, aug


class DeviceCrop(nn.Module):
    """Random resized crop + flip on the device with torch's RNG, for the loader mode that
    decodes whole images: slower than FFCV's fused crop, but bit-for-bit reproducible."""

    def __init__(self, crop_size: int, scale_min: float):
        super().__init__()
        self.ops = K.AugmentationSequential(
            K.RandomResizedCrop((crop_size, crop_size), scale=(scale_min, 1.0)), K.RandomHorizontalFlip()
        )

    @torch.no_grad()
    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return (self.ops(images.float()).round_().clamp_(0, 255)).to(torch.uint8)


class Photometric(nn.Module):
    """uint8 NCHW -> augmented, normalised float NCHW."""

    def __init__(self, ops: list[K.IntensityAugmentationBase2D]):
        super().__init__()
        self.ops = K.AugmentationSequential(*ops) if ops else nn.Identity()
        self.register_buffer("mean", torch.tensor(MEAN).view(1, 3, 1, 1))
        self.register_buffer("std", torch.tensor(STD).view(1, 3, 1, 1))

    @torch.no_grad()
    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = images.float().div_(255.0)
        x = self.ops(x)
        return (x - self.mean) / self.std


def normalize(images: torch.Tensor) -> torch.Tensor:
    """uint8 NCHW -> normalised float NCHW, no augmentation (evaluation)."""
    mean = torch.tensor(MEAN, device=images.device).view(1, 3, 1, 1)
    std = torch.tensor(STD, device=images.device).view(1, 3, 1, 1)
    return (images.float() / 255.0 - mean) / std
