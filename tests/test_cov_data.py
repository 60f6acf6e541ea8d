"""Coverage of the data layer: the numba bodies of the seeded crop run interpreted (they never
run under the coverage tracer when jitted) and must give the jitted crops bit for bit; the
error paths of the loaders, sources and conversion name what is wrong."""

import contextlib

import numpy as np
import pytest
import torch

from pipeline import seeded_crop
from pipeline.data import two_view_loader

JITTED = ("splitmix64", "uniform", "batch_key", "crop_and_flip", "flip_columns")


@contextlib.contextmanager
def interpreted():
    """The seeded crop and FFCV's pipeline as plain Python: the numba functions' own bodies
    (``py_func``, calling each other through the module) and FFCV's Compiler switched off."""
    from ffcv.pipeline.compiler import Compiler

    with pytest.MonkeyPatch.context() as mp, np.errstate(over="ignore"):  # uint64 wraps by design
        for name in JITTED:
            mp.setattr(seeded_crop, name, getattr(seeded_crop, name).py_func)
        mp.setattr(Compiler, "is_enabled", False)
        yield


def views_of_epoch(beton, epoch=1):
    loader = two_view_loader(beton, batch_size=8, crop_size=16, scale_min=0.2, workers=1, seed=5)
    loader.set_epoch(epoch)
    return [torch.cat([v1, v2]).clone() for v1, v2, _, _ in loader]


@pytest.fixture(scope="module")
def jpg_beton(synthetic_small, tmp_path_factory):
    """A split stored as JPEG: the decoder's decoding branch."""
    from pipeline.convert import run as convert

    out = tmp_path_factory.mktemp("jpg") / "train.beton"
    convert(synthetic_small / "cls" / "train", out, {"max_resolution": 32, "write_mode": "jpg", "workers": 1})
    return out


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # FFCV's decoding thread
@pytest.mark.parametrize("stored", ["raw", "jpg"])
def test_interpreted_seeded_crop_equals_the_jitted_one(stored, ffcv_small, jpg_beton):
    beton = ffcv_small / "train.beton" if stored == "raw" else jpg_beton
    jitted = views_of_epoch(beton)
    with interpreted():
        python = views_of_epoch(beton)
    assert len(python) == len(jitted) > 0
    assert all(torch.equal(a, b) for a, b in zip(python, jitted))


def test_splitmix64_is_the_reference_generator():
    """SplitMix64 (Steele, Lea, Flood 2014) seeded with 0: its first two outputs are
    0xE220A8397B1DCDAF and 0x6E789E6AA1B965F4 (the state advances by the golden gamma)."""
    with interpreted():
        first = seeded_crop.splitmix64(np.uint64(0))
        second = seeded_crop.splitmix64(seeded_crop.GOLDEN)
    assert (first, second) == (np.uint64(0xE220A8397B1DCDAF), np.uint64(0x6E789E6AA1B965F4))
    assert seeded_crop.splitmix64(np.uint64(0)) == first  # the jitted one


@pytest.mark.parametrize(
    "height, width, scale, expected",
    [
        (1, 1000, (0.08, 1.0), (0, 499, 1, 1)),  # wider than 4/3: the central 4/3 crop, rounded to 1 x 1
        (1000, 1, (0.08, 1.0), (499, 0, 1, 1)),  # taller than 3/4: likewise
        (10, 10, (2.0, 3.0), (0, 0, 10, 10)),  # no draw fits (area > the image): the whole image
    ],
)
def test_crop_falls_back_to_the_central_crop_when_no_draw_fits(height, width, scale, expected):
    args = (np.uint32(height), np.uint32(width), np.array(scale), np.array([3 / 4, 4 / 3]), np.uint64(7))
    with interpreted():
        python = seeded_crop.crop_and_flip(*args)
    assert python[:4] == expected
    assert python == seeded_crop.crop_and_flip(*args)


def test_flip_columns_mirrors_left_right():
    image = np.arange(2 * 5 * 3, dtype=np.uint8).reshape(2, 5, 3)
    python, jitted = image.copy(), image.copy()
    with interpreted():
        seeded_crop.flip_columns(python)
    seeded_crop.flip_columns(jitted)
    assert np.array_equal(python, image[:, ::-1]) and np.array_equal(jitted, python)


def test_crop_generator_hook_is_the_seeded_crop():
    """FFCV's abstract hook of crop decoders answers the crop this decoder draws with."""
    decoder = seeded_crop.SeededRandomResizedCrop((8, 8))
    assert decoder.get_crop_generator is seeded_crop.crop_and_flip
