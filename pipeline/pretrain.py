"""Pretraining stage: a registered method (MoCo v1/v2/v3, end-to-end, memory bank, SimCLR,
BYOL) or a supervised / random baseline, on an FFCV dataset.

Runs as one process, under torchrun, or as one srun task per GPU (rank and world size come
from the environment; see pipeline.runtime.distributed). Resumes exactly from ``--state`` (a folder
outside the rule's outputs) after a kill, a requeue or a time limit: the resume state is
written at every epoch end and every ``checkpoint_every`` steps. It resumes only its own run
(the state's fingerprint, run_fingerprint, must match) and, once its outputs are written,
renames its state to ``finished.pt``, which no run resumes from.

    python -m pipeline.pretrain --config workflow/config/config.yaml \\
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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from pipeline.dag.config import ConfigError, load_stage_config, pretrain_warnings, result_config, section
from pipeline.dag.sections import Data
from pipeline.data.augment import view_recipes
from pipeline.data.loaders import Centre, Reading, Views, data_identity, eval_loader, is_converted, two_view_loader
from pipeline.eval.features import features_of
from pipeline.eval.knn import knn_accuracy
from pipeline.methods import Metric, method_spec
from pipeline.methods.build import (
    arch_of,
    bn_guard_text,
    build_model,
    build_optimizer,
    check_global_bn,
    pretrain_schedule,
)
from pipeline.methods.ema_check import EmaRecord
from pipeline.methods.momentum_target import MomentumTarget
from pipeline.methods.section import Pretrain
from pipeline.nets.fast_path import FastPath
from pipeline.nets.method import Method, Step
from pipeline.nets.models import build_backbone
from pipeline.runtime import checkpoint, cpus, distributed, preempt, provenance
from pipeline.runtime.board import Board, board_dir
from pipeline.runtime.io import atomic_write_json, atomic_write_text
from pipeline.runtime.stage_log import stage_log
from pipeline.runtime.stopwatch import Stopwatch

SECTIONS = ["data", "pretrain"]
# log.csv's columns, in this order where a row has them, the method's own metrics (its entry's
# MethodSpec.metrics) after the loss; other metrics and diagnostics follow in the order reported
# (the summary's "final" row holds them all, the metrics not logged too)
LOG_COLUMNS = [
    "epoch",
    "loss",
    "knn",
    "lr",
    "m",
    "queue_age_mean",
    "queue_age_p99",
    "queue_age_max",
    "drift",
    "negative_drift_mean",
    "negative_drift_max",
    "seconds",
]


log = stage_log("pretrain")


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def run_fingerprint(cfg: dict, data_dir: Path, world_size: int) -> dict:
    """Everything that determines a run, and nothing that differs between a job and its requeue
    (no time, host or absolute path): its sections' result keys (pipeline.dag.config.result_config;
    the seed among them), the world size (it sets the per-rank batch, the BN groups and the
    crops) and its training data by content (pipeline.data.loaders.data_identity: not the
    conversion's timing, path or workers) and the .beton's size."""
    beton = data_dir / "train.beton"
    data = {"train.beton bytes": beton.stat().st_size if beton.is_file() else None, **data_identity(data_dir)}
    sections = result_config({name: cfg[name] for name in SECTIONS})
    ranks = {"world_size": world_size}
    return json.loads(json.dumps({**sections, **ranks, "data files": data}))  # plain lists, as a state loads


@dataclass(frozen=True)
class Job:
    """A pretraining job's config: as its JSON states it (stored with the outputs; its result
    keys are the run's fingerprint) and its sections, typed once."""

    stated: dict
    pretrain: Pretrain
    data: Data

    @classmethod
    def of(cls, cfg: dict) -> Job:
        """The job of a (validated) config with ``data`` and ``pretrain`` sections."""
        return cls(cfg, section("pretrain", cfg["pretrain"]), section("data", cfg["data"]))


@dataclass(frozen=True)
class Outcome:
    """What a run leaves (pipeline.pretrain.finish writes it)."""

    arch: dict  # the backbone record (methods.arch_of)
    backbone_state: dict
    model_state: dict
    log_rows: list[dict]
    bn_guard: str
    fast_path: str | None  # the path its steps took (FastPath.precision); None: no training
    diverged: bool = False
    key_encoder: dict | None = None  # the momentum target's check (pipeline.methods.ema_check)
    failure: str | None = None  # why the run counts as failed (pipeline.pretrain.failure)


def queue_checksum(model: nn.Module) -> str:
    q = getattr(model, "queue", None)
    return "-" if q is None else f"{float(q.keys.double().sum()):.10f}/{int(q.ptr)}"


class Trainer:
    def __init__(
        self, job: Job, data_dir: Path, state_dir: Path, env, progress: bool = True, watch: Stopwatch | None = None
    ):
        self.p, self.d, self.env = job.pretrain, job.data, env
        self.watch = watch or Stopwatch()
        self.state_path = state_dir / "last.pt"
        self.fingerprint = run_fingerprint(job.stated, data_dir, env.world_size)
        self.progress = progress and env.is_main
        p, d = self.p, self.d
        report = data_dir / "train.json"  # the conversion's report (absent: a hand-made .beton)
        info = {"num_samples": 0, "classes": [], **(json.loads(report.read_text()) if report.is_file() else {})}
        self.num_samples = info["num_samples"]
        if p.batch_size % env.world_size:
            raise ConfigError(f"pretrain.batch_size={p.batch_size} is not divisible by the world size {env.world_size}")
        for warning in pretrain_warnings(p, self.num_samples):
            log(f"warning: {warning}")
        self.model = build_model(p, d.crop_size, len(info["classes"]) or 1, self.num_samples, env.world_size)
        self.bn_guard = bn_guard_text(self.model, env.world_size)
        log(f"BN-leak guard: {self.bn_guard}")
        self.device = distributed.rank_device(env.local_rank)
        self.threads = cpus.use(p.threads, self.device.type, d.workers)
        kept = checkpoint.recorded(self.state_path, self.fingerprint, "fast_path")  # a resume keeps its path
        self.fast = FastPath(p.fast_path, self.device, p.backbone, kept=kept)
        log(f"fast path: {self.fast.describe()}")
        check_global_bn(self.model, p, self.device, env.world_size)
        if self.device.type == "cuda" and env.world_size > 1 and self.model.sync_batch_norm:
            self.model = nn.SyncBatchNorm.convert_sync_batchnorm(self.model)
        self.fast.model(self.model.to(self.device))
        self.optimizer = build_optimizer(p, self.model.parameters())
        self.net: Callable[..., Step] = self.model
        if env.world_size > 1:
            # buffers (queue, BN statistics) are kept identical by the method itself
            self.net = nn.parallel.DistributedDataParallel(self.model, broadcast_buffers=False)
        if p.compile:
            self.net = torch.compile(self.net)
        reading = Reading(
            batch_size=p.batch_size // env.world_size,
            loader=d.loader,
            workers=self.threads.loader,
            threads=self.threads.torch,
            distributed=env.world_size > 1,
        )
        self.loader = two_view_loader(data_dir / "train.beton", Views.of(p, d), reading)
        self.schedule = pretrain_schedule(p, len(self.loader))  # the lr at each step of the run
        if len(self.loader) == 0:
            raise ConfigError(
                f"pretrain.batch_size={p.batch_size} exceeds the training set ({self.num_samples} images)"
            )
        self.aug1, self.aug2 = (a.to(self.device) for a in view_recipes(p.aug, d.crop_size, p.jitter_scale))
        self.data_dir = data_dir
        self.epoch, self.step_in_epoch, self.stats = 0, 0, checkpoint.EpochStats(self.device)
        self.log_rows: list[dict] = []
        self._resume_rng: dict | None = None  # the RNG state to restore mid-epoch (load_state)
        self.board: Board | None = None  # TensorBoard scalars (rank 0; set by train())
        # methods with a momentum target: checked on this run (pipeline.methods.ema_check)
        self.ema_record = EmaRecord(self.model) if isinstance(self.model, MomentumTarget) else None
        self.eval_loaders: dict = {}

    # --- resume state (pipeline.runtime.checkpoint) ---------------------------------------------
    def save_state(self) -> None:
        with self.watch.phase("checkpoints"):
            checkpoint.save_resume_state(
                self.state_path,
                self.model,
                self.optimizer,
                self.stats,
                self.env,
                arch=arch_of(self.p, self.d.crop_size),
                method=self.p.method,
                epoch=self.epoch,
                step_in_epoch=self.step_in_epoch,
                log=self.log_rows,
                fingerprint=self.fingerprint,
                fast_path=self.fast.on,
            )

    def load_state(self) -> bool:
        resumed = checkpoint.load_resume_state(
            self.state_path, self.model, self.optimizer, self.env, self.device, self.fingerprint, log
        )
        if resumed is None:
            return False
        self.epoch, self.step_in_epoch, self.log_rows, self.stats, self._resume_rng = resumed
        log(f"resumed from {self.state_path} at epoch {self.epoch + 1}, step {self.step_in_epoch}")
        return True

    # --- training -----------------------------------------------------------------------
    def train(self) -> bool:
        """Run to the last epoch; returns False if the loss diverged."""
        p = self.p
        self._resume_rng = None
        if not self.load_state() and self.board is not None:
            self.board.drop_earlier_runs()  # a fresh start: the folder's curves are another run's
        while self.epoch < p.epochs:
            skip = self.step_in_epoch
            if skip == 0:
                # Augmentation randomness from (seed, epoch, rank): an epoch replays exactly.
                torch.manual_seed(p.seed * 100003 + self.epoch * 1009 + self.env.rank)
                self.stats = checkpoint.EpochStats(self.device)
            elif self._resume_rng is not None:
                checkpoint.set_rng_state(self._resume_rng)
            self.run_epoch(skip)
            distributed.average_bn_statistics(self.model)
            row = self.epoch_row()
            if self.knn_due():
                with self.watch.phase("knn_monitor"):
                    row["knn"] = self.knn_monitor()
            self.log_rows.append(row)
            log(" ".join(f"{k}={v}" for k, v in row.items()))
            if self.board is not None:
                self.board.add(row, step=row["epoch"])
            self.epoch, self.step_in_epoch = self.epoch + 1, 0
            self.save_state()
            if not math.isfinite(row["loss"]):
                log(f"loss diverged at epoch {row['epoch']}: stopping; the cell is reported as failed")
                return False
        return True

    def run_epoch(self, skip: int = 0) -> None:
        """The steps of epoch ``self.epoch`` from step ``skip`` on; saves the resume state every
        ``checkpoint_every`` steps and exits for a requeue when a preemption signal came."""
        p, every = self.p, self.p.checkpoint_every
        self.loader.set_epoch(self.epoch)
        self.model.train()
        t0 = time.time()
        bar = tqdm(
            total=len(self.loader),
            initial=skip,
            mininterval=5,
            leave=False,
            desc=f"epoch {self.epoch + 1}/{p.epochs}",
            disable=not self.progress,
            file=sys.stderr,
        )
        batches = iter(self.loader.batches(skip))
        while True:
            # the first batch a process loads waits for FFCV's pipeline compilation
            with self.watch.phase("data_wait" if "loader_first_batch" in self.watch.phases else "loader_first_batch"):
                batch = next(batches, None)
            if batch is None:
                break
            with self.watch.phase("steps"):
                self.train_step(*batch)
            self.step_in_epoch += 1
            bar.update()
            stop = self.stop_requested()
            if stop or (every and self.step_in_epoch % every == 0 and self.step_in_epoch < len(self.loader)):
                self.stats.seconds += time.time() - t0
                t0 = time.time()
                self.save_state()
            if stop:
                preempt.requeue_and_exit(log)
        bar.close()
        self.stats.seconds += time.time() - t0

    def knn_due(self) -> bool:
        every = self.p.knn_every
        last = self.epoch + 1 == self.p.epochs
        return (
            bool(every)
            and ((self.epoch + 1) % every == 0 or last)
            and is_converted(self.data_dir / "val.beton", self.d.loader)
        )

    @torch.no_grad()
    def knn_monitor(self) -> float:
        """Weighted kNN top-1 of the query backbone (val against train features): a cheap
        view of representation quality during training. Every rank computes it (no I/O
        races, identical numbers); BN statistics are untouched (eval mode)."""
        backbone = self.model.encoder_q.backbone
        train_x, train_y = features_of(backbone, self.eval_batches("train"), self.device)
        val_x, val_y = features_of(backbone, self.eval_batches("val"), self.device)
        labelled = train_y >= 0  # unlabeled pretraining images (label -1) cannot vote
        train_x, train_y = train_x[labelled], train_y[labelled]
        if len(train_y) == 0:
            return float("nan")
        self.model.train()
        return round(knn_accuracy(train_x, train_y, val_x, val_y, int(train_y.max()) + 1), 3)

    def eval_batches(self, split: str):
        """The split's evaluation loader, built once per job (the kNN monitor reuses it). The
        whole shorter side (crop_ratio 1): this stage does not see probe.crop_ratio, so that no
        probe setting reruns a pretraining; the kNN reported beside the probe uses it."""
        if split not in self.eval_loaders:
            reading = Reading(
                batch_size=512,
                loader=self.d.loader,
                workers=self.threads.loader,
                threads=self.threads.torch,
            )
            self.eval_loaders[split] = eval_loader(
                self.data_dir / f"{split}.beton", Centre(crop_size=self.d.crop_size), reading
            )
        return self.eval_loaders[split]

    def stop_requested(self) -> bool:
        """A preemption signal reached any rank: all ranks stop at the same step."""
        return preempt.stop_agreed(self.step_in_epoch, self.env.world_size)

    def train_step(self, v1, v2, labels, index) -> None:
        p, steps = self.p, len(self.loader)
        step = self.epoch * steps + self.step_in_epoch
        progress = step / max(steps * p.epochs, 1)
        self.stats.lr = p.lr * self.schedule.factor(step)
        for group in self.optimizer.param_groups:
            group["lr"] = self.stats.lr
        self.model.on_step(progress)  # e.g. MoCo v3's momentum schedule
        self.optimize(*self.augment(v1, v2), labels, index)

    def augment(self, v1, v2) -> tuple[torch.Tensor, torch.Tensor]:
        """The two views' photometric recipes, on the training device."""
        x1, x2 = self.aug1(self.to_device(v1)), self.aug2(self.to_device(v2))
        return self.fast.images(x1), self.fast.images(x2)

    def optimize(self, x1, x2, labels, index) -> Step:
        """One optimisation step on augmented views; returns its Step, the loss detached."""
        index, labels = (t.to(self.device, torch.long, non_blocking=True).clone() for t in (index, labels))
        if self.ema_record is not None and self.in_last_steps(self.ema_record.span):
            self.ema_record.before_step()  # only near the end: copies of a few tensors, no cost before
        with self.fast.autocast():
            loss, metrics, logits = self.net(x1, x2, index, labels)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        self.stats.add(loss, metrics, x1.shape[0])
        self.model.after_step(self.epoch * len(self.loader) + self.step_in_epoch)
        return Step(loss.detach(), metrics, None if logits is None else logits.detach())

    def in_last_steps(self, n: int) -> bool:
        """Is the step about to run one of the run's last ``n``?"""
        steps = len(self.loader)
        return (self.p.epochs - self.epoch) * steps - self.step_in_epoch <= n

    def to_device(self, images: torch.Tensor) -> torch.Tensor:
        # FFCV hands out views of reused buffers: copy before the next batch overwrites them
        return images.to(self.device, non_blocking=True) if self.device.type != "cpu" else images

    def epoch_row(self) -> dict:
        s, model = self.stats, self.model
        seen = max(s.seen * self.env.world_size, 1)
        sums = {"loss": s.loss.clone(), **{name: value.clone() for name, value in s.metrics.items()}}
        if self.env.world_size > 1:
            for value in sums.values():
                torch.distributed.all_reduce(value)
        means = {name: float(value) / seen for name, value in sums.items()}
        row = {"epoch": self.epoch + 1, "loss": round(means.pop("loss"), 5)}
        decimals = {m.name: m.decimals for m in method_spec(self.p.method).metrics}
        row.update({name: round(value, decimals.get(name, 5)) for name, value in means.items()})  # the method's
        row.update({"lr": round(s.lr, 6), "seconds": round(s.seconds, 2)})
        row.update(model.diagnostics())  # m, drifts, queue ages: whatever the method reports
        return row


def run(cfg: dict, data_dir: Path, out_dir: Path, state_dir: Path, progress: bool = True) -> dict:
    """``cfg``: the job's config as its JSON states it (typed here once)."""
    job, watch = Job.of(cfg), Stopwatch()
    p, arch = job.pretrain, arch_of(job.pretrain, job.data.crop_size)
    preempt.install()
    env = distributed.init()
    cpus.use(p.threads)  # the Trainer sets it again once it knows its device
    seed_everything(p.seed)  # identical initial weights on every rank
    log(
        f"rank {env.rank}/{env.world_size} on {env.host}: method={p.method} variant={p.variant} "
        f"mechanism={p.mechanism} backbone={p.backbone} K={p.K} m={p.m} T={p.T}"
    )
    if not p.trains:  # the random-init baseline: same backbone, no training
        untrained = build_backbone(arch).state_dict()
        outcome = Outcome(arch, untrained, {}, [], "not applicable (no training)", fast_path=None)
        return finish(job, outcome, out_dir, env, watch)
    trainer = Trainer(job, data_dir, state_dir, env, progress, watch)
    if env.is_main:  # loss, instance accuracy, lr, m, kNN, queue age, drift per epoch
        trainer.board = Board(board_dir(out_dir.parent, "pretrain"), "pretrain")
    watch.mark("setup")  # imports, model, loader
    ok = trainer.train()
    if trainer.board is not None:
        trainer.board.close()
    log(f"rank {env.rank}/{env.world_size} on {env.host}: queue checksum {queue_checksum(trainer.model)}")
    key_encoder = trainer.ema_record.report(trainer.optimizer) if trainer.ema_record is not None else None
    if key_encoder is not None and not key_encoder["holds"]:
        log(f"warning: the key encoder check failed: {key_encoder}")
    failed = failure(trainer.log_rows, trainer.model)
    if failed and ok:
        log(f"warning: training failed ({failed}); the cell is reported as failed")
    outcome = Outcome(
        arch,
        trainer.model.encoder_q.backbone.state_dict(),
        trainer.model.state_dict(),
        trainer.log_rows,
        trainer.bn_guard,
        trainer.fast.precision,
        diverged=not ok,
        key_encoder=key_encoder,
        failure=failed,
    )
    summary = finish(job, outcome, out_dir, env, watch)
    checkpoint.retire(trainer.state_path, env, log)
    return summary


def failure(log_rows: list[dict], method: Method) -> str | None:
    """Why a run counts as failed, or None: its loss diverged, or its last epoch's row meets the
    method's own failure rule (Method.failure: a contrastive loss at chance, the paper's m = 0
    row; BYOL's outputs collapsed to a point)."""
    if not log_rows:
        return None
    last = log_rows[-1]
    if not math.isfinite(last["loss"]):
        return f"diverged: loss {last['loss']} at epoch {last['epoch']}"
    return method.failure(last)


def finish(job: Job, outcome: Outcome, out_dir: Path, env, watch: Stopwatch) -> dict:
    """Write the stage's outputs (rank 0): checkpoint, per-epoch CSV log, summary (with where
    this process's time went: ``timing``, seconds); the config as the job's JSON stated it."""
    method, log_rows = job.pretrain.method, outcome.log_rows
    summary = {
        "method": method,
        "arch": outcome.arch,
        "world_size": env.world_size,
        "epochs_run": len(log_rows),
        "diverged": outcome.diverged,
        "failure": outcome.failure,
        "bn_guard": outcome.bn_guard,
        "final": log_rows[-1] if log_rows else {},
        "key_encoder": outcome.key_encoder,
        # CPU, flags, library versions, commit, and the path its steps took
        "provenance": provenance.record(fast_path=outcome.fast_path),
    }  # no optimizer entry, no gradient, EMA replayed (ema_check)
    if env.is_main:
        out_dir.mkdir(parents=True, exist_ok=True)
        checkpoint.save(
            out_dir / "checkpoint.pt",
            arch=outcome.arch,
            method=method,
            backbone=outcome.backbone_state,
            model=outcome.model_state,
            log=log_rows,
            config=job.stated,
        )
        atomic_write_text(rows_to_csv(log_rows, method_spec(job.pretrain.method).metrics), out_dir / "log.csv")
        summary["timing"] = watch.report()
        atomic_write_json(summary, out_dir / "summary.json")
        atomic_write_json(job.stated, out_dir / "config.json")
    distributed.barrier()
    return summary


def log_columns(rows: list[dict], metrics: tuple[Metric, ...] = ()) -> list[str]:
    """log.csv's header: epoch, loss, the method's logged ``metrics``, LOG_COLUMNS where the rows
    have them, then the rows' other keys."""
    unlogged = {m.name for m in metrics if not m.logged}
    present = {k: None for row in rows for k in row if k not in unlogged}
    own = [m.name for m in metrics if m.name in present]
    first = [*LOG_COLUMNS[:2], *own, *(c for c in LOG_COLUMNS[2:] if c in present)]  # epoch, loss always
    return first + [k for k in present if k not in first]


def rows_to_csv(rows: list[dict], metrics: tuple[Metric, ...] = ()) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=log_columns(rows, metrics), extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()


def build_parser() -> argparse.ArgumentParser:
    """The stage's arguments; pipeline.launch checks a job's arguments with this same parser."""
    ap = argparse.ArgumentParser(
        prog="python -m pipeline.pretrain", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--config", required=True, help="inline JSON or a YAML file with 'data' and 'pretrain'")
    ap.add_argument("--data", required=True, help="folder with train.beton (and train.json)")
    ap.add_argument("--out", required=True, help="output folder: checkpoint.pt, log.csv, summary.json")
    ap.add_argument("--state", help="resume folder, outside the outputs (default: <out>/../state)")
    ap.add_argument("--no-progress", action="store_true")
    return ap


def main(argv=None) -> None:
    args = build_parser().parse_args(argv)
    try:
        cfg = load_stage_config(args.config, SECTIONS)
        out = Path(args.out)
        summary = run(
            cfg,
            Path(args.data),
            out,
            Path(args.state) if args.state else out.parent / "state",
            progress=not args.no_progress,
        )
    except (ConfigError, checkpoint.CheckpointError, FileNotFoundError, ValueError) as err:
        raise SystemExit(f"[pretrain] error: {err}") from None
    log(f"done: {json.dumps(summary['final'])}")
    distributed.shutdown()


if __name__ == "__main__":
    main()
