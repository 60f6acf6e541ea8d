"""Loaders: two augmented views for pretraining, one centre view for evaluation.

Two implementations behind the same two factories, chosen by ``loader=`` (``data.loader``):

- ``ffcv``: reads the ``.beton``; random resized crop + flip are fused with decoding (numba).
- ``torchvision``: reads the images the ``.beton`` was converted from (its JSON report names
  the source; files skipped then are skipped again) through a torch DataLoader with
  transforms v2 per sample. The benchmark baseline, and the fallback where FFCV cannot be
  installed (the report alone is enough: ``python -m pipeline.convert --report-only``).

Both visit the same samples in the same order for a given seed and epoch (FFCV's RANDOM and
SEQUENTIAL orders; DistributedSampler's shards when ``distributed``) and yield uint8 NCHW
batches: (view1, view2, label, index) for two views, (image, label, index) for evaluation.
FFCV's batches are views into reused buffers: clone what you keep. Photometric augmentation
and normalisation happen on the training device (pipeline.data.augment), never in the loader: on
CPU FFCV's normalisation hangs (FFCV issue #396).
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import math
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from pipeline.dag.sections import Data
from pipeline.methods.section import Pretrain
from pipeline.runtime import lean_torchvision

LOADERS = ("ffcv", "torchvision")
RATIO = (3 / 4, 4 / 3)  # aspect ratios of the random resized crop (as torchvision's default)


@dataclass(frozen=True, kw_only=True)
class Views:
    """How two_view_loader draws an image's two views: each a random resized crop (side
    ``crop_size``, a share scale_min..1 of the area, an aspect ratio in ``ratio``) and a flip,
    from ``seed``; ``crop``: where the crops are drawn (loader | device). scale_min=1,
    ratio=(1, 1), flip=False: no geometric augmentation (both views equal the evaluation view)."""

    crop_size: int
    scale_min: float = 0.2
    ratio: tuple[float, float] = RATIO
    flip: bool = True
    crop: str = "loader"
    seed: int = 0

    @classmethod
    def of(cls, p: Pretrain, d: Data) -> Views:
        """A pretraining cell's views."""
        return cls(crop_size=d.crop_size, scale_min=p.crop_scale_min, crop=d.crop, seed=p.seed)


@dataclass(frozen=True, kw_only=True)
class Centre:
    """The evaluation view: the centre square of ``ratio`` x the shorter side, resized to
    ``crop_size`` (0.875: the references' Resize(256) + CenterCrop(224)); in file order, or
    shuffled from ``seed`` (``order`` random)."""

    crop_size: int
    ratio: float = 1.0
    order: str = "sequential"
    seed: int = 0


@dataclass(frozen=True, kw_only=True)
class Reading:
    """How a split is read: batches of ``batch_size`` (per process) by ``loader``, with
    ``workers`` decoding processes and ``threads`` torch threads; one shard per rank when
    ``distributed``; ``drop_last`` None: the factory's own (two views: drop the last partial
    batch, equal steps; the evaluation view and the probe's crops: every sample)."""

    batch_size: int
    loader: str = "ffcv"
    workers: int = 2
    threads: int | None = None
    distributed: bool = False
    drop_last: bool | None = None

    def dropping(self, default: bool) -> Reading:
        """This reading with drop_last decided (``default`` where it is None)."""
        return self if self.drop_last is not None else replace(self, drop_last=default)


# --- factories -----------------------------------------------------------------------------
def two_view_loader(path, views: Views, reading: Reading):
    """Yields (view1, view2, label, index); each view is its own random resized crop + flip.

    path: the split's ``.beton`` (its report ``.json`` next to it is what the torchvision
    loader reads). views.crop="loader": crops drawn while decoding (fastest); with FFCV they
    are drawn from (seed, view, batch, sample) (pipeline.data.seeded_crop), so every run of a
    config, and every resumed run, sees the same views. crop="device": the loader yields whole
    centre views and the crops are drawn from torch's RNG on the device.
    """
    v, r = views, reading.dropping(True)
    _check_choice(r.loader, v.crop)
    if v.crop == "device":
        from pipeline.data.augment import DeviceCrop

        base = eval_loader(path, Centre(crop_size=v.crop_size, order="random", seed=v.seed), r)
        return TwoViewLoader(base, DeviceCrop(v.crop_size, v.scale_min))
    return TwoViewLoader(_random_views(path, views, r))


def crop_loader(path, views: Views, reading: Reading, indices=None):
    """Yields (image, label, index): one random resized crop + flip of each whole stored image
    (so a crop can reach its corners), drawn while decoding, in a random order; only the
    samples ``indices`` (all if None), each once an epoch (``distributed``: this rank's shard of
    the epoch, padded to equal shards). The augmented probe's view: the references'
    RandomResizedCrop(224) + flip of the full image."""
    r = _every_sample(reading, "crop_loader")
    _check_choice(r.loader, views.crop)
    return _random_views(path, views, r, count=1, indices=indices)


def _every_sample(reading: Reading, what: str) -> Reading:
    if reading.drop_last:
        raise ValueError(f"{what} reads every sample once: not Reading(drop_last=True)")
    return reading.dropping(False)


def _random_views(path, views: Views, reading: Reading, count: int = 2, indices=None):
    """``count`` random resized crops + flips of each image, drawn while decoding, by the
    torchvision loader or by FFCV (two_view_loader's and crop_loader's)."""
    v, r = views, reading
    scale = (v.scale_min, 1.0)
    if r.loader == "torchvision":
        dataset = TwoViewDataset(
            converted_source(path), v.crop_size, scale, v.ratio, v.flip, v.seed, views=count, indices=indices
        )
        return TorchLoader(dataset, r.batch_size, r.workers, v.seed, True, r.distributed, bool(r.drop_last))
    return _ffcv_views(path, v, r, scale, count, indices)


def eval_loader(path, centre: Centre, reading: Reading):
    """Yields (image, label, index): the centre view, in file order (every sample once) unless
    ``centre.order`` is random."""
    c = centre
    _check_choice(reading.loader, "loader")
    if c.order not in ("sequential", "random"):
        raise ValueError(f"order must be 'sequential' or 'random', not {c.order!r}")
    r = _every_sample(reading, "eval_loader in file order") if c.order == "sequential" else reading.dropping(False)
    if r.loader == "torchvision":
        dataset = CentreViewDataset(converted_source(path), c.crop_size, c.ratio)
        return TorchLoader(
            dataset, r.batch_size, r.workers, c.seed, c.order == "random", r.distributed, bool(r.drop_last)
        )
    return _ffcv_eval(path, c, r)


def is_converted(path, loader: str = "ffcv") -> bool:
    """Can ``loader`` read this split? FFCV needs the .beton; torchvision only its report."""
    path = Path(path)
    return (path if loader == "ffcv" else path.with_suffix(".json")).is_file()


def _check_choice(loader: str, crop: str) -> None:
    if loader not in LOADERS:
        raise ValueError(f"data.loader must be one of {LOADERS}, not {loader!r}")
    if crop not in ("loader", "device"):
        raise ValueError(f"crop must be 'loader' or 'device', not {crop!r}")


def batches_from(loader, skip: int = 0, epoch: int | None = None):
    """The batches of an FFCV loader or a TorchLoader from batch ``skip`` on (a resume), of
    epoch ``epoch`` (default: the loader's next); the torch loader does not even decode the
    skipped ones."""
    if epoch is not None:  # the order (and seeded crops) of epoch e are drawn from seed + e
        loader.next_epoch = epoch
    if isinstance(loader, TorchLoader):
        return loader.iter_from(skip)
    return itertools.islice(loader, skip, None)


class TwoViewLoader:
    """Names the positional outputs (FFCV's layout: image, label, index, image2) and lets the
    training loop set the epoch."""

    def __init__(self, loader, device_crop=None):
        self.loader = loader
        self.device_crop = device_crop

    def __len__(self):
        return len(self.loader)

    def set_epoch(self, epoch: int) -> None:
        # The order of epoch e is drawn from seed + e; resuming must continue the sequence.
        self.loader.next_epoch = epoch

    def __iter__(self):
        return self.batches()

    def batches(self, skip: int = 0):
        """Iterate, skipping the first ``skip`` batches without augmenting them (resume)."""
        return map(self._views, batches_from(self.loader, skip))

    def _views(self, batch):
        if self.device_crop is not None:
            image, label, index = batch
            return self.device_crop(image), self.device_crop(image), label, index
        image, label, index, image2 = batch
        return image, image2, label, index


# --- FFCV ----------------------------------------------------------------------------------
def _beton(path) -> str:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"FFCV dataset not found: {path} (run the convert stage first)")
    try:
        from pipeline.data import ffcv_runtime

        ffcv_runtime.load()
    except ImportError as err:
        raise RuntimeError(f"FFCV is not importable ({err}): install it, or set data.loader: torchvision") from None
    return str(path)


def _restore_threads(n: int | None) -> None:
    # Creating a Loader changes torch's thread count; put back what the stage asked for.
    if n:
        torch.set_num_threads(n)


@functools.cache
def _ffcv_loader_class():
    """FFCV's Loader, keeping the stage's torch thread count: its ``__iter__`` sets torch's
    threads to the loader's workers at every epoch (ffcv.pipeline.compiler), so that a job with
    1 torch thread and 2 workers trained on 2 threads from its first epoch on."""
    from ffcv.loader import Loader

    class ThreadKeepingLoader(Loader):
        torch_threads: int | None = None

        def __iter__(self):
            iterator = super().__iter__()
            _restore_threads(self.torch_threads)
            return iterator

    return ThreadKeepingLoader


def _ffcv_loader(*args, threads: int | None, **kwargs):
    loader = _ffcv_loader_class()(*args, **kwargs)
    loader.torch_threads = threads
    _restore_threads(threads)
    return loader


def _int_pipeline():
    from ffcv.fields.basics import IntDecoder
    from ffcv.transforms import Squeeze, ToTensor

    return [IntDecoder(), ToTensor(), Squeeze(1)]


def _ffcv_views(path, v: Views, r: Reading, scale: tuple[float, float], count: int, indices):
    path = _beton(path)
    from ffcv.loader import OrderOption
    from ffcv.pipeline import PipelineSpec
    from ffcv.transforms import ToTensor, ToTorchImage

    from pipeline.data.seeded_crop import SeededRandomResizedCrop

    def view(number):  # crop + flip fused with decoding, drawn from (seed, view, batch, sample)
        return SeededRandomResizedCrop(
            (v.crop_size, v.crop_size), scale, v.ratio, seed=v.seed, view=number, flip=v.flip
        )

    pipelines = {"image": [view(1), ToTensor(), ToTorchImage()], "label": _int_pipeline(), "index": _int_pipeline()}
    if count == 2:
        pipelines["image2"] = PipelineSpec("image", decoder=view(2), transforms=[ToTensor(), ToTorchImage()])
    # RANDOM, not QUASI_RANDOM: the latter raises NotImplementedError with distributed=True.
    return _ffcv_loader(
        path,
        threads=r.threads,
        batch_size=r.batch_size,
        num_workers=r.workers,
        order=OrderOption.RANDOM,
        seed=v.seed,
        distributed=r.distributed,
        drop_last=r.drop_last,
        pipelines=pipelines,
        indices=None if indices is None else np.asarray(indices, dtype=np.int64),
    )


def _ffcv_eval(path, c: Centre, r: Reading):
    path = _beton(path)
    from ffcv.fields.rgb_image import CenterCropRGBImageDecoder
    from ffcv.loader import OrderOption
    from ffcv.transforms import ToTensor, ToTorchImage

    pipelines = {
        "image": [CenterCropRGBImageDecoder((c.crop_size, c.crop_size), ratio=c.ratio), ToTensor(), ToTorchImage()],
        "label": _int_pipeline(),
        "index": _int_pipeline(),
    }
    return _ffcv_loader(
        path,
        threads=r.threads,
        batch_size=r.batch_size,
        num_workers=r.workers,
        order=OrderOption.RANDOM if c.order == "random" else OrderOption.SEQUENTIAL,
        seed=c.seed,
        distributed=r.distributed,
        drop_last=r.drop_last,
        pipelines=pipelines,
    )


# --- torchvision ---------------------------------------------------------------------------
def read_report(path) -> dict:
    """The conversion report of a split: ``x.json`` next to ``x.beton`` (either path works)."""
    report = Path(path).with_suffix(".json")
    if not report.is_file():
        raise FileNotFoundError(f"conversion report not found: {report} (run the convert stage first)")
    return json.loads(report.read_text())


# What a conversion report records about the run that wrote it, not about the data: where
# it wrote, how long it took, with how many processes. Re-converting the same images (another
# results folder, more workers) gives the same data identity.
REPORT_RUN_KEYS = ("beton", "seconds", "source.root", "options.workers", "options.writers")


def data_identity(folder) -> dict:
    """The identity of the converted train split in ``folder`` (what decides a resume): its
    report without REPORT_RUN_KEYS (sample keys' digest, counts, classes, stored resolution,
    write options, bytes) as a short sha256; None entries when there is no report."""
    path = Path(folder) / "train.json"
    if not path.is_file():  # a hand-made .beton
        return {"train.json content": None}
    report = json.loads(path.read_text())
    for key in REPORT_RUN_KEYS:
        *parents, leaf = key.split(".")
        part = report
        for name in parents:
            part = part.get(name, {})
        part.pop(leaf, None)
    text = json.dumps(report, sort_keys=True, separators=(",", ":"))
    return {"train.json content": hashlib.sha256(text.encode()).hexdigest()[:16]}


def converted_source(path):
    """The source a split was converted from, without the files skipped then: the same
    samples, labels and indices as in the ``.beton``."""
    from pipeline.data.sources import open_source

    report = read_report(path)
    src = open_source(**report["source"])
    skipped = {s["path"] for s in report["skipped"]}
    src = src.select([i for i in range(len(src)) if src.key(i) not in skipped])
    expected = report.get("sample_keys_sha1")
    if len(src) != report["num_samples"] or (expected and src.digest() != expected):
        raise RuntimeError(
            f"{report['source']['root']} changed since it was converted ({len(src)} images now, "
            f"{report['num_samples']} then): rerun the convert stage"
        )
    return src


def _as_chw(image: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(image).permute(2, 0, 1)  # a view: the resize kernels like channels-last


def sample_seed(seed: int, epoch: int, index: int) -> int:
    """The seed of one sample's random draws in one epoch: a function of these alone, so that
    the draws are the same in any worker and after a resume mid-epoch."""
    return int(np.random.SeedSequence((seed, epoch, index)).generate_state(1, np.uint64)[0])


class TwoViewDataset(torch.utils.data.Dataset):
    """Decode once, crop twice: (view1, label, index, view2) (FFCV's output layout); views=1:
    (view1, label, index); ``indices``: only these samples (their own indices are returned).

    Its items are keyed (epoch, position) (TorchLoader passes the epoch), and the views' random
    draws are a function of (seed, epoch, index) alone, as FFCV's seeded crops: the same in any
    worker, and after a resume mid-epoch (the workers' RNG streams are not in the resume state)."""

    keyed_by_epoch = True

    def __init__(self, source, crop_size: int, scale, ratio, flip: bool, seed: int = 0, views: int = 2, indices=None):
        v2 = lean_torchvision.transforms_v2()  # not torch._dynamo with it (see there)

        self.source, self.seed, self.views = source, seed, views
        self.indices = None if indices is None else list(indices)
        ops = [v2.RandomResizedCrop((crop_size, crop_size), scale=tuple(scale), ratio=tuple(ratio), antialias=True)]
        self.transform = v2.Compose(ops + ([v2.RandomHorizontalFlip()] if flip else []))

    def __len__(self):
        return len(self.source) if self.indices is None else len(self.indices)

    def __getitem__(self, key: tuple[int, int]):
        epoch, i = key
        i = i if self.indices is None else self.indices[i]
        image = _as_chw(self.source.load(i))
        with torch.random.fork_rng(devices=[]):  # the process's own stream is left as it was
            torch.manual_seed(sample_seed(self.seed, epoch, i))
            first = (self.transform(image), self.source.labels[i], i)
            return first if self.views == 1 else (*first, self.transform(image))


class CentreViewDataset(torch.utils.data.Dataset):
    """(image, label, index): the square centre crop FFCV's CenterCropRGBImageDecoder takes."""

    def __init__(self, source, crop_size: int, crop_ratio: float = 1.0):
        self.source, self.crop_size, self.crop_ratio = source, crop_size, crop_ratio

    def __len__(self):
        return len(self.source)

    def __getitem__(self, i):
        F = lean_torchvision.transforms_v2().functional

        image = _as_chw(self.source.load(i))
        h, w = image.shape[1:]
        side = int(self.crop_ratio * min(h, w))
        image = F.resized_crop(
            image, (h - side) // 2, (w - side) // 2, side, side, [self.crop_size, self.crop_size], antialias=True
        )
        return image.contiguous(), self.source.labels[i], i


def epoch_order(n: int, epoch: int, seed: int, shuffle: bool, sampler=None) -> np.ndarray:
    """The sample order FFCV uses in an epoch: a DistributedSampler's shard when distributed,
    else a permutation drawn from seed + epoch (RANDOM) or file order (SEQUENTIAL)."""
    if sampler is not None:
        sampler.set_epoch(epoch)
        return np.fromiter(iter(sampler), dtype=np.int64)
    return np.random.default_rng(seed + epoch).permutation(n) if shuffle else np.arange(n)


class _ListSampler(torch.utils.data.Sampler):
    """The indices of the epoch being iterated (set just before each epoch)."""

    def __init__(self):
        self.indices: list = []  # sample indices, or (epoch, index) keys

    def __iter__(self):
        return iter(self.indices)


class TorchLoader:
    """A torch DataLoader over a map-style dataset with FFCV's interface and orders.

    ``next_epoch`` is the epoch the next iteration draws its order from (then incremented),
    as in FFCV's Loader. Workers persist across epochs (no start-up cost per epoch)."""

    def __init__(
        self,
        dataset,
        batch_size: int,
        workers: int,
        seed: int,
        shuffle: bool,
        distributed: bool = False,
        drop_last: bool = True,
    ):
        from torch.utils.data import DataLoader, DistributedSampler

        self.dataset, self.batch_size, self.seed, self.shuffle = dataset, batch_size, seed, shuffle
        self.drop_last, self.next_epoch = drop_last, 0
        # Sharding like FFCV's (which uses a DistributedSampler with drop_last=False inside).
        self.shard: DistributedSampler | None = (
            # a sampler only needs len(): the indices of a range stand for the dataset
            DistributedSampler(range(len(dataset)), shuffle=shuffle, seed=seed, drop_last=False)  # type: ignore[arg-type]
            if distributed
            else None
        )
        self.sampler = _ListSampler()
        self.loader = DataLoader(
            dataset,
            batch_size=batch_size,
            sampler=self.sampler,
            num_workers=workers,
            drop_last=drop_last,
            persistent_workers=workers > 0,
        )
        n = len(self.shard) if self.shard is not None else len(dataset)
        self._len = n // batch_size if drop_last else math.ceil(n / batch_size)

    def __len__(self):
        return self._len

    def __iter__(self):
        return self.iter_from(0)

    def iter_from(self, skip: int = 0):
        epoch = self.next_epoch
        order = epoch_order(len(self.dataset), epoch, self.seed, self.shuffle, self.shard)
        self.next_epoch += 1
        chosen = order[skip * self.batch_size : self._len * self.batch_size].tolist()
        keyed = getattr(self.dataset, "keyed_by_epoch", False)  # random views: see TwoViewDataset
        self.sampler.indices = [(epoch, i) for i in chosen] if keyed else chosen
        return iter(self.loader)
