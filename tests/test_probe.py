"""Linear probe and kNN: the frozen backbone stays bit-identical; kNN is exact on separable data."""

import json

import numpy as np
import pytest
import torch
from PIL import Image
from test_convert import make_stl10

from pipeline import probe
from pipeline.convert import run as convert
from pipeline.dag.config import section
from pipeline.dag.sections import Convert
from pipeline.data.augment import normalize
from pipeline.data.loaders import LOADERS, Reading, Views, crop_loader
from pipeline.eval.features import extract
from pipeline.eval.knn import knn_accuracy
from pipeline.nets.models import build_backbone
from pipeline.probe import assert_unchanged, run, snapshot
from pipeline.runtime import checkpoint

ARCH = {"backbone": "resnet18", "width": 8, "cifar_stem": True}


@pytest.fixture()
def random_checkpoint(tmp_path):
    torch.manual_seed(0)
    path = tmp_path / "ckpt.pt"
    checkpoint.save(path, arch=ARCH, method="random", backbone=build_backbone(ARCH).state_dict())
    return path


@pytest.mark.parametrize("mode,protocol", [("cached", "moco"), ("augmented", "mocov3")])
def test_probe_leaves_backbone_bit_identical(ffcv_small, random_checkpoint, tmp_path, mode, protocol):
    cfg = {
        "data": {"crop_size": 32, "workers": 1},
        "probe": {"mode": mode, "protocol": protocol, "epochs": 2, "batch_size": 32, "threads": 1},
    }
    metrics = run(cfg, random_checkpoint, ffcv_small, tmp_path / "probe.json")
    assert metrics["mode"] == mode and metrics["protocol"] == protocol
    assert 0 <= metrics["top1"] <= metrics["top5"] <= 100
    assert len(metrics["curve"]) == 2 and set(metrics["per_class_top1"]) == set(
        json.loads((ffcv_small / "train.json").read_text())["classes"]
    )
    # run() verifies the backbone itself; check the file on disk is untouched too
    after = checkpoint.load(random_checkpoint)["backbone"]
    torch.manual_seed(0)
    reference = build_backbone(ARCH).state_dict()
    assert all(torch.equal(after[k], reference[k]) for k in reference)


def test_changed_backbone_is_detected():
    backbone = build_backbone(ARCH).eval()
    before = snapshot(backbone)
    backbone.train()(torch.randn(4, 3, 16, 16))  # a forward in train mode moves BN statistics
    with pytest.raises(RuntimeError, match="frozen backbone changed.*running_mean"):
        assert_unchanged(backbone, before)


def test_knn_on_separable_features_is_perfect():
    torch.manual_seed(0)
    centers = torch.eye(4) * 10
    train_y = torch.arange(4).repeat_interleave(25)
    val_y = torch.arange(4).repeat_interleave(10)
    train_x = centers[train_y] + 0.1 * torch.randn(100, 4)
    val_x = centers[val_y] + 0.1 * torch.randn(40, 4)
    assert knn_accuracy(train_x, train_y, val_x, val_y, num_classes=4, k=20) == 100.0


def test_knn_at_chance_on_shuffled_labels():
    torch.manual_seed(0)
    x = torch.randn(400, 8)
    y = torch.randint(0, 4, (400,))
    acc = knn_accuracy(x[:300], y[:300], x[300:], y[300:], num_classes=4, k=20)
    assert acc < 45.0


# --- the probe's geometry and schedule as the references (moco / moco-v3 main_lincls.py) -------
def stored_256x341(tmp_path, copies: int = 1) -> tuple[np.ndarray, object]:
    """A 256 x 341 (h x w) image, stored as is (raw, no resize), ``copies`` times: grey with a
    red 40 px square in the top-left corner and a blue one in the bottom-right corner, both
    outside the centre 256 x 256 square."""
    image = np.full((256, 341, 3), 128, np.uint8)
    image[:40, :40] = (255, 0, 0)
    image[-40:, -40:] = (0, 0, 255)
    (tmp_path / "src" / "a").mkdir(parents=True)
    for i in range(copies):
        Image.fromarray(image).save(tmp_path / "src" / "a" / f"{i}.png")
    beton = tmp_path / "train.beton"
    convert(tmp_path / "src", beton, Convert(max_resolution=None, write_mode="raw", workers=1), progress=False)
    return image, beton


@pytest.mark.parametrize("loader", LOADERS)
def test_validation_view_is_the_centre_crop_of_the_0875_region(tmp_path, loader):
    """Resize(256) + CenterCrop(224) of a 256 x 341 image is rows 16..239 and columns
    round((341 - 224) / 2) = 58..281 of it, unresized: what the probe's features see at
    probe.crop_ratio 0.875 (the ImageNet presets' value)."""
    image, beton = stored_256x341(tmp_path)
    feats, _ = extract(torch.nn.Identity(), beton, 224, workers=1, loader=loader, crop_ratio=0.875, device="cpu")
    expected = torch.from_numpy(image[16:240, 58:282]).permute(2, 0, 1)[None]
    torch.testing.assert_close(feats, normalize(expected), rtol=0, atol=1e-6)


@pytest.mark.parametrize("loader", LOADERS)
def test_augmented_probe_crops_reach_the_image_corners(tmp_path, loader):
    """The references' RandomResizedCrop draws from the whole image: some of the probe's crops
    hold the red top-left or the blue bottom-right corner (the centre square holds neither)."""
    _, beton = stored_256x341(tmp_path, copies=48)
    views = torch.cat(
        [
            x
            for x, _, _ in crop_loader(
                beton, Views(crop_size=64, scale_min=0.08), Reading(batch_size=16, workers=1, loader=loader)
            )
        ]
    ).int()
    red = ((views[:, 0] > 200) & (views[:, 2] < 60)).flatten(1).any(1)
    blue = ((views[:, 2] > 200) & (views[:, 0] < 60)).flatten(1).any(1)
    assert len(views) == 48 and bool(red.any()) and bool(blue.any())


@pytest.mark.parametrize("loader", LOADERS)
def test_unlabelled_images_do_not_stretch_the_augmented_probe(tmp_path, random_checkpoint, monkeypatch, loader):
    """STL-10 train+unlabeled (12 labelled + 12 unlabeled here), batch 5: ceil(12 / 5) = 3 steps
    an epoch, every one on labelled images, and the cosine lr falls at every step."""
    make_stl10(tmp_path / "stl", n=12)
    data = tmp_path / "data"
    for split, name in (("train+unlabeled", "train"), ("test", "val")):
        convert(
            tmp_path / "stl", data / f"{name}.beton", Convert(workers=1), source="stl10", split=split, progress=False
        )
    steps, ratios = [], []
    train_batch, extract_features = probe.LinearProbe.train_batch, probe.extract

    def record(self, feats, labels):
        assert bool((labels >= 0).all())
        loss = train_batch(self, feats, labels)
        steps.append(self.opt.param_groups[0]["lr"])
        return loss

    def extract_recording(*args, **kwargs):
        ratios.append(kwargs["crop_ratio"])
        return extract_features(*args, **kwargs)

    monkeypatch.setattr(probe.LinearProbe, "train_batch", record)
    monkeypatch.setattr(probe, "extract", extract_recording)
    cfg = {
        "data": {"crop_size": 32, "workers": 1, "loader": loader},
        "probe": {"mode": "augmented", "protocol": "mocov3", "epochs": 3, "batch_size": 5, "crop_ratio": 0.875},
    }
    run(cfg, random_checkpoint, data, tmp_path / "probe.json")
    assert len(steps) == 3 * 3 and all(a > b for a, b in zip(steps, steps[1:]))
    assert ratios == [0.875, 0.875]  # train and val features: probe.crop_ratio


def test_train_cached_fits_a_probe_on_cached_features():
    from pipeline.dag.config import section
    from pipeline.probe import LinearProbe, settings, train_cached

    torch.manual_seed(0)
    pc = section("probe", {"epochs": 2, "batch_size": 8})
    s = settings(pc, {"backbone": "resnet18"})
    assert s["epochs"] == 2 and s["batch_size"] == 8
    # two well separated classes: feature 0 carries the label
    y = torch.arange(32) % 2
    x = torch.randn(32, 4) * 0.1
    x[:, 0] += y.float() * 2 - 1
    probe = LinearProbe(4, 2, s, pc.standardize, 32 // 8)
    curve = train_cached(probe, x, y, x, y, pc.seed)
    assert [p["epoch"] for p in curve] == [1, 2]  # one point per epoch
    assert all(set(p) == {"epoch", "train_loss", "val_top1"} for p in curve)
    assert probe.step == 2 * 4  # 2 epochs x 32 / 8 batches


@pytest.mark.parametrize("protocol", ["moco", "mocov3"])
def test_configured_probe_lr_is_used_as_given(protocol):
    """An explicit lr overrides the protocol's and is not scaled by the batch (mocov3 would: x512/256)."""
    s = probe.settings(section("probe", {"protocol": protocol, "lr": 0.5, "batch_size": 512}), ARCH)
    assert (s["lr"], s["batch_size"]) == (0.5, 512)


def test_probe_without_labelled_images_exits_with_the_file(tmp_path):
    make_stl10(tmp_path / "stl", n=4)
    data = tmp_path / "data"
    for split, name in (("unlabeled", "train"), ("test", "val")):
        convert(
            tmp_path / "stl", data / f"{name}.beton", Convert(workers=1), source="stl10", split=split, progress=False
        )
    torch.manual_seed(0)
    ckpt = tmp_path / "ckpt.pt"
    probe.checkpoint.save(ckpt, arch=ARCH, method="random", backbone=build_backbone(ARCH).state_dict())
    cfg = json.dumps({"data": {"crop_size": 32, "workers": 1}, "probe": {"epochs": 1}})
    args = ["--config", cfg, "--data", str(data), "--out", str(tmp_path / "probe.json")]
    with pytest.raises(SystemExit, match=r"\[probe\] error: .*train\.beton has no labelled images"):
        probe.main([*args, "--checkpoint", str(ckpt)])
    with pytest.raises(SystemExit, match=r"\[probe\] error: checkpoint not found: .*nope\.pt"):
        probe.main([*args, "--checkpoint", str(tmp_path / "nope.pt")])
    assert not (tmp_path / "probe.json").exists()
