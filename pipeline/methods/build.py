"""The model a pretraining cell trains: a new backbone (the checkpoint's arch record) and its
method's ``build`` (pipeline.methods: each method's entry); and the optimiser and learning-rate
schedule it trains with (from pipeline.nets.optim's parts).

Every model has ``encoder_q.backbone`` (what transfers) and
``forward(x1, x2, index, labels) -> (loss, logits, target)``.
"""

from __future__ import annotations

import torch
from torch import nn

from pipeline.base.errors import ConfigError
from pipeline.base.layout import VITS, is_resnet
from pipeline.methods.section import Pretrain
from pipeline.methods.split_bn import has_batch_norm, max_splits
from pipeline.nets.method import Method
from pipeline.nets.models import build_backbone
from pipeline.nets.optim import LARS, SGD, STEP_DROPS, AdamW, Schedule, share_of


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


def check_global_bn(model: Method, p: Pretrain, device: torch.device, world_size: int) -> None:
    """A method that normalises over the global batch (SimCLR, BYOL, MoCo v3: SyncBN) across CPU
    ranks is refused: torch syncs BatchNorm on GPUs only, so each rank would normalise its own
    images alone (SimCLR's positives against its local negatives' statistics only)."""
    if not model.sync_batch_norm or world_size < 2 or device.type == "cuda" or not has_batch_norm(model):
        return
    raise ConfigError(
        f"pretrain.method={p.method}{' variant=' + p.variant if p.is_moco else ''} normalises over the global "
        f"batch (SyncBN), which torch runs on GPU ranks only: on {world_size} CPU ranks each would normalise "
        f"its own {p.batch_size // world_size} images instead of the batch of {p.batch_size}. Train it in one "
        "process on CPU (the pretrain rule's tasks / tasks_per_node: 1 in the profile, launch.slurm.tasks_per_node: "
        "1), or on GPUs"
    )


def build_model(p: Pretrain, image_size: int, num_classes: int, num_samples: int, world_size: int = 1) -> Method:
    """The model of the cell's method (its entry's ``build``) on a new backbone."""
    # MoCo v3's ResNet starts each residual branch at zero (zero_init_residual, as its reference);
    # its ViT keeps the random patch projection (unset: MoCo only, a supervised ViT trains it)
    v3_resnet = p.is_moco and p.variant == "v3" and is_resnet(p.backbone)
    frozen_patches = p.is_moco if p.freeze_patch_embed is None else p.freeze_patch_embed
    backbone = build_backbone(arch_of(p, image_size), zero_init_residual=v3_resnet, freeze_patch_embed=frozen_patches)
    return p.spec.builder()(p, backbone, num_classes, num_samples, world_size)


def build_optimizer(p: Pretrain, params) -> torch.optim.Optimizer:
    params = [t for t in params if t.requires_grad]  # never the key encoder nor frozen parts
    name, wd = p.optimizer_name, p.weight_decay
    if name == "sgd":
        return SGD(params, lr=p.lr, momentum=p.sgd_momentum, weight_decay=wd)
    if name == "lars":
        return LARS(params, lr=p.lr, weight_decay=wd, momentum=p.sgd_momentum, trust_coefficient=p.lars_trust)
    if name == "adamw":
        return AdamW(params, lr=p.lr, weight_decay=wd)
    raise ValueError(f"unknown optimizer '{name}' (sgd, lars, adamw)")


def pretrain_schedule(p: Pretrain, steps_per_epoch: int) -> Schedule:
    """Pretraining's schedule: ``warmup_epochs``, then cosine, or x0.1 at each of
    ``lr_step_epochs`` (torchvision's 30/60 of 90), else at STEP_DROPS."""
    total = steps_per_epoch * p.epochs
    if p.lr_step_epochs:
        drops = tuple(float(e * steps_per_epoch) for e in p.lr_step_epochs)
    else:
        drops = share_of(total, STEP_DROPS)
    return Schedule(total, p.schedule, p.warmup_epochs * steps_per_epoch, drops)
