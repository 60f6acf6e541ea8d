"""The supervised baseline's model: a linear classifier on the backbone."""

from __future__ import annotations

from torch import nn
from torch.nn import functional as F

from pipeline.nets.method import Encoder, Method
from pipeline.nets.models import feature_dim


class Supervised(Method):
    """The supervised baseline: the same backbone trained with labels (cross-entropy)."""

    def __init__(self, backbone: nn.Module, num_classes: int):
        super().__init__()
        self.encoder_q = Encoder(backbone, nn.Linear(feature_dim(backbone), num_classes))

    def forward(self, x1, x2=None, index=None, labels=None):
        logits = self.encoder_q(x1)
        return F.cross_entropy(logits, labels), logits, labels
