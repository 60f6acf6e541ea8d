"""The supervised baseline's model: a linear classifier on the backbone."""

from __future__ import annotations

from torch import nn
from torch.nn import functional as F

from pipeline.methods.cross_entropy import CrossEntropyMethod
from pipeline.nets.method import Encoder, Step
from pipeline.nets.models import feature_dim


class Supervised(CrossEntropyMethod):
    """The supervised baseline: the same backbone trained with labels (cross-entropy); its
    ``inst_acc`` is the training views' top-1 over the classes, its chance loss ln(classes)."""

    def __init__(self, backbone: nn.Module, num_classes: int):
        super().__init__()
        self.encoder_q = Encoder(backbone, nn.Linear(feature_dim(backbone), num_classes))

    def forward(self, x1, x2=None, index=None, labels=None):
        logits = self.encoder_q(x1)
        return Step(F.cross_entropy(logits, labels), self.report(logits, labels), logits)
