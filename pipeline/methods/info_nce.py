"""InfoNCE, the contrastive loss MoCo (every mechanism) and SimCLR share: a query's similarity
to its positive against its negatives, over a temperature, as one cross-entropy; the positive
at index 0 of a row (MoCo's queue), or in-batch where the negatives are the batch's other keys.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from pipeline.methods.gather import gather_all, gather_with_grad, rank


def similarities(q: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """q @ keys.T (N x M) in fp32, under autocast too. The references' logits are fp32 (v1/v2)
    or fp16 (v3: 11 significant bits); in bf16 (8 bits) a cosine is off by up to 2^-8, which
    after / T (0.07-0.2) is noise of 0.02-0.06 on the logits, and under autocast it fell on
    the negatives only (the positive's elementwise product stays fp32)."""
    with torch.autocast(q.device.type, enabled=False):
        return q.float() @ keys.float().T


def info_nce(
    q: torch.Tensor,
    k: torch.Tensor,
    negatives: torch.Tensor,
    T: float,
    neg_mask: torch.Tensor | None = None,
    labels: torch.Tensor | None = None,
):
    """(K+1)-way InfoNCE with the positive at index 0. Returns (loss, logits).

    q, k: N x C (normalised); negatives: K x C; neg_mask: N x K, True = not a negative;
    labels: a preallocated tensor of N zeros (allocated here if not given).
    """
    l_pos = (q.float() * k.float()).sum(dim=1, keepdim=True)  # N x 1, fp32 as the negatives'
    l_neg = similarities(q, negatives)  # N x K
    if neg_mask is not None:
        l_neg = l_neg.masked_fill(neg_mask, float("-inf"))
    logits = torch.cat([l_pos, l_neg], dim=1) / T
    if labels is None:
        labels = torch.zeros(logits.shape[0], dtype=torch.long, device=logits.device)
    return F.cross_entropy(logits, labels), logits


class ZeroLabels(nn.Module):
    zeros: torch.Tensor
    """The positives' index (0) for every row, allocated once per batch size, not per step."""

    def __init__(self):
        super().__init__()
        self.register_buffer("zeros", torch.zeros(0, dtype=torch.long), persistent=False)

    def forward(self, n: int, device) -> torch.Tensor:
        if self.zeros.numel() < n or self.zeros.device != torch.device(device):
            self.zeros = torch.zeros(n, dtype=torch.long, device=device)
        return self.zeros[:n]


def in_batch_info_nce(q: torch.Tensor, k: torch.Tensor, T: float, with_grad: bool = False):
    """InfoNCE of this rank's queries against every rank's keys: the positive of row i is this
    rank's key i (column rank * N + i), the other keys are its negatives. q, k: N x C,
    normalised; ``with_grad``: gradients flow back through the gathered keys (end-to-end).
    Returns (loss, logits, target)."""
    k_all = gather_with_grad(k) if with_grad else gather_all(k)
    logits = similarities(q, k_all) / T
    target = torch.arange(q.shape[0], device=q.device) + rank() * q.shape[0]
    return F.cross_entropy(logits, target), logits, target
