"""One detection trial from end to end: load the checkpoint and the splits, build and verify
the detector, set up the ranks, fine-tune, score the val split on rank 0 and write its metrics
JSON (every setting and the timing recorded with it)."""

from __future__ import annotations

import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader

from pipeline.dag.config import section, to_dict
from pipeline.dag.sections import Detect
from pipeline.data.detection import load_splits
from pipeline.nets.fast_path import precision, resolve
from pipeline.runtime import checkpoint, cpus, distributed
from pipeline.runtime.io import atomic_write_json
from pipeline.runtime.stopwatch import Stopwatch
from pipeline.transfer import log
from pipeline.transfer.data import CocoBoxes, EpochOrder, EpochSeeded, collate
from pipeline.transfer.evaluate import evaluate, predict
from pipeline.transfer.model import build_detector, test_scale, verify_backbone
from pipeline.transfer.ranks import normalisation, per_rank_batch, sync_batchnorm
from pipeline.transfer.train import iterations, run_fingerprint, train


def train_loader(train_set: CocoBoxes, dc: Detect, env, device: torch.device, seed: int) -> DataLoader:
    """This rank's batches of a trial: the order and the flips drawn from ``seed`` and the epoch."""
    return DataLoader(
        EpochSeeded(train_set, seed),
        batch_size=per_rank_batch(dc, env.world_size),
        sampler=EpochOrder(len(train_set), env.world_size, env.rank, seed),
        collate_fn=collate,
        num_workers=dc.workers,
        pin_memory=device.type == "cuda",
        drop_last=len(train_set) > dc.batch_size,  # equal-sized steps, unless one batch is all there is
        generator=torch.Generator().manual_seed(seed),  # (not the process's stream: the resume restores that)
    )


def run(
    cfg: dict, ckpt_path: Path, data_dir: Path, out: Path, seed: int | None = None, state_dir: Path | None = None
) -> dict | None:
    """Fine-tune on the train split, score the val split, write the metrics JSON to ``out``
    (rank 0; the other ranks return None); the resume state lives in ``state_dir`` (None: none).
    ``seed`` (default detect.seed) draws the new layers, the batch order and the flips."""
    dc = section("detect", cfg["detect"])
    cfg = {**cfg, "detect": to_dict(dc)}  # the metrics record every setting, defaults included
    seed, watch = dc.seed if seed is None else seed, Stopwatch()
    torch.manual_seed(seed)
    ckpt = checkpoint.load(ckpt_path)
    train_split, val_split = load_splits(data_dir, dc.dataset, dc.voc)
    masks = dc.task == "segmentation"
    train_set, val_set = CocoBoxes(train_split, flip=True, masks=masks), CocoBoxes(val_split, masks=masks)
    num_classes = max(train_split.num_classes, val_split.num_classes)  # label 0 is background
    detector = build_detector(ckpt, dc, num_classes, str(ckpt_path))
    verify_backbone(detector, ckpt["backbone"], str(ckpt_path))
    env = distributed.init()  # one process, or one per GPU under torchrun (detect.ranks)
    device = distributed.rank_device(env.local_rank)
    cpus.use(dc.threads, device.type, dc.workers or None)  # torch threads; decoding: detect.workers
    fast = resolve(dc.fast_path, device, "detect.fast_path")
    detector, synced = sync_batchnorm(detector, dc, env.world_size, device)
    detector.to(device)
    per_rank = per_rank_batch(dc, env.world_size)
    loader = train_loader(train_set, dc, env, device, seed)
    head, norm_text, total = dc.head, normalisation(dc, synced, env.world_size), iterations(dc, len(loader))
    log(
        f"{train_split.name}: {len(train_set)} train / {val_split.name}: {len(val_set)} val images, "
        f"{num_classes - 1} classes, {ckpt['arch']}, {dc.task}, head {head}, {norm_text}, "
        f"{total} iterations, seed {seed}, {env.world_size} rank(s) on {device}, steps in {precision(fast)}"
    )
    start = time.time()
    watch.mark("setup")
    model = distributed.ddp(detector, device)
    state = checkpoint.StageState(
        state_dir, run_fingerprint(dc, ckpt_path, seed, train_split, precision(fast)), env, log, dc.checkpoint_every
    )
    with watch.phase("fine_tune"):
        curve = train(model, loader, dc, state, fast)
    distributed.check_ranks_agree(detector, "detector")
    metrics = None
    if env.is_main:  # one evaluation, on the full val split, in fp32: bf16 would round the decoded
        # boxes to 8 bits (~0.4 px at 96 px), which moves IoU at AP's strict thresholds
        with watch.phase("evaluate"):
            test_scale(detector, dc)
            metrics = evaluate(val_split, predict(detector, val_set, per_rank), dc)
        metrics.update(
            {
                "epochs": len(curve),
                "iterations": total,
                "train_loss": curve,
                "seconds": round(time.time() - start, 1),
                "arch": ckpt["arch"],
                "method": ckpt.get("method"),
                "head": head,
                "task": dc.task,
                "norm": dc.norm,
                "head_norm": dc.new_layers_norm,
                "lr": dc.learning_rate,
                "sync_bn": synced,
                "ranks": env.world_size,
                "batch_size": dc.batch_size,
                "normalisation": norm_text,
                "fast_path": precision(fast),  # the fine-tuning steps' path
                "seed": seed,
                "checkpoint": str(ckpt_path),
                "train_set": train_split.name,
                "val_set": val_split.name,
                "num_train_images": len(train_set),
                "num_val_images": len(val_set),
                "config": cfg,
                "timing": watch.report(),
            }
        )
        atomic_write_json(metrics, out)
    state.retire()
    if env.world_size > 1:
        distributed.barrier()
        distributed.shutdown()
    return metrics
