"""Pretraining stage: MoCo v1/v2 (or a supervised / random baseline) on an FFCV dataset.

Runs as one process, under torchrun, or as one srun task per GPU (rank and world size come
from the environment; see pipeline.distributed). Resumes from ``--state`` (a folder outside
the rule's outputs) after a kill, a requeue or a time limit.

    python -m pipeline.pretrain --config workflow/config/config.yaml \
        --data results/data/ffcv --out results/cells/base/pretrain --state results/state/base
"""
from __future__ import annotations

import argparse
import csv
import io
import json
import math
import random
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from pipeline import checkpoint, distributed
from pipeline.augment import recipe
from pipeline.config import ConfigError, load_stage_config
from pipeline.data import two_view_loader
from pipeline.io import atomic_write_json, atomic_write_text
from pipeline.models import Encoder, build_backbone, projection_head
from pipeline.moco import MoCo
from pipeline.moco.momentum import relative_drift

SECTIONS = ["data", "pretrain"]


def log(msg: str) -> None:
    print(f"[pretrain] {msg}", flush=True)


def arch_of(p: dict) -> dict:
    return {"backbone": p["backbone"], "width": p.get("width", 64), "cifar_stem": p.get("cifar_stem", False)}


class Supervised(nn.Module):
    """The supervised baseline: the same backbone trained with labels (cross-entropy)."""

    def __init__(self, backbone: nn.Module, num_classes: int):
        super().__init__()
        self.encoder_q = Encoder(backbone, nn.Linear(backbone.out_dim, num_classes))

    def forward(self, im_q, im_k, index=None, labels=None):
        logits = self.encoder_q(im_q)
        return nn.functional.cross_entropy(logits, labels), logits


def build_model(p: dict, num_classes: int) -> nn.Module:
    backbone = build_backbone(arch_of(p))
    if p["method"] == "supervised":
        return Supervised(backbone, num_classes)
    head = projection_head(backbone.out_dim, p.get("dim", 128), mlp=p.get("variant", "v2") == "v2")
    return MoCo(Encoder(backbone, head), dim=p.get("dim", 128), K=p["K"], m=p["m"], T=p["T"],
                mask_same_source=p.get("mask_same_source", False))


def lr_at(p: dict, progress: float) -> float:
    """Learning rate at a fraction of training: cosine, or x0.1 at 60% and 80% (step)."""
    if p.get("schedule", "cosine") == "cosine":
        return p["lr"] * 0.5 * (1.0 + math.cos(math.pi * progress))
    return p["lr"] * (0.1 ** sum(progress >= f for f in (0.6, 0.8)))


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def queue_checksum(model: nn.Module) -> str:
    q = getattr(model, "queue", None)
    if q is None:
        return "-"
    return f"{float(q.keys.double().sum()):.10f}/{int(q.ptr)}"


def train(cfg: dict, data_dir: Path, out_dir: Path, state_dir: Path, progress: bool = True) -> dict:
    p, d = cfg["pretrain"], cfg["data"]
    env = distributed.init()
    torch.set_num_threads(p.get("threads", 2))
    seed_everything(p.get("seed", 0) + env.rank)
    info = json.loads((data_dir / "train.json").read_text()) if (data_dir / "train.json").is_file() else {}
    num_classes = len(info.get("classes", [])) or 1
    model = build_model(p, num_classes) if p["method"] != "random" else None
    log(f"rank {env.rank}/{env.world_size} on {env.host}: method={p['method']} "
        f"backbone={p['backbone']} width={p.get('width')} K={p.get('K')} m={p.get('m')} T={p.get('T')}")

    if p["method"] == "random":  # the random-init baseline: same backbone, no training
        backbone = build_backbone(arch_of(p))
        return finish(cfg, out_dir, backbone.state_dict(), log_rows=[], env=env, extra={"epochs_run": 0})

    if p["batch_size"] % env.world_size != 0:
        raise ConfigError(f"pretrain.batch_size={p['batch_size']} is not divisible by the world size {env.world_size}")
    local_batch = p["batch_size"] // env.world_size
    params = [t for t in model.parameters() if t.requires_grad]
    optimizer = torch.optim.SGD(params, lr=p["lr"], momentum=p.get("sgd_momentum", 0.9),
                                weight_decay=p.get("weight_decay", 1e-4))
    net = model
    if env.world_size > 1:
        net = nn.parallel.DistributedDataParallel(model, broadcast_buffers=False)

    start_epoch, log_rows = 0, []
    state_path = state_dir / "last.pt"
    if state_path.is_file():
        state = checkpoint.load(state_path)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start_epoch, log_rows = state["epoch"], list(state["log"])
        log(f"resumed from {state_path} at epoch {start_epoch}")

    loader = two_view_loader(data_dir / "train.beton", local_batch, d.get("crop_size", 32),
                             scale_min=p.get("crop_scale_min", 0.2), workers=d.get("workers", 2),
                             seed=p.get("seed", 0), distributed=env.world_size > 1,
                             threads=p.get("threads", 2))
    if len(loader) == 0:
        raise ConfigError(f"pretrain.batch_size={p['batch_size']} exceeds the training set "
                          f"({info.get('num_samples', '?')} images)")
    augment = recipe(p.get("aug", "v2"), d.get("crop_size", 32))
    steps_per_epoch, total = len(loader), len(loader) * p["epochs"]
    diverged = False
    for epoch in range(start_epoch, p["epochs"]):
        # Augmentation randomness from (seed, epoch, rank): a resumed epoch replays exactly.
        torch.manual_seed(p.get("seed", 0) * 100003 + epoch * 1009 + env.rank)
        loader.set_epoch(epoch)
        model.train()
        t0 = time.time()
        loss_sum = torch.zeros(())
        correct = torch.zeros(())
        seen = 0
        bar = tqdm(loader, desc=f"epoch {epoch + 1}/{p['epochs']}", disable=not (progress and env.is_main),
                   mininterval=5, leave=False, file=sys.stderr)
        for it, (v1, v2, labels, index) in enumerate(bar):
            lr = lr_at(p, (epoch * steps_per_epoch + it) / max(total, 1))
            for group in optimizer.param_groups:
                group["lr"] = lr
            x1, x2 = augment(v1), augment(v2)
            labels, index = labels.long().clone(), index.long().clone()
            if p["method"] == "supervised":
                loss, logits = net(x1, x2, labels=labels)
                target = labels
            else:
                loss, logits = net(x1, x2, index)
                target = torch.zeros_like(labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            loss_sum += loss.detach() * len(labels)  # summed on device: no sync per step
            correct += (logits.detach().argmax(1) == target).sum()
            seen += len(labels)
        row = epoch_row(model, p, epoch, loss_sum, correct, seen, lr, time.time() - t0)
        log_rows.append(row)
        log(" ".join(f"{k}={v}" for k, v in row.items()))
        if not math.isfinite(row["loss"]):
            diverged = True
            log(f"loss diverged at epoch {epoch + 1}: stopping; the cell is reported as failed")
        if env.is_main:
            checkpoint.save(state_path, arch=arch_of(p), method=p["method"], model=model.state_dict(),
                            optimizer=optimizer.state_dict(), epoch=epoch + 1, log=log_rows,
                            rng=checkpoint.rng_state())
        distributed.barrier()
        if diverged:
            break
    log(f"rank {env.rank}/{env.world_size} on {env.host}: queue checksum {queue_checksum(model)}")
    return finish(cfg, out_dir, model.encoder_q.backbone.state_dict(), log_rows, env,
                  extra={"epochs_run": len(log_rows), "diverged": diverged, "model": model.state_dict()})


def epoch_row(model, p, epoch, loss_sum, correct, seen, lr, seconds) -> dict:
    row = {"epoch": epoch + 1, "loss": round(float(loss_sum) / max(seen, 1), 5),
           "inst_acc": round(100.0 * float(correct) / max(seen, 1), 3), "lr": round(lr, 6),
           "seconds": round(seconds, 2)}
    if isinstance(model, MoCo):
        mean_age, max_age = model.queue.age_stats(int(model.step))
        row.update(m=model.m, queue_age_mean=round(mean_age, 2), queue_age_max=max_age,
                   drift=round(relative_drift(model.encoder_k, model.encoder_q), 6))
    return row


def finish(cfg, out_dir: Path, backbone_state, log_rows, env, extra: dict) -> dict:
    """Write the stage's outputs (rank 0): checkpoint, per-epoch CSV log, summary."""
    p = cfg["pretrain"]
    summary = {"method": p["method"], "arch": arch_of(p), "world_size": env.world_size,
               "epochs_run": extra.get("epochs_run", 0), "diverged": extra.get("diverged", False),
               "final": log_rows[-1] if log_rows else {}}
    if env.is_main:
        out_dir.mkdir(parents=True, exist_ok=True)
        checkpoint.save(out_dir / "checkpoint.pt", arch=arch_of(p), method=p["method"],
                        backbone=backbone_state, model=extra.get("model", {}), log=log_rows, config=cfg)
        atomic_write_text(rows_to_csv(log_rows), out_dir / "log.csv")
        atomic_write_json(summary, out_dir / "summary.json")
        atomic_write_json(cfg, out_dir / "config.json")
    distributed.barrier()
    return summary


def rows_to_csv(rows: list[dict]) -> str:
    cols = ["epoch", "loss", "inst_acc", "lr", "m", "queue_age_mean", "queue_age_max", "drift", "seconds"]
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=cols, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True, help="inline JSON or a YAML file with 'data' and 'pretrain'")
    ap.add_argument("--data", required=True, help="folder with train.beton (and train.json)")
    ap.add_argument("--out", required=True, help="output folder: checkpoint.pt, log.csv, summary.json")
    ap.add_argument("--state", help="resume folder, outside the outputs (default: <out>/../state)")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)
    try:
        cfg = load_stage_config(args.config, SECTIONS)
    except ConfigError as err:
        raise SystemExit(f"[pretrain] config error: {err}")
    out = Path(args.out)
    state = Path(args.state) if args.state else out.parent / "state"
    summary = train(cfg, Path(args.data), out, state, progress=not args.no_progress)
    log(f"done: {json.dumps(summary['final'])}")
    distributed.shutdown()


if __name__ == "__main__":
    main()
