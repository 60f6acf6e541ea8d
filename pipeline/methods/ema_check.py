"""The momentum target (pipeline.methods.momentum_target: MoCo's key encoder, BYOL's target),
checked on the run itself: it never appears in the optimizer (no parameter,
no state, no gradient), and its weights follow the EMA of the query's,
theta_k <- m * theta_k + (1 - m) * theta_q, replayed over the last logged steps.

``EmaRecord.before_step()`` (called just before each optimisation step, after any momentum
schedule has set m) keeps, in a window of the last ``steps + 1`` steps, copies of a few
parameter tensors of both encoders (the first, two middle ones and the last) and the m in
force; ``report(optimizer)`` replays the recurrence from the oldest copy and compares it
with the newest.
"""

from __future__ import annotations

from collections import deque

import torch

from pipeline.methods.momentum_target import MomentumTarget


class EmaRecord:
    def __init__(self, model: MomentumTarget, steps: int = 3):
        self.model = model
        pairs = list(zip(model.encoder_k.named_parameters(), model.encoder_q.parameters()))
        picked = sorted({0, len(pairs) // 3, 2 * len(pairs) // 3, len(pairs) - 1})
        self.names = [pairs[i][0][0] for i in picked]
        self.key = [pairs[i][0][1] for i in picked]
        self.query = [pairs[i][1] for i in picked]
        self.span = steps + 1  # the steps a window holds
        self.window: deque = deque(maxlen=self.span)

    @torch.no_grad()
    def before_step(self) -> None:
        self.window.append(
            (
                [k.detach().float().cpu().clone() for k in self.key],
                [q.detach().float().cpu().clone() for q in self.query],
                float(self.model.m),
            )
        )

    def replay_error(self) -> tuple[int, float]:
        """(steps replayed, largest |replayed - recorded| relative to the tensor's scale)."""
        if len(self.window) < 2:
            return 0, float("nan")
        snaps = list(self.window)
        key = [k.clone() for k in snaps[0][0]]
        for _, query, m in snaps[:-1]:  # the update of each step uses that step's theta_q and m
            key = [k.mul(m).add(q, alpha=1.0 - m) for k, q in zip(key, query)]
        return len(snaps) - 1, max(
            float((k - rec).abs().max() / rec.abs().max().clamp_min(1e-12)) for k, rec in zip(key, snaps[-1][0])
        )

    def report(self, optimizer: torch.optim.Optimizer, tolerance: float = 1e-5) -> dict:
        key_ids = {id(p) for p in self.model.encoder_k.parameters()}
        in_groups = [p for g in optimizer.param_groups for p in g["params"]]
        steps, error = self.replay_error()
        out = {
            "optimizer_parameters": len(in_groups),
            "key_parameters_in_optimizer": sum(id(p) in key_ids for p in in_groups),
            "key_parameters_with_optimizer_state": sum(id(p) in key_ids for p in optimizer.state),
            "key_parameters_with_grad": sum(
                p.grad is not None or p.requires_grad for p in self.model.encoder_k.parameters()
            ),
            "ema_replay": {"steps": steps, "tensors": self.names, "max_relative_error": error, "tolerance": tolerance},
        }
        out["holds"] = (
            out["key_parameters_in_optimizer"]
            == out["key_parameters_with_optimizer_state"]
            == out["key_parameters_with_grad"]
            == 0
            and steps > 0
            and error <= tolerance
        )
        return out
