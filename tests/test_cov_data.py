"""Coverage of the data layer: the numba bodies of the seeded crop run interpreted (they never
run under the coverage tracer when jitted) and must give the jitted crops bit for bit; the
error paths of the loaders, sources and conversion name what is wrong."""

import contextlib

import numpy as np
import pytest
import torch

from pipeline.data import seeded_crop
from pipeline.data.loaders import Reading, Views, two_view_loader

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


# --- loaders: bad choices name the value ------------------------------------------------------
def test_bad_order_and_crop_are_named(ffcv_small):
    from pipeline.data.loaders import Centre, eval_loader

    beton = ffcv_small / "val.beton"
    with pytest.raises(ValueError, match="order must be 'sequential' or 'random', not 'shuffled'"):
        eval_loader(beton, Centre(crop_size=16, order="shuffled"), Reading(batch_size=4))
    with pytest.raises(ValueError, match="crop must be 'loader' or 'device', not 'gpu'"):
        two_view_loader(beton, Views(crop_size=16, crop="gpu"), Reading(batch_size=4))
    with pytest.raises(ValueError, match="eval_loader in file order reads every sample once"):
        eval_loader(beton, Centre(crop_size=16), Reading(batch_size=4, drop_last=True))


def test_missing_ffcv_says_how_to_do_without(ffcv_small, monkeypatch):
    from pipeline.data import ffcv_runtime
    from pipeline.data import loaders as data

    def no_ffcv():
        raise ImportError("No module named 'ffcv'")

    monkeypatch.setattr(ffcv_runtime, "load", no_ffcv)
    with pytest.raises(
        RuntimeError, match=r"FFCV is not importable \(No module named 'ffcv'\).*data.loader: torchvision"
    ):
        data._beton(ffcv_small / "val.beton")


# --- the platform corners of the small helpers ------------------------------------------------
def test_cpus_without_affinity_counts_the_machine(monkeypatch):
    """Off Linux (no sched_getaffinity): os.cpu_count(), or 1 where even that is unknown."""
    from pipeline.runtime import cpus

    monkeypatch.delattr(cpus.os, "sched_getaffinity")
    monkeypatch.setattr(cpus.os, "cpu_count", lambda: 3)
    assert cpus.available() == 3
    monkeypatch.setattr(cpus.os, "cpu_count", lambda: None)
    assert cpus.available() == 1


def test_process_age_is_zero_without_a_boot_clock(monkeypatch):
    from pipeline.runtime import stopwatch

    assert stopwatch.process_age() > 0  # Linux: this process started before this line
    monkeypatch.delattr(stopwatch.time, "CLOCK_BOOTTIME")  # as on macOS
    assert stopwatch.process_age() == 0.0


def test_stopwatch_report_by_hand(monkeypatch):
    """A clock the test moves: the process started 2 s before the Stopwatch; setup (marked),
    two spells of steps, a kNN pass, a second mark, then 1 s that no phase claimed."""
    from types import SimpleNamespace

    from pipeline.runtime import stopwatch

    now = [100.0]
    monkeypatch.setattr(stopwatch, "time", SimpleNamespace(perf_counter=lambda: now[0]))
    monkeypatch.setattr(stopwatch, "process_age", lambda: 2.0)
    watch = stopwatch.Stopwatch()  # the process started at 98
    now[0] = 101.0
    watch.mark("setup")  # 98 -> 101: 3 s
    for start, end, name in ((101.0, 105.0, "steps"), (106.0, 107.0, "steps"), (107.0, 108.5, "knn")):
        now[0] = start
        with watch.phase(name):
            now[0] = end
    now[0] = 109.0
    watch.mark("teardown")  # unclaimed so far: 105 -> 106 and 108.5 -> 109
    now[0] = 110.0
    # wall 110 - 98 = 12; other: 12 - (3 + 5 + 1.5 + 1.5)
    expected = {"setup": 3.0, "steps": 5.0, "knn": 1.5, "teardown": 1.5, "other": 1.0, "wall": 12.0}
    assert watch.report() == expected


def test_install_outside_the_main_thread_is_a_no_op():
    """signal.signal raises ValueError off the main thread: install leaves the handlers as they were."""
    import signal
    import threading

    from pipeline.runtime import preempt

    before = {sig: signal.getsignal(sig) for sig in preempt.SIGNALS}
    thread = threading.Thread(target=preempt.install)
    thread.start()
    thread.join()
    assert {sig: signal.getsignal(sig) for sig in preempt.SIGNALS} == before


def test_versions_of_a_missing_library_is_none(monkeypatch):
    from importlib import metadata

    from pipeline.runtime import provenance

    monkeypatch.setattr(provenance, "LIBRARIES", ("numpy", "no-such-distribution-here"))
    assert provenance.versions() == {"numpy": metadata.version("numpy"), "no-such-distribution-here": None}


# --- the synthetic dataset's fallbacks ---------------------------------------------------------
class ConstantRng:
    """Draws the grey (value, value, value) for ever."""

    def __init__(self, value):
        self.value = value

    def integers(self, low, high, size):
        return np.full(size, self.value)


@pytest.mark.parametrize("background, grey, expected", [(0, 10, 255), (250, 240, 0)])
def test_no_contrasting_draw_falls_back_to_white_or_black(background, grey, expected):
    """Grey g has luma g / 255: every draw is within 0.25 of the background's, so after 100
    draws the colour is white on a dark background (luma < 0.5) and black on a light one."""
    from pipeline.synthetic import _contrasting_colour

    assert _contrasting_colour(ConstantRng(grey), (background,) * 3) == (expected,) * 3


def test_unknown_shape_is_named():
    from PIL import Image, ImageDraw

    from pipeline.synthetic import _draw_shape

    with pytest.raises(ValueError, match="unknown shape hexagon"):
        _draw_shape(ImageDraw.Draw(Image.new("RGB", (8, 8))), "hexagon", 4, 4, 2, 0.0, (255, 0, 0))


def test_a_shape_that_finds_no_room_is_left_out(monkeypatch):
    """Every placement overlaps (all centres at distance 0): after 30 tries each further shape
    is dropped and the scene keeps the first one."""
    import math
    import types

    from pipeline import synthetic

    crowded = types.SimpleNamespace(**{**vars(math), "hypot": lambda *xy: 0.0})
    monkeypatch.setattr(synthetic, "math", crowded)
    for index in range(3):
        _, boxes, _ = synthetic.detection_scene(0, "train", index, 48)
        assert len(boxes) == 1


def test_bad_synthetic_config_names_the_key(tmp_path):
    from pipeline.synthetic import main

    with pytest.raises(SystemExit, match=r"\[synthetic\] error: .*shapes_per_image"):
        main(["--out", str(tmp_path), "--config", '{"shapes_per_image": 3}'])
    assert not any(tmp_path.iterdir())
