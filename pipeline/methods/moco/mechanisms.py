"""The two mechanisms the MoCo paper compares against (its Figure 3), through the same
interface as MoCo.

- EndToEnd: keys come from the query encoder itself, with gradients; the negatives are the
  other samples of the (all-gathered) batch, so the dictionary size is the batch size.
- MemoryBank (InstDisc): one stored embedding per training sample; the positive is the bank
  entry of the query's own sample, K negatives are drawn at random from the bank, and the
  entries of the samples in the batch move towards their new embeddings with momentum m.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.nn import functional as F

from pipeline.methods.cross_entropy import CrossEntropyMethod
from pipeline.methods.gather import encode_shuffled, gather_all, gather_with_grad, world_size
from pipeline.methods.info_nce import ZeroLabels, in_batch_info_nce, info_nce
from pipeline.methods.split_bn import has_batch_norm
from pipeline.nets.method import Encoder, Step


class EndToEnd(CrossEntropyMethod):
    """shuffle_bn: the same BN-leak guard as MoCo's (the paper uses it for both), here with
    gradients through the shuffle."""

    def __init__(self, encoder: Encoder, *, T: float, shuffle_bn: bool = True):
        super().__init__()
        self.T = T
        self.encoder_q = encoder
        self.shuffle_bn = shuffle_bn and has_batch_norm(encoder)

    def encode_keys(self, x2: torch.Tensor) -> torch.Tensor:
        """Keys from the query encoder (gradients flow through them too), guarded like MoCo's."""
        return encode_shuffled(self.encoder_q, x2, gather_with_grad) if self.shuffle_bn else self.encoder_q(x2)

    def forward(self, x1, x2, index=None, labels=None):
        q = F.normalize(self.encoder_q(x1), dim=1)
        k = F.normalize(self.encode_keys(x2), dim=1)
        loss, logits, target = in_batch_info_nce(q, k, self.T, with_grad=True)
        return Step(loss, self.report(logits, target), logits)


class MemoryBank(CrossEntropyMethod):
    bank: torch.Tensor  # a buffer: one normalised embedding per training sample

    def __init__(self, encoder: Encoder, num_samples: int, *, dim: int, K: int, m: float, T: float):
        super().__init__()
        if K > num_samples - 1:
            raise ValueError(
                f"memory bank: K={K} negatives need more than K samples (the training set has {num_samples})"
            )
        self.K, self.m, self.T = K, m, T
        self.encoder_q = encoder
        self.register_buffer("bank", F.normalize(torch.randn(num_samples, dim), dim=1))
        self.labels = ZeroLabels()

    def forward(self, x1, x2, index, labels=None):
        if index is None:
            raise ValueError("the memory bank needs each sample's index")
        q = F.normalize(self.encoder_q(x1), dim=1)
        positives = self.bank[index].clone()
        draw = torch.randint(0, self.bank.shape[0], (self.K,), device=q.device)
        if world_size() > 1:
            dist.broadcast(draw, src=0)  # the same negatives on every rank
        negatives = self.bank[draw].clone()
        mask = draw[None, :] == index[:, None]  # a sample is never its own negative
        target = self.labels(q.shape[0], q.device)
        loss, logits = info_nce(q, positives, negatives, self.T, mask, target)
        if self.training:
            self.update(gather_all(q.detach()), gather_all(index))
        return Step(loss, self.report(logits, target), logits)

    @torch.no_grad()
    def update(self, q: torch.Tensor, index: torch.Tensor) -> None:
        mixed = self.m * self.bank[index] + (1.0 - self.m) * q
        self.bank.index_copy_(0, index, F.normalize(mixed, dim=1))
