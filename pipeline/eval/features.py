"""Frozen-backbone feature extraction over an FFCV split (evaluation view, no augmentation)."""

from __future__ import annotations

import torch

from pipeline.data.augment import normalize
from pipeline.data.loaders import Centre, Reading, eval_loader


def extract(
    backbone: torch.nn.Module,
    beton,
    crop_size: int,
    workers: int = 2,
    batch_size: int = 512,
    threads: int | None = None,
    device=None,
    loader: str = "ffcv",
    crop_ratio: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(features N x D, labels N) in file order, on ``device`` (default: the backbone's), of
    the centre view (crop_ratio: its side over the shorter side, see data.eval_loader)."""
    reading = Reading(batch_size=batch_size, loader=loader, workers=workers, threads=threads)
    batches = eval_loader(beton, Centre(crop_size=crop_size, ratio=crop_ratio), reading)
    return features_of(backbone, batches, device)


@torch.no_grad()
def features_of(backbone: torch.nn.Module, batches, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(features, labels) of an evaluation loader's batches; reuse one loader for repeated
    extractions (e.g. the kNN monitor): each new FFCV loader compiles its pipeline again."""
    backbone.eval()
    device = device or next(backbone.parameters()).device
    feats, labels = [], []
    for images, y, _ in batches:
        feats.append(backbone(normalize(images.to(device))))
        labels.append(y.to(device, torch.long).clone())
    return torch.cat(feats), torch.cat(labels)
