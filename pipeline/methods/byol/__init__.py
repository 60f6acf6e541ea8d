"""BYOL as a pretraining method: its registry entry and its recipe (its own key: keys.py). The
model (an online encoder and predictor regressing the momentum target, no negatives) is in
.model (torch), imported when built.

It shares m (its target decay tau: 0.996 in the paper, raised to 1 by a cosine), dim and mlp_dim
(its projector and predictor, Linear-BN-ReLU-Linear) with the other methods, and owns
``predictor`` (false: the ablation without a predictor, which the BYOL paper reports collapses).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipeline.methods.registry import MethodSpec, Metric, register

if TYPE_CHECKING:
    from torch import nn

    from pipeline.methods.section import Pretrain
    from pipeline.nets.method import Method


def optimizer(p: Pretrain) -> str:
    """BYOL's recipe: LARS (lr 0.2 x B/256, weight decay 1.5e-6)."""
    return "lars"


def recipe(cell: dict) -> dict:
    """BYOL's recipe (its paper, 3.3 and Appendix C): LARS, lr 0.2 x B/256, weight decay 1.5e-6;
    tau 0.996 -> 1 in the paper over 300 epochs, here 0.99 -> 1 (its window of ~100 steps fits the
    base budget's 520, as MoCo's m = 0.99 does; 0.996's 250 would be half the run); heads 256 wide."""
    return {
        "optimizer": "lars",
        "lr": 0.2 * cell["batch_size"] / 256,
        "weight_decay": 1.5e-6,
        "m": 0.99,
        "mlp_dim": 256,
    }


def build(p: Pretrain, backbone: nn.Module, num_classes: int, num_samples: int, world_size: int) -> Method:
    from pipeline.methods.byol.model import BYOL
    from pipeline.methods.heads import bn_mlp
    from pipeline.nets.method import Encoder
    from pipeline.nets.models import feature_dim

    projector = bn_mlp(2, feature_dim(backbone), p.mlp_dim, p.dim, last_bn=False)
    predictor = bn_mlp(2, p.dim, p.mlp_dim, p.dim, last_bn=False) if p.predictor else None
    return BYOL(Encoder(backbone, projector), predictor, m=p.m)


# its collapse measure (pipeline.methods.byol.model.spread: 0 collapsed, ~1 spread), drawn x 100 on the % axis
SPREAD = Metric("spread", "output spread x 100 (pretext)", scale=100)
# on the embedded data the paper's rule (LARS at lr 0.05, weight decay 1.5e-6) stays at random init's
# level: SGD with the base cell's weight decay learns, at lr 0.12 +17 points above random init on
# average over 5 held-out seeds (+8 to +28; studies.recipe's byol_bg1_sgd_lr0.12, chosen
# again over lr 0.24, tau 0.996 and SimCLR's colour strength)
EMBEDDED = {"optimizer": "sgd", "lr": 0.12, "weight_decay": 5e-4}
ENTRY = register(
    MethodSpec(
        "byol",
        "BYOL",
        14,
        build,
        optimizer=optimizer,
        recipe=recipe,
        recipe_slots={"byol": EMBEDDED},
        metrics=(SPREAD,),
    )
)
