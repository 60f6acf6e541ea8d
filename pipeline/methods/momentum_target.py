"""The momentum (EMA) target: a copy of a method's online encoder that never gets a gradient or
optimizer state and follows it as theta_k <- m * theta_k + (1 - m) * theta_q.

MoCo's key encoder and BYOL's target network are this one part (the seeds' "reusable
primitive"); MoCo v1/v2 hold m constant, MoCo v3 and BYOL raise it from m0 to 1 on a cosine
over the run (m0 = 0, no EMA, stays 0). The run checks it on itself (pipeline.methods.ema_check).
"""

from __future__ import annotations

import copy
import math

import torch
from torch import nn

from pipeline.nets.method import Method

SCHEDULES = ("constant", "cosine")


@torch.no_grad()
def momentum_update(key: nn.Module, query: nn.Module, m: float) -> None:
    """Fused multi-tensor EMA over all parameters (one kernel per op, not one per tensor).

    mul-then-add (not lerp) so that m=0 copies theta_q and m=1 leaves theta_k bit-exact.
    Buffers (BN running statistics) are not averaged: the key encoder runs in train mode and
    keeps the statistics of the keys it normalises, as in the reference implementation.
    """
    k_params: list[torch.Tensor] = list(key.parameters())
    q_params = [p.detach() for p in query.parameters()]
    if len(k_params) != len(q_params):
        raise ValueError("key and query encoders differ in structure")
    torch._foreach_mul_(k_params, m)
    torch._foreach_add_(k_params, q_params, alpha=1.0 - m)


def cosine_momentum(m0: float, progress: float) -> float:
    """Cosine increase from m0 (progress 0) to 1 (progress 1): MoCo v3's and BYOL's schedule."""
    return 1.0 - (1.0 - m0) * 0.5 * (1.0 + math.cos(math.pi * progress))


@torch.no_grad()
def relative_drift(key: nn.Module, query: nn.Module) -> float:
    """||theta_k - theta_q|| / ||theta_q|| over all parameters: how far behind the keys lag."""
    diff = torch._foreach_sub([p for p in key.parameters()], [p for p in query.parameters()])
    num = torch.stack(torch._foreach_norm(diff)).norm()
    den = torch.stack(torch._foreach_norm([p for p in query.parameters()])).norm()
    return float(num / den.clamp_min(1e-12))


class MomentumTarget(Method):
    """A method with a momentum target: ``encoder_k`` is the EMA copy of ``encoder_q``.

    A subclass sets ``encoder_q`` and calls ``init_target`` in its constructor, calls
    ``update_target`` once per step before it encodes with ``encoder_k``, and the loop sets m
    before each step (``on_step``). pipeline.pretrain checks every such method's target
    (no optimizer entry, no state, no gradient, the EMA replayed).
    """

    encoder_k: nn.Module  # the target (key) encoder: never a gradient, never an optimizer entry
    m: float  # the momentum in force this step
    m0: float  # its value at the start (the cosine schedule's base)
    schedule: str

    def init_target(self, m: float, schedule: str = "constant") -> None:
        if schedule not in SCHEDULES:
            raise ValueError(f"momentum schedule '{schedule}' is not one of {', '.join(SCHEDULES)}")
        self.m0 = self.m = m
        # m = 0 is "no EMA" (the target is the online encoder behind a stop-gradient: MoCo's m = 0,
        # BYOL's tau = 0): a cosine would raise it towards 1 and make it an EMA after all. (From
        # m = 1, a fixed random target, the cosine stays at 1.)
        self.schedule = "constant" if m == 0.0 else schedule
        self.encoder_k = copy.deepcopy(self.encoder_q)
        for p in self.encoder_k.parameters():
            p.requires_grad_(False)  # updated by the momentum rule only, never by gradients

    def on_step(self, progress: float) -> None:
        if self.schedule == "cosine":
            self.m = cosine_momentum(self.m0, progress)

    def update_target(self) -> None:
        momentum_update(self.encoder_k, self.encoder_q, self.m)

    def diagnostics(self) -> dict:
        """m in force and how far the target lags the online encoder."""
        return {"m": round(self.m, 6), "drift": round(relative_drift(self.encoder_k, self.encoder_q), 6)}
