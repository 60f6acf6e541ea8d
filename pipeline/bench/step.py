"""Training-step cost of MoCo against a plain supervised step of the same encoder and batch.

A MoCo v1/v2 step adds one no-grad forward of the key encoder to forward + backward +
update: with backward ~ 2 forwards, the floor of the ratio is (3 + 1) / 3 ~ 1.33. MoCo v3
runs both views through both encoders: floor (2*3 + 2) / 3 ~ 2.67.

Backward is not 2 forwards on every CPU, so the v2 floor is also measured: the key
encoder's forward alone (shuffled, split BN, no grad), timed beside the steps; the measured
floor is (supervised + key forward) / supervised. ``moco_v2_unguarded`` (no BN-leak guard)
shows what the guard costs.

The rivals beside their nearest MoCo mechanism: SimCLR against end-to-end (one encoder, in-batch
negatives, keys with gradients; SimCLR adds the symmetric loss over 2N views), BYOL against MoCo v3
(both views through both encoders, symmetric, a predictor): ``rival_ratios``.

``--fast-path both`` times every step in fp32 and on the fast path (bf16 autocast, channels_last
where the model takes it), interleaved in one run: ``fast_path_speedup`` is each step's fp32
median over its fast path's, and each path keeps its own ratios and floor (``paths``).

    python -m pipeline.bench step [--batch 128 --size 32 --width 64 --rounds 3] [--fast-path both]
"""

from __future__ import annotations

import argparse
import contextlib
import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from pipeline.bench.timing import OUT_DIR, interleaved, write
from pipeline.dag.config import section
from pipeline.methods.build import build_model, build_optimizer
from pipeline.methods.moco.builder import MoCo
from pipeline.methods.section import Pretrain
from pipeline.nets.fast_path import FastPath

FLOORS = {"moco_v2": 4 / 3, "moco_v3": 8 / 3}
RIVALS = {"simclr": "end_to_end", "byol": "moco_v3"}  # each rival's step over its nearest MoCo step's
# the ViT's step over the base cell's (MoCo v2) and over MoCo v3's on the ResNet
VIT_PAIRS = ("moco_v2", "moco_v3")


def embedded_vit() -> dict:
    """The ViT the demo's grid trains (config.yaml's grid.cells): its backbone, patch and depth."""
    from pipeline.base.layout import is_vit
    from pipeline.dag.config import DEFAULT_CONFIG, load_yaml

    cells = load_yaml(DEFAULT_CONFIG)["grid"].get("cells") or []
    vit = next(c for c in cells if is_vit(c.get("backbone", "")) and c.get("variant") == "v3")
    return {k: vit[k] for k in ("backbone", "patch_size", "depth") if k in vit}


def optimizer_step(loss_of, opt):
    """One training step: ``loss_of()`` (the forward pass and loss), backward, update."""

    def step():
        loss = loss_of()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


def step_fn(model: nn.Module, opt, x1, x2, labels, index, context=contextlib.nullcontext):
    """A step of one of our methods (they return the loss first); the forward pass runs in
    ``context()`` (the fast path's autocast)."""

    def loss():
        with context():
            return model(x1, x2, index, labels)[0]

    return optimizer_step(loss, opt)


def fast_step(path: FastPath, model: nn.Module, p: Pretrain, images, labels, index):
    """A step of ``model`` on the fast path ``path`` (its memory format and autocast)."""
    x1, x2 = (path.images(x) for x in images)
    return step_fn(path.model(model), build_optimizer(p, model.parameters()), x1, x2, labels, index, path.autocast)


def key_forward_fn(model: MoCo, x, context=contextlib.nullcontext):
    """The key encoder's forward alone, as a MoCo step runs it (no grad, BN-leak guard on)."""

    def forward():
        with torch.no_grad(), context():
            model.encode_keys(x)

    return forward


def method_steps(name: str, p: Pretrain, setting: str, size: int, images, labels, index, suffix: str) -> dict:
    """The timed callables of one method on one path (``setting``, as pretrain.fast_path), named
    ``name + suffix``; MoCo v2's come with its key forward (the measured floor) and, on the fast
    path, the same step kept contiguous (split BN regrouping into channels, one batch_norm call
    per layer: the path before split BN ran channels_last batches per sub-batch)."""
    model = build_model(p, size, num_classes=10, num_samples=20 * p.K).train()
    fp = FastPath(setting, torch.device("cpu"), p.backbone)
    steps = {name + suffix: fast_step(fp, model, p, images, labels, index)}
    if name == "moco_v2":
        assert isinstance(model, MoCo)
        steps["key_forward" + suffix] = key_forward_fn(fp.model(model), fp.images(images[1]), fp.autocast)
        if fp.channels_last:
            contiguous = FastPath(setting, torch.device("cpu"), p.backbone)
            contiguous.channels_last = False
            model = build_model(p, size, num_classes=10, num_samples=20 * p.K).train()
            steps["moco_v2_contiguous" + suffix] = fast_step(contiguous, model, p, images, labels, index)
    return steps


def summarise(res: dict, suffix: str, batch: int, setting: str, backbone: str) -> dict:
    """One path's ratios from the interleaved medians ``res`` (its steps named with ``suffix``)."""
    mine = {name[: len(name) - len(suffix)]: r for name, r in res.items() if name.endswith(suffix)}
    sup = mine["supervised"]["median_s"]
    ratios = {name: round(mine[name]["median_s"] / sup, 3) for name in [*FLOORS, "moco_v2_unguarded"]}
    measured_floor = round((sup + mine["key_forward"]["median_s"]) / sup, 3)
    return {
        "fast_path": FastPath(setting, torch.device("cpu"), backbone).describe(),
        "results": mine,
        "ratio_vs_supervised": ratios,
        "floor": {k: round(v, 3) for k, v in FLOORS.items()},
        "moco_v2_measured_floor": measured_floor,
        "moco_v2_over_measured_floor": round(ratios["moco_v2"] / measured_floor, 3),
        "rival_ratios": {
            f"{rival}/{rest}": round(mine[rival]["median_s"] / mine[rest]["median_s"], 3)
            for rival, rest in RIVALS.items()
        },
        "vit_ratios": {
            f"moco_v3_vit/{rest}": round(mine["moco_v3_vit"]["median_s"] / mine[rest]["median_s"], 3)
            for rest in VIT_PAIRS
        },
        "samples_per_s": {k: round(batch / v["median_s"], 1) for k, v in mine.items()},
        "split_bn_channels_last_over_contiguous": (
            round(mine["moco_v2"]["median_s"] / mine["moco_v2_contiguous"]["median_s"], 3)
            if "moco_v2_contiguous" in mine
            else None
        ),
    }


def report(path: dict, batch: int) -> None:
    """One path's lines: each step, its ratio and floor, the measured floor, the rivals."""
    ratios = path["ratio_vs_supervised"]
    print(f"fast path {path['fast_path']}:")
    for name, r in path["results"].items():
        extra = f"  ratio {ratios[name]:.3f}" if name in ratios else ""
        extra += f" (floor {FLOORS[name]:.2f})" if name in FLOORS else ""
        print(f"  {name:<17} {r['median_s']:.3f} s/step  {batch / r['median_s']:.1f} samples/s{extra}")
    print(
        f"  moco_v2 floor measured on this CPU: {path['moco_v2_measured_floor']:.3f} (supervised + key "
        f"forward); moco_v2 is {path['moco_v2_over_measured_floor']:.3f}x that floor"
    )
    for pair, ratio in {**path["rival_ratios"], **path["vit_ratios"]}.items():
        print(f"  {pair}: {ratio:.3f}x")


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--size", type=int, default=32)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--backbone", default="resnet18")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument(
        "--fast-path",
        default="off",
        choices=["auto", "on", "off", "both"],
        help="as pretrain.fast_path: on = channels_last (ResNet) + bf16 autocast on this CPU; "
        "both = every step on either path, interleaved in one run (fp32 / fast path per step)",
    )
    ap.add_argument(
        "--all-methods",
        action="store_true",
        help="also v1, end-to-end, memory bank and v3 ViT-tiny (patch 4, 12 blocks) at the same batch",
    )
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    base: dict[str, Any] = {
        "backbone": args.backbone,
        "width": args.width,
        "cifar_stem": args.size <= 64,
        "dim": 128,
        "K": 16 * args.batch,
        "m": 0.999,
        "T": 0.2,
        "epochs": 1,
        "batch_size": args.batch,
        "lr": 0.03,
        "mlp_dim": 1024,
        "weight_decay": 1e-4,
    }  # as before the defaults moved to config.yaml's 5e-4
    variants: dict[str, dict[str, Any]] = {
        "supervised": {"method": "supervised"},
        "moco_v2": {"method": "moco", "variant": "v2"},
        "moco_v3": {"method": "moco", "variant": "v3", "T": 1.0, "m": 0.99},
        # the demo grid's ViT (its geometry: config.yaml's grid.cells), AdamW as its recipe
        "moco_v3_vit": {"method": "moco", "variant": "v3", **embedded_vit(), "T": 0.2, "m": 0.99, "lr": 1e-3},
        "end_to_end": {"method": "moco", "variant": "v2", "mechanism": "end_to_end"},
        "simclr": {"method": "simclr", "T": 0.1, "optimizer": "lars"},
        "byol": {"method": "byol", "m": 0.99, "optimizer": "lars"},
    }
    if args.all_methods:
        variants.update(
            {
                "moco_v1": {"method": "moco", "variant": "v1"},
                "memory_bank": {"method": "moco", "variant": "v2", "mechanism": "memory_bank"},
                "moco_v3_vit_tiny": {
                    "method": "moco",
                    "variant": "v3",
                    "backbone": "vit_tiny",
                    "patch_size": 4,
                    "T": 0.2,
                    "m": 0.99,
                },
            }
        )
    images = torch.randn(args.batch, 3, args.size, args.size), torch.randn(args.batch, 3, args.size, args.size)
    labels, index = torch.randint(0, 10, (args.batch,)), torch.arange(args.batch)
    # without the guard: no shuffle and plain BN over the whole batch
    variants["moco_v2_unguarded"] = {"method": "moco", "variant": "v2", "shuffle_bn": False, "bn_splits": 1}
    # --fast-path both: every step in fp32 and on the fast path, interleaved in one run
    settings = {"off": "@fp32", "on": "@fast"} if args.fast_path == "both" else {args.fast_path: ""}
    steps = {}
    for setting, suffix in settings.items():
        for name, overrides in variants.items():
            p = section("pretrain", {**base, **overrides})
            steps.update(method_steps(name, p, setting, args.size, images, labels, index, suffix))
    res = interleaved(steps, rounds=args.rounds)
    common = {"batch": args.batch, "size": args.size, "backbone": args.backbone, "width": args.width}
    common["threads"] = torch.get_num_threads()
    paths = {
        setting: summarise(res, suffix, args.batch, setting, args.backbone) for setting, suffix in settings.items()
    }
    if len(paths) == 1:
        result = {**common, **paths[args.fast_path]}
    else:  # each step's fp32 time over its fast path's, and the two paths' own summaries
        speedup = {
            name: round(res[f"{name}@fp32"]["median_s"] / res[f"{name}@fast"]["median_s"], 3) for name in variants
        }
        result = {**common, "fast_path_speedup": speedup, "paths": paths, "results": res}
    loader = OUT_DIR / "loader.json"
    if loader.is_file():  # is data the bottleneck? loader samples/s against the step's
        result["loader_samples_per_s"] = json.loads(Path(loader).read_text()).get("samples_per_s")
    on = args.fast_path != "both" and FastPath(args.fast_path, torch.device("cpu"), args.backbone).on
    path = write("step_paths" if args.fast_path == "both" else "step_fast_path" if on else "step", result)
    print(f"{args.backbone} width {args.width}, batch {args.batch}, {args.size} px, {torch.get_num_threads()} threads")
    for summary in paths.values():
        report(summary, args.batch)
    for name, ratio in result.get("fast_path_speedup", {}).items():
        print(f"  {name:<17} fp32 / fast path: {ratio:.3f}x")
    print(f"({path})")
    return result


if __name__ == "__main__":
    main()
