"""The config's sections as typed, frozen dataclasses: every key declared here, once.

A key's declaration holds its default, what it means and what a value may be (JSON Schema's
words: enum, minimum, pattern, ...); pipeline.dag.schema derives the config's schema from
them, its types from the annotations. config.yaml states the defaults (a test holds its values
and its enum comments to these). Lists are tuples here, so that a section cannot change once
built; pipeline.dag.config builds the sections from validated dicts and turns them back into
dicts.

Standard library only: Snakemake imports this while it builds the DAG (no torch, no pandas).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, make_dataclass
from functools import partial
from typing import Any

from pipeline.base.keys import (
    BATCH,
    CHECKPOINT_EVERY,
    COUNT,
    EPOCHS,
    INIT,
    JOBS,
    NON_NEGATIVE,
    POSITIVE,
    RUNTIME,
    SEED,
    THREADS,
    WORKERS,
    key,
    like_pretrain,
    runtime,
)
from pipeline.base.layout import AXES, BACKBONES, CELL_ID, CLAIM_KEYS, FAST_PATH_SETTINGS
from pipeline.methods import METHODS, MethodSpec, method_spec
from pipeline.methods.section import SCHEDULES, Pretrain

# the embedded dataset's shape classes, in label order (pipeline.synthetic draws them)
SYNTHETIC_CLASSES = ("disk", "square", "triangle", "diamond", "ring", "frame", "plus", "cross", "bars", "checker")
# the detection scenes' categories (dataset.synthetic.det_shapes): the classification shapes, or
# ten the classification data never shows, a downstream label set disjoint from pretraining's
# (pipeline.synthetic's docstring has the design)
NOVEL_SHAPES = ("star", "crescent", "arrow", "ell", "tee", "dots", "zigzag", "half_disk", "bowtie", "chevron")
DETECTION_SHAPES = {"pretraining": SYNTHETIC_CLASSES, "novel": NOVEL_SHAPES}
SOURCES = ("synthetic", "imagefolder", "unlabeled", "cifar10", "cifar100", "stl10")


@dataclass(frozen=True, kw_only=True)
class Synthetic:
    """dataset.synthetic: the embedded dataset, generated deterministically."""

    seed: int = key(0, **SEED)
    image_size: int = key(32, minimum=16, maximum=256)
    train_per_class: int = key(260, **COUNT)
    val_per_class: int = key(60, **COUNT)
    det_train_images: int = key(192, "detection scenes", **COUNT)
    det_val_images: int = key(48, **COUNT)
    det_image_size: int = key(96, minimum=32, maximum=1024)
    det_shapes: str = key(
        "novel",
        "the detection scenes' categories: novel = ten shapes the classification data never shows (a "
        "transfer to another task); pretraining = the ten classification shapes (the supervised baseline's own labels)",
        enum=list(DETECTION_SHAPES),
    )
    backgrounds: int = key(
        1,
        "shared pool of background gradients the images draw from; 0 = each image its own",
        minimum=0,
        maximum=100_000,
    )

    def part(self, name: str) -> dict:
        """The values one part of the dataset is generated from (SYNTHETIC_PARTS[name])."""
        return {k: getattr(self, k) for k in SYNTHETIC_PARTS[name]}


# the keys each part of the embedded dataset is generated from (pipeline.synthetic --part): the
# workflow writes the two in jobs of their own, so a changed detection key (det_shapes, the scenes'
# size or count) regenerates the scenes and reruns the transfer, never the pretraining
SYNTHETIC_PARTS = {
    "cls": ("seed", "image_size", "train_per_class", "val_per_class", "backgrounds"),
    "det": ("seed", "det_train_images", "det_val_images", "det_image_size", "det_shapes", "backgrounds"),
}


@dataclass(frozen=True, kw_only=True)
class Dataset:
    source: str = key(
        "synthetic",
        "synthetic = the embedded dataset; imagefolder = root/{train,val}/<class>/<image>; unlabeled = "
        "root/{train,val}/**/<image> (label -1); cifar10, cifar100, stl10 = torchvision's on-disk copy "
        "under root (val = the test set; never downloaded)",
        enum=list(SOURCES),
    )
    root: str | None = key(
        None, "required for every source but synthetic: any existing folder (commands quote it)", minLength=1
    )
    stl10_unlabeled: bool = key(
        False, "stl10 only; the train split holds train+unlabeled (105k images, the unlabeled ones with label -1)"
    )
    train_images: int | None = key(
        None,
        "imagefolder / unlabeled: the train split's image count (ImageNet-1k 1281167), for plans made "
        "before conversion (claims' seeds and gates, cost plan); the conversion report wins",
        minimum=1,
        maximum=10**9,
    )
    synthetic: Synthetic = key(factory=Synthetic)


@dataclass(frozen=True, kw_only=True)
class Convert:
    max_resolution: int | None = key(
        64, "longest side stored in the .beton (larger images are scaled down); null = as is", minimum=8, maximum=4096
    )
    jpeg_quality: int = key(90, minimum=1, maximum=100)
    write_mode: str = key(
        "auto",
        "auto = raw while the split's pixels fit in 4 GiB, else proportion",
        enum=["auto", "raw", "jpg", "smart", "proportion"],
    )
    compress_probability: float = key(0.5, "proportion: share of JPEG images", minimum=0, maximum=1)
    smart_threshold: int = key(
        3 * 128 * 128, "smart: JPEG for images above this many raw bytes", minimum=1, maximum=2**31 - 1
    )
    workers: int = runtime(2, "processes that check and write images (the same .beton)", **WORKERS)
    strict: bool = key(False, "fail on the first unreadable image instead of skipping it")


@dataclass(frozen=True, kw_only=True)
class Data:
    loader: str = key(
        "ffcv",
        "ffcv = the .beton; torchvision = the source images through a torch DataLoader (baseline, fallback)",
        enum=["ffcv", "torchvision"],
    )
    crop: str = key(
        "loader",
        "loader = crops drawn while decoding (fastest); device = torch-seeded crops (bit-exact resume)",
        enum=["loader", "device"],
    )
    crop_size: int = key(32, "(a ViT's image size)", sets=INIT, minimum=8, maximum=1024)
    # both loaders draw each sample's crops from (seed, epoch, index): the count changes no result
    workers: int | None = runtime(
        None, "loader workers per job; null = from the job's threads (pipeline.runtime.cpus)", **WORKERS
    )


@dataclass(frozen=True, kw_only=True)
class Probe:
    mode: str = key(
        "cached",
        "cached = features extracted once (fast); augmented = crop+flip views every epoch",
        enum=["cached", "augmented"],
    )
    protocol: str = key(
        "moco",
        "moco (SGD lr 30, step decay) or mocov3 (batch 1024, cosine, lr 0.1 x bs/256; ViT 3 x bs/256)",
        enum=["moco", "mocov3"],
    )
    standardize: bool = key(False, "parameter-free BN before the linear layer")
    epochs: int = key(100, **EPOCHS)
    batch_size: int | None = key(None, "null = the protocol's", **BATCH)
    lr: float | None = key(None, "null = the protocol's", **POSITIVE)
    weight_decay: float = key(0.0, **NON_NEGATIVE)
    knn_k: int = key(200, **COUNT)
    knn_t: float = key(0.07, **POSITIVE)
    crop_ratio: float = key(
        1.0,
        "evaluation view = centre square of this share of the shorter side (0.875 = Resize(256) + CenterCrop(224))",
        exclusiveMinimum=0,
        maximum=1,
    )
    seed: int = key(0, "the workflow probes a cell at this + the cell's pretrain.seed", **SEED)
    # the views' shards and BN groups: a result key, except at 1, as every probe before the key existed
    ranks: int = runtime(
        1,
        "processes per probe, one per GPU (torchrun, DDP, the batch split over them); augmented mode only",
        unless=lambda pc: pc.ranks > 1,
        minimum=1,
        maximum=1024,
    )
    threads: int = runtime(1, **THREADS)
    checkpoint_every: int = runtime(
        0, "also write the resume state every N steps (0 = at epoch ends only)", **CHECKPOINT_EVERY
    )


@dataclass(frozen=True, kw_only=True)
class Rpn:
    """Proposals kept before / after NMS, in training and at test."""

    pre_nms_train: int = key(1000, **COUNT)
    post_nms_train: int = key(300, **COUNT)
    pre_nms_test: int = key(500, **COUNT)
    post_nms_test: int = key(150, **COUNT)


VOC_SET: dict[str, Any] = {"type": "string", "pattern": "^(2007|2012)/[A-Za-z0-9_]+$"}


@dataclass(frozen=True, kw_only=True)
class Voc:
    """VOC image sets as <year>/<set>: the paper's VOC07+12 -> VOC07 test."""

    train: tuple[str, ...] = key(("2007/trainval", "2012/trainval"), "a union", minItems=1, items=VOC_SET)
    val: str = key("2007/test", "the evaluation set", pattern=VOC_SET["pattern"])


BACKBONE_NORMS = ("frozen_bn", "bn", "gn")  # detect.norm
HEAD_NORMS = ("none", "bn", "gn")  # detect.head_norm, besides auto
# Detectron2's learning rate for its batch (SOLVER.BASE_LR at IMS_PER_BATCH), scaled linearly
DETECTRON2_LR, DETECTRON2_BATCH = 0.02, 16


@dataclass(frozen=True, kw_only=True)
class Detect:
    enabled: bool = key(True, sets=JOBS)
    cells: tuple[str, ...] = key(
        ("base", "method=supervised"),
        "cell ids whose encoder goes through detection transfer, or [all]",
        sets=JOBS,
        items={"type": "string", "pattern": "^[A-Za-z0-9_.,=+-]+$"},
    )
    root: str | None = key(
        None,
        "COCO folder (instances_{train,val}.json + images, or the COCO 2017 layout) or a VOCdevkit; "
        "null = the embedded scenes",
        minLength=1,
    )
    dataset: str = key("auto", "layout of root (auto = found from what it holds)", enum=["auto", "coco", "voc"])
    voc: Voc = key(factory=Voc, doc="VOC image sets as <year>/<set>: train (a union) and val (the evaluation set)")
    head: str = key(
        "fpn",
        "fpn = FPN over layer1..4; c4 = RPN and RoIAlign on layer3, layer4 as the box head (the paper's R50-C4)",
        enum=["fpn", "c4"],
    )
    task: str = key(
        "segmentation",
        "detection = Faster R-CNN, box AP; segmentation = Mask R-CNN (a mask head beside the box head; c4: "
        "on the res5 features), box and mask AP (needs instance masks: COCO-format data, not VOC)",
        enum=["detection", "segmentation"],
    )
    epochs: int = key(4, **EPOCHS)
    batch_size: int = key(4, **BATCH)
    lr: float | None = key(
        0.02,
        "Detectron2's base lr, unscaled (the embedded 576-iteration schedule's choice: docs/studies/"
        "2026-12-07-detection-protocol.md); null = Detectron2's rule, 0.02 for 16 images linear in batch_size",
        **POSITIVE,
    )
    weight_decay: float = key(0.0001, **NON_NEGATIVE)
    image_size: int = key(96, "shorter image side after resizing", minimum=32, maximum=1333)
    max_image_size: int | None = key(
        None, "cap on the longer side (Detectron2: 1333); null = image_size (square-bounded)", minimum=32, maximum=2000
    )
    fpn_channels: int = key(32, minimum=8, maximum=4096)
    anchor_sizes: tuple[int, ...] | None = key(
        None,
        "anchor sides in pixels (fpn: one per level, 5; c4: any number); null = fractions of image_size "
        "for the embedded scenes",
        minItems=1,
        items={"type": "integer", "minimum": 2, "maximum": 4096},
    )
    norm: str = key(
        "bn",
        "the backbone's: frozen_bn = pretrained BN statistics fixed; bn = BN fine-tuned with batch statistics; "
        "gn = GroupNorm (GN-pretrained backbones)",
        enum=list(BACKBONE_NORMS),
    )
    head_norm: str = key(
        "auto",
        "the new layers' (FPN, box and mask heads): none | bn | gn; auto = the backbone's (none under frozen_bn)",
        enum=["auto", *HEAD_NORMS],
    )
    rpn: Rpn = key(
        factory=Rpn,
        doc="proposals kept before / after NMS in training and at test (before NMS per FPN level with fpn); "
        "Detectron2: 12000 / 2000, 6000 / 1000",
    )
    roi_per_image: int = key(
        128, "RoIs sampled per image for the box head's loss (Detectron2: 512)", minimum=1, maximum=4096
    )
    schedule: str = key(
        "cosine", "cosine = decay to 0 after the warmup; step = x0.1 at each of lr_steps (Detectron2's)", enum=SCHEDULES
    )
    lr_steps: tuple[int, ...] | None = key(
        None,
        "schedule step: iterations at which the lr is multiplied by 0.1 (Detectron2's SOLVER.STEPS)",
        minItems=1,
        items={"type": "integer", "minimum": 1, "maximum": 10**7},
    )
    warmup_iters: int = key(
        100,
        "iterations of linear warmup, at most a quarter of the training (Detectron2's WARMUP_ITERS)",
        minimum=1,
        maximum=10**7,
    )
    iterations: int | None = key(
        None,
        "training length in iterations (Detectron2's MAX_ITER), replacing epochs; null = epochs x iterations per epoch",
        minimum=1,
        maximum=10**7,
    )
    train_sizes: tuple[int, ...] | None = key(
        None,
        "multi-scale training: each image's shorter side drawn from these (Detectron2's MIN_SIZE_TRAIN); "
        "null = image_size; evaluation uses image_size",
        minItems=1,
        items={"type": "integer", "minimum": 32, "maximum": 1333},
    )
    voc_metric: str = key(
        "auto",
        "VOC's AP: 11point (the VOC2007 devkit), area (VOC2010 and later), auto = 11point on a 2007 test set",
        enum=["auto", "11point", "area"],
    )
    seed: int = key(0, **SEED)
    trials: int = key(
        1,
        "fine-tuning runs per cell, seeds seed..seed+trials-1 (the paper averages 5 on VOC); tables show mean ± std",
        sets=JOBS,
        minimum=1,
        maximum=100,
    )
    threads: int = runtime(1, **THREADS)
    # each flip is drawn from (seed, epoch, image) (pipeline.transfer.data.EpochSeeded): the count changes no result
    workers: int = runtime(
        0,
        "image-decoding processes of the training loader (0 = in the main process; 4-8 on GPU nodes)",
        minimum=0,
        maximum=256,
    )
    ranks: int = key(
        1,
        "processes of one fine-tuning job, one per GPU (torchrun); with norm bn their BN statistics are "
        "synchronised (SyncBN); give the profile's detect jobs as many GPUs",
        minimum=1,
        maximum=64,
    )
    checkpoint_every: int = runtime(
        0, "also write the resume state every N iterations (0 = at epoch ends only)", **CHECKPOINT_EVERY
    )
    fast_path: str | bool = key(
        "auto",
        "the fine-tuning's forward passes under bf16 autocast (roi_align, the losses and the evaluation stay "
        "fp32); auto = on for CUDA, off on CPU; on = also on CPU",
        enum=list(FAST_PATH_SETTINGS),
    )
    protocols: dict = key(
        factory=dict,
        doc="other fine-tuning protocols on the same cells, seeds and trials: name -> detect keys over this "
        "section, e.g. {frozen_bn: {norm: frozen_bn, head_norm: auto}}; each writes detect-<name>.json",
        sets=JOBS,
        propertyNames={"pattern": "^[A-Za-z0-9_]+$"},
        additionalProperties={"type": "object"},
    )

    @property
    def learning_rate(self) -> float:
        """detect.lr, or Detectron2's rule: 0.02 for 16 images, linear in the batch."""
        return self.lr if self.lr is not None else DETECTRON2_LR * self.batch_size / DETECTRON2_BATCH

    @property
    def new_layers_norm(self) -> str:
        """head_norm, auto resolved: the backbone's norm, none under frozen BN."""
        if self.head_norm != "auto":
            return self.head_norm
        return "none" if self.norm == "frozen_bn" else self.norm


@dataclass(frozen=True, kw_only=True)
class LaunchSlurm:
    """The SLURM job of the submitit launcher."""

    nodes: int = key(1, minimum=1, maximum=4096)
    tasks_per_node: int = key(1, "ranks per node, one per GPU", minimum=1, maximum=64)
    gpus_per_node: int = key(0, minimum=0, maximum=64)
    cpus_per_task: int = key(2, **THREADS)
    mem_gb: float | None = key(None, "per node; null = the partition's default", **POSITIVE)
    timeout_min: int = key(60, "time limit of one run (requeued after it)", minimum=1, maximum=525600)
    partition: str | None = key(None, "null = the cluster's default", pattern="^[A-Za-z0-9_.,-]+$")
    account: str | None = key(None, pattern="^[A-Za-z0-9_.-]+$")
    signal_delay_s: int = key(120, "SIGUSR2 this long before the time limit", minimum=1, maximum=86400)
    max_requeues: int = key(3, "time-limit requeues before giving up", minimum=0, maximum=1000)


@dataclass(frozen=True, kw_only=True)
class Launch:
    launcher: str = key(
        "direct",
        "direct = the rule runs the ranks (srun inside its SLURM job); submitit = the rule submits one SLURM "
        "job through submitit and waits",
        enum=["direct", "submitit"],
    )
    slurm: LaunchSlurm = key(factory=LaunchSlurm, doc="the job the submitit launcher submits")


@dataclass(frozen=True, kw_only=True)
class Resources:
    """grid.resources: the size of each cell's pretraining job (pipeline.dag.grid.cell_resources)."""

    minutes_per_epoch: float = key(1, **NON_NEGATIVE)
    overhead_minutes: float = key(10, **NON_NEGATIVE)
    nodes: int = key(1, minimum=1, maximum=4096)
    batch_per_node: int | None = key(
        None, "e.g. 1024: one more node per 1024 images of global batch", minimum=1, maximum=2**20
    )
    backbone_cost: dict = key(
        factory=dict,
        doc="epoch cost vs a ResNet-18, per backbone; unset: pipeline.dag.grid.BACKBONE_COST's",
        propertyNames={"enum": list(BACKBONES)},
        additionalProperties={"type": "number", "exclusiveMinimum": 0},
    )


@dataclass(frozen=True, kw_only=True)
class MethodRecipe:
    """grid.<method>: a method's own recipe beneath its cells (one for every method that trains
    and is not MoCo: grid.supervised, grid.simclr, ...); each None keeps its entry's rule, else the
    base cell's value. Not part of a cell's id."""

    epochs: int | None = like_pretrain()
    batch_size: int | None = like_pretrain()
    lr: float | None = like_pretrain()
    optimizer: str | None = like_pretrain()
    weight_decay: float | None = like_pretrain()
    schedule: str | None = like_pretrain()
    lr_step_epochs: tuple[int, ...] | None = like_pretrain()
    warmup_epochs: float | None = like_pretrain()
    aug: str | None = like_pretrain()  # none: the loader's RandomResizedCrop + flip only
    crop_scale_min: float | None = like_pretrain()
    jitter_scale: float | None = like_pretrain()
    lars_trust: float | None = like_pretrain()
    T: float | None = like_pretrain()
    m: float | None = like_pretrain()
    dim: int | None = like_pretrain()
    mlp_dim: int | None = like_pretrain()


# the grid's experiment design, which config.yaml sets for the demo; absent, no sweep, one seed
DESIGN = ("one_at_a_time", "product", "cells", "baselines", "seeds", "only")
SWEEP: dict[str, Any] = {
    "propertyNames": {"enum": list(AXES)},  # in the order of a cell id's parts
    "additionalProperties": {"type": "array", "minItems": 1},
}


def recipe_slot(spec: MethodSpec, slot: str, default: Mapping[str, Any]) -> Any:
    """grid.<slot>: a method's recipe (pretrain keys) beneath the cells of the slot; by default
    its recipe for the embedded data, where it has one (MethodSpec.recipe_slots)."""
    under = "its paper's rule (MethodSpec.recipe)" if spec.recipe else "the base cell's value"
    whose = spec.label if slot == spec.name else f"{spec.label} ({slot})"
    return key(factory=partial(MethodRecipe, **default), doc=f"{whose}'s recipe (pretrain keys); null = {under}")


# each registered method's recipe slots (grid.supervised, grid.simclr, grid.byol, MoCo v3's by
# backbone): a method added to the registry gets its slots without an edit here
MethodRecipes = make_dataclass(
    "MethodRecipes",
    [
        (slot, MethodRecipe, recipe_slot(spec, slot, default))
        for spec in METHODS.values()
        for slot, default in spec.slots().items()
    ],
    frozen=True,
    kw_only=True,
)


@dataclass(frozen=True, kw_only=True)
class Grid(MethodRecipes):  # type: ignore[misc, valid-type]  # its recipe slots from the registry
    """The ablation grid around the base cell (pretrain), and each other method's recipe."""

    one_at_a_time: dict = key(factory=dict, doc="axis (a pretrain key) -> values, each varied alone", **SWEEP)
    product: dict = key(factory=dict, doc="axis (a pretrain key) -> values, every combination", **SWEEP)
    cells: tuple = key(
        (),
        "cells given whole beside the sweeps, each {axis: value, ...} over the base cell (e.g. "
        "{variant: v3, backbone: vit_tiny, patch_size: 8, depth: 4}); its recipe beneath it",
        items={"type": "object", "minProperties": 1, "propertyNames": {"enum": list(AXES)}},
    )
    baselines: tuple = key(
        (),
        "the other methods trained beside the base cell, each a cell method=<name> (its recipe: grid.<name>)",
        items={"enum": [name for name in METHODS if name != "moco"]},
        uniqueItems=True,
    )
    only: tuple | None = key(
        None,
        "run only these cells of the grid (ids as under results/cells, e.g. [base, method=random]); null = every cell",
        minItems=1,
        items={"type": "string", "pattern": f"^{CELL_ID}$"},
    )
    seeds: int = key(
        1,
        "replicates of every cell, seeds pretrain.seed .. pretrain.seed + N - 1 (tables show mean ± 95 % CI, n)",
        minimum=1,
        maximum=100,
    )
    resources: Resources = key(
        factory=Resources,
        sets=RUNTIME,
        doc="job size of each cell's pretraining, scaled with the cell (pipeline.dag.grid.cell_resources): "
        "nodes = max(nodes, ceil(batch_size / batch_per_node)), runtime = overhead_minutes + "
        "minutes_per_epoch * epochs * backbone_cost / nodes",
    )

    def recipe(self, cell: Mapping[str, Any]) -> MethodRecipe | None:
        """The recipe beneath ``cell`` (its pretrain values): its method's slot (grid.supervised,
        ...; MoCo v3's by backbone); None where it has none (MoCo v1/v2, random init)."""
        slot = method_spec(cell["method"]).slot(cell)
        recipe = getattr(self, slot, None) if slot else None
        return recipe if isinstance(recipe, MethodRecipe) else None


NOT_ONE: dict[str, Any] = {"not": {"const": 1}}


@dataclass(frozen=True, kw_only=True)
class Claims:
    """snakemake claims: cells around the base trained ``epochs``, and ``long_epochs`` once;
    ``seeds`` of each (paired by seed; a verdict needs a 95 % CI, so >= 2)."""

    epochs: int = key(9, **EPOCHS)
    long_epochs: int = key(18, minimum=2, maximum=100_000)
    seeds: int = key(
        5, "seeds of every claims cell (first_seed ..); a verdict needs >= 2 (a 95 % CI)", minimum=1, maximum=1000
    )
    first_seed: int | None = key(
        None,
        "the first compared seed; null = pretrain.seed. Another value repeats the study on seeds no earlier "
        "run saw (a confirmatory run)",
        minimum=0,
        maximum=10**6,
    )
    pilot_seeds: int = key(
        5,
        "more seeds of the reference and of random init (after the compared ones), never compared: the "
        "accuracy claims are decided only if these runs learnt something (paired Δ vs random init, 95 % CI "
        "above 0); 0 = no pilot (the table says the check was not made), else >= 2",
        minimum=0,
        maximum=1000,
        **NOT_ONE,
    )
    invariant_seeds: int = key(
        2,
        "seeds of the cells only an invariant needs (random replacement, for the FIFO bound): it holds when "
        "every run satisfies it, so these need runs, not a CI",
        minimum=1,
        maximum=1000,
    )
    random_init_margin: float = key(
        5.0,
        "points of linear top-1: a probe whose paired Δ vs random init has its 95 % CI below this is at random "
        "init's level (m = 0 fails), one whose CI lies above it learnt something (an equivalence margin)",
        minimum=0,
        maximum=100,
    )
    m: tuple = key(
        (0.0, 0.5, 0.9, 0.99, 0.999, 0.9999),
        minItems=1,
        uniqueItems=True,
        items={"type": "number", "minimum": 0, "exclusiveMaximum": 1},
    )
    K: tuple = key(
        (128, 256),
        "each under FIFO and random replacement",
        minItems=1,
        uniqueItems=True,
        items={"type": "integer", "minimum": 1, "maximum": 2**24},
    )

    only: tuple | None = key(
        None,
        "train only the cells of these claims (pipeline.base.layout.CLAIM_KEYS, e.g. [large_batch, "
        "byol_learns]); the others read what already exists and are otherwise `not run`. null = every claim",
        minItems=1,
        uniqueItems=True,
        items={"enum": list(CLAIM_KEYS)},
    )

    def seed(self, base_seed: int) -> int:
        """The first compared seed: ``first_seed``, else the base cell's."""
        return base_seed if self.first_seed is None else self.first_seed


@dataclass(frozen=True, kw_only=True)
class Config:
    """The whole workflow config, typed once (pipeline.dag.config.load_config); the rules read it."""

    results: str = key("results", "everything the workflow writes goes under this folder", pattern="^[A-Za-z0-9_./-]+$")
    dataset: Dataset = key(factory=Dataset)
    convert: Convert = key(factory=Convert)
    data: Data = key(factory=Data)
    pretrain: Pretrain = key(factory=Pretrain, doc="the base cell of the ablation grid")
    cell: str | None = key(
        None,
        "the one ablation cell `snakemake cell --config cell=K=1024,m=0.9` builds (command line only)",
        pattern=f"^{CELL_ID}$",
    )
    grid: Grid = key(factory=Grid)
    claims: Claims | None = key(
        None,
        "the seeds' claims as experiments (snakemake claims -> tables/claims.*): cells around a reference "
        "cell, the base trained `epochs`; each m, each K under each queue policy, the memory bank, random "
        "init, and the reference trained `long_epochs`; `seeds` of each",
    )
    probe: Probe = key(factory=Probe)
    detect: Detect = key(factory=Detect)
    launch: Launch = key(
        factory=Launch, doc='how the pretrain rule starts its ranks (see docs/cluster.md, "The submitit launcher")'
    )
