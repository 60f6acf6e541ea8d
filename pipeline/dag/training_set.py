"""The training split's size before anything runs: what the claims' seeds and gates, the cost
plan and the base cell's least length (``pretrain.min_steps``) are computed from.

In order: the embedded dataset's config (exact); the conversion report when it is this
dataset's (the count the jobs will see); ``dataset.train_images`` (declared for a folder
dataset); a known count for torchvision's datasets. A folder dataset with none of these is an error that asks for
the key, never an unknown size that would quietly plan fewer runs.

No torch: Snakemake calls it at DAG build, pipeline.plan before any job.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path

from pipeline.base.errors import ConfigError
from pipeline.base.folders import count_images
from pipeline.dag.sections import SYNTHETIC_CLASSES, Config, Dataset

IMAGENET_TRAIN = 1_281_167  # ImageNet-1k (ILSVRC-2012) training images
# torchvision's datasets: (training images, classes, what)
KNOWN = {
    "cifar10": (50_000, 10, "CIFAR-10 train"),
    "cifar100": (50_000, 100, "CIFAR-100 train"),
    "stl10": (5_000, 10, "STL-10 train (labelled)"),
    "stl10+unlabeled": (105_000, 10, "STL-10 train + unlabeled"),
}
REPORT = "data/ffcv/train.json"  # under the results folder: pipeline.convert's report


@dataclass(frozen=True)
class TrainingSet:
    images: int
    classes: int | None  # None: not known before conversion (a folder dataset)
    where: str  # where the count comes from


def training_set(cfg: Config, results: Path | str | None = None) -> TrainingSet:
    """The training split of ``cfg.dataset`` (``results``: the results folder, cfg.results if None)."""
    ds = cfg.dataset
    if ds.source == "synthetic":
        return TrainingSet(synthetic_images(ds), len(SYNTHETIC_CLASSES), "the synthetic dataset's config")
    folder = Path(cfg.results if results is None else results)
    found = _report(folder / REPORT, ds)
    if isinstance(found, TrainingSet):
        return found
    note = f"; {found}"
    if ds.train_images is not None:
        return TrainingSet(ds.train_images, None, "dataset.train_images" + note)
    if _known(ds) in KNOWN:
        images, classes, what = KNOWN[_known(ds)]
        return TrainingSet(images, classes, what + note)
    raise ConfigError(
        f"dataset.train_images: the size of {ds.root}'s train split is not known before conversion "
        f"({found}); declare it (ImageNet-1k: {IMAGENET_TRAIN}) so that the plan can size the runs"
    )


def synthetic_images(ds: Dataset) -> int:
    """The embedded dataset's training images (exact: its config generates them)."""
    return len(SYNTHETIC_CLASSES) * ds.synthetic.train_per_class


def _known(ds: Dataset) -> str:
    """``ds``'s key in KNOWN (a torchvision dataset; any other source is not in it)."""
    return "stl10+unlabeled" if ds.source == "stl10" and ds.stl10_unlabeled else ds.source


def _report(path: Path, ds: Dataset) -> TrainingSet | str:
    """The conversion report's count when it is of this dataset, else why it is not used."""
    if not path.is_file():
        return f"no conversion report yet ({path})"
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError:
        return f"{path} is unreadable: ignored"
    described = data.get("source") or {}
    if not _report_is_of(described, ds):
        return f"{path} is of another dataset ({described.get('root')}): ignored"
    classes = len(data.get("classes") or []) or None
    return TrainingSet(int(data["num_samples"]), classes, f"the conversion report {path}")


def _report_is_of(described: dict, ds: Dataset) -> bool:
    kind, root = ds.source, Path(str(ds.root))
    where = Path(str(described.get("root", ""))).expanduser().resolve()
    return described.get("kind") == kind and where.is_relative_to(root.expanduser().resolve())


def lengthen_base(cfg: Config, stated: dict) -> Config:
    """``cfg`` with the base cell's epochs raised to reach ``pretrain.min_steps`` on this training
    set, where its own epochs fall short (``stated``, the config as given, is updated to agree:
    the jobs' JSON holds what they train). The recipe study chose a number of steps (520 of a
    batch of 64), which the config writes as 13 epochs of the embedded 2,600 images; on a smaller
    folder 13 epochs are fewer steps, and below ~300 leaving the loss plateau is luck (the
    digits check in docs/embedded-data.md). Cells that set their own epochs keep them: they
    are overrides of the base (pipeline.dag.grid)."""
    p = cfg.pretrain
    if not p.min_steps or not p.epochs:
        return cfg
    enough = p.batch_size * math.ceil(p.min_steps / p.epochs)  # images at which `epochs` suffice
    images = _images_up_to(cfg.dataset, enough)
    steps = (images or 0) // p.batch_size  # two views drop the last partial batch
    if not steps or steps * p.epochs >= p.min_steps:
        return cfg  # unknown or empty (the jobs say what is wrong), or long enough
    epochs = math.ceil(p.min_steps / steps)
    stated["pretrain"] = {**stated.get("pretrain", {}), "epochs": epochs}  # a new dict: the caller's stays
    return dataclasses.replace(cfg, pretrain=dataclasses.replace(p, epochs=epochs))


def _images_up_to(ds: Dataset, limit: int) -> int | None:
    """The training split's image count, counted no further than ``limit`` for a folder (an
    ImageNet folder stops after a few thousand files); None where it cannot be known yet. The
    same count on every DAG build: a folder is counted, never its conversion report, which
    appears after the first build."""
    if ds.source == "synthetic":
        return synthetic_images(ds)
    if ds.train_images is not None:
        return ds.train_images
    if _known(ds) in KNOWN:
        return KNOWN[_known(ds)][0]
    return count_images(Path(str(ds.root)).expanduser() / "train", ds.source, limit)
