"""How the ranks share a detection trial: the batch split evenly over them, BatchNorm made
SyncBatchNorm across GPU ranks, and the sentence that says which statistics normalise the
fine-tuned features over how many images."""

from __future__ import annotations

import torch
from torch import nn

from pipeline.dag.config import ConfigError
from pipeline.dag.sections import Detect


def sync_batchnorm(detector: nn.Module, dc: Detect, world_size: int, device: torch.device) -> tuple[nn.Module, bool]:
    """(the detector, whether synced): with BN fine-tuned over several GPU ranks, every
    BatchNorm becomes SyncBatchNorm (statistics over the images of every rank: the paper's
    SyncBN); elsewhere (gloo on CPU has no SyncBN) each rank normalises its own images."""
    uses_bn = "bn" in (dc.norm, dc.new_layers_norm)
    synced = world_size > 1 and uses_bn and device.type == "cuda"
    if synced:
        detector = nn.SyncBatchNorm.convert_sync_batchnorm(detector)
    return detector, synced


def per_rank_batch(dc: Detect, world_size: int) -> int:
    """Images per rank and step: detect.batch_size split evenly over the ranks."""
    if dc.batch_size % world_size:
        raise ConfigError(f"detect.batch_size={dc.batch_size} is not a multiple of the {world_size} ranks")
    return dc.batch_size // world_size


def normalisation(dc: Detect, synced: bool, world_size: int) -> str:
    """Which statistics normalise the fine-tuned detector's features, over how many images."""
    per_rank = dc.batch_size // world_size
    ranks = f" on each of {world_size} ranks" if world_size > 1 else ""
    if synced:
        batch_bn = f"SyncBN over {dc.batch_size} images ({world_size} ranks x {per_rank})"
    else:
        batch_bn = f"BN over {per_rank} images{ranks}"
    said = {"frozen_bn": "frozen BN (pretrained statistics)", "none": "none", "gn": "GroupNorm", "bn": batch_bn}
    return f"backbone {said[dc.norm]}, new layers {said[dc.new_layers_norm]}, batch {dc.batch_size}"
