"""MoCo v1/v2/v3 as a pretraining method: its registry entry, its own keys and its config rules.
Its algorithm is beside this file (builder.py: Algorithm 1; v3.py; mechanisms.py: the paper's
end-to-end and memory bank; queue.py, staleness.py), its model on a backbone in model.py (torch,
imported when built); the parts it shares with other methods (the momentum target, InfoNCE, split
BN, gathering across ranks) are in pipeline/methods/ beside the methods.

Standard library only: the DAG reads the entry and the keys.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from pipeline.dag.errors import ConfigError
from pipeline.dag.keys import key
from pipeline.dag.layout import QUEUE_POLICIES
from pipeline.methods.registry import CROSS_ENTROPY_METRICS, MethodSpec, register

if TYPE_CHECKING:
    from torch import nn

    from pipeline.dag.sections import Pretrain
    from pipeline.nets.method import Method


@dataclass(frozen=True, kw_only=True)
class MocoKeys:
    """MoCo's own pretrain keys (m, T, dim and mlp_dim are shared with other methods)."""

    variant: str = key(
        "v2",
        "v1 (linear head), v2 (MLP head, aug+, cosine), v3 (no queue, predictor, symmetric loss)",
        enum=["v1", "v2", "v3"],
    )
    mechanism: str = key(
        "moco",
        "how negatives are produced (MoCo paper, Figure 3); v1/v2 only",
        enum=["moco", "end_to_end", "memory_bank"],
    )
    K: int = key(256, "queue size (number of negatives); a multiple of the global batch", minimum=1, maximum=2**24)
    mask_same_source: bool = key(False)
    symmetric: bool = key(False, "v1/v2: add the loss with the two views swapped (2B keys enqueued per step)")
    queue_policy: str = key(
        "fifo",
        "how a new key takes a queue slot: fifo (the oldest, the paper's) or random (a seeded uniform draw, "
        "for the staleness study)",
        enum=list(QUEUE_POLICIES),
    )
    shuffle_bn: bool = key(
        True,
        "the BN-leak guard (MoCo paper 3.3, v1/v2 and end-to-end): keys shuffled across ranks and across "
        "each rank's split-BN sub-batches around the key encoder; ignored without BatchNorm",
    )
    bn_splits: int | None = key(
        None,
        "sub-batches in which BatchNorm normalises each rank's batch (v1/v2 and end-to-end); null = 1 across "
        "ranks, in one process the most (up to 8) of at least 16 images",
        minimum=1,
        maximum=64,
    )
    bank_m: float = key(0.5, "momentum of memory-bank entries", minimum=0, maximum=1)


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


ENTRY = register(
    MethodSpec(
        "moco",
        "MoCo",
        10,
        build,
        moco=True,
        has_queue=has_queue,
        check=check,
        keys=MocoKeys,
        metrics=CROSS_ENTROPY_METRICS,
    )
)
