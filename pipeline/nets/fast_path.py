"""The GPU fast path of a training step, as one switch (``pretrain.fast_path``): ResNets in
channels_last memory format and the forward pass under bf16 autocast.

Both pay off on tensor cores and only cost time on most CPUs, so ``auto`` turns the fast path
on for CUDA devices only; ``on`` forces it on any device, which is how the tests run the very
lines a GPU runs on a CPU (torch has channels_last and bf16 autocast on CPU too).
"""

from __future__ import annotations

from typing import TypeVar

import torch
from torch import nn

from pipeline.base.layout import FAST_PATH_SETTINGS as SETTINGS
from pipeline.base.layout import is_resnet

M = TypeVar("M", bound=nn.Module)


def resolve(setting: str | bool, device: torch.device, key: str = "pretrain.fast_path") -> bool:
    """Whether ``setting`` (of config ``key``) puts a step on ``device`` on the fast path."""
    if setting not in SETTINGS:
        raise ValueError(f"{key} must be one of {SETTINGS}, not {setting!r}")
    return setting in ("on", True) or (setting == "auto" and device.type == "cuda")


def bf16_autocast(device_type: str, on: bool) -> torch.autocast:
    """A forward pass's context: bf16 autocast when ``on``, a no-op otherwise (pretraining's steps,
    the detection fine-tuning's and their benchmarks all enter it here)."""
    return torch.autocast(device_type, dtype=torch.bfloat16, enabled=on)


def precision(on: bool) -> str:
    """A path in a word or two: what a summary, a trial's metrics and the footnotes say."""
    return "bf16 autocast" if on else "fp32"


class FastPath:
    """The path of one run. ``kept``: the path its resume state recorded. Under ``auto`` a resumed
    run keeps it, so that a requeue onto a node where ``auto`` resolves otherwise does not change
    the precision half-way through a run (an explicit on / off is the fingerprint's business)."""

    def __init__(self, setting: str | bool, device: torch.device, backbone: str, kept: bool | None = None):
        here = resolve(setting, device)
        self.on = kept if setting == "auto" and kept is not None else here
        self.kept_note = (
            f"kept from the run's state (auto resolves to {'on' if here else 'off'} on this {device.type})"
            if self.on != here
            else ""
        )
        # split BN too: in channels_last its encoder runs once per sub-batch
        # (pipeline.methods.split_bn), where regrouping the batch into channels would copy it
        self.channels_last = self.on and is_resnet(backbone)
        self.device_type = device.type

    def autocast(self) -> torch.autocast:
        """The forward pass's context: bf16 autocast on the fast path, a no-op off it."""
        return bf16_autocast(self.device_type, self.on)

    def model(self, model: M) -> M:
        """The model in the path's memory format (in place, as ``Module.to``)."""
        return model.to(memory_format=torch.channels_last) if self.channels_last else model

    def images(self, x: torch.Tensor) -> torch.Tensor:
        """A batch of images in the path's memory format."""
        return x.contiguous(memory_format=torch.channels_last) if self.channels_last else x

    @property
    def precision(self) -> str:
        """The run's path in a word or two, as its summary and the tables' footnote name it."""
        return precision(self.on)

    def describe(self) -> str:
        kept = f"; {self.kept_note}" if self.kept_note else ""
        if not self.on:
            return f"off (fp32, contiguous) on {self.device_type}{kept}"
        layout = "channels_last" if self.channels_last else "contiguous (not a ResNet)"
        return f"on: bf16 autocast, {layout}, on {self.device_type}{kept}"
