"""Evaluation stages' error paths and branches the other tests leave out: detection (SyncBN
decision, per-rank batch, a non-finite loss, missing files), detection datasets, the probe."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from conftest import REPO
from test_convert import make_stl10
from torch import nn

from pipeline import detect, probe
from pipeline.convert import run as convert
from pipeline.dag.config import ConfigError, section
from pipeline.dag.sections import Convert
from pipeline.data.detection import DetectionDataError, DetectionSplit, coco_split, load_splits, voc_split, write_voc
from pipeline.nets.models import build_backbone
from pipeline.runtime import checkpoint
from pipeline.runtime.distributed import DistEnv

ARCH = {"backbone": "resnet18", "width": 8, "cifar_stem": True}
CUDA1 = torch.device("cuda", 1)  # a device object only: nothing runs on it


def bn_detector() -> nn.Module:
    torch.manual_seed(0)
    ckpt = {"arch": ARCH, "backbone": build_backbone(ARCH).state_dict()}
    return detect.build_detector(
        ckpt, section("detect", {"norm": "bn", "image_size": 64, "fpn_channels": 16}), num_classes=3
    )


# --- detect: the decisions of a multi-rank run ---------------------------------------------------
def test_bn_on_several_gpu_ranks_becomes_syncbn_with_the_same_weights():
    detector = bn_detector()
    bns = {n: m.weight.clone() for n, m in detector.named_modules() if isinstance(m, nn.BatchNorm2d)}
    synced_detector, synced = detect.sync_batchnorm(detector, section("detect", {"norm": "bn"}), 2, CUDA1)
    syncs = {n: m for n, m in synced_detector.named_modules() if isinstance(m, nn.SyncBatchNorm)}
    assert synced and bns and set(syncs) == set(bns)
    assert not any(isinstance(m, nn.BatchNorm2d) for m in synced_detector.modules())
    assert all(torch.equal(syncs[n].weight, w) for n, w in bns.items())


@pytest.mark.parametrize(
    "norm,world_size,device",
    [("bn", 2, torch.device("cpu")), ("bn", 1, CUDA1), ("frozen_bn", 2, CUDA1), ("gn", 2, CUDA1)],
)
def test_syncbn_only_for_bn_over_several_gpu_ranks(norm, world_size, device):
    """gloo on CPU has no SyncBN, one rank has nothing to sync, frozen BN and GN no batch statistics."""
    module = nn.Sequential(nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4))
    out, synced = detect.sync_batchnorm(module, section("detect", {"norm": norm}), world_size, device)
    assert out is module and not synced and isinstance(module[1], nn.BatchNorm2d)


def test_ddp_gets_the_ranks_gpu_and_no_ids_on_cpu():
    assert detect.distributed.ddp_device_ids(CUDA1) == [1]
    assert detect.distributed.ddp_device_ids(torch.device("cpu")) is None


def test_batch_is_split_evenly_over_the_ranks():
    assert detect.per_rank_batch(section("detect", {"batch_size": 16}), 4) == 4
    with pytest.raises(ConfigError, match=r"detect.batch_size=4 is not a multiple of the 3 ranks"):
        detect.per_rank_batch(section("detect", {"batch_size": 4}), 3)


def test_normalisation_names_group_norm_and_syncbn():
    gn = section("detect", {"norm": "gn", "batch_size": 16})
    assert detect.normalisation(gn, False, 1) == "GroupNorm (batch-independent), batch 16"
    bn = section("detect", {"norm": "bn", "batch_size": 16})
    assert detect.normalisation(bn, True, 8) == "SyncBN over 16 images (8 ranks x 2)"


def test_configured_anchor_sizes_are_used_as_given():
    dc = section("detect", {"anchor_sizes": [8, 16, 32, 64, 128], "image_size": 64})
    assert detect.anchor_sizes(dc) == [8, 16, 32, 64, 128]


# --- detect: failures ----------------------------------------------------------------------------
class NanLoss(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(()))

    def forward(self, images, targets):
        return {"loss_box": self.w + float("nan")}


def test_non_finite_loss_stops_before_the_step_and_names_the_lr():
    model = NanLoss()
    batch = (torch.zeros(3, 8, 8), {"boxes": torch.zeros(0, 4), "labels": torch.zeros(0, dtype=torch.int64)})
    loader = torch.utils.data.DataLoader([batch] * 2, batch_size=1, collate_fn=detect.collate)
    with pytest.raises(FloatingPointError, match=r"at epoch 1 step 1; lower detect.lr \(now 0.02\)"):
        no_state = checkpoint.StageState(None, {}, DistEnv())  # nothing saved or resumed
        detect.train(model, loader, section("detect", {"epochs": 1, "lr": 0.02}), no_state)
    assert float(model.w.detach()) == 0.0  # no step was taken with the NaN gradient


def test_missing_image_and_annotation_file_are_named(tmp_path):
    split = DetectionSplit(
        {"images": [{"id": 1, "file_name": "a.png"}], "annotations": [], "categories": [{"id": 1}]}, tmp_path, "x"
    )
    with pytest.raises(DetectionDataError, match=r"image not found: .*a\.png"):
        detect.CocoBoxes(split)[0]
    with pytest.raises(FileNotFoundError, match=r"annotation file not found: .*nope\.json"):
        detect.coco_evaluate(tmp_path / "nope.json", [])


# --- detection datasets --------------------------------------------------------------------------
def test_unknown_dataset_kind_is_named(tmp_path):
    with pytest.raises(ValueError, match=r"auto, coco or voc, not 'yolo'"):
        load_splits(tmp_path, "yolo")


def test_malformed_coco_json_names_the_file(tmp_path):
    path = tmp_path / "instances_train.json"
    path.write_text("{not json")
    with pytest.raises(DetectionDataError, match=r"instances_train\.json: not valid JSON"):
        coco_split(tmp_path, "train")
    path.write_text(json.dumps({"images": []}))
    with pytest.raises(DetectionDataError, match=r"not a COCO annotation file \(no \['annotations', 'categories'\]\)"):
        coco_split(tmp_path, "train")


def test_voc_annotation_missing_or_without_a_size_names_the_xml(tmp_path):
    listing = tmp_path / "VOC2007" / "ImageSets" / "Main" / "test.txt"
    listing.parent.mkdir(parents=True)
    listing.write_text("000001\n")
    with pytest.raises(DetectionDataError, match=r"VOC annotation not found: .*VOC2007/Annotations/000001\.xml"):
        voc_split(tmp_path, ["2007/test"])
    xml = tmp_path / "VOC2007" / "Annotations" / "000001.xml"
    xml.parent.mkdir()
    xml.write_text("<annotation><size><width>4</width></size></annotation>")
    with pytest.raises(DetectionDataError, match=r"000001\.xml: malformed VOC annotation \(ValueError: no <height>\)"):
        voc_split(tmp_path, ["2007/test"])


def test_more_classes_than_voc_has_are_refused(tmp_path):
    split = DetectionSplit({"images": [], "annotations": [], "categories": [{"id": 21}]}, tmp_path, "scenes")
    with pytest.raises(DetectionDataError, match=r"scenes: more than 20 classes do not fit VOC's"):
        write_voc(split, tmp_path / "devkit", "2007", "test")
    assert not (tmp_path / "devkit").exists()


def test_to_voc_cli_exits_with_the_missing_file(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "pipeline.data.detection", "--coco", str(tmp_path / "no"), "--out", str(tmp_path / "v")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1
    assert "[detection_data] error: annotation file not found:" in proc.stderr
    assert "instances_train.json" in proc.stderr


# --- probe -----------------------------------------------------------------------------------
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
