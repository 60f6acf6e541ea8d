"""A detection trial's next steps replayed from its resume state, in fp32 and under bf16
autocast side by side: each step's losses and gradient norm, up to the first loss that is not
finite. It answers "did the fast path make it diverge, or would fp32 from the same weights?"

    python -m pipeline.bench divergence --state results/state/<cell>/detect/trial0/last.pt \\
        --checkpoint results/cells/<cell>/pretrain/checkpoint.pt --data results/data/synthetic/det \\
        [--steps 8] [--lr 0.01]

The trial's settings and seed are the ones its state's fingerprint recorded; the replay
restores its weights, optimizer, BN statistics and RNG streams and draws the same batches, so
on the trial's own path it repeats the trial's steps exactly. ``--lr`` replays at another peak
lr (the schedule's shape kept). The state is only read.
"""

from __future__ import annotations

import argparse
import copy
import math
from pathlib import Path

import torch

from pipeline.bench.timing import write
from pipeline.dag.config import section
from pipeline.data.detection import load_splits
from pipeline.nets.fast_path import bf16_autocast
from pipeline.runtime import checkpoint, distributed
from pipeline.transfer.data import CocoBoxes, EpochOrder
from pipeline.transfer.model import build_detector
from pipeline.transfer.train import fine_tune_schedule, iterations, optimizer, restore, set_lr, to_device
from pipeline.transfer.trial import train_loader

PATHS = {"fp32": False, "bf16": True}


def replay(state: dict, ckpt: dict, data_dir: Path, bf16: bool, steps: int, lr: float | None = None) -> list[dict]:
    """The ``steps`` steps after ``state`` (a trial's resume state, rank 0's), on one path: per
    step its iteration, lr, losses by name, their sum and the gradient norm; it stops after
    the first step whose loss is not finite."""
    state = copy.deepcopy(state)  # the optimizer takes its momentum tensors as they are: a copy per replay
    recorded = state["fingerprint"]
    dc = section("detect", {**recorded["detect"], **({} if lr is None else {"lr": lr})})
    train_split, val_split = load_splits(data_dir, dc.dataset, dc.voc)
    train_set = CocoBoxes(train_split, flip=True, masks=dc.task == "segmentation")
    num_classes = max(train_split.num_classes, val_split.num_classes)
    detector = build_detector(ckpt, dc, num_classes, "the trial's checkpoint")
    device = torch.device("cpu")
    loader = train_loader(train_set, dc, distributed.init(), device, recorded["seed"])
    opt = optimizer(detector, dc)
    restore(detector, opt, {**state, "rank": state["ranks"][0]})
    checkpoint.set_rng_state(state["ranks"][0]["rng"])
    schedule = fine_tune_schedule(dc, iterations(dc, len(loader)))
    epoch, start = state["epoch"], state["step_in_epoch"]
    order = loader.sampler
    assert isinstance(order, EpochOrder) and loader.batch_size is not None
    order.epoch, order.start = epoch, start * loader.batch_size
    done, rows = epoch * len(loader) + start, list[dict]()
    detector.train()
    for images, targets in loader:
        if len(rows) == steps:
            break
        images, targets = to_device(images, targets, device)
        set_lr(opt, dc.learning_rate * schedule.factor(done))
        with bf16_autocast(device.type, bf16):
            losses = detector(images, targets)
        loss = sum(losses.values())
        row = {"iteration": done + 1, "lr": opt.param_groups[0]["lr"], "loss": float(loss.detach())}
        row["losses"] = {name: float(value.detach()) for name, value in losses.items()}
        rows.append(row)
        if not math.isfinite(row["loss"]):
            break
        opt.zero_grad()
        loss.backward()
        grads = [p.grad for p in detector.parameters() if p.grad is not None]
        row["grad_norm"] = float(torch.nn.utils.get_total_norm(grads))  # what clip_grad_norm_ measures
        opt.step()
        done += 1
    return rows


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--state", required=True, help="a detection trial's resume state (last.pt)")
    ap.add_argument("--checkpoint", required=True, help="the pretraining checkpoint the trial fine-tunes")
    ap.add_argument("--data", required=True, help="the detection data the trial trains on")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--lr", type=float, default=None, help="another peak lr (default: the trial's)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    state, ckpt = checkpoint.load(args.state), checkpoint.load(args.checkpoint)
    if "detector" not in state:
        raise SystemExit(f"[bench] {args.state} is not a detection trial's resume state")
    paths = {name: replay(state, ckpt, Path(args.data), bf16, args.steps, args.lr) for name, bf16 in PATHS.items()}
    print(
        f"from {args.state}: epoch {state['epoch'] + 1}, step {state['step_in_epoch']} (trial path: "
        f"{state['fingerprint']['fast path']})"
    )
    for name, rows in paths.items():
        print(f"  {name}:")
        for row in rows:
            parts = " ".join(f"{k.removeprefix('loss_')} {v:.4g}" for k, v in row["losses"].items())
            grad = f"grad norm {row['grad_norm']:.4g}" if "grad_norm" in row else "not finite: stopped"
            print(f"    iteration {row['iteration']} lr {row['lr']:.4g}: loss {row['loss']:.4g} ({parts}), {grad}")
    result = {"state": args.state, "lr": args.lr, "paths": paths}
    print(f"({write('divergence', result)})")
    return result


if __name__ == "__main__":
    main()
