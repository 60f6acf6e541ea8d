"""What the configured grid will cost, before it is submitted.

    snakemake plan [--configfile PRESET]                  # PLAN_PROFILE=<dir> picks the profile
    python -m pipeline.plan [--configfile PRESET ...] [--config results=...] [--profile profiles/slurm]
    python -m pipeline.plan --claims [...]                # the claims study's cells instead of the grid's

Per cell: training images x epochs, GPU-hours from a published throughput figure (table
THROUGHPUT below, each entry with its source), the job's wall time on the GPUs the profile gives
it, and whether that exceeds the job's time limit (``runtime``: grid.resources, or the profile's
set-resources) in its first attempt or in all of them (a killed job resumes on its retry). The
same for each cell's linear probe (forward-only images/s derived from the training figures:
PROBE_FORWARDS) and for detection transfer where a figure exists; then the totals and the wall
time at the profile's ``jobs`` limit. Neither the dataset's folder nor detection's need exist:
without its conversion report the training set's size is the config's (pipeline.dag.training_set).

Standard library, yaml and the config code only: it never imports torch (a test holds it so).
"""

from __future__ import annotations

import argparse
import dataclasses
import heapq
import json
import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

from pipeline.dag.claims_plan import not_trained, one_sided
from pipeline.dag.config import (
    DEFAULT_CONFIG,
    ConfigError,
    load_config,
    load_yaml,
    merge,
)
from pipeline.dag.grid import Cell, cell_resources, claims_budget, claims_cells, detects, grid_cells
from pipeline.dag.job_gpus import gres_gpus
from pipeline.dag.sections import Config
from pipeline.dag.training_set import IMAGENET_TRAIN, training_set
from pipeline.methods.section import Pretrain

DEFAULT_PROFILE = "profiles/slurm"


def per_gpu(images: int, epochs: int, hours: float, gpus: int) -> float:
    """Images per second per GPU of a published run: images x epochs in ``hours`` on ``gpus``."""
    return images * epochs / (hours * 3600 * gpus)


@dataclass(frozen=True)
class Throughput:
    """Training images per second per GPU of one backbone x resolution x method."""

    backbone: str
    resolution: float  # side of the training crops, px (a progressive schedule: its pixel mean)
    method: str  # moco v1/v2 | moco v3 | supervised (method_key)
    img_per_s: float  # per GPU
    gpu: str
    source: str
    arch: tuple = (("width", 64), ("cifar_stem", False))  # the cell's backbone must be this one


# FFCV's recipe trains 160 px crops for 75% of the epochs, then 192 px: this many pixels on average
FFCV_RESOLUTION = math.sqrt(0.75 * 160**2 + 0.25 * 192**2)  # 168.6 px

THROUGHPUT = (
    Throughput(
        "resnet50", 224, "moco v1/v2", per_gpu(IMAGENET_TRAIN, 200, 53, 8), "V100",
        "facebookresearch/moco README: ResNet-50, 200 epochs in 53 hours on 8 V100 (MoCo v1 and v2, batch 256)",
    ),
    Throughput(
        "resnet50", FFCV_RESOLUTION, "supervised", per_gpu(IMAGENET_TRAIN, 88, 77.2 / 60, 8), "A100",
        "libffcv/ffcv-imagenet README: rn50_88_epochs, 88 epochs in 77.2 min on 8 A100 (160->192 px)",
    ),
    Throughput(
        "resnet18", FFCV_RESOLUTION, "supervised", per_gpu(IMAGENET_TRAIN, 88, 187.3 / 60, 1), "A100",
        "libffcv/ffcv-imagenet README: rn18_88_epochs, 88 epochs in 187.3 min on 1 A100 (160->192 px)",
    ),
)  # fmt: skip
# Figures without an entry, said once in the output.
UNPUBLISHED = (
    "MoCo v3 (ResNet-50, ViT-S, ViT-B): facebookresearch/moco-v3 publishes setups "
    "(ViT-S on 8 V100, batch 1024; ViT-B on 64 GPUs) but no training times",
    "bench gpu: no GPU measurement here (run python -m pipeline.bench gpu on a GPU node for one)",
)

# The linear probe's cost, derived (no published time for its protocol): it runs the frozen
# backbone forward only, once per image and epoch. A training step per image costs, in
# forward passes of the backbone (a backward pass ~ two forwards): supervised 1 + 2 = 3; MoCo
# v1/v2 the query's forward and backward (3) plus the key encoder's forward of the other view
# (1) = 4. So the probe's images/s per GPU = the figure's training images/s x that count.
PROBE_FORWARDS = {"supervised": 3, "moco v1/v2": 4}


@dataclass(frozen=True)
class DetectionSpeed:
    """Seconds per iteration of one detector fine-tuning, at ``images`` per iteration on ``gpus``."""

    backbone: str
    head: str
    s_per_iter: float
    images: int
    gpus: int
    gpu: str
    source: str
    task: str = "detection"  # detect.task: Faster R-CNN, or Mask R-CNN (segmentation)


DETECTION = (
    DetectionSpeed(
        "resnet50", "c4", 0.551, 16, 8, "V100",
        "facebookresearch/detectron2 MODEL_ZOO: Faster R-CNN R50-C4 1x (COCO), 0.551 s/iter on 8 V100, 16 images/iter",
    ),
    DetectionSpeed(
        "resnet50", "fpn", 0.210, 16, 8, "V100",
        "facebookresearch/detectron2 MODEL_ZOO: Faster R-CNN R50-FPN 1x (COCO), 0.210 s/iter on 8 V100, 16 images/iter",
    ),
    DetectionSpeed(
        "resnet50", "c4", 0.584, 16, 8, "V100",
        "facebookresearch/detectron2 MODEL_ZOO: Mask R-CNN R50-C4 1x (COCO), 0.584 s/iter on 8 V100, 16 images/iter",
        "segmentation",
    ),
    DetectionSpeed(
        "resnet50", "fpn", 0.261, 16, 8, "V100",
        "facebookresearch/detectron2 MODEL_ZOO: Mask R-CNN R50-FPN 1x (COCO), 0.261 s/iter on 8 V100, 16 images/iter",
        "segmentation",
    ),
)  # fmt: skip


def method_key(p: Pretrain) -> str:
    """The throughput table's method of a cell: what a training step computes."""
    if not p.is_moco:
        return p.method
    if p.mechanism != "moco":
        return f"moco {p.mechanism}"
    return "moco v3" if p.variant == "v3" else "moco v1/v2"


def find_throughput(p: Pretrain, resolution: int, table=THROUGHPUT) -> tuple[Throughput | None, float, str]:
    """(entry, img/s per GPU at ``resolution``, note). Another resolution of the same backbone
    and method scales with the pixels per image; no entry: (None, 0, why)."""
    key = method_key(p)
    same = [t for t in table if t.backbone == p.backbone and t.method == key]
    if not same:
        return None, 0.0, f"no figure for {p.backbone} {key}"
    fitting = [t for t in same if all(getattr(p, k) == v for k, v in t.arch)]
    if not fitting:
        wanted = ", ".join(f"{k}={v}" for k, v in same[0].arch)
        return None, 0.0, f"the figures are for {wanted}"
    entry = min(fitting, key=lambda t: abs(t.resolution - resolution))
    scale = (entry.resolution / resolution) ** 2
    note = "" if scale == 1 else f"scaled x{scale:.3f} from {entry.resolution:.0f} px"
    return entry, entry.img_per_s * scale, note


# resources the pretrain rule sets itself (from grid.resources): default-resources do not apply
PRETRAIN_OWN = ("runtime", "nodes")


def profile_resources(profile: dict, rule: str, own: tuple = ()) -> dict:
    """A rule's resources as the profile sets them: set-resources, then default-resources for
    what the rule does not set itself (``own``)."""
    defaults = {k: v for k, v in (profile.get("default-resources") or {}).items() if k not in own}
    return {**defaults, **((profile.get("set-resources") or {}).get(rule) or {})}


def minutes(value, attempt: int = 1) -> float:
    """A runtime resource in minutes: a number, a Python expression of ``attempt`` (the retry's
    attempt, 1 first), or Snakemake's units ("2h", "1d 4h", "90m")."""
    if isinstance(value, (int, float)):
        return float(value)
    text = str(value).strip()
    try:
        return float(eval(text, {"__builtins__": {}}, {"attempt": attempt}))  # noqa: S307 (the user's own profile)
    except Exception:  # noqa: BLE001 (not an expression: units)
        pass
    unit_minutes = {"d": 1440, "h": 60, "m": 1, "min": 1, "s": 1 / 60}
    parts = re.findall(r"(\d+(?:\.\d+)?)\s*(min|d|h|m|s)", text)
    if not parts:
        raise ConfigError(f"profile: runtime '{value}' is neither minutes, an expression of attempt, nor e.g. '2h'")
    return sum(float(n) * unit_minutes[u] for n, u in parts)


def limits(value, attempts: int) -> list[float]:
    """The time limit of each attempt of a job (minutes): a killed probe, detection trial or
    pretraining resumes on its retry, so together they have the sum."""
    return [minutes(value, a) for a in range(1, attempts + 1)]


def time_check(row: dict, wall_h: float | None, limit: list[float] | None) -> dict:
    """``row`` with its limits: ``runtime_min`` (the first attempt's), ``limit_all_min`` (all
    attempts together), ``exceeds`` (the first attempt cannot finish), ``short`` (all of them
    together cannot), ``attempts_needed`` (the attempts that finish it; None: short)."""
    if not limit:
        return {**row, "runtime_min": None, "limit_all_min": None, "exceeds": False, "short": False}
    done = [k + 1 for k in range(len(limit)) if wall_h is not None and wall_h * 60 <= sum(limit[: k + 1])]
    need = done[0] if done else None
    return {**row, "runtime_min": limit[0], "limit_all_min": sum(limit), "exceeds": wall_h is not None and need != 1,
            "short": wall_h is not None and need is None, "attempts_needed": need}  # fmt: skip


def gpus_of(resources: dict) -> int:
    """GPUs per node of a job: its tasks_per_node (one rank per GPU), else its gres gpu:N, else 1."""
    if resources.get("tasks_per_node"):
        return int(resources["tasks_per_node"])
    gres = re.search(r"gpu(?::[^:,]+)?:(\d+)", str(resources.get("gres", "")))
    return int(gres[1]) if gres else 1


def detection_cells(cfg: Config, cells: dict[str, Cell]) -> list[str]:
    """The cells with detection transfer (the rules' choice: pipeline.dag.grid.detects)."""
    return [cid for cid, cell in cells.items() if detects(cfg.detect, cid, cell.pretrain)]


def makespan(hours: list[float], slots: int) -> float:
    """Wall time of independent jobs on ``slots`` parallel slots, longest first onto the slot
    that frees first (LPT)."""
    free = [0.0] * max(1, slots)
    for h in sorted(hours, reverse=True):
        heapq.heappush(free, heapq.heappop(free) + h)
    return max(free)


def attempts_of(profile: dict) -> int:
    return 1 + int(profile.get("restart-times", 0))


def pretraining_row(cid: str, p: Pretrain, cfg: Config, profile: dict, images: int, table) -> dict:
    row = {"cell": cid, "images": images, "epochs": p.epochs, "images_x_epochs": images * p.epochs}
    if not p.trains:  # the random-init baseline: a small CPU job
        row = {**row, "gpu_hours": 0.0, "gpu": None, "note": "trains nothing", "gpus": 0, "wall_h": 0.0}
        return time_check(row, None, None)
    sized = cell_resources(p, cfg.grid.resources)
    res = profile_resources(profile, "pretrain", PRETRAIN_OWN)
    nodes = int(res.get("nodes", sized["nodes"]))
    # the rule's runtime: the cell's x attempt (workflow/rules/pretrain.smk), unless the profile sets one
    runtime = res.get("runtime", f"{sized['runtime']} * attempt")
    gpus = nodes * gpus_of(res)
    entry, img_per_s, note = find_throughput(p, cfg.data.crop_size, table)
    row = {**row, "nodes": nodes, "gpus": gpus, "note": note}
    if entry is None:
        return time_check({**row, "gpu_hours": None, "gpu": None, "wall_h": None}, None, None)
    gpu_hours = images * p.epochs / img_per_s / 3600
    wall = gpu_hours / gpus
    row = {**row, "gpu_hours": gpu_hours, "gpu": entry.gpu, "source": entry.source, "img_per_s": img_per_s,
           "wall_h": wall}  # fmt: skip
    return time_check(row, wall, limits(runtime, attempts_of(profile)))


def probe_throughput(p: Pretrain, resolution: int, table=THROUGHPUT) -> tuple[Throughput | None, float, str]:
    """(entry, forward-only img/s per GPU at ``resolution``, note) for the probe of a cell with
    backbone ``p``: a training figure of the same backbone x PROBE_FORWARDS (the nearest
    resolution, scaled by the pixels); none: (None, 0, why)."""
    same = [t for t in table if t.backbone == p.backbone and t.method in PROBE_FORWARDS]
    fitting = [t for t in same if all(getattr(p, k) == v for k, v in t.arch)]
    if not same:
        return None, 0.0, f"no training figure for {p.backbone}"
    if not fitting:
        return None, 0.0, "the figures are for " + ", ".join(f"{k}={v}" for k, v in same[0].arch)
    entry = min(fitting, key=lambda t: abs(t.resolution - resolution))
    scale = (entry.resolution / resolution) ** 2
    forwards = PROBE_FORWARDS[entry.method]
    note = f"forward only: {forwards} x the {entry.method} figure" + (
        "" if scale == 1 else f", scaled x{scale:.3f} from {entry.resolution:.0f} px"
    )
    return entry, entry.img_per_s * scale * forwards, note


def probe_row(cid: str, p: Pretrain, cfg: Config, profile: dict, images: int, table) -> dict:
    """One cell's linear probe on ``probe.ranks`` GPUs: the training set's features once on every
    rank (both modes), then ``probe.epochs`` epochs of new views through the backbone, split over
    the ranks (augmented; cached trains on the stored features: no backbone pass). The validation
    features and the kNN are left out (ImageNet: 50,000 images, 4% of one pass)."""
    pc = cfg.probe
    views = pc.epochs if pc.mode == "augmented" else 0
    passes = 1 + views
    res = profile_resources(profile, "probe")
    row = {"cell": cid, "mode": pc.mode, "epochs": pc.epochs, "passes": passes, "images": images, "gpus": pc.ranks}
    entry, img_per_s, note = probe_throughput(p, cfg.data.crop_size, table)
    limit = limits(res["runtime"], attempts_of(profile)) if "runtime" in res else None
    if entry is None:
        return time_check({**row, "gpu_hours": None, "gpu": None, "wall_h": None, "note": note}, None, limit)
    wall = images * (1 + views / pc.ranks) / img_per_s / 3600
    row = {**row, "gpu_hours": wall * pc.ranks, "gpu": entry.gpu, "source": entry.source, "img_per_s": img_per_s,
           "wall_h": wall, "note": note}  # fmt: skip
    return time_check(row, wall, limit)


def detection_plan(cfg: Config, cells: dict[str, Cell], profile: dict, table=DETECTION) -> dict:
    det = cfg.detect
    chosen = detection_cells(cfg, cells)
    jobs = [(cid, t) for cid in chosen for t in range(det.trials)]
    res = profile_resources(profile, "detect")
    # the rule asks for gres gpu:<detect.ranks>; a gres the profile pins wins (None: no GPU gres)
    pinned = gres_gpus(res["gres"]) if "gres" in res else det.ranks
    out = {"cells": chosen, "jobs": len(jobs), "trials": det.trials, "ranks": det.ranks, "profile_gpus": pinned,
           "task": det.task}  # fmt: skip
    backbones = {cells[cid].pretrain.backbone for cid in chosen}
    speeds = [s for s in table if s.head == det.head and s.task == det.task and s.backbone in backbones]
    if not jobs:
        return {**out, "gpu_hours": 0.0, "note": "no detection transfer"}
    if det.iterations is None or not speeds or len(backbones) > 1:
        figure = f"no figure for {backbones} {det.head} {det.task}"
        why = "detect.iterations unset" if det.iterations is None else figure
        return {**out, "gpu_hours": None, "note": f"not estimated ({why})"}
    s = speeds[0]
    per_trial = det.iterations * s.s_per_iter * (det.batch_size / s.images) * s.gpus / 3600
    wall = per_trial / det.ranks
    limit = limits(res["runtime"], attempts_of(profile)) if "runtime" in res else None
    out = {**out, "per_trial_gpu_hours": per_trial, "gpu_hours": per_trial * len(jobs), "gpu": s.gpu,
           "source": s.source, "wall_h": wall, "note": ""}  # fmt: skip
    return time_check(out, wall, limit)


def by_gpu(parts: list[dict]) -> dict[str, float]:
    """GPU-hours summed per GPU kind (each figure's own GPU: V100-hours and A100-hours differ)."""
    totals: dict[str, float] = {}
    for part in parts:
        if part.get("gpu_hours"):
            totals[part["gpu"]] = totals.get(part["gpu"], 0.0) + part["gpu_hours"]
    return totals


def make_plan(cfg: Config, profile: dict, throughput=THROUGHPUT, detection=DETECTION, claims: bool = False) -> dict:
    """The plan as numbers (render() prints it); ``claims``: of the claims study's cells (no
    detection), with the claims it does not train because this budget cannot decide them."""
    skipped, halves = {}, {}
    if claims:
        cfg = dataclasses.replace(cfg, detect=dataclasses.replace(cfg.detect, enabled=False))
        cells = claims_cells(cfg)
        assert cfg.claims is not None  # claims_cells refuses a config without it
        skipped = not_trained(cfg.claims, claims_budget(cfg))
        halves = one_sided(cfg.claims, claims_budget(cfg))
    else:
        cells = grid_cells(cfg)
    data = training_set(cfg)
    images, images_from = data.images, data.where
    rows = [pretraining_row(cid, cell.pretrain, cfg, profile, images, throughput) for cid, cell in cells.items()]
    probes = [probe_row(cid, cell.pretrain, cfg, profile, images, throughput) for cid, cell in cells.items()]
    detect = detection_plan(cfg, cells, profile, detection)
    jobs = int(profile.get("jobs", 1))
    walls = {
        "pretrain": makespan([r["wall_h"] for r in rows if r["wall_h"]], jobs),
        "probe": makespan([r["wall_h"] for r in probes if r["wall_h"]], jobs),
        "detect": makespan([detect["wall_h"]] * detect["jobs"], jobs) if detect.get("wall_h") else 0.0,
    }
    det_jobs = [{**detect, "job": f"detect {cid}"} for cid in detect["cells"]] if detect.get("wall_h") else []
    every = [{**r, "job": r["cell"]} for r in rows] + [{**r, "job": f"probe {r['cell']}"} for r in probes] + det_jobs
    return {
        "study": "claims" if claims else "grid",
        "not_trained": skipped,
        "one_sided": halves,
        "cells": rows,
        "probes": probes,
        "images": images,
        "images_from": images_from,
        "detect": detect,
        "probe_jobs": len(probes),
        "jobs": jobs,
        "gpu_hours": {
            "pretrain": by_gpu(rows),
            "probe": by_gpu(probes),
            "total": by_gpu(rows + probes + [detect]),
        },
        "not_estimated": [r["cell"] for r in rows if r["gpu_hours"] is None],
        "probes_not_estimated": [r["cell"] for r in probes if r["gpu_hours"] is None],
        "wall_h": {**walls, "total": sum(walls.values())},
        "exceeding": [r["job"] for r in every if r.get("exceeds")],
        "attempts": attempts_of(profile),
        "short_after_retries": [r["job"] for r in every if r.get("short")],
    }


def _hours(h: float | None, gpu: str | None = None) -> str:
    return "—" if h is None else f"{h:,.1f}" + (f" {gpu}" if gpu else "")


def _wall_line(plan: dict, partial: bool) -> str:
    wall, head = plan["wall_h"], f"Wall time at jobs: {plan['jobs']}: "
    if not plan["gpu_hours"]["total"]:
        return head + "not estimated (no job has a throughput figure)"
    which = "; estimated jobs only" if partial else ""
    return (
        head + f"{wall['pretrain']:,.1f} h pretraining + {wall['probe']:,.1f} h probe + {wall['detect']:,.1f} h "
        f"detection = {wall['total']:,.1f} h (stage after stage, every job granted at once, no queue wait; "
        f"GPUs as in each figure{which})"
    )


def _flag(row: dict, attempts: int) -> str:
    """A job over its time limit: how many attempts finish it (a killed job resumes), or none."""
    if row.get("short"):
        return f"  EXCEEDS all {attempts} attempts ({row['limit_all_min'] / 60:,.1f} h)"
    if row.get("exceeds"):
        return f"  EXCEEDS its runtime: finishes in attempt {row['attempts_needed']} of {attempts}"
    return ""


def _limit(row: dict) -> str:
    limit = row.get("runtime_min")
    return _hours(None if limit is None else limit / 60)


def _sum(hours_by_gpu: dict[str, float]) -> str:
    return " + ".join(f"{h:,.1f} {gpu}-hours" for gpu, h in hours_by_gpu.items()) or "0 GPU-hours"


def _unestimated(cells: list[str]) -> str:
    return f" (not estimated: {', '.join(cells)})" if cells else ""


def render(plan: dict, profile_path: str) -> str:
    rows, probes, det, n = plan["cells"], plan["probes"], plan["detect"], plan["attempts"]
    sources = {r["source"] for r in [*rows, *probes, det] if r.get("source")}
    ref = {s: f"[{i}]" for i, s in enumerate(sorted(sources), 1)}
    study = " of the claims study" if plan["study"] == "claims" else ""
    head = f"{'images x {}':>20} {'GPUs':>5} {'GPU-hours':>14} {'wall h':>8} {'limit h':>8}  figure"
    w = max([24, *(len(r["cell"]) for r in rows)])  # the cell column: its longest id
    lines = [
        f"Cost plan{study}: {len(rows)} cells, profile {profile_path} (jobs: {plan['jobs']}, restart-times: {n - 1})",
        f"Training images: {plan['images']:,} ({plan['images_from']})",
        *[f"Not trained, this budget cannot decide it: {key} ({why})" for key, why in plan["not_trained"].items()],
        *[f"Trained, decidable one way only: {key} ({why})" for key, why in plan["one_sided"].items()],
        "",
        f"{'pretraining':<{w}} " + head.replace("{}", "epochs"),
    ]
    for r in rows:
        figure = " ".join(x for x in (ref.get(r.get("source"), ""), r["note"]) if x) or "—"
        lines.append(
            f"{r['cell']:<{w}} {r['images']:>11,} x {r['epochs']:<6} {r['gpus']:>5} "
            f"{_hours(r['gpu_hours'], r['gpu']):>14} {_hours(r['wall_h']):>8} {_limit(r):>8}  {figure}{_flag(r, n)}"
        )
    missing = plan["not_estimated"]
    lines += ["", f"{'linear probe':<{w}} " + head.replace("{}", "passes")]
    for r in probes:
        figure = " ".join(x for x in (ref.get(r.get("source"), ""), r["note"]) if x)
        lines.append(
            f"{r['cell']:<{w}} {r['images']:>11,} x {r['passes']:<6} {r['gpus']:>5} "
            f"{_hours(r['gpu_hours'], r['gpu']):>14} {_hours(r['wall_h']):>8} {_limit(r):>8}  {figure}{_flag(r, n)}"
        )
    if probes:
        mode, epochs = probes[0]["mode"], probes[0]["epochs"]
        passes = f"the features + {epochs} epochs of new views" if mode == "augmented" else "the features only"
        ranks = probes[0]["gpus"]
        per_job = "one GPU per job" if ranks == 1 else f"{ranks} GPUs per job, the views split over them"
        lines.append(f"  passes over the training set: {passes} (probe.mode {mode}); {per_job}; "
                     "validation features and kNN not counted")  # fmt: skip
    lines += [
        "",
        f"Pretraining: {_sum(plan['gpu_hours']['pretrain'])}" + _unestimated(missing),
        f"Linear probe: {_sum(plan['gpu_hours']['probe'])}" + _unestimated(plan["probes_not_estimated"]),
    ]  # fmt: skip
    if det["jobs"]:
        model = " (Mask R-CNN)" if det.get("task") == "segmentation" else ""
        head = f"Detection transfer{model}: {det['jobs']} jobs ({len(det['cells'])} cells x {det['trials']} trials), "
        if det["gpu_hours"] is None:
            lines.append(head + det["note"])
        else:
            lines.append(
                head + f"{det['per_trial_gpu_hours']:,.1f} {det['gpu']}-hours each on {det['ranks']} GPUs: "
                f"{det['wall_h']:.1f} h wall (limit {_limit(det)} h) {ref[det['source']]}{_flag(det, n)}"
            )
        if det["profile_gpus"] is not None and det["profile_gpus"] != det["ranks"]:
            lines.append(
                f"  note: detect.ranks is {det['ranks']} but the profile's set-resources.detect.gres gives "
                f"{det['profile_gpus']} GPU(s) per job"
            )
    lines.append(f"Total: {_sum(plan['gpu_hours']['total'])}")
    partial = bool(missing or plan["probes_not_estimated"]) or det["gpu_hours"] is None
    lines += [
        _wall_line(plan, partial),
        "Over their first attempt's runtime: " + (", ".join(plan["exceeding"]) or "none"),
        f"Over all {n} attempts (a killed job resumes on its retry, whose runtime grows with the attempt): "
        + (", ".join(plan["short_after_retries"]) or "none"),
        "",
        "Throughput figures:",
    ]  # fmt: skip
    used = {r["source"]: r for r in rows if r.get("source")}
    for source, mark in ref.items():
        speed = f"{used[source]['img_per_s']:,.1f} img/s per {used[source]['gpu']} here; " if source in used else ""
        lines.append(f"  {mark} {speed}{source}")
    lines += [f"  - {text}" for text in UNPUBLISHED]
    return "\n".join(lines)


def merged_config(configfiles: list[str], overrides: list[str]) -> dict:
    """workflow/config/config.yaml, then each --configfile, then each --config key=value
    (a YAML value), merged as Snakemake merges them."""
    cfg = load_yaml(DEFAULT_CONFIG)
    for path in configfiles:
        cfg = merge(cfg, load_yaml(path))
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"--config {item}: expected key=value")
        cfg = merge(cfg, {key: yaml.safe_load(value)})
    return cfg


def check(cfg: dict) -> Config:
    """The config typed, after its schema and cross-field rules, but not its folders: a plan
    is made before the data is where the jobs will read it."""
    return load_config(cfg)


def load_profile(path: str) -> dict:
    folder = Path(path)
    file = folder / "config.yaml" if folder.is_dir() else folder
    if not file.is_file():
        raise ConfigError(f"profile not found: {path} (a folder with config.yaml)")
    return yaml.safe_load(file.read_text()) or {}


def run(cfg: dict, profile: str = DEFAULT_PROFILE, as_json: bool = False, claims: bool = False) -> str:
    """The plan of a whole workflow config under the profile folder ``profile``, as text or JSON."""
    plan = make_plan(check(cfg), load_profile(profile), claims=claims)
    return json.dumps(plan, indent=2) if as_json else render(plan, profile)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configfile", nargs="+", default=[], help="config files over workflow/config/config.yaml")
    ap.add_argument("--config", nargs="+", default=[], metavar="KEY=VALUE", help="as snakemake --config")
    ap.add_argument("--config-json", help="the whole config as JSON (what `snakemake plan` passes)")
    ap.add_argument("--profile", default=DEFAULT_PROFILE, help="Snakemake profile folder (default %(default)s)")
    ap.add_argument("--json", action="store_true", help="print the plan as JSON")
    ap.add_argument("--claims", action="store_true", help="plan the claims study's cells (snakemake claims)")
    args = ap.parse_args(argv)
    try:
        cfg = json.loads(args.config_json) if args.config_json else merged_config(args.configfile, args.config)
        print(run(cfg, args.profile, as_json=args.json, claims=args.claims))
    except ConfigError as err:
        print(f"plan: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
