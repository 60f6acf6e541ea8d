"""The dictionary as a FIFO queue of keys: a preallocated ring buffer stored as buffers.

Besides the keys, each slot records the step at which its key was enqueued (staleness) and
the index of the sample it came from (to mask a query's own image among its negatives).
Everything is a module buffer, so the queue travels in the checkpoint and resumes exactly.

``policy="random"`` (for the staleness study): each enqueued key overwrites a slot drawn
uniformly at random (without replacement within a batch), from a generator seeded with
(seed, step), so the choice is reproducible and resumes exactly with the same buffers. FIFO
bounds a key's age at K/B steps; random replacement bounds nothing.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from pipeline.base.layout import QUEUE_POLICIES


class KeyQueue(nn.Module):
    # buffers (typed here: torch types a module's attributes as Tensor | Module)
    keys: torch.Tensor
    ptr: torch.Tensor
    enqueued_at: torch.Tensor
    source: torch.Tensor

    def __init__(self, size: int, dim: int, policy: str = "fifo", seed: int = 0):
        super().__init__()
        if policy not in QUEUE_POLICIES:
            raise ValueError(f"queue policy must be one of {QUEUE_POLICIES}, not {policy!r}")
        self.size, self.policy, self.seed = size, policy, seed
        self.register_buffer("keys", F.normalize(torch.randn(size, dim), dim=1))
        self.register_buffer("ptr", torch.zeros((), dtype=torch.long))
        self.register_buffer("enqueued_at", torch.full((size,), -1, dtype=torch.long))
        self.register_buffer("source", torch.full((size,), -1, dtype=torch.long))

    @torch.no_grad()
    def enqueue(self, keys: torch.Tensor, source: torch.Tensor, step: torch.Tensor) -> None:
        """Replace the oldest ``len(keys)`` slots in place (no concatenation, no host sync)."""
        n = keys.shape[0]
        if self.size % n != 0:
            raise ValueError(f"queue size K={self.size} is not a multiple of the batch of keys ({n})")
        # ptr stays a tensor: index arithmetic on device avoids a .item() sync per step.
        slots = (
            self.ptr + torch.arange(n, device=keys.device)
            if self.policy == "fifo"
            else self.random_slots(n, int(step)).to(keys.device)
        )
        self.keys.index_copy_(0, slots, keys.to(self.keys.dtype))
        self.source.index_copy_(0, slots, source.to(torch.long))
        self.enqueued_at.index_copy_(0, slots, step.expand(n).to(torch.long))
        self.ptr.copy_((self.ptr + n) % self.size)

    def random_slots(self, n: int, step: int) -> torch.Tensor:
        """The slots the keys of ``step`` overwrite under the random policy (seed and step only)."""
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        return torch.randperm(self.size, generator=g)[:n]

    @torch.no_grad()
    def age_stats(self, step: int) -> tuple[float, float, float]:
        """(mean, 99th percentile, max) age in steps of the keys enqueued so far; under FIFO
        the max is K/B at steady state."""
        filled = self.enqueued_at >= 0
        if not bool(filled.any()):
            return float("nan"), float("nan"), float("nan")
        age = (step - self.enqueued_at[filled]).float()
        return float(age.mean()), float(torch.quantile(age, 0.99)), float(age.max())
