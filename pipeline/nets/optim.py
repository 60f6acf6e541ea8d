"""Optimisers and schedules of the MoCo recipes: SGD (v1/v2), LARS (v3 ResNet), AdamW (v3 ViT);
linear warmup then cosine (or x0.1 at 60% and 80%)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from pipeline.dag.sections import Pretrain


class LARS(torch.optim.Optimizer):
    """SGD with momentum and a layer-wise trust ratio (You et al. 2017), as MoCo v3 uses it:
    weight decay and adaptation apply to weight matrices and kernels only (ndim > 1), never
    to biases or normalisation parameters."""

    def __init__(
        self, params, lr: float, weight_decay: float = 0.0, momentum: float = 0.9, trust_coefficient: float = 0.001
    ):
        super().__init__(
            params, dict(lr=lr, weight_decay=weight_decay, momentum=momentum, trust_coefficient=trust_coefficient)
        )

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                update = p.grad
                if p.ndim > 1:
                    update = update.add(p, alpha=group["weight_decay"])
                    w_norm, u_norm = p.norm(), update.norm()
                    ratio = torch.where(
                        (w_norm > 0) & (u_norm > 0),
                        group["trust_coefficient"] * w_norm / u_norm,
                        torch.ones_like(w_norm),
                    )
                    update = update.mul(ratio)
                buf = self.state[p].get("momentum_buffer")
                if buf is None:
                    buf = self.state[p]["momentum_buffer"] = torch.zeros_like(p)
                buf.mul_(group["momentum"]).add_(update)
                p.add_(buf, alpha=-group["lr"])


def optimizer_name(p: Pretrain) -> str:
    return p.spec.optimizer(p) if p.optimizer == "auto" else p.optimizer  # auto: the method's own


def build_optimizer(p: Pretrain, params) -> torch.optim.Optimizer:
    params = [t for t in params if t.requires_grad]  # never the key encoder nor frozen parts
    name, wd = optimizer_name(p), p.weight_decay
    if name == "sgd":
        return torch.optim.SGD(params, lr=p.lr, momentum=p.sgd_momentum, weight_decay=wd)
    if name == "lars":
        return LARS(params, lr=p.lr, weight_decay=wd, momentum=p.sgd_momentum)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=p.lr, weight_decay=wd)
    raise ValueError(f"unknown optimizer '{name}' (sgd, lars, adamw)")


def lr_at(p: Pretrain, progress: float, epochs: float) -> float:
    """Learning rate at a fraction of training: linear warmup, then cosine or step decay."""
    warm = p.warmup_epochs / max(epochs, 1e-9)
    if progress < warm:
        return p.lr * progress / warm
    if p.schedule == "cosine":
        return p.lr * decayed("cosine", (progress - warm) / max(1.0 - warm, 1e-9))
    # x0.1 at each of lr_step_epochs (torchvision's 30/60 of 90), else at STEP_DROPS
    drops = [e / max(epochs, 1e-9) for e in p.lr_step_epochs] if p.lr_step_epochs else STEP_DROPS
    return p.lr * decayed("step", progress, drops=drops)


STEP_DROPS = (0.6, 0.8)  # fractions of training where the step schedule drops x0.1 (MoCo's 120/160 of 200)


def decayed(schedule: str, done: float, total: float = 1.0, drops: Sequence[float] = STEP_DROPS) -> float:
    """The factor on the base learning rate after warmup, for every stage's schedule: ``cosine``
    from 1 at ``done`` 0 to 0 at ``done == total``, or ``step``: x0.1 at each of ``drops`` passed
    (in done's unit: a fraction of training, or a detector's iterations)."""
    if schedule == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * done / total))
    return 0.1 ** sum(done >= d for d in drops)
