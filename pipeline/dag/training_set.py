"""The training split's size before anything runs: what the claims' seeds and gates and the cost
plan are computed from.

In order: the embedded dataset's config (exact); the conversion report when it is this
dataset's (the count the jobs will see); ``dataset.train_images`` (declared for a folder
dataset); a known count for torchvision's datasets. A folder dataset with none of these is an error that asks for
the key, never an unknown size that would quietly plan fewer runs.

No torch: Snakemake calls it at DAG build, pipeline.plan before any job.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from pipeline.dag.config import ConfigError
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
        images = len(SYNTHETIC_CLASSES) * ds.synthetic.train_per_class
        return TrainingSet(images, len(SYNTHETIC_CLASSES), "the synthetic dataset's config")
    folder = Path(cfg.results if results is None else results)
    found = _report(folder / REPORT, ds)
    if isinstance(found, TrainingSet):
        return found
    note = f"; {found}"
    if ds.train_images is not None:
        return TrainingSet(ds.train_images, None, "dataset.train_images" + note)
    key = "stl10+unlabeled" if ds.source == "stl10" and ds.stl10_unlabeled else ds.source
    if key in KNOWN:
        images, classes, what = KNOWN[key]
        return TrainingSet(images, classes, what + note)
    raise ConfigError(
        f"dataset.train_images: the size of {ds.root}'s train split is not known before conversion "
        f"({found}); declare it (ImageNet-1k: {IMAGENET_TRAIN}) so that the plan can size the runs"
    )


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
