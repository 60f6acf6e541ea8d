"""Detection transfer: COCO scoring, weight transfer into the detector, a tiny end-to-end run."""
from __future__ import annotations

import json
import shutil

import pytest
import torch
from torchvision.ops import FrozenBatchNorm2d

from pipeline import checkpoint, detect
from pipeline.models import build_backbone
from pipeline.synthetic import generate

ARCH = {"backbone": "resnet18", "width": 8, "cifar_stem": True}
TINY = {"epochs": 1, "batch_size": 4, "lr": 0.01, "image_size": 64, "fpn_channels": 16,
        "norm": "frozen_bn", "seed": 0, "threads": 2}


@pytest.fixture(scope="module")
def det_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("synth")
    generate(root, {"train_per_class": 1, "val_per_class": 1, "det_train_images": 16, "det_val_images": 8},
             progress=False)
    return root / "det"


@pytest.fixture(scope="module")
def ckpt_path(tmp_path_factory):
    torch.manual_seed(0)
    backbone = build_backbone(ARCH)
    with torch.no_grad():  # non-default BN statistics, so a lost running_mean would show
        for mod in backbone.modules():
            if isinstance(mod, torch.nn.BatchNorm2d):
                mod.running_mean.uniform_(-0.5, 0.5)
                mod.running_var.uniform_(0.5, 2.0)
                mod.weight.uniform_(0.5, 1.5)
    path = tmp_path_factory.mktemp("ckpt") / "checkpoint.pt"
    checkpoint.save(path, arch=ARCH, method="random", backbone=backbone.state_dict())
    return path


# --- COCO evaluation ---------------------------------------------------------------------------

def test_ground_truth_as_detections_scores_100(det_dir):
    gt = json.loads((det_dir / "instances_val.json").read_text())
    dets = [{"image_id": a["image_id"], "category_id": a["category_id"], "bbox": a["bbox"], "score": 1.0}
            for a in gt["annotations"]]
    m = detect.coco_evaluate(det_dir / "instances_val.json", dets)
    assert m["AP"] == pytest.approx(100.0) and m["AP50"] == pytest.approx(100.0)
    assert m["AP75"] == pytest.approx(100.0)
    assert set(m) == set(detect.AP_KEYS)


def test_empty_detections_score_0(det_dir, capsys):
    m = detect.coco_evaluate(det_dir / "instances_val.json", [])
    assert m["AP"] == 0.0 and m["AP50"] == 0.0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith("[detect] COCO bbox")  # pycocotools kept quiet


def test_wrong_class_scores_0(det_dir):
    gt = json.loads((det_dir / "instances_val.json").read_text())
    dets = [{"image_id": a["image_id"], "category_id": a["category_id"] % 10 + 1, "bbox": a["bbox"],
             "score": 1.0} for a in gt["annotations"]]
    assert detect.coco_evaluate(det_dir / "instances_val.json", dets)["AP50"] == 0.0


# --- dataset -----------------------------------------------------------------------------------

def test_dataset_targets_and_flip(det_dir):
    plain = detect.CocoBoxes(det_dir / "instances_train.json", det_dir)
    image, target = plain[0]
    assert image.dtype == torch.float32 and 0.0 <= float(image.min()) and float(image.max()) <= 1.0
    assert target["labels"].dtype == torch.int64 and target["boxes"].shape == (len(target["labels"]), 4)
    assert bool((target["boxes"][:, 2:] > target["boxes"][:, :2]).all())  # xyxy
    flipping = detect.CocoBoxes(det_dir / "instances_train.json", det_dir, flip=True)
    for seed in range(20):
        torch.manual_seed(seed)
        flipped, ftarget = flipping[0]
        if not torch.equal(flipped, image):
            break
    assert torch.equal(flipped, image.flip(-1))
    width = image.shape[-1]
    assert torch.allclose(ftarget["boxes"][:, 0], width - target["boxes"][:, 2])
    assert torch.allclose(ftarget["boxes"][:, 2], width - target["boxes"][:, 0])


def test_missing_annotation_file_names_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="instances_train.json"):
        detect.CocoBoxes(tmp_path / "instances_train.json", tmp_path)


# --- weight transfer ---------------------------------------------------------------------------

@pytest.mark.parametrize("norm", ["frozen_bn", "bn"])
def test_detector_backbone_holds_the_checkpoint_weights(ckpt_path, norm):
    ckpt = checkpoint.load(ckpt_path)
    detector = detect.build_detector(ckpt, {**TINY, "norm": norm}, num_classes=11)
    detect.verify_backbone(detector, ckpt["backbone"])
    body = detector.backbone.body.state_dict()
    compared = 0
    for key, value in ckpt["backbone"].items():
        if key.endswith("num_batches_tracked") and norm == "frozen_bn":
            continue  # FrozenBatchNorm2d keeps no step counter
        assert torch.equal(body[key], value), key
        compared += 1
    assert compared >= len(ckpt["backbone"]) - 20
    bns = [m for m in detector.backbone.body.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    frozen = [m for m in detector.backbone.body.modules() if isinstance(m, FrozenBatchNorm2d)]
    assert (len(bns), bool(frozen)) == ((0, True) if norm == "frozen_bn" else (len(bns), False))
    assert all(p.requires_grad for p in detector.backbone.body.parameters())  # convs fine-tuned


def test_verify_backbone_detects_a_changed_weight(ckpt_path):
    ckpt = checkpoint.load(ckpt_path)
    detector = detect.build_detector(ckpt, TINY, num_classes=11)
    with torch.no_grad():
        detector.backbone.body.layer3[0].conv1.weight.add_(1e-3)
    with pytest.raises(checkpoint.CheckpointError, match="layer3.0.conv1.weight"):
        detect.verify_backbone(detector, ckpt["backbone"])


def test_missing_key_fails_with_its_name(ckpt_path):
    ckpt = checkpoint.load(ckpt_path)
    del ckpt["backbone"]["layer1.0.bn1.running_mean"]
    with pytest.raises(checkpoint.CheckpointError, match=r"missing \['layer1.0.bn1.running_mean'\]"):
        detect.build_detector(ckpt, TINY, num_classes=11)


def test_misnamed_key_fails_with_both_names(ckpt_path):
    ckpt = checkpoint.load(ckpt_path)
    ckpt["backbone"]["layer2.0.convX.weight"] = ckpt["backbone"].pop("layer2.0.conv1.weight")
    with pytest.raises(checkpoint.CheckpointError) as err:
        detect.build_detector(ckpt, TINY, num_classes=11)
    assert "layer2.0.conv1.weight" in str(err.value) and "layer2.0.convX.weight" in str(err.value)


# --- end to end --------------------------------------------------------------------------------

def test_tiny_run_writes_metrics(det_dir, ckpt_path, tmp_path):
    data = tmp_path / "det"
    shutil.copytree(det_dir, data)
    ann_path = data / "instances_train.json"
    ann = json.loads(ann_path.read_text())
    ann["annotations"] = [a for a in ann["annotations"] if a["image_id"] != 1]  # one empty scene
    ann_path.write_text(json.dumps(ann))
    out = tmp_path / "metrics.json"
    detect.main(["--config", json.dumps({"detect": TINY}), "--checkpoint", str(ckpt_path),
                 "--data", str(data), "--out", str(out)])
    m = json.loads(out.read_text())
    for key in detect.AP_KEYS:
        assert key in m and (m[key] is None or 0.0 <= m[key] <= 100.0)
    assert len(m["train_loss"]) == 1 and m["train_loss"][0] > 0
    assert (m["num_train_images"], m["num_val_images"], m["epochs"]) == (16, 8, 1)
    assert m["arch"] == ARCH and m["norm"] == "frozen_bn" and m["config"]["detect"]["image_size"] == 64


def test_cli_errors_exit_with_a_message(det_dir, ckpt_path, tmp_path):
    args = ["--checkpoint", str(ckpt_path), "--out", str(tmp_path / "m.json")]
    with pytest.raises(SystemExit, match=r"\[detect\] error: annotation file not found: .*instances_train"):
        detect.main(["--config", json.dumps({"detect": TINY}), "--data", str(tmp_path), *args])
    with pytest.raises(SystemExit, match=r"\[detect\] error: .*detect.norm"):
        detect.main(["--config", json.dumps({"detect": {**TINY, "norm": "gn"}}), "--data", str(det_dir), *args])
    with pytest.raises(SystemExit, match=r"\[detect\] error: checkpoint not found"):
        detect.main(["--config", json.dumps({"detect": TINY}), "--data", str(det_dir),
                     "--checkpoint", str(tmp_path / "nope.pt"), "--out", str(tmp_path / "m.json")])
    assert not (tmp_path / "m.json").exists()
