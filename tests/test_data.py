"""Loaders: FFCV and torchvision agree (samples, labels, order); the two views differ; without
geometric augmentation both views equal the evaluation view; the photometric recipes are the
papers'; the benchmark runs. Creating an FFCV Loader costs a numba compilation (seconds), so
the tests share loaders where they can."""

import json
import subprocess
import sys

import pytest
import torch
from conftest import REPO
from test_convert import make_cifar, make_imagefolder, make_stl10

from pipeline.convert import run as convert
from pipeline.dag.sections import Convert
from pipeline.data import augment
from pipeline.data.loaders import LOADERS, Centre, Reading, Views, converted_source, eval_loader, two_view_loader


@pytest.fixture(scope="module")
def eval_views(ffcv_small):
    """index -> (image, label) of the centre view at 32 px (the stored size), per loader."""
    out = {}
    for kind in LOADERS:
        views = {}
        for x, y, i in eval_loader(
            ffcv_small / "train.beton", Centre(crop_size=32), Reading(batch_size=16, workers=1, loader=kind)
        ):
            views.update({int(k): (img.clone(), int(lab)) for k, img, lab in zip(i, x, y)})
        out[kind] = views
    return out


def test_eval_views_agree_exactly(eval_views):
    ffcv, tv = eval_views["ffcv"], eval_views["torchvision"]
    assert sorted(ffcv) == sorted(tv) == list(range(80))
    for k in ffcv:
        assert torch.equal(ffcv[k][0], tv[k][0]) and ffcv[k][1] == tv[k][1]


def test_same_samples_same_order(ffcv_small):
    beton = ffcv_small / "train.beton"
    loaders = {
        kind: two_view_loader(beton, Views(crop_size=24, seed=3), Reading(batch_size=16, workers=1, loader=kind))
        for kind in LOADERS
    }
    assert len(loaders["ffcv"]) == len(loaders["torchvision"]) == 80 // 16
    orders = {}
    for epoch in (0, 1, 1):
        seen = {}
        for kind, loader in loaders.items():
            loader.set_epoch(epoch)
            batches = []
            for v1, v2, y, i in loader.batches():
                assert v1.dtype == v2.dtype == torch.uint8 and v1.shape == v2.shape == (16, 3, 24, 24)
                assert not torch.equal(v1, v2)  # independent random crops
                batches.append((y.tolist(), i.tolist()))
            seen[kind] = batches
        assert seen["ffcv"] == seen["torchvision"]
        assert sorted(sum((i for _, i in seen["ffcv"]), [])) == list(range(80))
        orders.setdefault(epoch, seen["ffcv"])
        assert orders[epoch] == seen["ffcv"]  # set_epoch replays an epoch's order
    assert orders[0] != orders[1]
    for loader in loaders.values():  # resume: skipping batches continues the same epoch
        loader.set_epoch(1)
        assert [i.tolist() for *_, i in loader.batches(skip=2)] == [i for _, i in orders[1][2:]]


@pytest.mark.parametrize("kind", LOADERS)
def test_no_augmentation_gives_the_eval_view(ffcv_small, eval_views, kind):
    loader = two_view_loader(
        ffcv_small / "train.beton",
        Views(crop_size=32, scale_min=1.0, ratio=(1, 1), flip=False, seed=3),
        Reading(batch_size=16, workers=1, drop_last=False, loader=kind),
    )
    none = augment.recipe("none", 32)
    count = 0
    for v1, v2, _y, i in loader:
        ref = torch.stack([eval_views[kind][int(k)][0] for k in i])
        assert torch.equal(v1, ref) and torch.equal(v2, ref)
        assert torch.equal(none(v1), augment.normalize(ref))
        count += len(i)
    assert count == 80


def test_torchvision_device_crop(ffcv_small):
    """crop="device": whole centre views from the loader, crops drawn from torch's RNG."""
    loader = two_view_loader(
        ffcv_small / "train.beton",
        Views(crop_size=24, seed=1, crop="device"),
        Reading(batch_size=16, workers=0, loader="torchvision"),
    )
    torch.manual_seed(0)
    v1, v2, y, i = next(iter(loader))
    assert v1.shape == v2.shape == (16, 3, 24, 24) and v1.dtype == torch.uint8 and not torch.equal(v1, v2)
    loader.set_epoch(0)
    torch.manual_seed(0)
    assert torch.equal(next(iter(loader))[0], v1)  # seeded: the same views again


def test_torchvision_loader_without_beton(tmp_path):
    """The fallback: a report-only conversion is enough (CIFAR, STL-10 unlabeled)."""
    truth = make_cifar(tmp_path / "cifar")
    convert(
        tmp_path / "cifar",
        tmp_path / "c" / "train.beton",
        Convert(workers=1),
        source="cifar10",
        beton=False,
        progress=False,
    )
    x, y = truth["train"]
    images, labels, idx = next(
        iter(
            eval_loader(
                tmp_path / "c" / "train.beton",
                Centre(crop_size=32),
                Reading(batch_size=10, workers=0, loader="torchvision"),
            )
        )
    )
    assert torch.equal(images, torch.from_numpy(x).permute(0, 3, 1, 2)) and labels.tolist() == y
    assert idx.tolist() == list(range(10))
    make_stl10(tmp_path / "stl")
    convert(
        tmp_path / "stl",
        tmp_path / "s" / "train.beton",
        Convert(workers=1),
        source="stl10",
        split="train+unlabeled",
        beton=False,
        progress=False,
    )
    v1, v2, labels, idx = next(
        iter(
            two_view_loader(
                tmp_path / "s" / "train.beton",
                Views(crop_size=48),
                Reading(batch_size=6, workers=1, loader="torchvision"),
            )
        )
    )
    assert v1.shape == (6, 3, 48, 48) and labels.tolist().count(-1) == 3
    assert sorted(idx.tolist()) == list(range(6))


def test_torchvision_loader_skips_what_conversion_skipped(tmp_path):
    root = tmp_path / "train"
    make_imagefolder(root)
    (root / "a" / "bad.png").write_bytes(b"garbage")
    report = convert(root, tmp_path / "train.beton", Convert(workers=1), beton=False, progress=False)
    assert len(report["skipped"]) == 1 and len(converted_source(tmp_path / "train.beton")) == 6
    make_imagefolder(root, classes=("b",), per_class=4)  # one more image after the conversion
    with pytest.raises(RuntimeError, match="changed since it was converted"):
        converted_source(tmp_path / "train.beton")


def test_factory_errors(tmp_path):
    with pytest.raises(ValueError, match="data.loader"):
        two_view_loader(tmp_path / "x.beton", Views(crop_size=32), Reading(batch_size=8, loader="dali"))
    with pytest.raises(FileNotFoundError, match="conversion report not found"):
        eval_loader(tmp_path / "x.beton", Centre(crop_size=32), Reading(batch_size=8, loader="torchvision"))
    with pytest.raises(FileNotFoundError, match="FFCV dataset not found"):
        eval_loader(tmp_path / "x.beton", Centre(crop_size=32), Reading(batch_size=8, loader="ffcv"))


# --- photometric recipes ---------------------------------------------------------------------
def _spec(module):
    out = []
    for op in module.ops.children():
        name, p = type(op).__name__, round(op.p, 3)
        if name == "ColorJitter":
            out.append((name, p, (op.brightness, op.contrast, op.saturation, op.hue)))
        elif name == "RandomGaussianBlur":
            out.append((name, p, tuple(float(v) for v in op._param_generator.sigma)))
        else:
            out.append((name, p))
    return out


def test_recipes_follow_the_papers():
    blur = (0.1, 2.0)
    assert _spec(augment.recipe("v1", 64)) == [("RandomGrayscale", 0.2), ("ColorJitter", 1.0, (0.4, 0.4, 0.4, 0.4))]
    assert _spec(augment.recipe("v2", 64)) == [
        ("ColorJitter", 0.8, (0.4, 0.4, 0.4, 0.1)),
        ("RandomGrayscale", 0.2),
        ("RandomGaussianBlur", 0.5, pytest.approx(blur)),
    ]
    # the official CIFAR-10 demo (moco colab-notebook branch): aug+ without the blur
    assert _spec(augment.recipe("cifar", 32)) == [("ColorJitter", 0.8, (0.4, 0.4, 0.4, 0.1)), ("RandomGrayscale", 0.2)]
    a, b = augment.view_recipes("v3", 64)
    jitter = ("ColorJitter", 0.8, (0.4, 0.4, 0.2, 0.1))
    assert _spec(a) == [jitter, ("RandomGrayscale", 0.2), ("RandomGaussianBlur", 1.0, pytest.approx(blur))]
    assert _spec(b) == [
        jitter,
        ("RandomGrayscale", 0.2),
        ("RandomGaussianBlur", 0.1, pytest.approx(blur)),
        ("RandomSolarize", 0.2),
    ]
    with pytest.raises(ValueError, match="unknown augmentation recipe"):
        augment.recipe("v4", 32)


def test_jitter_scale_reaches_simclr_strength():
    """v2's jitter (0.4, 0.4, 0.4, 0.1) x 2 is SimCLR's colour distortion at strength 1.0
    (0.8s, 0.8s, 0.8s, 0.2s); hue stops at 0.5, a full turn of the colour wheel."""
    assert _spec(augment.recipe("v2", 64, jitter_scale=2.0))[0] == ("ColorJitter", 0.8, (0.8, 0.8, 0.8, 0.2))
    assert _spec(augment.recipe("v1", 64, jitter_scale=2.0))[1] == ("ColorJitter", 1.0, (0.8, 0.8, 0.8, 0.5))
    a, _ = augment.view_recipes("v3", 64, jitter_scale=0.5)
    assert _spec(a)[0] == ("ColorJitter", 0.8, (0.2, 0.2, 0.1, 0.05))


@pytest.mark.parametrize("name", ["v1", "v2", "v3"])
def test_recipes_run_per_sample(name):
    torch.manual_seed(0)
    x = torch.full((8, 3, 32, 32), 128, dtype=torch.uint8)
    x[:, 0] = 200
    out = augment.view_recipes(name, 32)[0](x)
    assert out.dtype == torch.float32 and out.shape == x.shape
    assert len({round(float(v), 4) for v in out.mean((1, 2, 3))}) > 1  # not one draw for the whole batch


# --- the benchmark -----------------------------------------------------------------------------
@pytest.mark.integration
def test_bench_dispatch_and_loader_smoke(tmp_path, monkeypatch):
    from pipeline import bench

    assert "loader" in bench.available()
    with pytest.raises(ValueError, match="unknown benchmark 'nope'"):
        bench.load("nope")
    monkeypatch.chdir(tmp_path)  # bench/out/ of this run lands here
    result = bench.load("loader").main(
        [
            "--images",
            "40",
            "--size",
            "40",
            "--crop",
            "32",
            "--batch",
            "8",
            "--write-modes",
            "auto",
            "--rounds",
            "1",
            "--seconds",
            "0",
            "--aug",
            "v2",
            "--cache",
            str(tmp_path / "cache"),
        ]
    )
    saved = json.loads((tmp_path / "bench" / "out" / "loader.json").read_text())
    assert saved["ratio"] == result["ratio"] > 0
    assert set(saved["loaders"]) == {"ffcv_auto", "torchvision"} and saved["photometric"]["samples_per_s"] > 0


def test_torchvision_views_replay_after_a_resume(ffcv_small):
    """The torchvision loader's crops come from (seed, epoch, index): a loader restarted
    mid-epoch (new workers, another RNG state) yields the batches the uninterrupted one did."""

    def epoch_batches(workers: int, skip: int, epoch: int = 1) -> list:
        loader = two_view_loader(
            ffcv_small / "train.beton",
            Views(crop_size=24, seed=1),
            Reading(batch_size=16, workers=workers, loader="torchvision"),
        )
        loader.set_epoch(epoch)
        return list(loader.batches(skip))

    full = epoch_batches(workers=0, skip=0)
    torch.manual_seed(123)  # a restarted process: its RNG stream is another
    resumed = epoch_batches(workers=2, skip=2)
    assert len(resumed) == len(full) - 2
    for a, b in zip(full[2:], resumed):
        assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not torch.equal(full[0][0], epoch_batches(workers=0, skip=0, epoch=2)[0][0])  # new views each epoch


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


def test_data_identity_without_a_report(tmp_path):
    from pipeline.data.loaders import data_identity

    assert data_identity(tmp_path) == {"train.json content": None}  # no train.json: a hand-made .beton
    (tmp_path / "train.json").write_text(json.dumps({"classes": 2}))
    assert data_identity(tmp_path)["train.json content"] is not None


# each in a fresh interpreter: the first call that imports torchvision in a process
FIRST_TORCHVISION_IMPORT = {
    "two views": "loaders.TwoViewDataset(None, 8, (0.5, 1.0), (0.75, 1.33), flip=True)",
    "centre view": "loaders.CentreViewDataset(Source(), 4)[0]",
    "cifar": "sources.scan_cifar(Path('missing'), 'bad split', 'cifar10')",
    "stl10": "sources.scan_stl10(Path('missing'), 'bad split')",
}


@pytest.mark.parametrize("call", sorted(FIRST_TORCHVISION_IMPORT))
def test_the_torchvision_loader_and_sources_leave_torch_dynamo_unimported(call):
    """The torchvision loader's views and the CIFAR/STL-10 sources import torchvision, whose ops
    import torch._dynamo (~1 s a job) unless imported through pipeline.runtime.lean_torchvision."""
    code = f"""
import sys
from pathlib import Path
import numpy as np
from pipeline.data import loaders, sources
class Source:
    labels = [0]
    def load(self, i):
        return np.zeros((6, 6, 3), np.uint8)
assert "torchvision" not in sys.modules
try:
    {FIRST_TORCHVISION_IMPORT[call]}
except sources.SourceError:
    pass  # the bad split, after the import
print("torchvision" in sys.modules, any(m.startswith("torch._dynamo") for m in sys.modules))
"""
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["True", "False"]  # torchvision imported, torch._dynamo not
