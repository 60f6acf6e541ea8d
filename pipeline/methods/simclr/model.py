"""SimCLR (Chen et al., 2020): one encoder, no momentum target, no queue; the negatives are the
batch's other 2N - 2 views, so their number is set by the batch size.

Both views go through the encoder as one batch of 2N, so every view is normalised with the same
BatchNorm statistics as its positive and its negatives (SimCLR's global BN, in one process the
batch itself): BN cannot tell the positive apart. The loss is NT-Xent: each of the 2N views
against the other 2N - 1, the positive its other view, both directions (symmetric).
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from pipeline.methods.cross_entropy import CrossEntropyMethod
from pipeline.methods.gather import gather_with_grad, rank
from pipeline.methods.info_nce import similarities
from pipeline.nets.method import Encoder, Step


def nt_xent(z1: torch.Tensor, z2: torch.Tensor, T: float):
    """NT-Xent of this rank's 2N views (z1: the first views, z2: the second, N x C, normalised)
    against every rank's 2N views but itself. Returns (loss, logits, target): row i is view i of
    [z1; z2], its positive the other view of the same image, its own column masked out."""
    n = z1.shape[0]
    z = torch.cat([z1, z2])
    z_all = gather_with_grad(z)  # every rank's [z1; z2], in rank order
    logits = similarities(z, z_all) / T
    start = rank() * 2 * n  # where this rank's views stand among every rank's
    rows = torch.arange(2 * n, device=z.device)
    logits[rows, start + rows] = float("-inf")  # a view is not its own negative
    target = start + (rows + n) % (2 * n)
    return F.cross_entropy(logits, target), logits, target


class SimCLR(CrossEntropyMethod):
    sync_batch_norm = True  # SimCLR's global BN: across GPUs, the whole batch's statistics

    def __init__(self, encoder: Encoder, T: float = 0.1):
        super().__init__()
        self.T = T
        self.encoder_q = encoder  # backbone + projection head

    def chance_loss(self, candidates: int) -> float:
        """Uniform logits over the 2N - 1 other views (the row's own column is masked)."""
        return super().chance_loss(candidates - 1)

    def forward(self, x1: torch.Tensor, x2: torch.Tensor, index: torch.Tensor | None = None, labels=None):
        n = x1.shape[0]
        z = F.normalize(self.encoder_q(torch.cat([x1, x2])), dim=1)
        loss, logits, target = nt_xent(z[:n], z[n:], self.T)
        return Step(loss, self.report(logits, target), logits)
