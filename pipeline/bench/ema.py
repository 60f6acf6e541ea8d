"""Momentum update of a ViT-B-sized parameter set: fused multi-tensor ops vs a Python loop.

python -m pipeline.bench ema [--rounds 10]
"""

from __future__ import annotations

import argparse

import torch
from torch import nn

from pipeline.bench.timing import interleaved, write
from pipeline.methods.momentum_target import momentum_update
from pipeline.nets.models import build_backbone


@torch.no_grad()
def loop_update(key: nn.Module, query: nn.Module, m: float) -> None:
    """The textbook form: one pair of kernels per parameter tensor."""
    for p_k, p_q in zip(key.parameters(), query.parameters()):
        p_k.data.mul_(m).add_(p_q.data, alpha=1.0 - m)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--arch", default="vit_base")
    args = ap.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    query = build_backbone({"backbone": args.arch, "patch_size": 16, "image_size": 224}).to(device)
    key = build_backbone({"backbone": args.arch, "patch_size": 16, "image_size": 224}).to(device)
    n_params = sum(p.numel() for p in query.parameters())
    n_tensors = len(list(query.parameters()))
    res = interleaved(
        {
            "fused_foreach": lambda: momentum_update(key, query, 0.999),
            "python_loop": lambda: loop_update(key, query, 0.999),
        },
        rounds=args.rounds,
    )
    speedup = res["python_loop"]["median_s"] / res["fused_foreach"]["median_s"]
    result = {
        "arch": args.arch,
        "params": n_params,
        "tensors": n_tensors,
        "device": device,
        "results": res,
        "speedup_fused_vs_loop": round(speedup, 3),
    }
    path = write("ema", result)
    print(
        f"EMA update of {args.arch} ({n_params / 1e6:.1f}M params in {n_tensors} tensors, {device}): "
        f"fused {res['fused_foreach']['median_s'] * 1e3:.2f} ms, loop {res['python_loop']['median_s'] * 1e3:.2f} ms "
        f"-> speedup x{speedup:.2f}  ({path})"
    )
    return result


if __name__ == "__main__":
    main()
