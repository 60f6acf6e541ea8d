"""MoCo v3: no queue; the negatives are the keys of the whole (all-gathered) batch.

Query side: backbone -> projector -> predictor. Key side (momentum encoder): backbone ->
projector. Symmetric loss over the two views, scaled by 2T; the momentum m rises from m0 to 1
on a per-iteration cosine schedule, set before each step (``on_step``).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from pipeline.methods.cross_entropy import CrossEntropyMethod
from pipeline.methods.info_nce import in_batch_info_nce
from pipeline.methods.momentum_target import MomentumTarget
from pipeline.nets.method import Encoder, Step


def ctr_loss(q: torch.Tensor, k: torch.Tensor, T: float):
    """In-batch InfoNCE of local queries against all ranks' keys, scaled by 2T (the
    reference's). Returns (loss, logits, target)."""
    loss, logits, target = in_batch_info_nce(F.normalize(q, dim=1), F.normalize(k, dim=1), T)
    return loss * (2 * T), logits, target


class MoCoV3(MomentumTarget, CrossEntropyMethod):
    sync_batch_norm = True  # its heads (and ResNet backbone) normalise over the global batch
    losses = 2  # one cross-entropy per view, each scaled by 2T

    def __init__(self, encoder: Encoder, predictor: nn.Module, *, T: float, m: float):
        super().__init__()
        self.T, self.loss_scale = T, 2 * T
        self.encoder_q = encoder  # backbone + projector
        self.predictor = predictor
        self.init_target(m, schedule="cosine")  # m rises from m0 to 1 over the run

    def forward(self, x1: torch.Tensor, x2: torch.Tensor, index: torch.Tensor | None = None, labels=None):
        q1, q2 = self.predictor(self.encoder_q(x1)), self.predictor(self.encoder_q(x2))
        self.update_target()
        with torch.no_grad():
            k1, k2 = self.encoder_k(x1), self.encoder_k(x2)
        loss1, logits, target = ctr_loss(q1, k2, self.T)
        loss2, _, _ = ctr_loss(q2, k1, self.T)
        return Step(loss1 + loss2, self.report(logits, target), logits)
