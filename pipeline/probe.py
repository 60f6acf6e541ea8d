"""Linear probe on the frozen query backbone of a pretraining checkpoint (+ weighted kNN).

Protocols (``probe.protocol``): ``moco`` (SGD lr 30, momentum 0.9, wd 0, x0.1 at 60% and
80% of the epochs, batch 256) and ``mocov3`` (batch 1024, cosine, lr 0.1 x batch/256 for a
ResNet, 3 x batch/256 for a ViT, wd 0: the v3 reference's CONFIG.md); ``lr`` / ``batch_size``
in the config override the protocol's when set.
Modes (``probe.mode``): ``augmented`` trains on RandomResizedCrop + flip views of the whole
stored train images (labelled ones only), as the papers do; ``cached`` extracts the features
once (centre view) and trains on them, much faster. Validation (and cached training) features
come from the centre square of ``probe.crop_ratio`` of the shorter side: 0.875 is the
references' Resize(256) + CenterCrop(224). The metrics say which protocol and mode produced them. The backbone is
frozen entirely (BN statistics included, eval mode) and verified bit-identical afterwards.

    python -m pipeline.probe --config workflow/config/config.yaml \\
        --checkpoint results/cells/base/pretrain/checkpoint.pt --data results/data/ffcv \\
        --out results/cells/base/probe.json
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import torch
from torch import nn
from tqdm import tqdm

from pipeline.data.augment import normalize
from pipeline.data.loaders import crop_loader
from pipeline.eval.features import extract
from pipeline.eval.knn import knn_accuracy
from pipeline.nets.models import build_backbone
from pipeline.nets.optim import decayed
from pipeline.runtime import checkpoint, cpus, provenance
from pipeline.runtime.board import Board, board_dir
from pipeline.runtime.distributed import rank_device
from pipeline.runtime.io import atomic_write_json
from pipeline.runtime.stage_log import stage_log
from pipeline.runtime.stopwatch import Stopwatch
from pipeline.spec.config import ConfigError, load_stage_config, section
from pipeline.spec.layout import is_resnet
from pipeline.spec.sections import Data, Probe

SECTIONS = ["data", "probe"]
PROTOCOLS = {
    "moco": {"lr": 30.0, "batch_size": 256, "schedule": "step", "weight_decay": 0.0},
    "mocov3": {"lr": 0.1, "batch_size": 1024, "schedule": "cosine", "weight_decay": 0.0, "scale_lr": True},
}
MOCOV3_VIT_LR = 3.0  # the v3 reference probes its ViTs at lr 3 x bs/256 (its ResNets at 0.1)


log = stage_log("probe")


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
    top = logits.topk(min(max(ks), logits.shape[1]), dim=1).indices
    hit = top == labels[:, None]
    return {f"top{k}": 100.0 * float(hit[:, :k].any(1).float().mean()) for k in ks}


def settings(pc: Probe, arch: dict) -> dict:
    """The protocol's hyper-parameters for this backbone, with the config's explicit overrides
    (``pc``: the probe section)."""
    s: dict[str, Any] = dict(PROTOCOLS[pc.protocol])
    if pc.protocol == "mocov3" and not is_resnet(arch["backbone"]):
        s["lr"] = MOCOV3_VIT_LR
    s["batch_size"] = pc.batch_size or s["batch_size"]
    if pc.lr:
        s["lr"] = pc.lr
    elif s.pop("scale_lr", False):
        s["lr"] = s["lr"] * s["batch_size"] / 256
    s.pop("scale_lr", None)
    s["weight_decay"] = pc.weight_decay
    s["epochs"] = pc.epochs
    return s


def make_classifier(dim: int, num_classes: int, standardize: bool) -> nn.Module:
    """Linear layer, optionally behind a parameter-free BN (feature standardisation, as MAE's
    probe): still a linear classifier at test time, and far less sensitive to the lr."""
    linear = nn.Linear(dim, num_classes)
    nn.init.normal_(linear.weight, std=0.01)
    nn.init.zeros_(linear.bias)
    return nn.Sequential(nn.BatchNorm1d(dim, affine=False), linear) if standardize else linear


class LinearProbe:
    """SGD on a linear classifier; batches come from cached features or a frozen backbone."""

    def __init__(
        self,
        dim: int,
        num_classes: int,
        s: dict,
        standardize: bool,
        steps_per_epoch: int,
        device: torch.device | str = "cpu",
    ):
        self.s, self.steps = s, max(1, steps_per_epoch * s["epochs"])
        self.classifier = make_classifier(dim, num_classes, standardize).to(device)
        self.opt = torch.optim.SGD(
            self.classifier.parameters(), lr=s["lr"], momentum=0.9, weight_decay=s["weight_decay"]
        )
        self.step = 0

    def train_batch(self, feats: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        for group in self.opt.param_groups:
            group["lr"] = self.s["lr"] * decayed(self.s["schedule"], self.step / self.steps)
        self.classifier.train()
        loss = nn.functional.cross_entropy(self.classifier(feats), labels)
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        self.step += 1
        return loss.detach()

    @torch.no_grad()
    def predict(self, feats: torch.Tensor) -> torch.Tensor:
        self.classifier.eval()
        return self.classifier(feats)


def train_cached(probe: LinearProbe, train_x, train_y, val_x, val_y, seed: int) -> list:
    g = torch.Generator().manual_seed(seed)
    bs, curve = probe.s["batch_size"], []
    for epoch in range(probe.s["epochs"]):
        perm = torch.randperm(len(train_x), generator=g)
        total = sum(float(probe.train_batch(train_x[i], train_y[i])) * len(i) for i in perm.split(bs))
        curve.append(curve_point(probe, epoch, total / len(train_x), val_x, val_y))
    return curve


def augmented_views(data_dir: Path, d: Data, pc: Probe, batch_size: int, labelled, threads: cpus.Threads):
    """The augmented probe's loader: RandomResizedCrop (scale 0.08-1, torchvision's default, as
    the references) + flip of each whole stored image, over the labelled images only (e.g.
    STL-10's 5k of 105k): ceil(labelled / batch) steps an epoch, the steps its schedule has."""
    return crop_loader(
        data_dir / "train.beton",
        batch_size,
        d.crop_size,
        scale_min=0.08,
        workers=threads.loader,
        seed=pc.seed,
        threads=threads.torch,
        loader=d.loader,
        indices=labelled,
    )


def train_augmented(probe: LinearProbe, backbone, loader, val_x, val_y) -> list:
    curve = []
    for epoch in tqdm(range(probe.s["epochs"]), desc="probe", mininterval=10):
        total, seen = 0.0, 0
        for images, labels, _ in loader:
            with torch.no_grad():
                feats = backbone(normalize(images.to(val_x.device)))
            total += float(probe.train_batch(feats, labels.long().to(val_x.device))) * len(labels)
            seen += len(labels)
        curve.append(curve_point(probe, epoch, total / max(seen, 1), val_x, val_y))
    return curve


def curve_point(probe, epoch, train_loss, val_x, val_y) -> dict:
    acc = topk_accuracy(probe.predict(val_x), val_y)["top1"]
    return {"epoch": epoch + 1, "train_loss": round(train_loss, 5), "val_top1": round(acc, 3)}


def run(cfg: dict, ckpt_path: Path, data_dir: Path, out: Path) -> dict:
    """``cfg``: the stage's sections as the job's JSON gives them (recorded so in the metrics),
    typed here once."""
    pc, d, watch = section("probe", cfg["probe"]), section("data", cfg["data"]), Stopwatch()
    torch.manual_seed(pc.seed)
    backbone, ckpt = load_frozen_backbone(ckpt_path)
    device = rank_device()
    threads = cpus.use(pc.threads, device.type, d.workers)
    backbone.to(device)
    before = snapshot(backbone)
    classes = json.loads((data_dir / "train.json").read_text())["classes"]
    crop, workers, mode = d.crop_size, threads.loader, pc.mode
    opts: dict[str, Any] = dict(threads=threads.torch, loader=d.loader, crop_ratio=pc.crop_ratio)
    watch.mark("setup")
    with watch.phase("features"):
        train_x, train_y = extract(backbone, data_dir / "train.beton", crop, workers, **opts)
        val_x, val_y = extract(backbone, data_dir / "val.beton", crop, workers, **opts)
    # e.g. STL-10 train+unlabeled: the probe learns from labelled images only (features in file order)
    labelled = torch.nonzero(train_y >= 0).flatten().cpu()
    train_x, train_y = train_x[labelled], train_y[labelled]
    if len(train_y) == 0:
        raise ConfigError(f"{data_dir / 'train.beton'} has no labelled images: a probe needs labels")
    log(
        f"features: train {tuple(train_x.shape)}, val {tuple(val_x.shape)}; mode {mode}, "
        f"protocol {pc.protocol}, on {device}"
    )
    s = settings(pc, ckpt["arch"])
    views = augmented_views(data_dir, d, pc, s["batch_size"], labelled.numpy(), threads) if mode != "cached" else None
    steps = len(views) if views is not None else math.ceil(len(train_x) / s["batch_size"])
    probe = LinearProbe(train_x.shape[1], len(classes), s, pc.standardize, steps, device)
    with watch.phase("fit"):
        if views is None:
            curve = train_cached(probe, train_x, train_y, val_x, val_y, pc.seed)
        else:
            curve = train_augmented(probe, backbone, views, val_x, val_y)
    logits = probe.predict(val_x)
    acc, pred = topk_accuracy(logits, val_y), logits.argmax(1)
    per_class = {
        name: round(100.0 * float((pred[val_y == c] == c).float().mean()), 2)
        for c, name in enumerate(classes)
        if bool((val_y == c).any())
    }
    with watch.phase("knn"):
        knn = knn_accuracy(train_x, train_y, val_x, val_y, len(classes), k=pc.knn_k, T=pc.knn_t)
    assert_unchanged(backbone, before)  # fail loudly if anything touched the frozen encoder
    metrics = {
        "mode": mode,
        "protocol": pc.protocol,
        "top1": round(acc["top1"], 3),
        "top5": round(acc["top5"], 3),
        "knn_top1": round(knn, 3),
        "per_class_top1": per_class,
        "curve": curve,
        "settings": s,
        "checkpoint": str(ckpt_path),
        "method": ckpt.get("method"),
        "arch": ckpt["arch"],
        "feature_dim": int(train_x.shape[1]),
        "config": cfg,
        "timing": watch.report(),
        "provenance": provenance.record(),  # CPU, flags, library versions, commit
    }
    atomic_write_json(metrics, out)
    board = Board(board_dir(out.parent, "probe"), "probe")  # the training curve
    board.drop_earlier_runs()  # a probe never resumes: earlier curves are another run's
    for point in curve:
        board.add(point, step=point["epoch"])
    board.close()
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
        raise SystemExit(f"[probe] error: {err}") from None
    log(f"top1={m['top1']} top5={m['top5']} knn={m['knn_top1']} ({m['mode']}, {m['protocol']})")


if __name__ == "__main__":
    main()
