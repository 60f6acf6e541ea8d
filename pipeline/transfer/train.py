"""Fine-tuning the detector: the learning-rate schedule and training length, the SGD loop over
the keyed batches (a mean loss per epoch), and its resume state: saved at epoch ends, every
detect.checkpoint_every iterations and on preemption, and resumed only by the same trial
(its fingerprint)."""

from __future__ import annotations

import hashlib
import json
import math
import sys
import time
from pathlib import Path

import torch
from torch import nn
from tqdm import tqdm

from pipeline.base.keys import JOBS, RUNTIME
from pipeline.dag.config import result_part, to_dict
from pipeline.dag.sections import Detect
from pipeline.data.detection import DetectionSplit
from pipeline.nets.fast_path import bf16_autocast
from pipeline.nets.optim import SGD, Schedule
from pipeline.runtime import checkpoint, distributed, preempt
from pipeline.transfer import log


def fine_tune_schedule(dc: Detect, total: int) -> Schedule:
    """``detect.warmup_iters`` of linear warmup (at most a quarter of the ``total`` iterations:
    random heads give huge first gradients, NaN at 2x lr), then cosine to zero, or x0.1 at each
    of ``lr_steps`` (iterations, as Detectron2's SOLVER.STEPS)."""
    warmup = max(1, min(dc.warmup_iters, total // 4))
    return Schedule(total, dc.schedule, warmup, tuple(float(s) for s in dc.lr_steps or ()))


def iterations(dc: Detect, steps_per_epoch: int) -> int:
    """Training length: detect.iterations when set (Detectron2's MAX_ITER), else epochs x steps."""
    return dc.iterations or dc.epochs * steps_per_epoch


def to_device(images, targets, device) -> tuple[list, list]:
    return (
        [im.to(device, non_blocking=True) for im in images],
        [{k: v.to(device) if torch.is_tensor(v) else v for k, v in t.items()} for t in targets],
    )


def optimizer(model: nn.Module, dc: Detect) -> torch.optim.Optimizer:
    """SGD with momentum over every weight the fine-tuning trains."""
    params = [p for p in model.parameters() if p.requires_grad]
    return SGD(params, lr=dc.learning_rate, momentum=0.9, weight_decay=dc.weight_decay)


def set_lr(opt: torch.optim.Optimizer, lr: float) -> None:
    for group in opt.param_groups:
        group["lr"] = lr


def restore(detector: nn.Module, opt: torch.optim.Optimizer, resumed: dict) -> None:
    """A trial's weights, optimizer and this rank's own BN statistics (unsynchronised BN on CPU
    ranks) from its resume state (``StageState.load``'s, this rank's values in ``rank``)."""
    detector.load_state_dict(resumed["detector"])
    opt.load_state_dict(resumed["optimizer"])
    with torch.no_grad():
        for name, buf in distributed.bn_statistics(detector).items():
            buf.copy_(resumed["rank"]["bn"][name])


def train(model: nn.Module, loader, dc: Detect, state: checkpoint.StageState, fast: bool = False) -> list[float]:
    """Fine-tune everything trainable (a FasterRCNN, or it wrapped in DDP); returns the mean
    loss of each epoch (this rank's). Resumes from ``state`` and saves it at epoch ends, every
    detect.checkpoint_every iterations and on a preemption signal (then exits for a requeue).
    ``fast``: the forward pass under bf16 autocast (detect.fast_path). What stays fp32 there:
    roi_align (torchvision's autocast runs it in fp32), the losses (autocast's fp32 list: cross
    entropy, smooth L1, BCE with logits) and so their sum, the weights and the optimiser."""
    detector = getattr(model, "module", model)  # DDP's: the weights saved under their own names
    device = next(model.parameters()).device
    opt = optimizer(model, dc)
    steps = len(loader)  # of a whole epoch: the sampler starts at 0
    total = iterations(dc, steps)
    epochs = math.ceil(total / steps)  # the last one cut short at `total` iterations
    schedule = fine_tune_schedule(dc, total)
    epoch, step, losses, curve = 0, 0, [], []
    resumed = state.load()
    if resumed is not None:
        restore(detector, opt, resumed)
        epoch, step, mine = resumed["epoch"], resumed["step_in_epoch"], resumed["rank"]
        losses, curve = list(mine["losses"]), list(mine["curve"])
    done = epoch * steps + step

    def save() -> None:
        bn = {k: v.cpu() for k, v in distributed.bn_statistics(detector).items()}
        state.save(
            epoch,
            step,
            {"losses": losses, "curve": curve, "bn": bn},
            detector=detector.state_dict(),
            optimizer=opt.state_dict(),
        )

    bar = tqdm(
        total=total,
        initial=done,
        desc="[detect] train",
        file=sys.stderr,
        mininterval=5,
        leave=False,
        disable=not distributed.is_main_process(),
    )
    model.train()
    while epoch < epochs:
        start = time.time()
        loader.sampler.epoch, loader.sampler.start = epoch, step * loader.batch_size
        for images, targets in loader:
            if done == total:
                break
            images, targets = to_device(images, targets, device)
            set_lr(opt, dc.learning_rate * schedule.factor(done))
            with bf16_autocast(device.type, fast):
                loss = sum(model(images, targets).values())
            if not torch.isfinite(loss):
                raise FloatingPointError(
                    f"loss is not finite at epoch {epoch + 1} step {step + 1}; lower detect.lr (now {dc.learning_rate})"
                )
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
            bar.update()
            done, step = done + 1, step + 1
            stop = preempt.stop_agreed(done, state.env.world_size)
            if stop or state.due(done):
                save()
            if stop:
                preempt.requeue_and_exit(log)
        curve.append(round(sum(losses) / len(losses), 5))
        log(
            f"epoch {epoch + 1}/{epochs} loss {curve[-1]:.4f} lr {opt.param_groups[0]['lr']:.5f} "
            f"({time.time() - start:.1f} s)"
        )
        epoch, step, losses = epoch + 1, 0, []
        save()
    bar.close()
    return curve


def run_fingerprint(dc: Detect, ckpt_path: Path, seed: int, train_split: DetectionSplit, path: str) -> dict:
    """What determines a trial (its resume state must match): the detect section's result keys,
    the seed, the checkpoint's content, the training split's images and annotations, and the
    path its steps take (``path``: fp32 or bf16 autocast, as detect.fast_path resolved on this
    node). A requeue where ``auto`` resolves otherwise sets the state aside, saying what differed,
    and trains afresh: one trial, one precision."""
    split = {k: train_split.coco.get(k) for k in ("images", "annotations", "categories")}
    text = json.dumps(split, sort_keys=True, separators=(",", ":"))
    return {
        "detect": json.loads(json.dumps(result_part("detect", to_dict(dc), drop=(RUNTIME, JOBS)))),
        "seed": seed,
        "checkpoint sha256": checkpoint.file_digest(ckpt_path),
        "train split sha256": hashlib.sha256(text.encode()).hexdigest()[:16],
        "fast path": path,
    }
