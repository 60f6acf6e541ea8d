"""Seeded FFCV crops: the same config sees the same views on every run, on any number of
decoding threads, and after a resume; new views every epoch; torchvision's crop statistics."""

import contextlib
import json
import math

import numpy as np
import pytest
import torch

from pipeline.data import seeded_crop
from pipeline.data.loaders import Reading, Views, two_view_loader
from pipeline.data.seeded_crop import crop_and_flip, splitmix64

JITTED = ("splitmix64", "uniform", "batch_key", "crop_and_flip", "flip_columns")


def epochs_of_views(beton, seed: int, workers: int, epochs=(0, 1), skip: int = 0):
    loader = two_view_loader(
        beton, Views(crop_size=24, scale_min=0.2, seed=seed), Reading(batch_size=16, workers=workers)
    )
    out = {}
    for epoch in epochs:
        loader.set_epoch(epoch)
        out[epoch] = [(v1.clone(), v2.clone(), i.clone()) for v1, v2, _, i in loader.batches(skip)]
    return out


def by_sample(batches):
    """Views of an epoch in sample order (index -> view 1)."""
    views, index = torch.cat([b[0] for b in batches]), torch.cat([b[2] for b in batches])
    return views[index.argsort()]


@pytest.mark.integration
def test_same_seed_same_views_on_any_thread_count(ffcv_small):
    a = epochs_of_views(ffcv_small / "train.beton", seed=3, workers=2)
    b = epochs_of_views(ffcv_small / "train.beton", seed=3, workers=1)
    for epoch in a:
        for (a1, a2, ai), (b1, b2, bi) in zip(a[epoch], b[epoch]):
            assert torch.equal(ai, bi) and torch.equal(a1, b1) and torch.equal(a2, b2)
        assert all(not torch.equal(v1, v2) for v1, v2, _ in a[epoch])  # the two views differ


@pytest.mark.integration
def test_new_views_every_epoch_and_seed(ffcv_small):
    a = epochs_of_views(ffcv_small / "train.beton", seed=3, workers=2)
    other_seed = epochs_of_views(ffcv_small / "train.beton", seed=4, workers=2, epochs=(0,))
    e0, e1 = by_sample(a[0]), by_sample(a[1])
    assert (e0 != e1).flatten(1).any(1).float().mean() > 0.9  # a sample's crop changes with the epoch
    assert (e0 != by_sample(other_seed[0])).flatten(1).any(1).float().mean() > 0.9


@pytest.mark.integration
def test_resumed_epoch_sees_the_same_views(ffcv_small):
    """Resuming replays the epoch's order and skips the batches done: the rest are the same crops."""
    full = epochs_of_views(ffcv_small / "train.beton", seed=3, workers=2, epochs=(1,))
    resumed = epochs_of_views(ffcv_small / "train.beton", seed=3, workers=2, epochs=(1,), skip=2)
    assert len(resumed[1]) == len(full[1]) - 2
    for (a1, a2, ai), (b1, b2, bi) in zip(full[1][2:], resumed[1]):
        assert torch.equal(ai, bi) and torch.equal(a1, b1) and torch.equal(a2, b2)


def test_crops_follow_random_resized_crop():
    """Over many samples: area fraction in scale, aspect ratio in ratio (log-uniform, so its log
    is centred on a square image), inside the image, flips at rate 1/2."""
    scale, ratio = np.array([0.2, 1.0]), np.array([3 / 4, 4 / 3])
    height, width, n = 64, 64, 4000
    areas, logs, flips = [], [], 0
    for s in range(n):
        i, j, h, w, flip = crop_and_flip(
            np.uint32(height), np.uint32(width), scale, ratio, np.uint64(splitmix64(np.uint64(s)))
        )
        assert 0 <= i and i + h <= height and 0 <= j and j + w <= width and h > 0 and w > 0
        areas.append(h * w / (height * width))
        logs.append(math.log(w / h))
        flips += bool(flip)
    areas, logs = np.array(areas), np.array(logs)
    assert areas.min() >= 0.19 and areas.max() <= 1.0
    assert abs(logs.mean()) < 0.03 and logs.min() >= math.log(3 / 4) - 0.05 and logs.max() <= math.log(4 / 3) + 0.05
    assert flips / n == pytest.approx(0.5, abs=0.03)
    # the same distribution as torchvision's RandomResizedCrop (rejected draws included)
    from torchvision.transforms import RandomResizedCrop

    torch.manual_seed(0)
    image = torch.zeros(3, height, width)
    ref = [RandomResizedCrop.get_params(image, [0.2, 1.0], [3 / 4, 4 / 3]) for _ in range(n)]
    ref_areas = np.array([h * w / (height * width) for _, _, h, w in ref])
    assert areas.mean() == pytest.approx(ref_areas.mean(), abs=0.02)
    assert np.quantile(areas, 0.1) == pytest.approx(np.quantile(ref_areas, 0.1), abs=0.03)
    for s in range(200):  # a wide image: every crop inside it
        i, j, h, w, _ = crop_and_flip(np.uint32(20), np.uint32(90), scale, ratio, np.uint64(splitmix64(np.uint64(s))))
        assert 0 <= i and i + h <= 20 and 0 <= j and j + w <= 90 and h > 0 and w > 0


@pytest.mark.integration
def test_crop_benchmark_smoke(tmp_path, monkeypatch):
    """bench crops times FFCV's own crops, the seeded decoder and device crops side by side."""
    from pipeline import bench

    crops = bench.load("crops")
    monkeypatch.chdir(tmp_path)  # bench/out/ of this run lands here
    real, measured = crops.measure, {}
    rates = {"ffcv_unseeded": 100.0, "ffcv_seeded": 80.0, "device_crop": 50.0}  # samples/s, set by the test

    def measure(loaders, rounds, seconds):  # the loaders run; their rates are replaced
        measured.update(real(loaders, rounds, seconds))
        return {name: {**r, "samples_per_s": rates[name]} for name, r in measured.items()}

    monkeypatch.setattr(crops, "measure", measure)
    result = crops.main(
        [
            "--images",
            "40",
            "--size",
            "32",
            "--batch",
            "8",
            "--rounds",
            "1",
            "--seconds",
            "0",
            "--cache",
            str(tmp_path / "cache"),
        ]
    )
    assert set(measured) == set(rates) and all(r["samples_per_s"] > 0 for r in measured.values())
    # 40 images at 100, 80 and 50 samples/s: epochs of 0.4, 0.5 and 0.8 s, over the unseeded 0.4 s
    assert result["epoch_s"] == {"ffcv_unseeded": 0.4, "ffcv_seeded": 0.5, "device_crop": 0.8}
    assert result["epoch_time_vs_unseeded"] == {"ffcv_seeded": 1.25, "device_crop": 2.0}
    assert result["ratio"] == 1.25  # the headline: seeded over unseeded
    saved = json.loads((tmp_path / "bench" / "out" / "crops.json").read_text())
    assert saved["ratio"] == 1.25 and "avx512" in saved["machine"]["cpu"]


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
    loader = two_view_loader(beton, Views(crop_size=16, scale_min=0.2, seed=5), Reading(batch_size=8, workers=1))
    loader.set_epoch(epoch)
    return [torch.cat([v1, v2]).clone() for v1, v2, _, _ in loader]


@pytest.fixture(scope="module")
def jpg_beton(synthetic_small, tmp_path_factory):
    """A split stored as JPEG: the decoder's decoding branch."""
    from pipeline.convert import run as convert
    from pipeline.dag.sections import Convert

    out = tmp_path_factory.mktemp("jpg") / "train.beton"
    convert(synthetic_small / "cls" / "train", out, Convert(max_resolution=32, write_mode="jpg", workers=1))
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
