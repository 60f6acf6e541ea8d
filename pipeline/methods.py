"""Which model a pretraining cell trains: MoCo v1/v2/v3, end-to-end, memory bank, supervised.

Every model has ``encoder_q.backbone`` (what transfers) and
``forward(x1, x2, index, labels) -> (loss, logits, target)``.
"""
from __future__ import annotations

from torch import nn
from torch.nn import functional as F

from pipeline.models import Encoder, bn_mlp, build_backbone, projection_head
from pipeline.moco import MoCo
from pipeline.moco.mechanisms import EndToEnd, MemoryBank
from pipeline.moco.v3 import MoCoV3


def arch_of(p: dict, image_size: int | None = None) -> dict:
    """The backbone record stored in checkpoints (enough to rebuild it)."""
    if p["backbone"].startswith("vit"):
        return {"backbone": p["backbone"], "patch_size": p.get("patch_size", 16),
                "image_size": image_size or 224, "depth": p.get("depth")}
    return {"backbone": p["backbone"], "width": p.get("width", 64), "cifar_stem": p.get("cifar_stem", False),
            "norm": p.get("norm", "bn")}


class Supervised(nn.Module):
    """The supervised baseline: the same backbone trained with labels (cross-entropy)."""

    def __init__(self, backbone: nn.Module, num_classes: int):
        super().__init__()
        self.encoder_q = Encoder(backbone, nn.Linear(backbone.out_dim, num_classes))

    def forward(self, x1, x2=None, index=None, labels=None):
        logits = self.encoder_q(x1)
        return F.cross_entropy(logits, labels), logits, labels


def build_model(p: dict, image_size: int, num_classes: int, num_samples: int) -> nn.Module:
    backbone = build_backbone(arch_of(p, image_size))
    dim, feat = p.get("dim", 128), backbone.out_dim
    if p["method"] == "supervised":
        return Supervised(backbone, num_classes)
    mechanism, variant = p.get("mechanism", "moco"), p.get("variant", "v2")
    if variant == "v3":
        hidden = p.get("mlp_dim", 4096)
        projector = bn_mlp(3 if p["backbone"].startswith("vit") else 2, feat, hidden, dim)
        return MoCoV3(Encoder(backbone, projector), bn_mlp(2, dim, hidden, dim), T=p["T"], m=p["m"])
    head = projection_head(feat, dim, mlp=variant == "v2")
    encoder = Encoder(backbone, head)
    if mechanism == "end_to_end":
        return EndToEnd(encoder, T=p["T"])
    if mechanism == "memory_bank":
        return MemoryBank(encoder, num_samples, dim=dim, K=p["K"], m=p.get("bank_m", 0.5), T=p["T"])
    return MoCo(encoder, dim=dim, K=p["K"], m=p["m"], T=p["T"], shuffle_bn=p.get("shuffle_bn", True),
                mask_same_source=p.get("mask_same_source", False))


