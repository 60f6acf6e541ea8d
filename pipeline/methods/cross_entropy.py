"""What every method whose loss is a cross-entropy over candidates reports and how it fails:
MoCo (v1/v2/v3, end-to-end, memory bank) and SimCLR over a positive and its negatives, the
supervised baseline over its classes.

Each step reports ``inst_acc`` (the share of rows whose target strictly beats every other
candidate) and ``chance_loss`` (the loss when every logit is alike). A run has failed when its
last epoch's loss sits at chance: the encoder tells the positive from no negative any more (the
MoCo paper's "training fails" at m = 0).
"""

from __future__ import annotations

import math

import torch

from pipeline.nets.method import Method

# a loss at or above this share of the chance loss counts as collapsed (fixed before any run)
CHANCE_LOSS_FRACTION = 0.99


def strictly_top(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """True where the target's logit beats every other one. argmax would count a collapsed
    encoder (all logits equal) as 100% correct, since ties resolve to index 0, the positive."""
    target_logit = logits.gather(1, target[:, None])
    others = logits.scatter(1, target[:, None], float("-inf"))
    return target_logit.squeeze(1) > others.max(1).values


class CrossEntropyMethod(Method):
    """A method whose loss is ``losses`` cross-entropies over its candidates, each scaled by
    ``loss_scale`` (MoCo v3: two, scaled by 2T)."""

    losses = 1
    loss_scale = 1.0

    def chance_loss(self, candidates: int) -> float:
        """The loss when every logit is alike: ln(candidates) per cross-entropy."""
        return self.losses * self.loss_scale * math.log(candidates)

    def report(self, logits: torch.Tensor, target: torch.Tensor) -> dict[str, torch.Tensor | float]:
        """This step's metrics from one direction's logits (rows: samples, columns: candidates)."""
        top = strictly_top(logits.detach(), target)
        return {"inst_acc": 100.0 * top.double().mean(), "chance_loss": self.chance_loss(logits.shape[1])}

    def failure(self, row: dict) -> str | None:
        chance = row.get("chance_loss")
        if chance and row["loss"] >= CHANCE_LOSS_FRACTION * chance:
            return f"collapsed: loss {row['loss']:.3f} at chance ({chance:.3f}: every logit alike)"
        return None
