"""Linear probe on the frozen query backbone of a pretraining checkpoint (+ weighted kNN).

``cached`` mode: features of the train and val splits are extracted once (centre view, no
augmentation, BN in eval mode), then a linear classifier is trained on them. The metrics say
which mode produced them. Every backbone tensor is verified unchanged afterwards.

    python -m pipeline.probe --config workflow/config/config.yaml \
        --checkpoint results/cells/base/pretrain/checkpoint.pt --data results/data/ffcv \
        --out results/cells/base/probe.json
"""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch
from torch import nn

from pipeline import checkpoint
from pipeline.config import ConfigError, load_stage_config
from pipeline.features import extract
from pipeline.io import atomic_write_json
from pipeline.knn import knn_accuracy
from pipeline.models import build_backbone

SECTIONS = ["data", "probe"]


def log(msg: str) -> None:
    print(f"[probe] {msg}", flush=True)


def load_frozen_backbone(path: Path) -> tuple[nn.Module, dict]:
    ckpt = checkpoint.load(path)
    backbone = build_backbone(ckpt["arch"])
    checkpoint.load_backbone_state(backbone, ckpt["backbone"], str(path))
    for t in backbone.parameters():
        t.requires_grad_(False)
    return backbone.eval(), ckpt


def snapshot(module: nn.Module) -> dict:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def assert_unchanged(module: nn.Module, before: dict) -> None:
    changed = [k for k, v in module.state_dict().items() if not torch.equal(v, before[k])]
    if changed:
        raise RuntimeError(f"frozen backbone changed during the probe: {changed[:5]}")


def topk_accuracy(logits: torch.Tensor, labels: torch.Tensor, ks=(1, 5)) -> dict:
    top = logits.topk(max(ks), dim=1).indices
    hit = top == labels[:, None]
    return {f"top{k}": 100.0 * float(hit[:, :k].any(1).float().mean()) for k in ks}


def train_linear(train_x, train_y, val_x, val_y, num_classes: int, pc: dict) -> tuple[nn.Module, list]:
    """SGD (momentum 0.9, cosine) on standardised features; returns the layer and its curve."""
    g = torch.Generator().manual_seed(pc.get("seed", 0))
    mean, std = train_x.mean(0), train_x.std(0).clamp_min(1e-6)
    scale = lambda x: (x - mean) / std  # noqa: E731  (a frozen, parameter-free BN)
    tx, vx = scale(train_x), scale(val_x)
    layer = nn.Linear(tx.shape[1], num_classes)
    opt = torch.optim.SGD(layer.parameters(), lr=pc["lr"], momentum=0.9, weight_decay=pc.get("weight_decay", 0.0))
    bs, epochs = pc.get("batch_size", 256), pc["epochs"]
    steps = math.ceil(len(tx) / bs) * epochs
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5 * (1 + math.cos(math.pi * s / steps)))
    curve = []
    for epoch in range(epochs):
        perm = torch.randperm(len(tx), generator=g)
        total = 0.0
        for start in range(0, len(tx), bs):
            idx = perm[start:start + bs]
            loss = nn.functional.cross_entropy(layer(tx[idx]), train_y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            total += float(loss.detach()) * len(idx)
        if epoch == epochs - 1 or (epoch + 1) % max(1, epochs // 10) == 0:
            with torch.no_grad():
                acc = topk_accuracy(layer(vx), val_y)["top1"]
            curve.append({"epoch": epoch + 1, "train_loss": round(total / len(tx), 5), "val_top1": round(acc, 3)})
    layer.eval()
    return (lambda x: layer(scale(x))), curve


def run(cfg: dict, ckpt_path: Path, data_dir: Path, out: Path) -> dict:
    pc, d = cfg["probe"], cfg["data"]
    torch.manual_seed(pc.get("seed", 0))
    torch.set_num_threads(pc.get("threads", 2))
    backbone, ckpt = load_frozen_backbone(ckpt_path)
    before = snapshot(backbone)
    classes = json.loads((data_dir / "train.json").read_text())["classes"]
    crop = d.get("crop_size", 32)
    train_x, train_y = extract(backbone, data_dir / "train.beton", crop, d.get("workers", 2), threads=pc.get("threads"))
    val_x, val_y = extract(backbone, data_dir / "val.beton", crop, d.get("workers", 2), threads=pc.get("threads"))
    log(f"features: train {tuple(train_x.shape)}, val {tuple(val_x.shape)}")
    classifier, curve = train_linear(train_x, train_y, val_x, val_y, len(classes), pc)
    with torch.no_grad():
        logits = classifier(val_x)
    acc = topk_accuracy(logits, val_y)
    pred = logits.argmax(1)
    per_class = {name: round(100.0 * float((pred[val_y == c] == c).float().mean()), 2)
                 for c, name in enumerate(classes) if bool((val_y == c).any())}
    knn = knn_accuracy(train_x, train_y, val_x, val_y, len(classes))
    assert_unchanged(backbone, before)
    metrics = {"mode": pc.get("mode", "cached"), "top1": round(acc["top1"], 3), "top5": round(acc["top5"], 3),
               "knn_top1": round(knn, 3), "per_class_top1": per_class, "curve": curve,
               "checkpoint": str(ckpt_path), "method": ckpt.get("method"), "arch": ckpt["arch"],
               "feature_dim": int(train_x.shape[1]), "config": cfg}
    atomic_write_json(metrics, out)
    return metrics


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True, help="inline JSON or a YAML file with 'data' and 'probe'")
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--data", required=True, help="folder with train/val .beton and .json")
    ap.add_argument("--out", required=True, help="metrics JSON")
    args = ap.parse_args(argv)
    try:
        cfg = load_stage_config(args.config, SECTIONS)
        m = run(cfg, Path(args.checkpoint), Path(args.data), Path(args.out))
    except (ConfigError, checkpoint.CheckpointError, FileNotFoundError) as err:
        raise SystemExit(f"[probe] error: {err}")
    log(f"top1={m['top1']} top5={m['top5']} knn={m['knn_top1']} ({m['mode']})")


if __name__ == "__main__":
    main()
