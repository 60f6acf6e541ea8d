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
With ``probe.ranks`` > 1 (augmented mode; torchrun starts one process per GPU) the views are
sharded over the ranks, each takes batch / ranks of every step and DDP averages the classifier's
gradients: the protocol's global batch and lr. With ``standardize`` on GPUs its BN is synced
(over the global batch); gloo on CPU has no SyncBN, so there each rank normalises its own share.
Every rank extracts the features and scores val each epoch; rank 0 runs kNN and writes.

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

from pipeline.base.layout import is_resnet
from pipeline.dag.config import ConfigError, load_stage_config, result_config, section
from pipeline.dag.sections import Data, Probe
from pipeline.data.augment import normalize
from pipeline.data.loaders import Reading, Views, batches_from, crop_loader, data_identity
from pipeline.eval.features import extract
from pipeline.eval.knn import knn_accuracy
from pipeline.nets.models import build_backbone
from pipeline.nets.optim import SGD, STEP_DROPS, Schedule, share_of
from pipeline.runtime import checkpoint, cpus, distributed, preempt, provenance
from pipeline.runtime.board import Board, board_dir
from pipeline.runtime.io import atomic_write_json
from pipeline.runtime.stage_log import stage_log
from pipeline.runtime.stopwatch import Stopwatch

SECTIONS = ["data", "probe"]
PROTOCOLS = {
    "moco": {"lr": 30.0, "batch_size": 256, "schedule": "step", "weight_decay": 0.0},
    "mocov3": {"lr": 0.1, "batch_size": 1024, "schedule": "cosine", "weight_decay": 0.0, "scale_lr": True},
}
MOCOV3_VIT_LR = 3.0  # the v3 reference probes its ViTs at lr 3 x bs/256 (its ResNets at 0.1)


log = stage_log("probe", when=distributed.is_main_process)


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
    if not is_resnet(arch["backbone"]):
        # MoCo v1/v2's lr 30 is set for a ResNet's pooled ReLU features; on a random ViT's class
        # token its training loss ends at 137 (lr 3: 16): either protocol probes a ViT as MoCo v3
        # does, at 3 x bs/256
        s["lr"], s["scale_lr"] = MOCOV3_VIT_LR, True
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


def synced(classifier: nn.Module, device: torch.device) -> nn.Module:
    """The classifier with its BN (``standardize``) synced over the ranks' GPUs; gloo on CPU has
    no SyncBN, so there each rank normalises its own share. No BN, or one process: unchanged."""
    return nn.SyncBatchNorm.convert_sync_batchnorm(classifier) if device.type == "cuda" else classifier


class LinearProbe:
    """SGD on a linear classifier; batches come from cached features or a frozen backbone.
    Under several ranks the classifier trains inside DDP (``model``), SyncBN on GPUs."""

    def __init__(
        self,
        dim: int,
        num_classes: int,
        s: dict,
        standardize: bool,
        steps_per_epoch: int,
        device: torch.device | None = None,
    ):
        device = device or torch.device("cpu")
        self.s, self.steps = s, max(1, steps_per_epoch * s["epochs"])
        # no warmup (the references' probes have none); step: x0.1 at 60 % and 80 %
        self.schedule = Schedule(self.steps, s["schedule"], drops=share_of(self.steps, STEP_DROPS))
        self.classifier = synced(make_classifier(dim, num_classes, standardize), device).to(device)
        self.model = distributed.ddp(self.classifier, device)
        self.opt = SGD(self.classifier.parameters(), lr=s["lr"], momentum=0.9, weight_decay=s["weight_decay"])
        self.step = 0

    def train_batch(self, feats: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        for group in self.opt.param_groups:
            group["lr"] = self.s["lr"] * self.schedule.factor(self.step)
        self.model.train()
        loss = nn.functional.cross_entropy(self.model(feats), labels)
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        self.step += 1
        return loss.detach()

    def state_dict(self) -> dict:
        return {"classifier": self.classifier.state_dict(), "optimizer": self.opt.state_dict(), "step": self.step}

    def load_state_dict(self, state: dict) -> None:
        self.classifier.load_state_dict(state["classifier"])
        self.opt.load_state_dict(state["optimizer"])
        self.step = state["step"]

    @torch.no_grad()
    def predict(self, feats: torch.Tensor) -> torch.Tensor:
        self.classifier.eval()
        return self.classifier(feats)


class CachedBatches:
    """The cached probe's batches: epoch e's order is drawn from a generator seeded once, in
    epoch order; ``start`` is its state at the current epoch's draw, which a resume restores."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, batch_size: int, seed: int):
        self.x, self.y, self.batch_size = x, y, batch_size
        self.start = torch.Generator().manual_seed(seed).get_state()

    def __call__(self, epoch: int, skip: int = 0):
        g = torch.Generator()
        g.set_state(self.start)
        batches = torch.randperm(len(self.x), generator=g).split(self.batch_size)
        for i in batches[skip:]:
            yield self.x[i], self.y[i]
        self.start = g.get_state()  # the next epoch's draw


def augmented_views(
    data_dir: Path, d: Data, pc: Probe, batch_size: int, labelled, threads: cpus.Threads, sharded: bool = False
):
    """The augmented probe's loader: RandomResizedCrop (scale 0.08-1, torchvision's default, as
    the references) + flip of each whole stored image, over the labelled images only (e.g.
    STL-10's 5k of 105k): ceil(labelled / batch) steps an epoch, the steps its schedule has.
    ``sharded``: this rank's share of each epoch's order (``batch_size``: per rank)."""
    views = Views(crop_size=d.crop_size, scale_min=0.08, seed=pc.seed)
    reading = Reading(
        batch_size=batch_size,
        loader=d.loader,
        workers=threads.loader,
        threads=threads.torch,
        distributed=sharded,
    )
    return crop_loader(data_dir / "train.beton", views, reading, indices=labelled)


class AugmentedBatches:
    """The augmented probe's batches: new crop + flip views (pipeline.data.crop_loader), their
    features from the frozen backbone."""

    def __init__(self, views, backbone: nn.Module, device):
        self.views, self.backbone, self.device = views, backbone, device
        self.start = None  # nothing to restore: the loader draws epoch e's views from (seed, e)

    def __call__(self, epoch: int, skip: int = 0):
        for images, labels, _ in batches_from(self.views, skip, epoch):
            with torch.no_grad():
                feats = self.backbone(normalize(images.to(self.device)))
            yield feats, labels.long().to(self.device)


def train_cached(probe: LinearProbe, train_x, train_y, val_x, val_y, seed: int) -> list:
    """The cached probe's fit, keeping no resume state (e.g. the recipe study's held-out score)."""
    no_state = checkpoint.StageState(None, {}, distributed.DistEnv(), log)
    return fit(probe, CachedBatches(train_x, train_y, probe.s["batch_size"], seed), val_x, val_y, no_state)


def fit(probe: LinearProbe, batches, val_x, val_y, state: checkpoint.StageState) -> list:
    """Train for the protocol's epochs on ``batches(epoch, skip)``; resumes from ``state`` and
    saves it at epoch ends, every probe.checkpoint_every steps and on a preemption signal (then
    exits for a requeue). Returns the curve, one point per epoch."""
    epoch, step, total, seen, curve = 0, 0, 0.0, 0, []
    resumed = state.load()
    if resumed is not None:
        probe.load_state_dict(resumed["probe"])
        batches.start = resumed["batch_order"]
        epoch, step, curve = resumed["epoch"], resumed["step_in_epoch"], resumed["curve"]
        total, seen = resumed["rank"]["loss_sum"], resumed["rank"]["seen"]

    def save() -> None:
        sums = {"loss_sum": total, "seen": seen}
        state.save(epoch, step, sums, probe=probe.state_dict(), batch_order=batches.start, curve=curve)

    while epoch < probe.s["epochs"]:
        for feats, labels in batches(epoch, step):
            total += float(probe.train_batch(feats, labels)) * len(labels)
            seen, step = seen + len(labels), step + 1
            stop = preempt.stop_agreed(step, state.env.world_size)
            if stop or state.due(step):
                save()
            if stop:
                preempt.requeue_and_exit(log)
        loss_sum, count = distributed.sum_over_ranks(total, seen)  # every rank's share of the epoch
        curve.append(curve_point(probe, epoch, loss_sum / max(count, 1), val_x, val_y))
        point = " ".join(f"{k}={v}" for k, v in curve[-1].items() if k != "epoch")
        log(f"epoch {epoch + 1}/{probe.s['epochs']} {point}")
        epoch, step, total, seen = epoch + 1, 0, 0.0, 0
        save()
    return curve


def curve_point(probe, epoch, train_loss, val_x, val_y) -> dict:
    acc = topk_accuracy(probe.predict(val_x), val_y)["top1"]
    return {"epoch": epoch + 1, "train_loss": round(train_loss, 5), "val_top1": round(acc, 3)}


def run(cfg: dict, ckpt_path: Path, data_dir: Path, out: Path, state_dir: Path | None = None) -> dict | None:
    """``cfg``: the stage's sections as the job's JSON gives them (recorded so in the metrics),
    typed here once. ``state_dir``: where the resume state lives (None: none is kept). Returns
    the metrics (rank 0; the other ranks None)."""
    pc, d, watch = section("probe", cfg["probe"]), section("data", cfg["data"]), Stopwatch()
    torch.manual_seed(pc.seed)
    env = distributed.init()  # one process, or probe.ranks under torchrun (one per GPU)
    if env.world_size != pc.ranks:
        raise ConfigError(f"probe.ranks={pc.ranks}, but {env.world_size} processes run this probe")
    backbone, ckpt = load_frozen_backbone(ckpt_path)
    device = distributed.rank_device(env.local_rank)
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
    if mode == "cached":
        batches: CachedBatches | AugmentedBatches = CachedBatches(train_x, train_y, s["batch_size"], pc.seed)
        steps = math.ceil(len(train_x) / s["batch_size"])
    else:
        per_rank = per_rank_batch(s["batch_size"], env.world_size)
        views = augmented_views(data_dir, d, pc, per_rank, labelled.numpy(), threads, sharded=env.world_size > 1)
        batches, steps = AugmentedBatches(views, backbone, device), len(views)
    probe = LinearProbe(train_x.shape[1], len(classes), s, pc.standardize, steps, device)
    fingerprint = run_fingerprint(cfg, ckpt_path, data_dir)
    state = checkpoint.StageState(state_dir, fingerprint, env, log, pc.checkpoint_every)
    with watch.phase("fit"):
        curve = fit(probe, batches, val_x, val_y, state)
    distributed.check_ranks_agree(probe.classifier, "linear classifier")
    if not env.is_main:  # rank 0 scores, runs kNN and writes
        return finish(state, env, None)
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
        "ranks": env.world_size,
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
    board.drop_earlier_runs()  # the whole curve, the epochs before a resume included
    for point in curve:
        board.add(point, step=point["epoch"])
    board.close()
    return finish(state, env, metrics)


def finish(state: checkpoint.StageState, env: distributed.DistEnv, metrics: dict | None) -> dict | None:
    """Every rank: the resume state retired once the outputs exist, the process group closed."""
    state.retire()
    if env.world_size > 1:
        distributed.barrier()
        distributed.shutdown()
    return metrics


def per_rank_batch(batch_size: int, world_size: int) -> int:
    """Views per rank and step: the protocol's batch split evenly over the ranks."""
    if batch_size % world_size:
        raise ConfigError(f"the probe's batch of {batch_size} is not a multiple of probe.ranks={world_size}")
    return batch_size // world_size


def run_fingerprint(cfg: dict, ckpt_path: Path, data_dir: Path) -> dict:
    """What determines a probe (its resume state must match): the result keys of its sections,
    the checkpoint's content and the training data's (pipeline.data.loaders.data_identity)."""
    sections = result_config({name: cfg[name] for name in SECTIONS})
    identity = {"checkpoint sha256": checkpoint.file_digest(ckpt_path), "data": data_identity(data_dir)}
    return json.loads(json.dumps({**sections, **identity}))  # plain lists, as a state loads


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True, help="inline JSON or a YAML file with 'data' and 'probe'")
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--data", required=True, help="folder with train/val .beton and .json")
    ap.add_argument("--out", required=True, help="metrics JSON")
    ap.add_argument("--state", help="resume folder, outside the outputs (default: <out without .json>.state)")
    args = ap.parse_args(argv)
    out = Path(args.out)
    try:
        cfg = load_stage_config(args.config, SECTIONS)
        preempt.install()
        m = run(cfg, Path(args.checkpoint), Path(args.data), out, Path(args.state or out.with_suffix(".state")))
    except (ConfigError, checkpoint.CheckpointError, FileNotFoundError) as err:
        raise SystemExit(f"[probe] error: {err}") from None
    if m is not None:  # rank 0's
        log(f"top1={m['top1']} top5={m['top5']} knn={m['knn_top1']} ({m['mode']}, {m['protocol']})")


if __name__ == "__main__":
    main()
