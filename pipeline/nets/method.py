"""What the training loop asks of every pretraining method (MoCo v1/v2/v3, end-to-end, memory
bank, supervised), and the encoder each one trains. Each method implements the hooks that apply
to it beside its own code, so the loop (pipeline.pretrain) never inspects a model: a new method
is its own module under pipeline/methods/ plus one line there.

Plain torch: the MoCo core (pipeline.moco) builds on it and imports nothing above it.
"""

from __future__ import annotations

import math

from torch import nn


class Encoder(nn.Module):
    """Backbone followed by a projection head; the backbone is what transfers."""

    def __init__(self, backbone: nn.Module, head: nn.Module):
        super().__init__()
        self.backbone = backbone
        self.head = head

    def forward(self, x):
        return self.head(self.backbone(x))


class Method(nn.Module):
    """``forward(x1, x2, index, labels) -> (loss, logits, target)``; ``encoder_q.backbone`` is
    what transfers. The hooks below do nothing unless a method overrides them."""

    # a key encoder updated as the EMA of the query encoder (encoder_k, encoder_q, m): the run
    # checks it never gets a gradient or optimizer state (pipeline.moco.ema_check)
    has_momentum_encoder = False
    # the BN-leak guard (pipeline.methods.build.bn_guard_text): True/False for methods that encode a
    # key batch apart from its queries (MoCo v1/v2, end-to-end), None where there is none
    shuffle_bn: bool | None = None
    # normalise over the global batch with SyncBatchNorm on several GPUs (MoCo v3's heads)
    sync_batch_norm = False
    encoder_q: Encoder  # every method's query encoder
    # the methods with a momentum encoder: its copy updated as the EMA, at momentum m
    encoder_k: nn.Module
    m: float

    def on_step(self, progress: float) -> None:
        """Before each optimisation step; ``progress`` runs from 0 to 1 over the whole run."""

    def after_step(self, step: int) -> None:
        """After optimisation step ``step`` (counted from 0 over the whole run)."""

    def chance_loss(self, candidates: int) -> float:
        """The logged loss when every logit is alike (no positive stands out from its
        ``candidates`` - 1 negatives): one cross-entropy over uniform logits, ln(candidates)."""
        return math.log(candidates)

    def diagnostics(self) -> dict:
        """This method's values for the epoch's log row (log.csv columns)."""
        return {}

    def diagnostics_state(self) -> dict | None:
        """What ``diagnostics`` needs after a resume that the state dict does not hold."""
        return None

    def load_diagnostics_state(self, state: dict) -> None:
        """Inverse of ``diagnostics_state``."""
