"""MoCo's models on a backbone: v3 (ResNet or ViT) with its projector and predictor, or v1/v2
with their head and the cell's mechanism (the queue, end-to-end or a memory bank), behind the
BN-leak guard where keys are encoded in a batch of their own."""

from __future__ import annotations

from torch import nn

from pipeline.base.errors import ConfigError
from pipeline.methods.heads import bn_mlp
from pipeline.methods.moco.builder import MoCo
from pipeline.methods.moco.mechanisms import EndToEnd, MemoryBank
from pipeline.methods.moco.v3 import MoCoV3
from pipeline.methods.section import Pretrain
from pipeline.methods.split_bn import default_splits, has_batch_norm, split_batch_norm
from pipeline.nets.method import Encoder, Method
from pipeline.nets.models import feature_dim


def projection_head(in_dim: int, out_dim: int, mlp: bool) -> nn.Module:
    """v1: a linear layer; v2: a 2-layer MLP (hidden = in_dim, ReLU)."""
    if not mlp:
        return nn.Linear(in_dim, out_dim)
    return nn.Sequential(nn.Linear(in_dim, in_dim), nn.ReLU(inplace=True), nn.Linear(in_dim, out_dim))


def bn_splits(p: Pretrain, world_size: int = 1) -> int:
    """Sub-batches in which each rank's BatchNorm normalises its batch (``pretrain.bn_splits``;
    null: 1 across ranks, several in one process, see split_bn.default_splits)."""
    per_rank = p.batch_size // world_size
    splits = p.bn_splits or default_splits(per_rank, world_size)
    if per_rank % splits:
        raise ConfigError(f"pretrain.bn_splits={splits} does not divide the batch of each rank ({per_rank})")
    return splits


def guarded_encoder(encoder: Encoder, p: Pretrain, world_size: int) -> Encoder:
    """The BN-leak guard's geometry for the mechanisms whose keys come from an encoder (the
    queue and end-to-end): split BN where one rank's batch would be one BN batch."""
    if not has_batch_norm(encoder):
        return encoder  # GroupNorm / LayerNorm: nothing can leak through batch statistics
    splits = bn_splits(p, world_size)
    if p.shuffle_bn and world_size == 1 and splits == 1:
        raise ConfigError(
            "pretrain.shuffle_bn: in one process the BN-leak guard needs bn_splits >= 2 "
            f"(the batch of {p.batch_size} is one BN batch otherwise); set bn_splits, "
            "or shuffle_bn: false to train without the guard"
        )
    return split_batch_norm(encoder, splits)


def build_moco(p: Pretrain, backbone: nn.Module, num_samples: int, world_size: int) -> Method:
    """MoCo v3 (ResNet or ViT), or v1/v2 with its mechanism: the queue, end-to-end or a memory bank."""
    dim, feat = p.dim, feature_dim(backbone)
    if p.variant == "v3":
        hidden, vit = p.mlp_dim, p.is_vit
        projector = bn_mlp(3 if vit else 2, feat, hidden, dim)
        # the reference's ResNet predictor ends in a Linear, its ViT predictor in a BN
        predictor = bn_mlp(2, dim, hidden, dim, last_bn=vit)
        return MoCoV3(Encoder(backbone, projector), predictor, T=p.T, m=p.m)
    head = projection_head(feat, dim, mlp=p.variant == "v2")
    encoder = Encoder(backbone, head)
    if p.mechanism == "memory_bank":  # positives come from the bank: no key batch to guard
        return MemoryBank(encoder, num_samples, dim=dim, K=p.K, m=p.bank_m, T=p.T)
    encoder = guarded_encoder(encoder, p, world_size)
    if p.mechanism == "end_to_end":
        return EndToEnd(encoder, T=p.T, shuffle_bn=p.shuffle_bn)
    return MoCo(
        encoder,
        dim=dim,
        K=p.K,
        m=p.m,
        T=p.T,
        shuffle_bn=p.shuffle_bn,
        mask_same_source=p.mask_same_source,
        queue_policy=p.queue_policy,
        seed=p.seed,
        batch_size=p.batch_size,
        symmetric=p.symmetric,
    )
