"""What the workflow's rules need, in the standard library only: building the DAG
(`snakemake -n`) imports neither torch nor pandas nor matplotlib.

One registry per list (backbones, studies, table formats, figures) and where each output lives
under the results folder; pipeline.nets.models, pipeline.report.studies, pipeline.tables and
pipeline.report.figures take theirs from here, and the config schema takes its enums from them.
"""

from __future__ import annotations

import hashlib
import json
import os

RESNETS = ("resnet18", "resnet50")  # their blocks and depths: pipeline.nets.resnet.ARCHS
# name: (embed_dim, depth, heads): ViT-Ti as DeiT; ViT-S/B as the MoCo v3 reference (12 heads
# in ViT-S, where DeiT-S has 6)
VITS = {"vit_tiny": (192, 12, 3), "vit_small": (384, 12, 12), "vit_base": (768, 12, 12)}
# every claim with cells of its own (pipeline.dag.claims_plan says what each needs), in the claims
# table's order; the transfer claims read the main grid
CLAIM_KEYS = (
    *("fifo", "low_m", "zero_m", "larger_K", "slow_m", "longer", "memory_bank"),
    *("mlp_head", "aug_plus", "patch_projection"),  # the MoCo v2 report's steps, MoCo v3's ViT
    *("large_batch", "queue_vs_batch", "byol_learns", "byol_predictor", "byol_predictor_lars", "byol_ema"),
)
# the queue's replacement rules (pipeline.methods.moco.queue implements each)
QUEUE_POLICIES = ("fifo", "random")
# pretrain.fast_path's and detect.fast_path's values (YAML reads a bare on / off as true / false)
FAST_PATH_SETTINGS = ("auto", "on", "off", True, False)
BACKBONE_LABELS = {
    "resnet18": "ResNet-18",
    "resnet50": "ResNet-50",
    "vit_tiny": "ViT-Ti",
    "vit_small": "ViT-S",
    "vit_base": "ViT-B",
}

# the studies' tables, each written where the cells sweep it (pipeline.dag.sweeps); ablation_<axis>
# tables of other single-axis sweeps are written when such cells exist
STUDY_NAMES = [
    "methods",
    "ablation_K",
    "ablation_m",
    "ablation_epochs",
    "mechanisms",
    "shuffle_bn",
    "detection",
    "segmentation",
    "grid",
]
TABLE_FORMATS = {"md": "Markdown", "csv": "CSV", "tex": "LaTeX"}
# written by `snakemake claims` (pipeline.claims), not by the default target
CLAIMS_TABLES = ["claims", "claims_momentum", "claims_queue"]
FIGURES = ["accuracy_vs_K", "accuracy_vs_m", "staleness", "bn_leak", "methods"]  # + curves/<cell>
FIGURE_FORMATS = ("png", "pdf")


BACKBONES = (*RESNETS, *VITS)
# the pretrain keys a grid sweeps, in the order a cell id lists them (pipeline.dag.grid.cell_id)
AXES = (
    "method",
    "variant",
    "mechanism",
    "backbone",
    "patch_size",
    "depth",
    "freeze_patch_embed",
    "width",
    "K",
    "m",
    "T",
    "epochs",
    "batch_size",
    "lr",
    "aug",
    "shuffle_bn",
    "dim",
    "queue_policy",
    "symmetric",
    "predictor",
    "negatives",
    "optimizer",
    "seed",
)
# a cell of the grid as its folder under results/cells names it: base, or axis=value pairs
CELL_ID = r"(base|[A-Za-z_]+=[A-Za-z0-9_.+-]+(,[A-Za-z_]+=[A-Za-z0-9_.+-]+)*)"


def is_resnet(backbone: str) -> bool:
    return backbone in RESNETS


def is_vit(backbone: str) -> bool:
    return backbone in VITS


# what each cell's jobs write, under <results>/cells/<cell>/
CELL_FILES = {
    "checkpoint": "pretrain/checkpoint.pt",
    "log": "pretrain/log.csv",
    "summary": "pretrain/summary.json",
    "config": "pretrain/config.json",
    "probe": "probe.json",
    "detect": "detect.json",
    "detect_trial": "detect/trial{trial}.json",
    "protocol": "detect-{protocol}.json",  # detect.protocols: another fine-tuning of the same cell
    "protocol_trial": "detect-{protocol}/trial{trial}.json",
    "export": "export/export.json",
}


def cell_file(results, cell: str, what: str) -> str:
    """Path of one of a cell's outputs (CELL_FILES); ``cell`` may be a wildcard, "{cell}"."""
    return f"{results}/cells/{cell}/{CELL_FILES[what]}"


MAIN_PROTOCOL = "main"  # detect's own settings, named beside detect.protocols' names


def trial_log(results, protocol: str | None = None) -> str:
    """Path of a detection trial's log ({cell}, {trial} left as wildcards): detect's own protocol's,
    or that of detect.protocols' ``protocol`` (a name, or "{protocol}")."""
    folder = "detect" if protocol is None else f"detect-{protocol}"
    return f"{results}/logs/{folder}/{{cell}}/trial{{trial}}.log"


def table_files(results, names=tuple(STUDY_NAMES)) -> dict[tuple[str, str], str]:
    """(study, format) -> path of every per-study table the tables stage always writes (or of
    the tables ``names``, e.g. CLAIMS_TABLES)."""
    return {(name, ext): f"{results}/tables/{name}.{ext}" for name in names for ext in TABLE_FORMATS}


def figure_files(results, cells, names=FIGURES) -> list[str]:
    """Every file the tables stage's figures ``names`` and these cells' curves write."""
    stems = [*names, *(f"curves/{c}" for c in cells)]
    return [f"{results}/figures/{s}.{ext}" for s in stems for ext in FIGURE_FORMATS]


def stage_config(**sections) -> str:
    """The JSON a stage receives: only its own sections, so that unrelated edits of the
    config do not invalidate its outputs (Snakemake reruns a job whose params changed)."""
    return json.dumps(sections, sort_keys=True, separators=(",", ":"))


def folder_state(root) -> str | None:
    """A short hash of the folders under ``root`` as the file system records them: each one's
    path relative to ``root`` (never the absolute path) and modification time. Adding,
    removing, renaming or replacing a file (cp -r, rsync, mv, tar x: each touches its folder)
    changes it; rewriting a file's bytes in place does not. Reads no file, and lists only
    folders that hold folders (a folder's link count says so, where the file system keeps it):
    an ImageNet split costs ~1,000 stat calls. None when ``root`` is missing."""
    if not root or not os.path.isdir(root):
        return None
    digest, stack = hashlib.sha256(), [str(root)]
    while stack:
        folder = stack.pop()
        info = os.stat(folder)
        digest.update(f"{os.path.relpath(folder, root)}\0{info.st_mtime_ns}\n".encode())
        if info.st_nlink != 2:  # 2: no subfolders (1: a file system that does not count them)
            with os.scandir(folder) as entries:  # is_dir follows links: a subset of symlinked classes
                stack.extend(sorted((e.path for e in entries if e.is_dir()), reverse=True))
    return digest.hexdigest()[:16]
