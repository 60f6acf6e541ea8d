"""A seeded random resized crop + flip for FFCV, fused with decoding like FFCV's own.

FFCV 1.0.2 draws its crops and flips from numba's per-thread global RNG inside a parallel loop:
nothing seeds it, and which thread decodes which image varies, so two runs of the same config
see different views. Here every random number is a pure function of

    (seed, view, the batch's sample indices, the sample's index)

through a counter-based hash (SplitMix64), so no state is shared between threads. The batch's
indices come from FFCV's order, itself drawn from (seed, epoch): each epoch gets new crops, the
same config gets the same crops on every run, and a run resumed mid-epoch (which replays the
order and skips the batches it has done) gets the crops the uninterrupted run got.

The crop follows torchvision's RandomResizedCrop: up to 10 draws of (area fraction in
``scale``, log-uniform aspect ratio in ``ratio``), then the central crop clamped to ``ratio``.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from pipeline.data import ffcv_runtime

ffcv_runtime.load()  # before any other ffcv import: see pipeline.data.ffcv_runtime
from ffcv.fields.rgb_image import IMAGE_MODES, ResizedCropRGBImageDecoder  # noqa: E402
from ffcv.pipeline.compiler import Compiler  # noqa: E402

from pipeline.data.ffcv_calls import imdecode, resize_crop  # noqa: E402  # cacheable (see there)

GOLDEN = np.uint64(0x9E3779B97F4A7C15)
MIX1, MIX2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
TO_UNIT = 1.0 / float(1 << 53)  # a 53-bit integer -> [0, 1)


@njit(cache=True)
def splitmix64(x):
    z = x + GOLDEN
    z = (z ^ (z >> np.uint64(30))) * MIX1
    z = (z ^ (z >> np.uint64(27))) * MIX2
    return z ^ (z >> np.uint64(31))


@njit(cache=True)
def uniform(key, counter, low, high):
    """The counter-th uniform number in [low, high) of the stream ``key``."""
    bits = splitmix64(key ^ (np.uint64(counter) * GOLDEN)) >> np.uint64(11)
    return low + (high - low) * (float(bits) * TO_UNIT)


@njit(cache=True)
def batch_key(key, indices):
    """One key per (stream, batch): the batch's sample indices in order, hashed."""
    h = key
    for ix in indices:
        h = splitmix64(h ^ np.uint64(ix))
    return h


@njit(cache=True)
def crop_and_flip(height, width, scale, ratio, key):
    """(row, col, h, w, flip) of one sample, from its own stream ``key``."""
    area = float(height) * float(width)
    log_lo, log_hi = np.log(ratio[0]), np.log(ratio[1])
    flip = uniform(key, 0, 0.0, 1.0) < 0.5
    for attempt in range(10):
        target = area * uniform(key, 4 * attempt + 1, scale[0], scale[1])
        aspect = np.exp(uniform(key, 4 * attempt + 2, log_lo, log_hi))
        w = int(round(np.sqrt(target * aspect)))
        h = int(round(np.sqrt(target / aspect)))
        if 0 < w <= width and 0 < h <= height:
            i = int(uniform(key, 4 * attempt + 3, 0.0, float(height - h + 1)))
            j = int(uniform(key, 4 * attempt + 4, 0.0, float(width - w + 1)))
            return i, j, h, w, flip
    height, width = int(height), int(width)
    in_ratio = float(width) / float(height)  # fallback: the central crop within the ratio range
    if in_ratio < ratio[0]:
        w, h = width, int(round(width / ratio[0]))
    elif in_ratio > ratio[1]:
        w, h = int(round(height * ratio[1])), height
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w, flip


@njit(cache=True)
def flip_columns(image):
    """Mirror an H x W x C image left-right, in place."""
    width = image.shape[1]
    for row in range(image.shape[0]):
        for col in range(width // 2):
            for ch in range(image.shape[2]):
                left = image[row, col, ch]
                image[row, col, ch] = image[row, width - 1 - col, ch]
                image[row, width - 1 - col, ch] = left


class SeededRandomResizedCrop(ResizedCropRGBImageDecoder):
    """Decoder of an RGBImageField: random resized crop to ``output_size`` and, if ``flip``,
    a horizontal flip with probability 0.5, both drawn from (seed, view, batch, sample).
    Give each view of a two-view pipeline its own ``view``."""

    def __init__(
        self, output_size, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3), seed: int = 0, view: int = 0, flip: bool = True
    ):
        super().__init__(output_size)
        self.scale, self.ratio, self.flip = np.array(scale, dtype=np.float64), np.array(ratio, dtype=np.float64), flip
        self.key = np.uint64(splitmix64(np.uint64(seed % 2**63) ^ splitmix64(np.uint64(view))))

    @property
    def get_crop_generator(self):  # the abstract hook of FFCV's crop decoders; unused here
        return crop_and_flip

    def generate_code(self):
        jpg = IMAGE_MODES["jpg"]
        mem_read, my_range = self.memory_read, Compiler.get_iterator()
        imdecode_c, resize_crop_c = Compiler.compile(imdecode), Compiler.compile(resize_crop)
        batch_key_c, crop_c, mix_c, flip_c = batch_key, crop_and_flip, splitmix64, flip_columns  # jitted
        scale, ratio, key, do_flip = self.scale, self.ratio, self.key, self.flip

        def decode(batch_indices, my_storage, metadata, storage_state):
            destination, temp_storage = my_storage
            this_batch = batch_key_c(key, batch_indices)
            for dst_ix in my_range(len(batch_indices)):
                source_ix = batch_indices[dst_ix]
                field = metadata[source_ix]
                image_data = mem_read(field["data_ptr"], storage_state)
                height, width = np.uint32(field["height"]), np.uint32(field["width"])
                if field["mode"] == jpg:
                    temp_buffer = temp_storage[dst_ix]
                    imdecode_c(image_data, temp_buffer, height, width, height, width, 0, 0, 1, 1, False, False)
                    temp_buffer = temp_buffer.reshape(-1)[: 3 * height * width].reshape(height, width, 3)
                else:
                    temp_buffer = image_data.reshape(height, width, 3)
                sample = mix_c(this_batch ^ np.uint64(source_ix))
                i, j, h, w, flip = crop_c(height, width, scale, ratio, sample)
                resize_crop_c(temp_buffer, i, i + h, j, j + w, destination[dst_ix])
                if do_flip and flip:
                    flip_c(destination[dst_ix])
            return destination[: len(batch_indices)]

        decode.is_parallel = True  # type: ignore[attr-defined]  # FFCV's flag for its compiler
        return decode
