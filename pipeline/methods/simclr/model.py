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


def nt_xent(z1: torch.Tensor, z2: torch.Tensor, T: float, negatives: int | None = None):
    """NT-Xent of this rank's 2N views (z1: the first views, z2: the second, N x C, normalised)
    against every rank's 2N views but itself, at the official code's scale: the sum of both
    directions' means (the paper's eq. averages the 2N anchors: half of it). ``negatives``: each
    row keeps that many of its other views as negatives, drawn afresh (the rest masked out);
    None: all. Returns (loss, logits, target): row i is view i of [z1; z2], its positive the other
    view of the same image, masked columns at -inf."""
    n = z1.shape[0]
    z = torch.cat([z1, z2])
    z_all = gather_with_grad(z)  # every rank's [z1; z2], in rank order
    logits = similarities(z, z_all) / T
    start = rank() * 2 * n  # where this rank's views stand among every rank's
    rows = torch.arange(2 * n, device=z.device)
    target = start + (rows + n) % (2 * n)
    logits[rows, start + rows] = float("-inf")  # a view is not its own negative
    if negatives is not None:
        logits = logits.masked_fill(~kept_negatives(logits, target, negatives), float("-inf"))
    return 2 * F.cross_entropy(logits, target), logits, target


def kept_negatives(logits: torch.Tensor, target: torch.Tensor, negatives: int) -> torch.Tensor:
    """True at each row's positive and at ``negatives`` of its other views, drawn uniformly at
    random (torch's stream) among the columns still finite."""
    available = int(torch.isfinite(logits[0]).sum()) - 1  # every view but itself and its positive
    if negatives > available:
        raise ValueError(f"negatives={negatives}: a row has only {available}")
    rows = torch.arange(len(logits), device=logits.device)
    score = torch.rand(logits.shape, device=logits.device)
    score[~torch.isfinite(logits)] = -1.0  # itself: never drawn
    score[rows, target] = -1.0  # the positive: kept apart, never counted among the negatives
    keep = torch.zeros_like(logits, dtype=torch.bool)
    keep.scatter_(1, score.topk(negatives, dim=1).indices, True)
    keep[rows, target] = True
    return keep


class SimCLR(CrossEntropyMethod):
    sync_batch_norm = True  # SimCLR's global BN: across GPUs, the whole batch's statistics
    losses = 2  # both directions' means, summed (the official code's scale)

    def __init__(self, encoder: Encoder, *, T: float, negatives: int | None = None):
        super().__init__()
        self.T, self.negatives = T, negatives
        self.encoder_q = encoder  # backbone + projection head

    def chance_loss(self, candidates: int) -> float:
        """Uniform logits over the positive and the negatives a row keeps: the 2N - 2 other views
        but itself (its own column is masked), or ``negatives`` of them."""
        kept = candidates - 2 if self.negatives is None else self.negatives
        return super().chance_loss(kept + 1)

    def forward(self, x1: torch.Tensor, x2: torch.Tensor, index: torch.Tensor | None = None, labels=None):
        n = x1.shape[0]
        z = F.normalize(self.encoder_q(torch.cat([x1, x2])), dim=1)
        loss, logits, target = nt_xent(z[:n], z[n:], self.T, self.negatives)
        return Step(loss, self.report(logits, target), logits)
