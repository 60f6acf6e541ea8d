"""Optimisers and schedules of the MoCo recipes: SGD (v1/v2), LARS (v3 ResNet), AdamW (v3 ViT);
linear warmup then cosine (or x0.1 at 60% and 80%)."""

from __future__ import annotations

import inspect
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar, cast

import torch

# torch.optim wraps these methods for torch.compile (a graph break in step, a compile-excluded
# zero_grad, add_param_group, state_dict, load_state_dict), and each wrapper imports torch._dynamo
# on its first call: ~1.5 s of a stage's CPU before its first step, for a compiler the stages never
# point at an optimizer (pretrain.compile compiles the model only).
COMPILE_WRAPPED = ("step", "zero_grad", "add_param_group", "state_dict", "load_state_dict")
OptimizerT = TypeVar("OptimizerT", bound=torch.optim.Optimizer)


def eager(optimizer: type[OptimizerT]) -> type[OptimizerT]:
    """``optimizer`` with torch's own methods unwrapped: the same arithmetic, the same state dict,
    without importing torch._dynamo. step keeps what its wrapper does outside compilation: no
    autograd (the stages' optimizers are not differentiable)."""

    def plain(name: str):
        method = inspect.unwrap(getattr(optimizer, name))
        return torch.no_grad()(method) if name == "step" else method

    methods = {name: plain(name) for name in COMPILE_WRAPPED}
    return cast(
        "type[OptimizerT]",
        type(optimizer.__name__, (optimizer,), {**methods, "__doc__": optimizer.__doc__, "__module__": __name__}),
    )


SGD = eager(torch.optim.SGD)
AdamW = eager(torch.optim.AdamW)


class LARS(eager(torch.optim.Optimizer)):  # type: ignore[misc]  # a class made at run time
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
        """One multi-tensor update per group (a kernel per op over all its tensors, not one per
        tensor: the per-tensor loop cost SimCLR's and BYOL's small CPU steps ~10 %)."""
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            updates = [p.grad for p in params]
            adapted = [i for i, p in enumerate(params) if p.ndim > 1]
            if adapted:
                weights = [params[i] for i in adapted]
                decayed = torch._foreach_add([updates[i] for i in adapted], weights, alpha=group["weight_decay"])
                w_norm = torch.stack(torch._foreach_norm(weights))
                u_norm = torch.stack(torch._foreach_norm(decayed))
                ratio = torch.where(
                    (w_norm > 0) & (u_norm > 0), group["trust_coefficient"] * w_norm / u_norm, torch.ones_like(w_norm)
                )
                torch._foreach_mul_(decayed, list(ratio.unbind()))
                for i, update in zip(adapted, decayed):
                    updates[i] = update
            for p in params:
                if "momentum_buffer" not in self.state[p]:
                    self.state[p]["momentum_buffer"] = torch.zeros_like(p)
            buffers = [self.state[p]["momentum_buffer"] for p in params]
            torch._foreach_mul_(buffers, group["momentum"])
            torch._foreach_add_(buffers, updates)
            torch._foreach_add_(params, buffers, alpha=-group["lr"])


STEP_DROPS = (0.6, 0.8)  # fractions of training where the step schedule drops x0.1 (MoCo's 120/160 of 200)


@dataclass(frozen=True)
class Schedule:
    """The learning-rate factor of every stage (pretraining, probe, detection) at each
    optimisation step, in steps throughout: a linear warmup over the first ``warmup`` steps (step
    s at (s + 1) / warmup: no step is wasted at lr 0), then ``cosine`` from 1 to 0 at ``total``,
    or ``step``: x0.1 at each of ``drops``. The stages convert their epochs and fractions once."""

    total: int
    kind: str = "cosine"  # cosine | step
    warmup: float = 0
    drops: tuple[float, ...] = ()

    def factor(self, step: int) -> float:
        if step < self.warmup:
            return (step + 1) / self.warmup
        if self.kind == "cosine":
            done = (step - self.warmup) / max(self.total - self.warmup, 1)
            return 0.5 * (1.0 + math.cos(math.pi * done))
        return 0.1 ** sum(step >= d for d in self.drops)


def share_of(total: int, fractions: Sequence[float]) -> tuple[float, ...]:
    """Fractions of training as steps of a ``total``-step run."""
    return tuple(f * total for f in fractions)
