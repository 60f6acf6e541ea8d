"""Which model a pretraining cell trains: MoCo v1/v2/v3, end-to-end, memory bank, supervised;
each method's builder is named in pipeline.dag.method_registry.

Every model has ``encoder_q.backbone`` (what transfers) and
``forward(x1, x2, index, labels) -> (loss, logits, target)``.
"""

from __future__ import annotations

from torch import nn
from torch.nn import functional as F

from pipeline.dag.config import ConfigError
from pipeline.dag.layout import VITS, is_resnet
from pipeline.dag.sections import Pretrain
from pipeline.moco import MoCo
from pipeline.moco.mechanisms import EndToEnd, MemoryBank
from pipeline.moco.method import Method
from pipeline.moco.split_bn import default_splits, has_batch_norm, max_splits, split_batch_norm
from pipeline.moco.v3 import MoCoV3
from pipeline.nets.models import Encoder, bn_mlp, build_backbone, feature_dim, projection_head


def arch_of(p: Pretrain, image_size: int | None = None) -> dict:
    """The backbone record stored in checkpoints (enough to rebuild it)."""
    if p.is_vit:
        return {
            "backbone": p.backbone,
            "patch_size": p.patch_size,
            "image_size": image_size or 224,
            "depth": p.depth,
            "heads": VITS[p.backbone][2],
        }
    return {"backbone": p.backbone, "width": p.width, "cifar_stem": p.cifar_stem, "norm": p.norm}


class Supervised(Method):
    """The supervised baseline: the same backbone trained with labels (cross-entropy)."""

    def __init__(self, backbone: nn.Module, num_classes: int):
        super().__init__()
        self.encoder_q = Encoder(backbone, nn.Linear(feature_dim(backbone), num_classes))

    def forward(self, x1, x2=None, index=None, labels=None):
        logits = self.encoder_q(x1)
        return F.cross_entropy(logits, labels), logits, labels


def bn_splits(p: Pretrain, world_size: int = 1) -> int:
    """Sub-batches in which each rank's BatchNorm normalises its batch (``pretrain.bn_splits``;
    null: 1 across ranks, several in one process, see split_bn.default_splits)."""
    per_rank = p.batch_size // world_size
    splits = p.bn_splits or default_splits(per_rank, world_size)
    if per_rank % splits:
        raise ConfigError(f"pretrain.bn_splits={splits} does not divide the batch of each rank ({per_rank})")
    return splits


def guarded_encoder(encoder: Encoder, p: Pretrain, world_size: int) -> Encoder:
    """The BN-leak guard's geometry for the methods whose keys come from an encoder (MoCo v1/v2
    and end-to-end): split BN where one rank's batch would be one BN batch."""
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


def bn_guard_text(model: nn.Module, world_size: int) -> str:
    """How the keys of this model are kept from the BN statistics of their queries (for the log)."""
    if model.shuffle_bn is None:
        return "not applicable (no key batch normalised apart from its queries)"
    if not model.shuffle_bn:
        return "off (shuffle_bn: false)" if has_batch_norm(model) else "not needed (no BatchNorm)"
    splits = max_splits(model)
    where = [f"{world_size} ranks"] if world_size > 1 else []
    where += [f"{splits} BN sub-batches per rank"] if splits > 1 else []
    return "keys shuffled across " + " x ".join(where)


def build_model(p: Pretrain, image_size: int, num_classes: int, num_samples: int, world_size: int = 1) -> Method:
    """The model of the cell's method (pipeline.dag.method_registry: its builder) on a new backbone."""
    # MoCo v3's ResNet starts each residual branch at zero (zero_init_residual, as its reference);
    # its ViT keeps the random patch projection (unset: MoCo only, a supervised ViT trains it)
    v3_resnet = p.is_moco and p.variant == "v3" and is_resnet(p.backbone)
    frozen_patches = p.is_moco if p.freeze_patch_embed is None else p.freeze_patch_embed
    backbone = build_backbone(arch_of(p, image_size), zero_init_residual=v3_resnet, freeze_patch_embed=frozen_patches)
    build = p.spec.build_function()
    return build(p, backbone, num_classes=num_classes, num_samples=num_samples, world_size=world_size)


def build_supervised(p: Pretrain, backbone: nn.Module, num_classes: int, num_samples: int, world_size: int) -> Method:
    return Supervised(backbone, num_classes)


def build_moco(p: Pretrain, backbone: nn.Module, num_classes: int, num_samples: int, world_size: int) -> Method:
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
