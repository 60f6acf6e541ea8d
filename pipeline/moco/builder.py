"""MoCo v1/v2: a query encoder, a momentum key encoder and a queue of keys.

The paper's Algorithm 1, line for line, is ``MoCo.forward``.
"""

from __future__ import annotations

import copy

import torch
from torch import nn
from torch.nn import functional as F

from pipeline.moco.distributed import encode_shuffled, gather_all
from pipeline.moco.momentum import momentum_diagnostics, momentum_update
from pipeline.moco.queue import KeyQueue
from pipeline.moco.split_bn import has_batch_norm
from pipeline.moco.staleness import NegativeDrift, history_length
from pipeline.nets.method import Encoder, Method


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


class MoCo(Method):
    """``encoder`` is the query encoder (backbone + head); its copy becomes the key encoder.

    K: queue size; m: momentum of the key encoder; T: temperature; shuffle_bn: the BN-leak
    guard (paper, 3.3): shuffle the key batch around the key encoder, across ranks and across
    the split-BN sub-batches of each rank (pipeline.moco.split_bn), so that key i is never
    normalised with the statistics that normalise query i; without BatchNorm in the encoder
    there is nothing to leak and no shuffle. mask_same_source: never use a key of the query's
    own image (seen in an earlier epoch) as a negative. queue_policy: fifo (the paper's), or
    random replacement seeded with ``seed`` (pipeline.moco.queue). batch_size: the global
    batch (sizes the history of the negatives' drift, moco.staleness). symmetric: add the loss
    with the views swapped (the CIFAR demo's option), both views' keys enqueued.
    """

    queue: KeyQueue
    step: torch.Tensor  # a buffer: optimisation steps so far

    has_momentum_encoder = True

    def __init__(
        self,
        encoder: Encoder,
        dim: int = 128,
        K: int = 65536,
        m: float = 0.999,
        T: float = 0.07,
        shuffle_bn: bool = True,
        mask_same_source: bool = False,
        queue_policy: str = "fifo",
        seed: int = 0,
        batch_size: int = 256,
        symmetric: bool = False,
    ):
        super().__init__()
        self.m, self.T, self.symmetric = m, T, symmetric
        self.shuffle_bn = shuffle_bn and has_batch_norm(encoder)
        self.mask_same_source = mask_same_source
        self.encoder_q = encoder
        self.encoder_k = copy.deepcopy(encoder)
        for p in self.encoder_k.parameters():
            p.requires_grad_(False)  # updated by the momentum rule only, never by gradients
        self.queue = KeyQueue(K, dim, queue_policy, seed)
        self.labels = ZeroLabels()
        self.register_buffer("step", torch.zeros((), dtype=torch.long))
        # how far the key encoder moved since each queued negative was encoded (not a buffer:
        # a diagnostic, kept with the resume state through diagnostics_state)
        self.negative_drift = NegativeDrift(
            self.encoder_k, history_length(K, batch_size * (1 + symmetric), queue_policy), seed=seed
        )

    def after_step(self, step: int) -> None:
        self.negative_drift.record(step)

    def diagnostics(self) -> dict:
        mean_age, p99_age, max_age = self.queue.age_stats(int(self.step))
        mean_drift, max_drift = self.negative_drift.measure(self.queue.enqueued_at)
        return {
            **momentum_diagnostics(self.encoder_k, self.encoder_q, self.m),
            "queue_age_mean": round(mean_age, 2),
            "queue_age_p99": round(p99_age, 2),
            "queue_age_max": max_age,
            "negative_drift_mean": round(mean_drift, 4),
            "negative_drift_max": round(max_drift, 4),
        }

    def diagnostics_state(self) -> dict:
        return {"negative_drift": self.negative_drift.state()}

    def load_diagnostics_state(self, state: dict) -> None:
        self.negative_drift.load(state["negative_drift"])

    def encode_keys(self, im_k: torch.Tensor) -> torch.Tensor:
        """The key encoder's output, in im_k's order, normalised apart from the queries' BN batches."""
        return encode_shuffled(self.encoder_k, im_k) if self.shuffle_bn else self.encoder_k(im_k)

    def forward(self, im_q: torch.Tensor, im_k: torch.Tensor, index: torch.Tensor | None = None, labels=None):
        """Returns (loss, logits, target) of im_q against im_k's keys; the positive of row i
        is logits[i, 0]. symmetric: + the loss of im_k against im_q's keys, against the same
        queue, after one key-encoder update (as the demo)."""
        with torch.no_grad():
            momentum_update(self.encoder_k, self.encoder_q, self.m)
        loss, logits, target, k = self.contrastive_loss(im_q, im_k, index)
        if self.symmetric:
            loss_swapped, _, _, k_swapped = self.contrastive_loss(im_k, im_q, index)
            loss, k = loss + loss_swapped, torch.cat([k_swapped, k])
            index = None if index is None else torch.cat([index, index])

        if self.training:
            if index is None:
                index = torch.full((k.shape[0],), -1, dtype=torch.long, device=k.device)
            self.queue.enqueue(gather_all(k), gather_all(index), self.step)
            self.step += 1
        return loss, logits, target

    def contrastive_loss(self, im_q: torch.Tensor, im_k: torch.Tensor, index: torch.Tensor | None):
        """(loss, logits, target, keys) of one direction, the queue untouched."""
        q = F.normalize(self.encoder_q(im_q), dim=1)
        with torch.no_grad():
            k = F.normalize(self.encode_keys(im_k), dim=1)

        mask = None
        if self.mask_same_source and index is not None:
            mask = index[:, None] == self.queue.source[None, :]
        target = self.labels(q.shape[0], q.device)
        # clone: the queue is updated in place below, autograd needs the keys as they were
        loss, logits = info_nce(q, k, self.queue.keys.clone(), self.T, mask, target)
        return loss, logits, target, k
