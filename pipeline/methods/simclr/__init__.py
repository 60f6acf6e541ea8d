"""SimCLR as a pretraining method: its registry entry and its config rules. The model (NT-Xent
over the batch's 2N - 2 other views, one encoder) is in .model (torch), imported when built.

It shares T (its temperature, 0.1 in the paper), dim and mlp_dim (its projection head:
Linear-BN-ReLU-Linear-BN, hidden mlp_dim) with the other methods. Its negatives are the batch:
the batch size is its dictionary size. It owns ``negatives`` (how many of them each view keeps):
fewer negatives at the same batch, steps and lr, the claims' test of what the number of negatives
alone does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipeline.base.errors import ConfigError
from pipeline.methods.registry import CROSS_ENTROPY_METRICS, MethodSpec, register

if TYPE_CHECKING:
    from torch import nn

    from pipeline.methods.section import Pretrain
    from pipeline.nets.method import Method


def check(p: Pretrain, where: str, num_samples: int | None) -> None:
    """A view has 2B - 2 negatives in a global batch of B."""
    if p.method == "simclr" and p.negatives is not None and p.negatives > 2 * p.batch_size - 2:
        raise ConfigError(
            f"{where}: negatives={p.negatives} is more than a view has at batch_size {p.batch_size} "
            f"({2 * p.batch_size - 2}: the other views but its positive)"
        )


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
    return SimCLR(Encoder(backbone, head), T=p.T, negatives=p.negatives)


ENTRY = register(
    MethodSpec(
        "simclr",
        "SimCLR",
        12,
        build,
        optimizer=optimizer,
        check=check,
        recipe=recipe,
        metrics=CROSS_ENTROPY_METRICS,
    )
)
