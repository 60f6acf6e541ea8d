"""BYOL (Grill et al., 2020): an online encoder with a predictor regresses the momentum target's
projection of the other view; no negatives at all. The target is the shared EMA part
(pipeline.methods.momentum_target), its momentum tau rising from tau_base to 1 by a cosine.

Nothing in the loss keeps the outputs apart: what prevents collapse is the asymmetry (the
predictor and the stop-gradient into the target). So the failure rule is a collapse measure,
not a loss level: the spread of the online projections over the batch, sqrt(d) times the mean
per-dimension standard deviation of the l2-normalised outputs. It is 0 when every image maps to
one point and about 1 when the outputs spread over the sphere (SimSiam's measure, scaled so
that its healthy value does not depend on d); a run whose last epoch's spread is below
SPREAD_FLOOR has collapsed.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from pipeline.methods.gather import gather_all
from pipeline.methods.momentum_target import MomentumTarget
from pipeline.nets.method import Encoder, Step

# a tenth of the healthy value, far above a collapsed run's (0 up to rounding): fixed before any run
SPREAD_FLOOR = 0.1


def regression_loss(p: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """BYOL's loss: ||p/|p| - z/|z|||^2 = 2 - 2 cos(p, z), averaged over the batch."""
    return (2 - 2 * F.cosine_similarity(p.float(), z.float(), dim=1)).mean()


@torch.no_grad()
def spread(z: torch.Tensor) -> torch.Tensor:
    """sqrt(d) x the mean over dimensions of the l2-normalised rows' standard deviation (every
    rank's rows): 0 for a constant output, about 1 for outputs spread over the sphere."""
    z = F.normalize(gather_all(z.float()), dim=1)
    return z.std(dim=0, unbiased=False).mean() * math.sqrt(z.shape[1])


class BYOL(MomentumTarget):
    sync_batch_norm = True  # its heads normalise over the global batch, as the reference's

    def __init__(self, encoder: Encoder, predictor: nn.Module | None, *, m: float):
        super().__init__()
        self.encoder_q = encoder  # online: backbone + projector
        # None: the ablation without a predictor (the BYOL paper's collapse)
        self.predictor = predictor if predictor is not None else nn.Identity()
        # tau: tau_base -> 1 over the run; the paper's end points (Table 5a) stay put: tau = 0, no
        # EMA (the shared part keeps m = 0 constant), and tau = 1, a fixed random target
        self.init_target(m, schedule="cosine")

    def forward(self, x1: torch.Tensor, x2: torch.Tensor, index: torch.Tensor | None = None, labels=None):
        z1, z2 = self.encoder_q(x1), self.encoder_q(x2)
        p1, p2 = self.predictor(z1), self.predictor(z2)
        self.update_target()
        with torch.no_grad():  # the stop-gradient: the target is regressed, never moved by the loss
            t1, t2 = self.encoder_k(x1), self.encoder_k(x2)
        loss = regression_loss(p1, t2) + regression_loss(p2, t1)  # symmetric, as the paper
        return Step(loss, {"spread": spread(z1.detach())})

    def failure(self, row: dict) -> str | None:
        value = row.get("spread")
        if value is not None and value < SPREAD_FLOOR:
            return f"collapsed: spread of the outputs {value:.3f} below {SPREAD_FLOOR} (every image near one point)"
        return None
