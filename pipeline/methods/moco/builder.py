"""MoCo v1/v2: a query encoder, a momentum key encoder and a queue of keys.

The paper's Algorithm 1, line for line, is ``MoCo.forward``.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from pipeline.methods.cross_entropy import CrossEntropyMethod
from pipeline.methods.gather import encode_shuffled, gather_all
from pipeline.methods.info_nce import ZeroLabels, info_nce
from pipeline.methods.moco.queue import KeyQueue
from pipeline.methods.moco.staleness import NegativeDrift, history_length
from pipeline.methods.momentum_target import MomentumTarget
from pipeline.methods.split_bn import has_batch_norm
from pipeline.nets.method import Encoder, Step


class MoCo(MomentumTarget, CrossEntropyMethod):
    """``encoder`` is the query encoder (backbone + head); its copy becomes the key encoder.

    K: queue size; m: momentum of the key encoder; T: temperature; shuffle_bn: the BN-leak
    guard (paper, 3.3): shuffle the key batch around the key encoder, across ranks and across
    the split-BN sub-batches of each rank (pipeline.methods.split_bn), so that key i is never
    normalised with the statistics that normalise query i; without BatchNorm in the encoder
    there is nothing to leak and no shuffle. mask_same_source: never use a key of the query's
    own image (seen in an earlier epoch) as a negative. queue_policy: fifo (the paper's), or
    random replacement seeded with ``seed`` (pipeline.methods.moco.queue). batch_size: the global
    batch (sizes the history of the negatives' drift, moco.staleness). symmetric: add the loss
    with the views swapped (the CIFAR demo's option), both views' keys enqueued.
    """

    queue: KeyQueue
    step: torch.Tensor  # a buffer: optimisation steps so far

    def __init__(
        self,
        encoder: Encoder,
        *,  # the config's keys (pipeline.dag.sections.Pretrain): their defaults live there alone
        dim: int,
        K: int,
        m: float,
        T: float,
        shuffle_bn: bool = True,
        mask_same_source: bool = False,
        queue_policy: str = "fifo",
        seed: int = 0,
        batch_size: int = 256,
        symmetric: bool = False,
    ):
        super().__init__()
        self.T, self.symmetric = T, symmetric
        self.losses = 1 + symmetric  # symmetric: the swapped views' cross-entropy too, so chance is 2 ln(1 + K)
        self.shuffle_bn = shuffle_bn and has_batch_norm(encoder)
        self.mask_same_source = mask_same_source
        self.encoder_q = encoder
        self.init_target(m)  # the key encoder: the EMA of the query encoder at a constant m
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
            **super().diagnostics(),
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
        """The loss of im_q against im_k's keys; the positive of row i is logits[i, 0], and the
        step reports im_q's logits. symmetric: + the loss of im_k against im_q's keys, against
        the same queue, after one key-encoder update (as the demo)."""
        self.update_target()
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
        return Step(loss, self.report(logits, target), logits)

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
