"""How stale the negatives really are: for every key in the queue, how far the key encoder has
moved since that key was encoded, ||theta_k(now) - theta_k(when encoded)|| / ||theta_k(now)||.

Keeping a copy of the key encoder per step would cost the model's size times the queue's span
(gigabytes for a ResNet-50 at K=65536). Instead each step keeps a count sketch of the key
encoder's parameters: every parameter adds, with a random sign, into one of ``buckets`` bins.
Distances between sketches estimate distances between parameter vectors without bias (in
squared L2), with a relative error of about sqrt(1 / buckets) on the norm (~2% at 2048 bins),
at the cost of one pass over the parameters per step.

The history covers the steps a key can still be in the queue: K/B under FIFO; under random
replacement a key survives a step with probability 1 - B/K, so ages are unbounded, and the
history spans (K/B) * ln(100 K) steps, beyond which fewer than 0.01 keys are expected. A key
older than the history is measured against the oldest sketch kept (a lower bound).
"""

from __future__ import annotations

import math

import torch
from torch import nn

BUCKETS = 2048


def history_length(K: int, batch: int, policy: str) -> int:
    """Steps of sketches to keep so that every key in the queue has its encoder's sketch."""
    span = max(1, K // batch)
    return span + 1 if policy == "fifo" else math.ceil(span * math.log(100 * K)) + 1


class ParameterSketch:
    """A fixed random count sketch of a module's parameters (the same bins every call)."""

    def __init__(self, module: nn.Module, buckets: int = BUCKETS, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.params = list(module.parameters())
        self.buckets = buckets
        self.bins = [
            torch.randint(0, buckets, (p.numel(),), generator=g, dtype=torch.int32).to(p.device) for p in self.params
        ]
        self.signs = [
            (torch.randint(0, 2, (p.numel(),), generator=g, dtype=torch.int8) * 2 - 1).to(p.device) for p in self.params
        ]

    @torch.no_grad()
    def __call__(self) -> torch.Tensor:
        device = self.params[0].device if self.params else torch.device("cpu")
        if self.bins and self.bins[0].device != device:  # the model moved to its training device
            self.bins, self.signs = [b.to(device) for b in self.bins], [s.to(device) for s in self.signs]
        out = torch.zeros(self.buckets, dtype=torch.float64, device=device)
        for p, bins, signs in zip(self.params, self.bins, self.signs):
            out.index_add_(0, bins, p.detach().flatten().double() * signs)
        return out


class NegativeDrift:
    """The key encoder's sketch at each recent step, and the drift of the queue's keys."""

    def __init__(self, key_encoder: nn.Module, history: int, buckets: int = BUCKETS, seed: int = 0):
        self.sketch = ParameterSketch(key_encoder, buckets, seed)
        self.sketches = torch.zeros(history, buckets, dtype=torch.float64)  # on the model's device once recorded
        self.steps = torch.full((history,), -1, dtype=torch.long)  # step of each row, -1: empty

    def record(self, step: int) -> None:
        """The key encoder as it encoded the keys enqueued at ``step`` (call after that step)."""
        row, sketch = step % len(self.steps), self.sketch()
        self.sketches = self.sketches.to(sketch.device)
        self.sketches[row] = sketch
        self.steps[row] = step

    @torch.no_grad()
    def measure(self, enqueued_at: torch.Tensor) -> tuple[float, float]:
        """(mean, max) relative drift in percent since each key of the queue was encoded, against
        the newest recorded encoder; keys of the initial random fill (step -1) are not counted."""
        kept = self.steps >= 0
        enqueued_at = enqueued_at[enqueued_at >= 0].cpu()
        if not bool(kept.any()) or enqueued_at.numel() == 0:
            return float("nan"), float("nan")
        newest = int(self.steps[kept].max())
        oldest = int(self.steps[kept].min())
        used, counts = torch.unique(enqueued_at.clamp(min=oldest), return_counts=True)
        now = self.sketches[newest % len(self.steps)]
        rows = (used % len(self.steps)).to(self.sketches.device)
        drift = ((self.sketches[rows] - now).norm(dim=1) / now.norm().clamp_min(1e-12)).cpu()
        mean = float((drift * counts).sum() / counts.sum())
        return 100 * mean, 100 * float(drift.max())

    def state(self) -> dict:
        return {"sketches": self.sketches.cpu(), "steps": self.steps.clone()}

    def load(self, state: dict) -> None:
        self.sketches = state["sketches"].to(self.sketches.device, torch.float64)
        self.steps.copy_(state["steps"])
