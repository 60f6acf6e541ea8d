"""What the training loop asks of every pretraining method (MoCo v1/v2/v3, end-to-end, memory
bank, SimCLR, BYOL, supervised), and the encoder each one trains. Each method implements the
hooks that apply to it beside its own code, so the loop (pipeline.pretrain) never inspects a
model: it logs what a method reports (``Step.metrics``, ``diagnostics``) and asks the method
whether its run failed (``failure``). A new method is its own folder under pipeline/methods/
plus one line there.

Plain torch: the methods' algorithms build on it, and it imports nothing of the package.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn


class Step(NamedTuple):
    """What one training step of a method returns: the loss the optimiser minimises and the
    step's own measurements (means over its rows, e.g. instance accuracy), which the loop
    averages over the epoch's rows and logs as columns of that name."""

    loss: torch.Tensor
    metrics: dict[str, torch.Tensor | float]
    # the scores behind the metrics where a method has them (a contrastive method's logits, rows
    # x candidates), for tests and benchmarks; the loop never reads them
    logits: torch.Tensor | None = None


class Encoder(nn.Module):
    """Backbone followed by a projection head; the backbone is what transfers."""

    def __init__(self, backbone: nn.Module, head: nn.Module):
        super().__init__()
        self.backbone = backbone
        self.head = head

    def forward(self, x):
        return self.head(self.backbone(x))


class Method(nn.Module):
    """``forward(x1, x2, index, labels) -> Step``; ``encoder_q.backbone`` is what transfers. The
    hooks below do nothing unless a method overrides them. A method with a momentum target
    derives from pipeline.methods.momentum_target.MomentumTarget."""

    # the BN-leak guard (pipeline.methods.build.bn_guard_text): True/False for methods that encode a
    # key batch apart from its queries (MoCo v1/v2, end-to-end), None where there is none
    shuffle_bn: bool | None = None
    # normalise over the global batch with SyncBatchNorm on several GPUs (MoCo v3's heads)
    sync_batch_norm = False
    encoder_q: Encoder  # every method's query (online) encoder

    def on_step(self, progress: float) -> None:
        """Before each optimisation step; ``progress`` runs from 0 to 1 over the whole run."""

    def after_step(self, step: int) -> None:
        """After optimisation step ``step`` (counted from 0 over the whole run)."""

    def failure(self, row: dict) -> str | None:
        """Why a run of this method failed, read from its last epoch's log row (the loop's loss
        and this method's metrics), or None. Each method states its own rule; a non-finite
        loss is every method's failure and the loop's to see."""
        return None

    def diagnostics(self) -> dict:
        """This method's values for the epoch's log row (log.csv columns)."""
        return {}

    def diagnostics_state(self) -> dict | None:
        """What ``diagnostics`` needs after a resume that the state dict does not hold."""
        return None

    def load_diagnostics_state(self, state: dict) -> None:
        """Inverse of ``diagnostics_state``."""
