"""MoCo v1/v2/v3 as a pretraining method: its registry entry and its config rules (its own keys: keys.py).
Its algorithm is beside this file (builder.py: Algorithm 1; v3.py; mechanisms.py: the paper's
end-to-end and memory bank; queue.py, staleness.py), its model on a backbone in model.py (torch,
imported when built); the parts it shares with other methods (the momentum target, InfoNCE, split
BN, gathering across ranks) are in pipeline/methods/ beside the methods.

Standard library only: the DAG reads the entry.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pipeline.base.errors import ConfigError
from pipeline.base.layout import VITS
from pipeline.methods.registry import CROSS_ENTROPY_METRICS, MethodSpec, register

if TYPE_CHECKING:
    from torch import nn

    from pipeline.methods.section import Pretrain
    from pipeline.nets.method import Method


def has_queue(p: Pretrain) -> bool:
    """MoCo v1/v2 keep their negatives in a queue; v3 and the other mechanisms do not."""
    return p.variant != "v3" and p.mechanism == "moco"


# MoCo v3's rule (moco-v3's main_moco.py and CONFIG.md): lr = base lr x B/256 by the optimiser of
# its backbone: LARS 0.6 for ResNets (the 100-epoch recipe), AdamW 1.5e-4 for ViTs; warmup 10 of
# 100 epochs (ResNet), 40 of 300 (ViT), as shares of the cell's epochs
V3_RESNET = {"optimizer": "lars", "base_lr": 0.6, "weight_decay": 1e-6, "warmup_share": 10 / 100, "T": 1.0}
V3_VIT = {"optimizer": "adamw", "base_lr": 1.5e-4, "weight_decay": 0.1, "warmup_share": 40 / 300, "T": 0.2}
# below these a v3 cell is at an SGD recipe's scale (MoCo v2: 0.06 per 256 images) and cannot
# learn: LARS moves a weight by lr x trust of its norm a step (the published LARS recipes: 0.2 to
# 0.6 per 256 images); AdamW by ~lr per weight whatever the gradient (theirs: 1.5e-4 per 256)
LARS_MIN_BASE_LR, ADAMW_MAX_LR = 0.1, 0.01
PAPER_BACKBONES = ("resnet50", "vit_small", "vit_base")  # MoCo v3's, with its 4096-wide heads


def recipe(cell: dict) -> dict:
    """MoCo's recipe where a cell switches to v3 (a v1/v2 cell keeps the base cell's settings):
    its paper's rule for the cell's backbone (V3_RESNET, V3_VIT), m 0.99 -> 1 on a cosine, BYOL's
    asymmetric augmentation (aug v3); the projector and predictor 4096 wide on the paper's
    backbones, 256 on the small ones (as SimCLR's and BYOL's heads here)."""
    if cell.get("variant") != "v3":
        return {}
    rule = V3_VIT if cell["backbone"] in VITS else V3_RESNET
    return {
        "optimizer": rule["optimizer"],
        "lr": rule["base_lr"] * cell["batch_size"] / 256,
        "weight_decay": rule["weight_decay"],
        "warmup_epochs": round(rule["warmup_share"] * cell["epochs"], 2),
        "T": rule["T"],
        "m": 0.99,
        "aug": "v3",
        "mlp_dim": 4096 if cell["backbone"] in PAPER_BACKBONES else 256,
        "symmetric": False,  # v1/v2's option: v3's loss is symmetric already
    }


def check(p: Pretrain, where: str, num_samples: int | None) -> None:
    """MoCo's cross-field rules."""
    if p.is_vit and p.variant != "v3":
        raise ConfigError(f"{where}: backbone {p.backbone} needs variant v3 (the ViT adaptation)")
    if p.variant == "v3" and p.mechanism != "moco":
        raise ConfigError(f"{where}: mechanism {p.mechanism} applies to v1/v2, not v3")
    check_v3_lr(p, where)
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


# grid.v3_resnet and grid.v3_vit: v3's recipe over its paper's rule, per backbone; their defaults
# are its recipe on the embedded data, where the rule does not learn there: chosen on held-out
# training images by a rule fixed before the runs (docs/studies/2026-12-07-v3-recipes.md). The
# ResNet's: LARS's trust coefficient x 20 (worst margin over random init: the rule's +7.9, this
# +20.4); the ViT's: AdamW at lr 1e-3 (the rule's +1.3, this +9.2: the best found, below the bar)
EMBEDDED_V3: dict[str, dict[str, Any]] = {"v3_resnet": {"lars_trust": 0.02}, "v3_vit": {"lr": 1e-3}}


def v3_slot(cell: dict) -> str | None:
    """The grid slot of a v3 cell's recipe, by its backbone; v1/v2 cells take the base cell's."""
    if cell.get("variant") != "v3":
        return None
    return "v3_vit" if cell["backbone"] in VITS else "v3_resnet"


def check_v3_lr(p: Pretrain, where: str) -> None:
    """Refuse a v3 cell at an SGD recipe's learning rate under LARS or AdamW: it trains, and
    learns nothing (the workflow gives a cell that switches to v3 its recipe; this catches an lr
    stated beside it, or a stage run by hand)."""
    optimizer = p.optimizer_name
    if p.variant != "v3" or optimizer == "sgd":
        return
    per_256 = p.lr * 256 / p.batch_size
    if (optimizer == "lars" and per_256 < LARS_MIN_BASE_LR) or (optimizer == "adamw" and p.lr >= ADAMW_MAX_LR):
        rule = recipe({"variant": "v3", "backbone": p.backbone, "batch_size": p.batch_size, "epochs": p.epochs})
        raise ConfigError(
            f"{where}: variant v3 under {optimizer} (pretrain.optimizer={p.optimizer}) at pretrain.lr={p.lr:g} "
            f"does not learn: an SGD recipe's scale (MoCo v1/v2). Set pretrain.lr by v3's rule ({rule['lr']:g} "
            f"at batch {p.batch_size}), or leave lr, optimizer, weight_decay, warmup_epochs and T at their "
            "defaults: the workflow then gives the cell v3's recipe (docs/methods.md)"
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
        recipe=recipe,
        recipe_slots=EMBEDDED_V3,
        slot_of=v3_slot,
        metrics=CROSS_ENTROPY_METRICS,
    )
)
