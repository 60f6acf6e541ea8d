"""MoCo v1/v2/v3 as a pretraining method: its registry entry and its config rules. The model is
built in .model (torch) from the algorithm core, pipeline.moco; v1/v2 also run the paper's
other mechanisms for comparison (end-to-end, memory bank: ``pretrain.mechanism``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipeline.dag.errors import ConfigError
from pipeline.methods.registry import MethodSpec, register

if TYPE_CHECKING:
    from torch import nn

    from pipeline.dag.sections import Pretrain
    from pipeline.nets.method import Method


def has_queue(p: Pretrain) -> bool:
    """MoCo v1/v2 keep their negatives in a queue; v3 and the other mechanisms do not."""
    return p.variant != "v3" and p.mechanism == "moco"


def check(p: Pretrain, where: str, num_samples: int | None) -> None:
    """MoCo's cross-field rules."""
    if p.is_vit and p.variant != "v3":
        raise ConfigError(f"{where}: backbone {p.backbone} needs variant v3 (the ViT adaptation)")
    if p.variant == "v3" and p.mechanism != "moco":
        raise ConfigError(f"{where}: mechanism {p.mechanism} applies to v1/v2, not v3")
    if p.mechanism == "memory_bank" and num_samples is not None and p.K >= num_samples:
        raise ConfigError(f"{where}: memory bank K={p.K} negatives need a larger training set ({num_samples} images)")
    if p.bn_splits and p.batch_size % p.bn_splits:
        raise ConfigError(
            f"{where}: bn_splits={p.bn_splits} does not divide the batch size {p.batch_size} "
            f"(BatchNorm normalises each rank's batch in that many equal sub-batches)"
        )
    if p.symmetric and not p.has_queue:
        raise ConfigError(f"{where}: symmetric applies to MoCo v1/v2's queue (v3's loss is symmetric already)")
    if not p.has_queue:
        return
    keys = p.batch_size * (1 + p.symmetric)  # per step: the symmetric loss enqueues both views' keys
    if p.K % keys != 0:
        raise ConfigError(
            f"{where}: K={p.K} is not a multiple of {'2 x ' * p.symmetric}the global batch size "
            f"{p.batch_size} (the keys enqueued per step: the queue is refilled whole batches at a time); "
            f"use e.g. K={max(1, p.K // keys) * keys}"
        )


def build(p: Pretrain, backbone: nn.Module, num_classes: int, num_samples: int, world_size: int) -> Method:
    from pipeline.methods.moco.model import build_moco

    return build_moco(p, backbone, num_samples, world_size)


ENTRY = register(MethodSpec("moco", "MoCo", 10, build, moco=True, has_queue=has_queue, check=check))
