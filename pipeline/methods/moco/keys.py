"""MoCo's own pretrain keys, declared apart from its entry (the Pretrain section,
pipeline.methods.section, holds them beside the shared keys; the entry reads that section).

Standard library only."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.base.keys import key
from pipeline.base.layout import QUEUE_POLICIES


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
