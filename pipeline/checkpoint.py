"""One checkpoint format for resume, probe and detection transfer.

A checkpoint is a dict of tensors and plain values only, so it loads with
``torch.load(weights_only=True)``: {"format", "arch", "method", "backbone" (query backbone
state), "model", "optimizer", "epoch", "step", "rng", "log", "config"}.
"""
from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import torch

from pipeline.io import atomic_torch_save

FORMAT = "moco-pipeline/1"


class CheckpointError(RuntimeError):
    pass


def rng_state() -> dict:
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    return {"torch": torch.get_rng_state(), "numpy": torch.from_numpy(keys.astype(np.int64)),
            "numpy_pos": int(pos), "numpy_gauss": [int(has_gauss), float(cached)],
            "python": random.getstate()}


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    has_gauss, cached = state["numpy_gauss"]
    np.random.set_state(("MT19937", state["numpy"].numpy().astype(np.uint32), state["numpy_pos"],
                         int(has_gauss), cached))
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))


def save(path: str | Path, **fields) -> None:
    atomic_torch_save({"format": FORMAT, **fields}, path)


def load(path: str | Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:
        raise CheckpointError(f"cannot read checkpoint {path}: {err}") from None
    if not isinstance(ckpt, dict) or ckpt.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not a {FORMAT} checkpoint")
    return ckpt


def load_backbone_state(module: torch.nn.Module, state: dict, source: str) -> None:
    """Load every backbone tensor; a missing, unexpected or misshapen key is an error."""
    own = module.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    shapes = [k for k in set(own) & set(state) if own[k].shape != state[k].shape]
    if missing or unexpected or shapes:
        raise CheckpointError(
            f"{source}: backbone weights do not match the model: missing {missing[:5]}"
            f"{'...' if len(missing) > 5 else ''}, unexpected {unexpected[:5]}"
            f"{'...' if len(unexpected) > 5 else ''}, wrong shape {shapes[:5]}")
    module.load_state_dict(state, strict=True)
