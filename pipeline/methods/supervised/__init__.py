"""The supervised baseline: the same backbone trained with labels (cross-entropy) on the cell's
views. Its registry entry; the model is in .model (torch), imported when one is built."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipeline.methods.registry import CROSS_ENTROPY_METRICS, MethodSpec, register

if TYPE_CHECKING:
    from torch import nn

    from pipeline.methods.section import Pretrain
    from pipeline.nets.method import Method


def build(p: Pretrain, backbone: nn.Module, num_classes: int, num_samples: int, world_size: int) -> Method:
    from pipeline.methods.supervised.model import Supervised

    return Supervised(backbone, num_classes)


ENTRY = register(MethodSpec("supervised", "supervised", 20, build, metrics=CROSS_ENTROPY_METRICS))
