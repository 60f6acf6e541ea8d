"""The config's sections as typed, frozen dataclasses: every default is defined here, once.

Standard library only: Snakemake imports this while it builds the DAG (no torch, no pandas).
The field names are the schema's keys (workflow/config/config.schema.yaml; a test holds them
equal) and the defaults are config.yaml's values (a test holds those equal too). Lists are
tuples here, so that a section cannot change once built; pipeline.dag.config builds the sections
from validated dicts and turns them back into dicts.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pipeline.dag.layout import is_vit
from pipeline.methods import MethodSpec, method_spec

# What a key sets (field metadata "sets"); unmarked keys determine their stage's result.
# A rule's params, which Snakemake compares to decide a rerun, and a pretraining run's
# fingerprint, which decides a resume, hold the result keys only (pipeline.dag.config.result_part).
RUNTIME = "runtime"  # resources, logging or monitoring: never changes a result's meaning
JOBS = "jobs"  # which jobs exist (e.g. detect.trials), not what one of them computes
INIT = "init"  # pretrain: with the seed, all an untrained (random-init) network depends on


def runtime(default, unless=None):
    """A RUNTIME key; ``unless(section)`` names the sections where it does change the result.
    Thread and worker counts change float rounding only (the order of summed terms, measured
    in docs/methods.md, "A run resumes only from its own state"): the same experiment, as on a GPU run to run."""
    return field(default=default, metadata={"sets": RUNTIME, "unless": unless})


def marked(default, sets: str):
    return field(default=default, metadata={"sets": sets})


# the embedded dataset's shape classes, in label order (pipeline.synthetic draws them)
SYNTHETIC_CLASSES = ("disk", "square", "triangle", "diamond", "ring", "frame", "plus", "cross", "bars", "checker")


@dataclass(frozen=True, kw_only=True)
class Synthetic:
    """dataset.synthetic: the embedded dataset, generated deterministically."""

    seed: int = 0
    image_size: int = 32
    train_per_class: int = 260
    val_per_class: int = 60
    det_train_images: int = 192  # detection scenes
    det_val_images: int = 48
    det_image_size: int = 96
    backgrounds: int = 1  # shared pool of background gradients; 0: each image its own (the old design)


@dataclass(frozen=True, kw_only=True)
class Dataset:
    source: str = "synthetic"  # synthetic | imagefolder | unlabeled | cifar10 | cifar100 | stl10
    root: str | None = None  # required for every source but synthetic
    stl10_unlabeled: bool = False  # stl10: the train split also holds the 100k unlabeled images
    # imagefolder | unlabeled: the train split's size, for plans made before conversion (the
    # claims' seeds and gates, the cost plan); the conversion report's count wins once it exists
    train_images: int | None = None
    synthetic: Synthetic = field(default_factory=Synthetic)


@dataclass(frozen=True, kw_only=True)
class Convert:
    max_resolution: int | None = 64  # longest side stored in the .beton; None: as is
    jpeg_quality: int = 90
    write_mode: str = "auto"  # auto: raw while the split's pixels fit 4 GiB, else proportion
    compress_probability: float = 0.5  # proportion: share of JPEG images
    smart_threshold: int = 3 * 128 * 128  # smart: JPEG for images above this many raw bytes
    workers: int = runtime(2)  # processes that check and write images (same .beton)
    strict: bool = False  # fail on the first unreadable image instead of skipping it


@dataclass(frozen=True, kw_only=True)
class Data:
    loader: str = "ffcv"  # ffcv | torchvision
    crop: str = "loader"  # loader: crops drawn while decoding | device: drawn on the device
    crop_size: int = marked(32, INIT)  # (a ViT's image size)
    # loader workers per job; None: from the job's threads. Both loaders draw each sample's
    # crops from (seed, epoch, index): the count changes no result
    workers: int | None = runtime(None)


@dataclass(frozen=True, kw_only=True)
class Pretrain:
    """One pretraining cell (the base cell of the grid)."""

    method: str = marked("moco", INIT)  # a name of pipeline.methods: moco | supervised | random
    variant: str = "v2"
    mechanism: str = "moco"  # how negatives are produced: moco | end_to_end | memory_bank
    backbone: str = marked("resnet18", INIT)
    width: int = marked(16, INIT)  # ResNet: channels of the first stage
    cifar_stem: bool = marked(True, INIT)  # 3x3 stem without max-pool, for small images
    norm: str = marked("bn", INIT)  # ResNet normalisation: bn | gn
    patch_size: int = marked(16, INIT)  # ViT
    depth: int | None = marked(None, INIT)  # ViT depth override; None: the architecture's
    mlp_dim: int = 4096  # hidden width of v3's projector and predictor
    dim: int = 128  # embedding dimension
    K: int = 256  # queue size (negatives)
    m: float = 0.99  # key encoder momentum
    T: float = 0.2  # softmax temperature
    epochs: int = 13
    batch_size: int = 64  # global batch
    lr: float = 0.015
    optimizer: str = "auto"  # auto: sgd (v1/v2), lars (v3 ResNet), adamw (v3 ViT)
    weight_decay: float = 0.0005
    sgd_momentum: float = 0.9
    warmup_epochs: float = 0
    schedule: str = "cosine"
    lr_step_epochs: tuple[int, ...] | None = None  # step: lr x0.1 at these epochs; None: at 60% and 80%
    aug: str = "v2"
    jitter_scale: float = 1.0  # the recipe's colour jitter x this (v2 x 2 = SimCLR's strength 1.0)
    crop_scale_min: float = 0.5
    mask_same_source: bool = False
    symmetric: bool = False  # v1/v2: also the loss with the views swapped (the CIFAR demo's option)
    freeze_patch_embed: bool | None = None  # ViT: keep the random patch projection; None: for MoCo only
    queue_policy: str = "fifo"  # which queue slot a new key takes: fifo | random
    shuffle_bn: bool = True  # the BN-leak guard
    bn_splits: int | None = None  # BN sub-batches per rank; None: see split_bn.default_splits
    bank_m: float = 0.5  # momentum of memory-bank entries
    fast_path: str | bool = "auto"  # auto | on | off: channels_last (ResNet) + bf16 autocast; auto: on CUDA only
    compile: bool = False  # torch.compile
    knn_every: int = runtime(10)  # kNN monitor every N epochs and the last; 0: off
    checkpoint_every: int = runtime(0)  # resume state every N steps too; 0: at epoch ends only
    seed: int = marked(0, INIT)
    threads: int = runtime(1)

    # what the method registry (pipeline.methods) and the backbone list say of this cell
    @property
    def spec(self) -> MethodSpec:
        return method_spec(self.method)

    @property
    def is_moco(self) -> bool:
        return self.spec.moco

    @property
    def has_queue(self) -> bool:
        """Negatives from a queue of keys (MoCo v1/v2): K must hold whole batches of keys."""
        return self.spec.has_queue(self)

    @property
    def trains(self) -> bool:
        return self.spec.trains

    @property
    def is_vit(self) -> bool:
        return is_vit(self.backbone)


@dataclass(frozen=True, kw_only=True)
class Probe:
    mode: str = "cached"  # cached: features extracted once | augmented: new views every epoch
    protocol: str = "moco"  # moco | mocov3
    standardize: bool = False  # parameter-free BN before the linear layer
    epochs: int = 100
    batch_size: int | None = None  # None: the protocol's
    lr: float | None = None  # None: the protocol's
    weight_decay: float = 0.0
    knn_k: int = 200
    knn_t: float = 0.07
    crop_ratio: float = (
        1.0  # centre crop of the evaluation view: side / shorter side (0.875: Resize(256)+CenterCrop(224))
    )
    seed: int = 0
    # processes per probe, one per GPU (torchrun, DDP; augmented only): the views' shards and
    # BN groups, so a result key, except at 1, as every probe before the key existed
    ranks: int = runtime(1, unless=lambda pc: pc.ranks > 1)
    threads: int = runtime(1)
    checkpoint_every: int = runtime(0)  # resume state every N steps too; 0: at epoch ends only


@dataclass(frozen=True, kw_only=True)
class Rpn:
    """Proposals kept before / after NMS, in training and at test."""

    pre_nms_train: int = 1000
    post_nms_train: int = 300
    pre_nms_test: int = 500
    post_nms_test: int = 150


@dataclass(frozen=True, kw_only=True)
class Voc:
    """VOC image sets as <year>/<set>: the paper's VOC07+12 -> VOC07 test."""

    train: tuple[str, ...] = ("2007/trainval", "2012/trainval")
    val: str = "2007/test"


@dataclass(frozen=True, kw_only=True)
class Detect:
    enabled: bool = marked(True, JOBS)
    cells: tuple[str, ...] = marked(("base", "method=supervised"), JOBS)  # or ("all",)
    root: str | None = None  # COCO folder or VOCdevkit; None: the embedded scenes
    dataset: str = "auto"  # layout of root: auto | coco | voc
    voc: Voc = field(default_factory=Voc)
    head: str = "fpn"  # fpn | c4
    task: str = "segmentation"  # segmentation: Mask R-CNN, box and mask AP | detection: Faster R-CNN, box AP
    epochs: int = 4
    batch_size: int = 4
    lr: float = 0.02
    weight_decay: float = 0.0001
    image_size: int = 96  # shorter side after resizing
    max_image_size: int | None = None  # cap on the longer side; None: image_size
    fpn_channels: int = 32
    anchor_sizes: tuple[int, ...] | None = None  # pixels; None: fractions of image_size
    norm: str = "frozen_bn"  # frozen_bn | bn | gn
    rpn: Rpn = field(default_factory=Rpn)
    roi_per_image: int = 128  # RoIs sampled per image for the box head's loss
    schedule: str = "cosine"  # cosine | step (x0.1 at each of lr_steps)
    lr_steps: tuple[int, ...] | None = None
    warmup_iters: int = 100  # linear warmup, at most a quarter of the iterations
    iterations: int | None = None  # None: epochs x iterations per epoch
    train_sizes: tuple[int, ...] | None = None  # multi-scale training sides; None: image_size
    voc_metric: str = "auto"  # 11point | area | auto (11point on a 2007 test set)
    seed: int = 0
    trials: int = marked(1, JOBS)  # fine-tuning runs per cell
    threads: int = runtime(1)
    # image-decoding processes; 0: in the main process. Each flip is drawn from (seed, epoch,
    # image) (pipeline.detect.EpochSeeded): the count changes no result
    workers: int = runtime(0)
    ranks: int = 1  # processes per fine-tuning, one per GPU
    checkpoint_every: int = runtime(0)  # resume state every N iterations too; 0: at epoch ends only


@dataclass(frozen=True, kw_only=True)
class LaunchSlurm:
    """The SLURM job of the submitit launcher."""

    nodes: int = 1
    tasks_per_node: int = 1  # one task (rank) per GPU
    gpus_per_node: int = 0
    cpus_per_task: int = 2
    mem_gb: float | None = None  # per node; None: the partition's default
    timeout_min: int = 60  # time limit of one run (requeued after it)
    partition: str | None = None  # None: the cluster's default
    account: str | None = None
    signal_delay_s: int = 120  # SIGUSR2 this long before the time limit
    max_requeues: int = 3


@dataclass(frozen=True, kw_only=True)
class Launch:
    launcher: str = "direct"  # direct | submitit
    slurm: LaunchSlurm = field(default_factory=LaunchSlurm)


@dataclass(frozen=True, kw_only=True)
class Resources:
    """grid.resources: the size of each cell's pretraining job (pipeline.dag.grid.cell_resources)."""

    minutes_per_epoch: float = 1
    overhead_minutes: float = 10
    nodes: int = 1
    batch_per_node: int | None = None  # e.g. 1024: one more node per 1024 images of global batch
    backbone_cost: dict = field(default_factory=dict)  # epoch cost vs a ResNet-18; unset: grid.BACKBONE_COST


@dataclass(frozen=True, kw_only=True)
class SupervisedRecipe:
    """grid.supervised: the supervised baseline's own recipe; each None keeps the base cell's."""

    epochs: int | None = None
    batch_size: int | None = None
    lr: float | None = None
    optimizer: str | None = None
    weight_decay: float | None = None
    schedule: str | None = None
    lr_step_epochs: tuple[int, ...] | None = None
    warmup_epochs: float | None = None
    aug: str | None = None  # none: the loader's RandomResizedCrop + flip only
    crop_scale_min: float | None = None


# the grid's experiment design, which config.yaml sets for the demo; absent, no sweep, one seed
DESIGN = ("one_at_a_time", "product", "baselines", "seeds", "only")


@dataclass(frozen=True, kw_only=True)
class Grid:
    """The ablation grid around the base cell (pretrain)."""

    one_at_a_time: dict = field(default_factory=dict)  # axis -> values, each varied alone
    product: dict = field(default_factory=dict)  # axis -> values, every combination
    baselines: tuple = ()  # random | supervised
    only: tuple | None = None  # run only these cells (ids); None: all
    seeds: int = 1  # replicates of every cell
    resources: Resources = field(default_factory=Resources, metadata={"sets": RUNTIME})
    supervised: SupervisedRecipe = field(default_factory=SupervisedRecipe)


@dataclass(frozen=True, kw_only=True)
class Claims:
    """snakemake claims: cells around the base trained ``epochs``, and ``long_epochs`` once;
    ``seeds`` of each (paired by seed; a verdict needs a 95 % CI, so >= 2)."""

    epochs: int = 9
    long_epochs: int = 18
    seeds: int = 5
    # the compared runs' seeds are first_seed, first_seed + 1, ... (None: pretrain.seed); another
    # first_seed repeats the whole study on seeds no earlier run saw (a confirmatory run)
    first_seed: int | None = None
    # seeds of the reference and random init beyond the compared ones (first_seed + seeds ..):
    # whether the reference learnt something is read from them, never from the runs compared
    pilot_seeds: int = 5
    # seeds of the cells only an invariant needs (random replacement, for the FIFO bound): an
    # invariant holds when every run satisfies it, so it needs runs, not a CI
    invariant_seeds: int = 2
    m: tuple = (0.0, 0.5, 0.9, 0.99, 0.999, 0.9999)
    K: tuple = (128, 256)  # each under FIFO and random replacement

    def seed(self, base_seed: int) -> int:
        """The first compared seed: ``first_seed``, else the base cell's."""
        return base_seed if self.first_seed is None else self.first_seed


@dataclass(frozen=True, kw_only=True)
class Config:
    """The whole workflow config, typed once (pipeline.dag.config.typed_config); the rules read it."""

    results: str = "results"
    dataset: Dataset = field(default_factory=Dataset)
    convert: Convert = field(default_factory=Convert)
    data: Data = field(default_factory=Data)
    pretrain: Pretrain = field(default_factory=Pretrain)
    cell: str | None = None  # snakemake cell --config cell=<id>: that cell's jobs
    grid: Grid = field(default_factory=Grid)
    claims: Claims | None = None  # snakemake claims only
    probe: Probe = field(default_factory=Probe)
    detect: Detect = field(default_factory=Detect)
    launch: Launch = field(default_factory=Launch)
