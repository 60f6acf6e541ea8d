"""Throughput and model-FLOPs utilisation of MoCo training steps on the current device.

    python -m pipeline.bench gpu                 # MoCo v2 R50 b256 224px + MoCo v3 ViT-S, bf16
    python -m pipeline.bench gpu --dry           # the same code path, tiny sizes, on CPU

MFU = achieved model FLOP/s (counted once per step with torch's FlopCounterMode) divided by
the device's peak dense bf16 FLOP/s (a table by device name, or GPU_PEAK_TFLOPS).
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode

from pipeline.bench.timing import sync, write
from pipeline.dag.config import section
from pipeline.methods.build import build_model, build_optimizer
from pipeline.methods.section import Pretrain
from pipeline.nets.fast_path import FastPath

PEAK_BF16_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "A10": 125.0, "V100": 125.0}


def peak_tflops() -> float | None:
    if os.environ.get("GPU_PEAK_TFLOPS"):
        return float(os.environ["GPU_PEAK_TFLOPS"])
    if not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name(0)
    return next((v for k, v in PEAK_BF16_TFLOPS.items() if k in name), None)


def measure(p: Pretrain, batch: int, size: int, steps: int, device, fast_path: str = "auto") -> dict:
    torch.manual_seed(0)
    model = build_model(p, size, num_classes=1000, num_samples=100 * batch).to(device).train()
    fast = FastPath(fast_path, device, p.backbone)  # the Trainer's (auto: on for CUDA)
    fast.model(model)
    opt = build_optimizer(p, model.parameters())
    x1, x2 = (torch.randn(batch, 3, size, size, device=device) for _ in range(2))
    x1, x2 = fast.images(x1), fast.images(x2)
    index = torch.arange(batch, device=device)

    def step():
        with fast.autocast():
            loss, _, _ = model(x1, x2, index)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    step()  # warm-up (cudnn autotune, allocator)
    with FlopCounterMode(display=False) as counter:
        step()
    flops = counter.get_total_flops()
    sync()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    sync()
    seconds = (time.perf_counter() - t0) / steps
    peak = peak_tflops()
    achieved = flops / seconds / 1e12
    return {
        "batch": batch,
        "size": size,
        "s_per_step": round(seconds, 4),
        "img_per_s": round(batch / seconds, 1),
        "tflop_per_step": round(flops / 1e12, 3),
        "achieved_tflops": round(achieved, 2),
        "peak_tflops": peak,
        "mfu_%": round(100 * achieved / peak, 1) if peak else None,
    }


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dry", action="store_true", help="tiny sizes, runs anywhere (checks the code path)")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument(
        "--fast-path", default="auto", choices=["auto", "on", "off"], help="as pretrain.fast_path (auto: on for CUDA)"
    )
    args = ap.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if not args.dry and device.type != "cuda":
        raise SystemExit("no CUDA device: use --dry for the CPU dry run")
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
    batch, size, steps = (8, 32, 2) if args.dry else (256, 224, args.steps)
    cases: dict[str, dict[str, Any]] = {
        "moco_v2_resnet50": {
            "method": "moco",
            "variant": "v2",
            "backbone": "resnet50",
            "width": 8 if args.dry else 64,
            "cifar_stem": False,  # the ImageNet stem at 224 px, as the papers' throughput
            "dim": 128,
            "K": 64 * batch,
            "m": 0.999,
            "T": 0.2,
            "epochs": 1,
            "batch_size": batch,
            "lr": 0.03,
        },
        "moco_v3_vit_small": {
            "method": "moco",
            "variant": "v3",
            "backbone": "vit_small",
            "patch_size": 16,
            "depth": 2 if args.dry else None,
            "dim": 256,
            "mlp_dim": 256 if args.dry else 4096,
            "K": batch,
            "m": 0.99,
            "T": 0.2,
            "epochs": 1,
            "batch_size": batch,
            "lr": 1.5e-4,
        },
    }
    results = {
        name: measure(section("pretrain", p), batch, size, steps, device, args.fast_path) for name, p in cases.items()
    }
    for name, r in results.items():
        print(
            f"{name:<18} {r['img_per_s']:>9.1f} img/s  {r['s_per_step'] * 1e3:8.1f} ms/step  "
            f"{r['achieved_tflops']:.2f} TFLOP/s  MFU {r['mfu_%']}%"
        )
    out = {"device": str(device), "dry": args.dry, "fast_path": args.fast_path, "results": results}
    write("gpu" + ("_dry" if args.dry else ""), out)
    return out


if __name__ == "__main__":
    main()
