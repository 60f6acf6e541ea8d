"""Weights people can take elsewhere: one cell's pretrained backbone in the formats other code
loads, each with a JSON sidecar (the cell's parameters, its probe top-1, each file's sha256 and
how to load it).

- ResNets: ``torchvision.pth``, a state dict with torchvision's key names (no ``fc``: the
  classifier is not pretrained), and ``detectron2.pkl``, the pickle Detectron2 loads as
  ``MODEL.WEIGHTS`` (its key names, numpy arrays, ``matching_heuristics``), as the MoCo
  repository's converter writes it for its detection configs;
- ViTs: ``timm.pth``, a state dict of timm's ``VisionTransformer`` (class token, fixed sin-cos
  positions, the frozen patch projection included; no head).

    python -m pipeline.export --checkpoint results/cells/base/pretrain/checkpoint.pt \\
        --probe results/cells/base/probe.json --cell base --out results/cells/base/export/export.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import pickle
from pathlib import Path

import torch

from pipeline.base.layout import VITS, is_resnet, is_vit
from pipeline.runtime import checkpoint
from pipeline.runtime.io import atomic_path, atomic_write_json

TIMM_NAMES = {name: f"{name}_patch16_224" for name in VITS}  # e.g. vit_small_patch16_224


def torchvision_loading(arch: dict) -> str:
    """Python that builds the torchvision model the state dict loads into (strict=True)."""
    name, width = arch["backbone"], arch.get("width", 64)
    if width != 64:
        return (
            f"# width {width} is not a torchvision ResNet: build it with "
            f"pipeline.nets.models.build_backbone({arch!r}) and load_state_dict(state, strict=True)"
        )
    lines = [f"model = torchvision.models.{name}()"]
    if arch.get("norm") == "gn":
        lines = [  # the GroupNorm of pipeline.nets.models.group_norm; math: the snippet imports what it adds
            "import math",
            f"model = torchvision.models.{name}(norm_layer=lambda c: torch.nn.GroupNorm(math.gcd(32, c), c))",
        ]
    if arch.get("cifar_stem"):
        lines += [
            "model.conv1 = torch.nn.Conv2d(3, 64, 3, 1, 1, bias=False)  # CIFAR stem: 3x3, stride 1",
            "model.maxpool = torch.nn.Identity()",
        ]
    lines += [
        "model.fc = torch.nn.Identity()  # fc is not exported: it was never pretrained",
        "model.load_state_dict(torch.load(path), strict=True)",
    ]
    return "\n".join(lines)


def timm_loading(arch: dict) -> str:
    size, patch = arch.get("image_size", 224), arch.get("patch_size", 16)
    depth = f", depth={arch['depth']}" if arch.get("depth") else ""
    return (
        f"model = timm.create_model({TIMM_NAMES[arch['backbone']]!r}, pretrained=False, num_classes=0, "
        f"img_size={size}, patch_size={patch}{depth}, global_pool='token')\n"
        "model.load_state_dict(torch.load(path), strict=True)"
    )


def detectron2_name(key: str) -> str:
    """torchvision ResNet key -> Detectron2's (stem, res2..res5, convN.norm, shortcut)."""
    if not key.startswith("layer"):
        key = "stem." + key
    for stage in range(1, 5):
        key = key.replace(f"layer{stage}.", f"res{stage + 1}.")
    for conv in range(1, 4):
        key = key.replace(f"bn{conv}.", f"conv{conv}.norm.")
    return key.replace("downsample.0.", "shortcut.").replace("downsample.1.", "shortcut.norm.")


def detectron2_weights(state: dict) -> dict:
    return {
        "model": {detectron2_name(k): v.numpy() for k, v in state.items() if not k.endswith("num_batches_tracked")},
        "__author__": "moco-pipeline",
        "matching_heuristics": True,
    }


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def run(ckpt_path: Path, out: Path, probe: Path | None = None, cell: str | None = None) -> dict:
    """Write the cell's export files next to ``out`` (the sidecar JSON); returns the sidecar."""
    ckpt = checkpoint.load(ckpt_path)
    arch, state = ckpt["arch"], {k: v.detach().cpu().contiguous() for k, v in ckpt["backbone"].items()}
    folder = out.parent
    files = {}

    def save(name: str, write, loading: str, what: str) -> None:
        path = folder / name
        with atomic_path(path) as tmp:
            write(tmp)
        files[name] = {"what": what, "sha256": sha256(path), "load": loading}

    if is_resnet(arch["backbone"]):
        save(
            "torchvision.pth",
            lambda p: torch.save(state, p),
            torchvision_loading(arch),
            "torchvision ResNet state dict, fc excluded (not pretrained)",
        )
        save(
            "detectron2.pkl",
            lambda p: p.write_bytes(pickle.dumps(detectron2_weights(state))),
            "MODEL.WEIGHTS: <this file>, MODEL.RESNETS.STRIDE_IN_1X1: False, INPUT.FORMAT: RGB, "
            "MODEL.PIXEL_MEAN/STD: ImageNet's in 0-255 (as the MoCo detection configs)",
            "Detectron2 checkpoint (stem, res2..res5), BN statistics included",
        )
    elif is_vit(arch["backbone"]):
        save(
            "timm.pth", lambda p: torch.save(state, p), timm_loading(arch), "timm VisionTransformer state dict, no head"
        )
    config = ckpt.get("config") or {}
    probe_record = json.loads(Path(probe).read_text()) if probe and Path(probe).is_file() else {}
    sidecar = {
        "cell": cell,
        "method": ckpt.get("method"),
        "arch": arch,
        "params": config.get("pretrain"),
        "probe_top1": probe_record.get("top1"),
        "knn_top1": probe_record.get("knn_top1"),
        "checkpoint": str(ckpt_path),
        "checkpoint_sha256": sha256(Path(ckpt_path)),
        "files": files,
    }
    atomic_write_json(sidecar, out)
    return sidecar


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", required=True, help="the cell's pretrain/checkpoint.pt")
    ap.add_argument("--probe", default=None, help="the cell's probe.json (its top-1 goes into the sidecar)")
    ap.add_argument("--cell", default=None, help="the cell's id, for the sidecar")
    ap.add_argument("--out", required=True, help="the sidecar JSON; the weights are written beside it")
    args = ap.parse_args(argv)
    try:
        sidecar = run(Path(args.checkpoint), Path(args.out), args.probe, args.cell)
    except checkpoint.CheckpointError as err:
        raise SystemExit(f"[export] error: {err}") from None
    print(f"[export] {', '.join(sidecar['files'])} -> {Path(args.out).parent}")


if __name__ == "__main__":
    main()
