"""SimCLR as a pretraining method: its registry entry and its config rules. The model (NT-Xent
over the batch's 2N - 2 other views, one encoder) is in .model (torch), imported when built.

Its keys are the shared ones: T (its temperature, 0.1 in the paper), dim and mlp_dim (its
projection head: Linear-BN-ReLU-Linear-BN, hidden mlp_dim). Its negatives are the batch: the
batch size is its dictionary size, which is what the seeds' comparison with MoCo's queue varies.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipeline.methods.registry import CROSS_ENTROPY_METRICS, MethodSpec, register

if TYPE_CHECKING:
    from torch import nn

    from pipeline.dag.sections import Pretrain
    from pipeline.nets.method import Method


def optimizer(p: Pretrain) -> str:
    """SimCLR's recipe: LARS (lr 0.3 x B/256, weight decay 1e-6)."""
    return "lars"


def recipe(cell: dict) -> dict:
    """SimCLR's recipe (its paper, Appendix B.1): LARS, lr 0.3 x B/256, weight decay 1e-6, T 0.1;
    the projection head 256 wide on the embedded data's 128 features (2048 on ResNet-50's)."""
    return {"optimizer": "lars", "lr": 0.3 * cell["batch_size"] / 256, "weight_decay": 1e-6, "T": 0.1, "mlp_dim": 256}


def build(p: Pretrain, backbone: nn.Module, num_classes: int, num_samples: int, world_size: int) -> Method:
    from pipeline.methods.heads import bn_mlp
    from pipeline.methods.simclr.model import SimCLR
    from pipeline.nets.method import Encoder
    from pipeline.nets.models import feature_dim

    head = bn_mlp(2, feature_dim(backbone), p.mlp_dim, p.dim)
    return SimCLR(Encoder(backbone, head), T=p.T)


ENTRY = register(
    MethodSpec("simclr", "SimCLR", 12, build, optimizer=optimizer, recipe=recipe, metrics=CROSS_ENTROPY_METRICS)
)
