"""FFCV loaders: two augmented views for pretraining, one centre view for evaluation.

Batches are uint8 NCHW tensors (views into FFCV's reused buffers: clone what you keep);
photometric augmentation and normalisation happen on the training device (pipeline.augment).
Normalisation is not an FFCV transform: on CPU that pipeline hangs (FFCV issue #396).
"""
from __future__ import annotations

from pathlib import Path

import torch


def _check(path: str | Path) -> str:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"FFCV dataset not found: {path} (run the convert stage first)")
    return str(path)


def _restore_threads(n: int | None) -> None:
    # Creating a Loader changes torch's thread count; put back what the stage asked for.
    if n:
        torch.set_num_threads(n)


def two_view_loader(path, batch_size: int, crop_size: int, scale_min: float = 0.2,
                    workers: int = 2, seed: int = 0, distributed: bool = False,
                    threads: int | None = None, drop_last: bool = True, crop: str = "loader"):
    """Yields (view1, view2, label, index); each view is its own random resized crop + flip.

    crop="loader": FFCV crops while decoding (fastest; its randomness is not seedable).
    crop="device": FFCV decodes whole images, the crops are drawn from torch's RNG: with a
    fixed seed every run, and every resumed run, sees exactly the same views.
    """
    if crop == "device":
        from pipeline.augment import DeviceCrop

        loader = eval_loader(path, batch_size, crop_size, workers, threads=threads, distributed=distributed,
                             order="random", seed=seed, drop_last=drop_last)
        return TwoViewLoader(loader, DeviceCrop(crop_size, scale_min))
    if crop != "loader":
        raise ValueError(f"crop must be 'loader' or 'device', not {crop!r}")
    from ffcv.fields.basics import IntDecoder
    from ffcv.fields.rgb_image import RandomResizedCropRGBImageDecoder
    from ffcv.loader import Loader, OrderOption
    from ffcv.pipeline import PipelineSpec
    from ffcv.transforms import RandomHorizontalFlip, Squeeze, ToTensor, ToTorchImage

    def view():
        return [RandomResizedCropRGBImageDecoder((crop_size, crop_size), scale=(scale_min, 1.0)),
                RandomHorizontalFlip(), ToTensor(), ToTorchImage()]

    pipelines = {
        "image": view(),
        "label": [IntDecoder(), ToTensor(), Squeeze(1)],
        "index": [IntDecoder(), ToTensor(), Squeeze(1)],
        "image2": PipelineSpec("image", decoder=view()[0], transforms=view()[1:]),
    }
    loader = Loader(_check(path), batch_size=batch_size, num_workers=workers, order=OrderOption.RANDOM,
                    seed=seed, distributed=distributed, drop_last=drop_last, pipelines=pipelines)
    _restore_threads(threads)
    return TwoViewLoader(loader)


class TwoViewLoader:
    """Names FFCV's positional outputs and lets the training loop set the epoch."""

    def __init__(self, loader, device_crop=None):
        self.loader = loader
        self.device_crop = device_crop

    def __len__(self):
        return len(self.loader)

    def set_epoch(self, epoch: int) -> None:
        # FFCV draws the order of epoch e from seed + e; resuming must continue the sequence.
        self.loader.next_epoch = epoch

    def __iter__(self):
        return self.batches()

    def batches(self, skip: int = 0):
        """Iterate, skipping the first ``skip`` batches without augmenting them (resume)."""
        for i, batch in enumerate(self.loader):
            if i >= skip:
                yield self._views(batch)

    def _views(self, batch):
        if self.device_crop is not None:
            image, label, index = batch
            return self.device_crop(image), self.device_crop(image), label, index
        image, label, index, image2 = batch
        return image, image2, label, index


def eval_loader(path, batch_size: int, crop_size: int, workers: int = 2, crop_ratio: float = 1.0,
                threads: int | None = None, distributed: bool = False, order: str = "sequential",
                seed: int = 0, drop_last: bool = False):
    """Yields (image, label, index): the centre crop, in file order (every sample once) unless
    order="random"."""
    from ffcv.fields.basics import IntDecoder
    from ffcv.fields.rgb_image import CenterCropRGBImageDecoder
    from ffcv.loader import Loader, OrderOption
    from ffcv.transforms import Squeeze, ToTensor, ToTorchImage

    pipelines = {
        "image": [CenterCropRGBImageDecoder((crop_size, crop_size), ratio=crop_ratio), ToTensor(), ToTorchImage()],
        "label": [IntDecoder(), ToTensor(), Squeeze(1)],
        "index": [IntDecoder(), ToTensor(), Squeeze(1)],
    }
    loader = Loader(_check(path), batch_size=batch_size, num_workers=workers,
                    order=OrderOption.RANDOM if order == "random" else OrderOption.SEQUENTIAL, seed=seed,
                    distributed=distributed, drop_last=drop_last, pipelines=pipelines)
    _restore_threads(threads)
    return loader
