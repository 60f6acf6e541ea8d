"""MoCo v3: no queue; the negatives are the keys of the whole (all-gathered) batch.

Query side: backbone -> projector -> predictor. Key side (momentum encoder): backbone ->
projector. Symmetric loss over the two views, scaled by 2T; the momentum m rises from m0 to 1
on a per-iteration cosine schedule, set before each step (``on_step``).
"""

from __future__ import annotations

import copy
import math

import torch
from torch import nn
from torch.nn import functional as F

from pipeline.moco.builder import similarities
from pipeline.moco.distributed import gather_all, rank
from pipeline.moco.momentum import momentum_diagnostics, momentum_update
from pipeline.nets.method import Encoder, Method


def ctr_loss(q: torch.Tensor, k: torch.Tensor, T: float):
    """InfoNCE of local queries against all ranks' keys; the positive of row i is this rank's
    key i, i.e. column rank * N + i. Returns (loss scaled by 2T, logits, target)."""
    q, k = F.normalize(q, dim=1), F.normalize(k, dim=1)
    k_all = gather_all(k)
    logits = similarities(q, k_all) / T
    target = torch.arange(q.shape[0], device=q.device) + rank() * q.shape[0]
    return F.cross_entropy(logits, target) * (2 * T), logits, target


def momentum_at(m0: float, progress: float) -> float:
    """Cosine increase from m0 (progress 0) to 1 (progress 1)."""
    return 1.0 - (1.0 - m0) * 0.5 * (1.0 + math.cos(math.pi * progress))


class MoCoV3(Method):
    has_momentum_encoder = True
    sync_batch_norm = True  # its heads (and ResNet backbone) normalise over the global batch

    def __init__(self, encoder: Encoder, predictor: nn.Module, T: float = 1.0, m: float = 0.99):
        super().__init__()
        self.T, self.m0, self.m = T, m, m
        self.encoder_q = encoder  # backbone + projector
        self.predictor = predictor
        self.encoder_k = copy.deepcopy(encoder)
        for p in self.encoder_k.parameters():
            p.requires_grad_(False)

    def on_step(self, progress: float) -> None:
        self.m = momentum_at(self.m0, progress)

    def chance_loss(self, candidates: int) -> float:
        """Two cross-entropies (one per view), each scaled by 2T: 2T (ln c + ln c)."""
        return 2 * self.T * 2 * math.log(candidates)

    def diagnostics(self) -> dict:
        return momentum_diagnostics(self.encoder_k, self.encoder_q, self.m)

    def forward(self, x1: torch.Tensor, x2: torch.Tensor, index: torch.Tensor | None = None, labels=None):
        q1, q2 = self.predictor(self.encoder_q(x1)), self.predictor(self.encoder_q(x2))
        with torch.no_grad():
            momentum_update(self.encoder_k, self.encoder_q, self.m)
            k1, k2 = self.encoder_k(x1), self.encoder_k(x2)
        loss1, logits, target = ctr_loss(q1, k2, self.T)
        loss2, _, _ = ctr_loss(q2, k1, self.T)
        return loss1 + loss2, logits, target
