"""Linear probe and kNN: the frozen backbone stays bit-identical; kNN is exact on separable data."""

import json

import pytest
import torch

from pipeline import checkpoint
from pipeline.knn import knn_accuracy
from pipeline.models import build_backbone
from pipeline.probe import assert_unchanged, run, snapshot

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
