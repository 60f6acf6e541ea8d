"""The momentum (EMA) update of the key encoder: theta_k <- m * theta_k + (1 - m) * theta_q."""

from __future__ import annotations

import torch
from torch import nn


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


def momentum_diagnostics(key: nn.Module, query: nn.Module, m: float) -> dict:
    """The log values of a method with a momentum encoder: m in force and how far keys lag."""
    return {"m": round(m, 6), "drift": round(relative_drift(key, query), 6)}


@torch.no_grad()
def relative_drift(key: nn.Module, query: nn.Module) -> float:
    """||theta_k - theta_q|| / ||theta_q|| over all parameters: how far behind the keys lag."""
    diff = torch._foreach_sub([p for p in key.parameters()], [p for p in query.parameters()])
    num = torch.stack(torch._foreach_norm(diff)).norm()
    den = torch.stack(torch._foreach_norm([p for p in query.parameters()])).norm()
    return float(num / den.clamp_min(1e-12))
