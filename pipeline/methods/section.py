"""The config's pretrain section: one pretraining cell, its shared keys and each method's own.

It lives with the methods because it joins their keys (each method's keys.py) to the keys every
method reads, and their entries read it; the other sections are in pipeline.dag.sections, which
holds this one as Config.pretrain. A key's declaration says what pipeline.dag.sections' docstring
says of every key.

Standard library only: Snakemake imports this while it builds the DAG (no torch).
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.base.keys import CHECKPOINT_EVERY, EPOCHS, INIT, NON_NEGATIVE, PLAN, POSITIVE, SEED, THREADS, key, runtime
from pipeline.base.layout import BACKBONES, FAST_PATH_SETTINGS, is_vit
from pipeline.methods.byol.keys import ByolKeys
from pipeline.methods.moco.keys import MocoKeys
from pipeline.methods.registry import METHODS, MethodSpec, method_spec
from pipeline.methods.simclr.keys import SimclrKeys

# the optimiser, schedule and augmentation of a pretraining (and of grid.supervised's recipe)
OPTIMIZERS = ["auto", "sgd", "lars", "adamw"]
SCHEDULES = ["cosine", "step"]
AUGS = ["v1", "v2", "v3", "cifar", "none"]


@dataclass(frozen=True, kw_only=True)
class SharedPretrain:
    """The pretrain keys every method reads or may read; each method's own keys are declared in
    its folder (its keys.py) and joined to these in Pretrain."""

    method: str = key(
        "moco",
        "moco, or a baseline through the same stages (supervised, random): a registered method (pipeline.methods)",
        sets=INIT,
        enum=lambda: list(METHODS),
    )
    backbone: str = key("resnet18", sets=INIT, enum=list(BACKBONES))
    width: int = key(16, "ResNet: channels of the first stage", sets=INIT, minimum=4, maximum=256)
    cifar_stem: bool = key(True, "3x3 stem without max-pool, for small images", sets=INIT)
    norm: str = key(
        "bn", "normalisation of ResNet backbones (gn = GroupNorm, batch-independent)", sets=INIT, enum=["bn", "gn"]
    )
    patch_size: int = key(16, "ViT", sets=INIT, minimum=1, maximum=64)
    depth: int | None = key(
        None,
        "ViT depth override (null = the architecture's); small values for CPU tests",
        sets=INIT,
        minimum=1,
        maximum=256,
    )
    mlp_dim: int = key(4096, "hidden width of v3's projector and predictor", minimum=8, maximum=65536)
    dim: int = key(128, "embedding dimension", minimum=2, maximum=4096)
    m: float = key(0.99, "momentum of the key encoder, in [0, 1]", minimum=0, maximum=1)
    T: float = key(0.2, "softmax temperature", **POSITIVE)
    epochs: int = key(13, minimum=0, maximum=100_000)
    min_steps: int = key(
        520,
        "the base cell's least number of steps: on a training set too small for them in `epochs`, the "
        "workflow trains ceil(min_steps / steps per epoch) epochs instead (0 = off); cells that set "
        "their own epochs (grid axes, claims) keep them",
        sets=PLAN,
        minimum=0,
        maximum=10**9,
    )
    batch_size: int = key(64, "global batch", minimum=2, maximum=2**20)
    lr: float = key(0.015, **POSITIVE)
    optimizer: str = key("auto", "auto = sgd (v1/v2), lars (v3 ResNet), adamw (v3 ViT)", enum=OPTIMIZERS)
    weight_decay: float = key(0.0005, **NON_NEGATIVE)
    sgd_momentum: float = key(0.9, minimum=0, maximum=1)
    lars_trust: float = key(
        0.001,
        "LARS's trust coefficient: a weight matrix's step is lr x this x its norm over its update's (0.001: "
        "MoCo v3's, SimCLR's, BYOL's at batch 4096; small-batch recipes take larger ones)",
        exclusiveMinimum=0,
        maximum=1,
    )
    warmup_epochs: float = key(0, **NON_NEGATIVE)
    schedule: str = key("cosine", "cosine, or step (x0.1 at lr_step_epochs)", enum=SCHEDULES)
    lr_step_epochs: tuple[int, ...] | None = key(
        None,
        "step schedule: epochs at which the lr drops x0.1 (null = at 60% and 80% of the epochs)",
        minItems=1,
        items={"type": "integer", **EPOCHS},
    )
    aug: str = key(
        "v2",
        "photometric recipe (v2 = aug+; cifar = the CIFAR demo's aug+ without blur; none = crop + flip only)",
        enum=AUGS,
    )
    jitter_scale: float = key(
        1.0,
        "the recipe's colour jitter (brightness, contrast, saturation, hue) times this (v2 x 2 = SimCLR's "
        "strength 1.0); hue capped at 0.5",
        minimum=0,
        maximum=2.5,
    )
    crop_scale_min: float = key(0.5, exclusiveMinimum=0, maximum=1)
    freeze_patch_embed: bool | None = key(
        None, "ViT: keep the random patch projection fixed (MoCo v3's stop_grad_conv1); null = for MoCo only"
    )
    fast_path: str | bool = key(
        "auto",
        "the GPU fast path of a step, one switch: channels_last (ResNets) and bf16 autocast; auto = on for "
        "CUDA, off on CPU (a resumed run keeps the path its state recorded); on = also on CPU (what the tests "
        "run). YAML reads a bare on / off as true / false: those mean the same",
        enum=list(FAST_PATH_SETTINGS),
    )
    compile: bool = key(False, "torch.compile the model (off by default; slow to start on CPU)")
    knn_every: int = runtime(
        10, "kNN monitor on the val split every N epochs and at the end (0 = off)", minimum=0, maximum=100_000
    )
    checkpoint_every: int = runtime(
        0, "also write the resume state every N steps (0 = at epoch ends only)", **CHECKPOINT_EVERY
    )
    seed: int = key(0, sets=INIT, **SEED)
    threads: int = runtime(1, **THREADS)


# Each method's own keys, after the shared ones (a dataclass lists its fields from the last base
# to the first): a method with keys of its own adds its class here, first (the README's "Extending")
@dataclass(frozen=True, kw_only=True)
class Pretrain(ByolKeys, SimclrKeys, MocoKeys, SharedPretrain):
    """One pretraining cell (the base cell of the grid): the shared keys, then each method's own."""

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

    @property
    def optimizer_name(self) -> str:
        """The optimiser it trains with: its own, or under ``optimizer: auto`` its method's."""
        return self.spec.optimizer(self) if self.optimizer == "auto" else self.optimizer
