"""Detection transfer: COCO scoring, weight transfer into the detector, a tiny end-to-end run."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
import torch
from conftest import REPO
from torch import nn
from torchvision.models.detection.faster_rcnn import FastRCNNConvFCHead, TwoMLPHead
from torchvision.ops import FrozenBatchNorm2d

from pipeline import detect
from pipeline.dag.config import ConfigError, section
from pipeline.dag.sections import Synthetic, Voc
from pipeline.data.detection import VOC_CLASSES, DetectionDataError, DetectionSplit, load_splits, write_voc
from pipeline.nets.models import build_backbone
from pipeline.runtime import checkpoint
from pipeline.runtime.distributed import DistEnv
from pipeline.synthetic import run as generate
from pipeline.transfer.summary import main as summary_job

ARCH = {"backbone": "resnet18", "width": 8, "cifar_stem": True}
CUDA1 = torch.device("cuda", 1)  # a device object only: nothing runs on it
TINY = {
    "task": "detection",  # Faster R-CNN; tests/test_segmentation.py covers Mask R-CNN
    "epochs": 1,
    "batch_size": 4,
    "lr": 0.01,
    "image_size": 64,
    "fpn_channels": 16,
    "norm": "frozen_bn",
    "seed": 0,
    "threads": 2,
}


@pytest.fixture(scope="module")
def det_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("synth")
    scenes = Synthetic(train_per_class=1, val_per_class=1, det_train_images=16, det_val_images=8)
    generate(root, scenes, progress=False)
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
    dets = [
        {"image_id": a["image_id"], "category_id": a["category_id"], "bbox": a["bbox"], "score": 1.0}
        for a in gt["annotations"]
    ]
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
    dets = [
        {"image_id": a["image_id"], "category_id": a["category_id"] % 10 + 1, "bbox": a["bbox"], "score": 1.0}
        for a in gt["annotations"]
    ]
    assert detect.coco_evaluate(det_dir / "instances_val.json", dets)["AP50"] == 0.0


# --- dataset -----------------------------------------------------------------------------------


def test_dataset_targets_and_flip(det_dir):
    train, _ = load_splits(det_dir)
    plain = detect.CocoBoxes(train)
    image, target = plain[0]
    assert image.dtype == torch.float32 and 0.0 <= float(image.min()) and float(image.max()) <= 1.0
    assert target["labels"].dtype == torch.int64 and target["boxes"].shape == (len(target["labels"]), 4)
    assert bool((target["boxes"][:, 2:] > target["boxes"][:, :2]).all())  # xyxy
    flipping = detect.CocoBoxes(train, flip=True)
    for seed in range(20):
        torch.manual_seed(seed)
        flipped, ftarget = flipping[0]
        if not torch.equal(flipped, image):
            break
    assert torch.equal(flipped, image.flip(-1))
    width = image.shape[-1]
    assert torch.allclose(ftarget["boxes"][:, 0], width - target["boxes"][:, 2])
    assert torch.allclose(ftarget["boxes"][:, 2], width - target["boxes"][:, 0])


def test_missing_or_unknown_roots_fail_clearly(tmp_path):
    with pytest.raises(FileNotFoundError, match="detection dataset root not found"):
        load_splits(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="neither a COCO folder .* nor a VOCdevkit"):
        load_splits(tmp_path)
    with pytest.raises(FileNotFoundError, match="instances_train.json"):
        load_splits(tmp_path, "coco")


def test_coco_2017_layout(det_dir, tmp_path):
    """annotations/instances_{split}2017.json with images under {split}2017/, as COCO ships."""
    for split in ("train", "val"):
        ann = json.loads((det_dir / f"instances_{split}.json").read_text())
        for img in ann["images"]:
            (tmp_path / f"{split}2017").mkdir(exist_ok=True)
            name = img["file_name"].split("/")[-1]
            shutil.copy(det_dir / img["file_name"], tmp_path / f"{split}2017" / name)
            img["file_name"] = name
        (tmp_path / "annotations").mkdir(exist_ok=True)
        (tmp_path / "annotations" / f"instances_{split}2017.json").write_text(json.dumps(ann))
    train, val = load_splits(tmp_path)
    assert train.image_root == tmp_path / "train2017" and len(val.coco["images"]) == 8
    image, target = detect.CocoBoxes(train)[0]
    reference, ref_target = detect.CocoBoxes(load_splits(det_dir)[0])[0]
    assert torch.equal(image, reference) and torch.equal(target["boxes"], ref_target["boxes"])


# --- Pascal VOC --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def voc_root(det_dir, tmp_path_factory):
    """VOC2007 trainval/test and VOC2012 trainval made of the embedded scenes; in the 07 test
    set, the first object of every image is marked difficult."""
    devkit = tmp_path_factory.mktemp("VOCdevkit")
    train, val = load_splits(det_dir)
    half = {**train.coco, "images": train.coco["images"][:10]}
    rest = {**train.coco, "images": train.coco["images"][10:]}
    write_voc(DetectionSplit(half, train.image_root, "07"), devkit, "2007", "trainval")
    write_voc(DetectionSplit(rest, train.image_root, "12"), devkit, "2012", "trainval")
    first = {min(a["id"] for a in val.coco["annotations"] if a["image_id"] == img["id"]) for img in val.coco["images"]}
    write_voc(val, devkit, "2007", "test", difficult=first)
    return devkit, first


def test_voc_07_12_trainval_and_07_test(det_dir, voc_root):
    devkit, difficult = voc_root
    train, val = load_splits(devkit)  # auto: a VOCdevkit
    coco_train, coco_val = load_splits(det_dir)
    assert train.name == "VOC 2007/trainval+2012/trainval" and val.name == "VOC 2007/test"
    assert len(train.coco["images"]) == 16 and len(val.coco["images"]) == 8  # 10 from 07 + 6 from 12
    assert [c["name"] for c in train.coco["categories"]] == list(VOC_CLASSES) and train.num_classes == 21
    # the same boxes and classes as the source, back in 0-based continuous coordinates
    got = [(a["category_id"], a["bbox"]) for a in val.coco["annotations"]]
    want = [(a["category_id"], a["bbox"]) for a in coco_val.coco["annotations"]]
    assert [g[0] for g in got] == [w[0] for w in want]
    assert all(g == pytest.approx(w, abs=1e-6) for (_, g), (_, w) in zip(got, want))
    assert sum(a["iscrowd"] for a in val.coco["annotations"]) == len(difficult) == 8
    image, target = detect.CocoBoxes(train)[12]  # an image from VOC2012
    assert image.shape == (3, 96, 96) and len(target["boxes"]) > 0
    # difficult objects are training targets, not ignored there
    test_targets = sum(len(detect.CocoBoxes(val)[i][1]["boxes"]) for i in range(8))
    assert test_targets == len(val.coco["annotations"])


def test_voc_difficult_objects_are_ignored_in_evaluation(voc_root):
    devkit, _ = voc_root
    _, val = load_splits(devkit, "voc")
    easy = [a for a in val.coco["annotations"] if not a["difficult"]]

    def as_dets(anns):
        return [
            {"image_id": a["image_id"], "category_id": a["category_id"], "bbox": a["bbox"], "score": 1.0} for a in anns
        ]

    assert detect.coco_evaluate(val.coco, as_dets(easy))["AP50"] == pytest.approx(100.0)  # not missed
    assert detect.coco_evaluate(val.coco, as_dets(val.coco["annotations"]))["AP50"] == pytest.approx(100.0)  # no FP


def test_voc_errors_name_the_file(voc_root, tmp_path):
    devkit, _ = voc_root
    with pytest.raises(FileNotFoundError, match=r"VOC2012.*test.txt"):
        load_splits(devkit, "voc", Voc(val="2012/test"))
    broken = tmp_path / "VOCdevkit"
    shutil.copytree(devkit, broken)
    xml = sorted((broken / "VOC2007" / "Annotations").glob("*.xml"))[0]
    xml.write_text(xml.read_text().replace("<name>", "<name>unicorn", 1))
    with pytest.raises(FileNotFoundError, match=f"{xml.name}: unknown VOC class 'unicorn"):
        load_splits(broken)
    xml.write_text("<annotation><size>")
    with pytest.raises(FileNotFoundError, match=f"{xml.name}: malformed VOC annotation"):
        load_splits(broken)


# --- weight transfer ---------------------------------------------------------------------------


@pytest.mark.parametrize("head", ["fpn", "c4"])
@pytest.mark.parametrize("norm", ["frozen_bn", "bn"])
def test_detector_backbone_holds_the_checkpoint_weights(ckpt_path, norm, head):
    ckpt = checkpoint.load(ckpt_path)
    detector = detect.build_detector(ckpt, section("detect", {**TINY, "norm": norm, "head": head}), num_classes=11)
    detect.verify_backbone(detector, ckpt["backbone"])
    own = detect.pretrained_part(detector)
    compared = 0
    for key, value in ckpt["backbone"].items():
        if key.endswith("num_batches_tracked") and norm == "frozen_bn":
            continue  # FrozenBatchNorm2d keeps no step counter
        assert torch.equal(own[key], value), key
        compared += 1
    assert compared >= len(ckpt["backbone"]) - 20
    assert any(k.startswith("layer4.") for k in own)  # C4: layer4 is the box head, loaded too
    pretrained = [detector.backbone if head == "c4" else detector.backbone.body]
    if head == "c4":
        assert isinstance(detector.roi_heads.box_head, detect.Res5Head)
        extra = detector.roi_heads.box_head.extra_norm  # the paper's extra BN after res5
        assert isinstance(extra, torch.nn.BatchNorm2d if norm == "bn" else torch.nn.Identity)
        pretrained.append(detector.roi_heads.box_head)
    modules = [m for part in pretrained for m in part.modules()]
    bns = [m for m in modules if isinstance(m, torch.nn.BatchNorm2d)]
    frozen = [m for m in modules if isinstance(m, FrozenBatchNorm2d)]
    assert (bool(bns), bool(frozen)) == ((False, True) if norm == "frozen_bn" else (True, False))
    assert all(p.requires_grad for part in pretrained for p in part.parameters())  # convs fine-tuned
    if head == "fpn":  # new layers: no norm with frozen BN, BatchNorm in FPN and a 4conv1fc head with bn
        fpn_bns = [m for m in detector.backbone.fpn.modules() if isinstance(m, torch.nn.BatchNorm2d)]
        assert bool(fpn_bns) == (norm == "bn")
        assert isinstance(detector.roi_heads.box_head, FastRCNNConvFCHead if norm == "bn" else TwoMLPHead)


def test_c4_head_changed_layer4_weight_is_detected(ckpt_path):
    ckpt = checkpoint.load(ckpt_path)
    detector = detect.build_detector(ckpt, section("detect", {**TINY, "head": "c4"}), num_classes=11)
    with torch.no_grad():
        detector.roi_heads.box_head.layer4[1].conv2.weight.add_(1e-3)
    with pytest.raises(checkpoint.CheckpointError, match="layer4.1.conv2.weight"):
        detect.verify_backbone(detector, ckpt["backbone"])


@pytest.mark.parametrize("head", ["fpn", "c4"])
def test_group_norm_backbone_and_heads_train(head, det_dir):
    """norm: gn for a GN-pretrained backbone: GroupNorm everywhere, no BatchNorm; one step learns."""
    arch = {**ARCH, "norm": "gn"}
    ckpt = {"arch": arch, "backbone": build_backbone(arch).state_dict()}
    detector = detect.build_detector(ckpt, section("detect", {**TINY, "norm": "gn", "head": head}), num_classes=11)
    detect.verify_backbone(detector, ckpt["backbone"])
    kinds = {type(m) for m in detector.modules()}
    assert torch.nn.GroupNorm in kinds and not kinds & {torch.nn.BatchNorm2d, FrozenBatchNorm2d}
    images, targets = detect.collate([detect.CocoBoxes(load_splits(det_dir)[0])[i] for i in range(2)])
    detector.train()
    loss = sum(detector(list(images), list(targets)).values())
    loss.backward()
    first_conv = (detector.backbone.body if head == "fpn" else detector.backbone).conv1.weight
    assert torch.isfinite(loss) and first_conv.grad.abs().sum() > 0


def test_verify_backbone_detects_a_changed_weight(ckpt_path):
    ckpt = checkpoint.load(ckpt_path)
    detector = detect.build_detector(ckpt, section("detect", TINY), num_classes=11)
    with torch.no_grad():
        detector.backbone.body.layer3[0].conv1.weight.add_(1e-3)
    with pytest.raises(checkpoint.CheckpointError, match="layer3.0.conv1.weight"):
        detect.verify_backbone(detector, ckpt["backbone"])


def test_missing_key_fails_with_its_name(ckpt_path):
    ckpt = checkpoint.load(ckpt_path)
    del ckpt["backbone"]["layer1.0.bn1.running_mean"]
    with pytest.raises(checkpoint.CheckpointError, match=r"missing \['layer1.0.bn1.running_mean'\]"):
        detect.build_detector(ckpt, section("detect", TINY), num_classes=11)


def test_misnamed_key_fails_with_both_names(ckpt_path):
    ckpt = checkpoint.load(ckpt_path)
    ckpt["backbone"]["layer2.0.convX.weight"] = ckpt["backbone"].pop("layer2.0.conv1.weight")
    with pytest.raises(checkpoint.CheckpointError) as err:
        detect.build_detector(ckpt, section("detect", TINY), num_classes=11)
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
    detect.main(
        [
            "--config",
            json.dumps({"detect": TINY}),
            "--checkpoint",
            str(ckpt_path),
            "--data",
            str(data),
            "--out",
            str(out),
        ]
    )
    m = json.loads(out.read_text())
    for key in detect.AP_KEYS:
        assert key in m and (m[key] is None or 0.0 <= m[key] <= 100.0)
    assert len(m["train_loss"]) == 1 and m["train_loss"][0] > 0
    assert (m["num_train_images"], m["num_val_images"], m["epochs"]) == (16, 8, 1)
    assert m["arch"] == ARCH and m["norm"] == "frozen_bn" and m["config"]["detect"]["image_size"] == 64


def test_a_trial_runs_without_importing_torch_dynamo(det_dir, ckpt_path, tmp_path):
    """The detection stage as a job runs it: a fine-tuning and a COCO evaluation through
    torchvision's RoIAlign, and torch._dynamo, which torchvision's ops import and the stage never
    runs, is not imported (pipeline.runtime.lean_torchvision; -X importtime lists every import)."""
    out = tmp_path / "metrics.json"
    cmd = [sys.executable, "-X", "importtime", "-m", "pipeline.detect", "--config", json.dumps({"detect": TINY})]
    cmd += ["--checkpoint", str(ckpt_path), "--data", str(det_dir), "--out", str(out)]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    imported = [line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")]
    assert "torchvision.ops.roi_align" in imported and "pycocotools.cocoeval" in imported
    assert not [name for name in imported if name.startswith("torch._dynamo")]
    assert len(json.loads(out.read_text())["train_loss"]) == 1


@pytest.mark.integration
def test_voc_c4_trials_and_their_summary(voc_root, ckpt_path, tmp_path):
    """Two trials (seeds) of a C4 detector on VOC07+12 -> VOC07 test, then their mean ± std."""
    devkit, _ = voc_root
    cfg = json.dumps({"detect": {**TINY, "head": "c4", "iterations": 6}})  # 4 per epoch: 1.5 epochs
    trials = []
    for seed in (3, 4):
        trials.append(tmp_path / f"trial{seed}.json")
        detect.main(
            [
                "--config",
                cfg,
                "--checkpoint",
                str(ckpt_path),
                "--data",
                str(devkit),
                "--seed",
                str(seed),
                "--out",
                str(trials[-1]),
            ]
        )
    runs = [json.loads(t.read_text()) for t in trials]
    assert [r["seed"] for r in runs] == [3, 4] and {r["head"] for r in runs} == {"c4"}
    assert runs[0]["train_set"] == "VOC 2007/trainval+2012/trainval" and runs[0]["val_set"] == "VOC 2007/test"
    assert (runs[0]["num_train_images"], runs[0]["num_val_images"]) == (16, 8)
    assert runs[0]["train_loss"] != runs[1]["train_loss"]  # the seed changes the run
    assert runs[0]["iterations"] == 6 and len(runs[0]["train_loss"]) == 2
    # scored by VOC's protocol (2007 test: the 11-point metric), the COCO-style numbers beside
    assert runs[0]["protocol"].startswith("VOC 11point AP") and runs[0]["APs"] is None
    assert set(runs[0]["coco_style"]) >= set(detect.AP_KEYS)
    assert set(runs[0]["per_class_AP50"]) <= set(VOC_CLASSES)
    assert runs[0]["normalisation"] == "backbone frozen BN (pretrained statistics), new layers none, batch 4"
    summary_job(["--out", str(tmp_path / "detect.json"), *map(str, trials)])
    summary = json.loads((tmp_path / "detect.json").read_text())
    assert summary["n"] == 2 and [t["seed"] for t in summary["trials"]] == [3, 4]
    for key in ("AP", "AP50"):
        a, b = runs[0][key], runs[1][key]
        assert summary[key] == pytest.approx((a + b) / 2, abs=1e-3)
        assert summary["std"][key] == pytest.approx(abs(a - b) / 2**0.5, abs=1e-3)


def test_summary_of_one_trial_has_no_std(tmp_path):
    (tmp_path / "t0.json").write_text(json.dumps({"AP": 10.0, "AP50": 20.0, "AP75": None, "seed": 0}))
    s = detect.summarize_trials([tmp_path / "t0.json"], tmp_path / "d.json")
    assert (s["AP"], s["std"]["AP"], s["AP75"], s["n"]) == (10.0, None, None, 1)
    with pytest.raises(SystemExit, match="detection trial unreadable: .*t1.json"):
        summary_job(["--out", str(tmp_path / "d.json"), str(tmp_path / "t1.json")])


def test_the_summary_job_imports_no_torch():
    """A cell's detect.json averages JSON files: its job, one per cell, pays no torch, torchvision
    or pycocotools start-up (3.6 s of imports in the fine-tuning stage)."""
    code = (
        "import sys, pipeline.transfer.summary\n"
        "print(sorted(m for m in ('torch', 'torchvision', 'pycocotools') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "[]"


def test_cli_errors_exit_with_a_message(det_dir, ckpt_path, tmp_path):
    args = ["--checkpoint", str(ckpt_path), "--out", str(tmp_path / "m.json")]
    with pytest.raises(SystemExit, match=r"\[detect\] error: .*: neither a COCO folder"):
        detect.main(["--config", json.dumps({"detect": TINY}), "--data", str(tmp_path), *args])
    with pytest.raises(SystemExit, match=r"\[detect\] error: .*detect.norm"):
        detect.main(["--config", json.dumps({"detect": {**TINY, "norm": "batch"}}), "--data", str(det_dir), *args])
    with pytest.raises(
        SystemExit, match=r"\[detect\] error: detect.norm: gn needs a backbone pretrained with GroupNorm"
    ):
        detect.main(["--config", json.dumps({"detect": {**TINY, "norm": "gn"}}), "--data", str(det_dir), *args])
    with pytest.raises(SystemExit, match=r"\[detect\] error: checkpoint not found"):
        detect.main(
            [
                "--config",
                json.dumps({"detect": TINY}),
                "--data",
                str(det_dir),
                "--checkpoint",
                str(tmp_path / "nope.pt"),
                "--out",
                str(tmp_path / "m.json"),
            ]
        )
    assert not (tmp_path / "m.json").exists()


def test_ranks_that_drifted_apart_fail(ckpt_path, monkeypatch):
    detector = detect.build_detector(checkpoint.load(ckpt_path), section("detect", TINY), num_classes=11)
    detect.distributed.check_ranks_agree(detector, "detector")  # one process: trivially equal
    monkeypatch.setattr(detect.distributed, "gather_objects", lambda x: [x, x + 1e-3])
    with pytest.raises(RuntimeError, match="detector weights differ across ranks"):
        detect.distributed.check_ranks_agree(detector, "detector")


@pytest.mark.timeout(600)
@pytest.mark.integration
def test_two_ranks_fine_tune_one_detector(det_dir, ckpt_path, tmp_path):
    """detect.ranks: 2 through torchrun (gloo on CPU): the batch is split over the ranks, DDP
    keeps their weights equal (checked after training), rank 0 alone scores and writes."""
    out = tmp_path / "metrics.json"
    cfg = json.dumps({"detect": {**TINY, "norm": "bn", "ranks": 2, "threads": 1}})
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            "-m",
            "pipeline.detect",
            "--config",
            cfg,
            "--checkpoint",
            str(ckpt_path),
            "--data",
            str(det_dir),
            "--seed",
            "1",
            "--out",
            str(out),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=540,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    m = json.loads(out.read_text())
    assert (m["ranks"], m["seed"], m["norm"]) == (2, 1, "bn")
    assert m["sync_bn"] is False  # SyncBN needs GPUs; on CPU each rank normalises its own images
    assert len(m["train_loss"]) == 1 and 0 <= m["AP50"] <= 100
    assert proc.stdout.count("COCO bbox") == 1  # one evaluation, by rank 0
    assert "2 rank(s) on cpu" in proc.stdout


def test_image_sizes_shorter_side_and_cap(ckpt_path):
    """image_size sets the shorter side; max_image_size caps the longer one (default: image_size)."""
    ckpt = checkpoint.load(ckpt_path)
    wide = [torch.rand(3, 40, 80)]
    square = detect.build_detector(ckpt, section("detect", TINY), num_classes=11).eval()
    assert square.transform(wide)[0].image_sizes == [(32, 64)]  # bounded by 64 x 64
    capped = detect.build_detector(ckpt, section("detect", {**TINY, "max_image_size": 200}), num_classes=11).eval()
    assert capped.transform(wide)[0].image_sizes == [(64, 128)]  # shorter side 64, as Detectron2's 800/1333


# --- the reference's settings: proposals, RoIs, scales, schedule ------------------------------


def test_proposal_and_roi_counts_come_from_the_config(ckpt_path):
    ckpt = checkpoint.load(ckpt_path)
    scenes = detect.build_detector(ckpt, section("detect", TINY), num_classes=11)  # the defaults, sized for the scenes
    assert scenes.rpn._pre_nms_top_n == {"training": 1000, "testing": 500}
    assert scenes.rpn._post_nms_top_n == {"training": 300, "testing": 150}
    assert scenes.roi_heads.fg_bg_sampler.batch_size_per_image == 128
    reference = {"pre_nms_train": 12000, "post_nms_train": 2000, "pre_nms_test": 6000, "post_nms_test": 1000}
    paper = detect.build_detector(
        ckpt, section("detect", {**TINY, "head": "c4", "rpn": reference, "roi_per_image": 512}), num_classes=21
    )
    assert paper.rpn._pre_nms_top_n == {"training": 12000, "testing": 6000}
    assert paper.rpn._post_nms_top_n == {"training": 2000, "testing": 1000}
    assert paper.roi_heads.fg_bg_sampler.batch_size_per_image == 512


def test_multi_scale_training_and_single_scale_test(ckpt_path):
    ckpt = checkpoint.load(ckpt_path)
    detector = detect.build_detector(
        ckpt, section("detect", {**TINY, "train_sizes": [48, 56, 64], "max_image_size": 200}), num_classes=11
    ).train()
    torch.manual_seed(0)
    sides = {min(detector.transform([torch.rand(3, 40, 80)])[0].image_sizes[0]) for _ in range(40)}
    assert sides == {48, 56, 64}  # each image draws its shorter side
    detect.test_scale(detector, section("detect", {**TINY, "image_size": 64}))
    detector.eval()
    assert detector.transform([torch.rand(3, 40, 80)])[0].image_sizes == [(64, 128)]


def test_step_schedule_drops_at_the_reference_iterations():
    voc = section("detect", {"schedule": "step", "lr_steps": [18000, 22000], "iterations": 24000})
    f = detect.fine_tune_schedule(voc, 24000).factor
    assert f(0) == pytest.approx(0.01) and f(99) == 1.0  # linear warmup over 100 iterations
    assert f(17999) == 1.0 and f(18000) == pytest.approx(0.1) and f(21999) == pytest.approx(0.1)
    assert f(22000) == pytest.approx(0.01) and f(23999) == pytest.approx(0.01)
    cosine = detect.fine_tune_schedule(section("detect", {}), 24000)
    assert cosine.factor(12050) == pytest.approx(0.5, abs=1e-12)  # half way through the 23,900 after warmup
    short = detect.fine_tune_schedule(section("detect", {"warmup_iters": 500}), 40)  # a quarter of 40 at most
    assert short.warmup == 10 and short.factor(0) == pytest.approx(0.1)


def test_embedded_scenes_as_a_voc_devkit(det_dir, tmp_path):
    from pipeline.data.detection import main as to_voc_cli

    to_voc_cli(["--coco", str(det_dir), "--out", str(tmp_path / "VOCdevkit")])
    train, val = load_splits(tmp_path / "VOCdevkit", "voc", Voc(train=("2007/trainval",), val="2007/test"))
    assert (val.kind, val.year, len(train.coco["images"]), len(val.coco["images"])) == ("voc", "2007", 16, 8)
    truth = [
        {"image_id": a["image_id"], "category_id": a["category_id"], "bbox": a["bbox"], "score": 1.0}
        for a in val.coco["annotations"]
    ]
    m = detect.evaluate(val, truth, section("detect", {"task": "detection", "voc_metric": "auto"}))
    assert m["AP50"] == m["AP"] == pytest.approx(100.0) and m["coco_style"]["AP"] == pytest.approx(100.0)
    assert m["protocol"].startswith("VOC 11point")
    area = detect.evaluate(val, truth, section("detect", {"task": "detection", "voc_metric": "area"}))
    assert area["protocol"].startswith("VOC area")


def bn_detector() -> nn.Module:
    torch.manual_seed(0)
    ckpt = {"arch": ARCH, "backbone": build_backbone(ARCH).state_dict()}
    return detect.build_detector(
        ckpt, section("detect", {"norm": "bn", "image_size": 64, "fpn_channels": 16}), num_classes=3
    )


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


def test_normalisation_names_each_part_group_norm_and_syncbn():
    gn = section("detect", {"norm": "gn", "batch_size": 16})
    assert detect.normalisation(gn, False, 1) == "backbone GroupNorm, new layers GroupNorm, batch 16"
    bn = section("detect", {"norm": "bn", "batch_size": 16})
    synced = "SyncBN over 16 images (8 ranks x 2)"
    assert detect.normalisation(bn, True, 8) == f"backbone {synced}, new layers {synced}, batch 16"
    bn_gn = section("detect", {"norm": "bn", "head_norm": "gn", "batch_size": 4})
    assert detect.normalisation(bn_gn, False, 1) == "backbone BN over 4 images, new layers GroupNorm, batch 4"


@pytest.mark.parametrize("batch,lr", [(16, 0.02), (4, 0.005), (2, 0.0025), (64, 0.08)])
def test_detection_lr_null_follows_detectron2s_rule(batch, lr):
    """lr null: Detectron2's BASE_LR 0.02 at IMS_PER_BATCH 16, scaled linearly (hand-computed
    values); a number, the default 0.02 included, is used as it is at any batch."""
    assert section("detect", {"batch_size": batch, "lr": None}).learning_rate == pytest.approx(lr)
    assert section("detect", {"batch_size": batch, "lr": 0.03}).learning_rate == 0.03
    assert section("detect", {"batch_size": batch}).learning_rate == 0.02


@pytest.mark.parametrize(
    "norm,head_norm,new_layers",
    [("frozen_bn", "auto", "none"), ("bn", "auto", "bn"), ("gn", "auto", "gn"), ("frozen_bn", "bn", "bn")],
)
def test_head_norm_auto_follows_the_backbone(norm, head_norm, new_layers):
    assert section("detect", {"norm": norm, "head_norm": head_norm}).new_layers_norm == new_layers


def test_group_norm_in_the_new_layers_over_a_trained_bn_backbone(ckpt_path, det_dir):
    """head_norm gn over norm bn: the backbone keeps its (trained) BatchNorms and the pretrained
    weights, FPN and the heads get GroupNorm; one step moves the backbone's BN affine."""
    ckpt = checkpoint.load(ckpt_path)
    dc = section("detect", {**TINY, "task": "segmentation", "norm": "bn", "head_norm": "gn"})
    detector = detect.build_detector(ckpt, dc, num_classes=11)
    detect.verify_backbone(detector, ckpt["backbone"])
    body, new = (
        detector.backbone.body,
        [detector.backbone.fpn, detector.roi_heads.box_head, detector.roi_heads.mask_head],
    )
    assert any(isinstance(m, torch.nn.BatchNorm2d) for m in body.modules())
    assert not any(isinstance(m, FrozenBatchNorm2d) for m in detector.modules())
    for part in new:
        kinds = {type(m) for m in part.modules()}
        assert torch.nn.GroupNorm in kinds and torch.nn.BatchNorm2d not in kinds
    images, targets = detect.collate([detect.CocoBoxes(load_splits(det_dir)[0], masks=True)[i] for i in range(2)])
    detector.train()
    loss = sum(detector(list(images), list(targets)).values())
    loss.backward()
    assert torch.isfinite(loss) and body.bn1.weight.grad.abs().sum() > 0


def test_configured_anchor_sizes_are_used_as_given():
    dc = section("detect", {"anchor_sizes": [8, 16, 32, 64, 128], "image_size": 64})
    assert detect.anchor_sizes(dc) == [8, 16, 32, 64, 128]


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


def test_epoch_seeded_has_its_datasets_length():
    from pipeline.transfer.data import EpochSeeded
    from pipeline.transfer.train import to_device

    data = torch.utils.data.TensorDataset(torch.arange(7))
    wrapped = EpochSeeded(data, seed=3)
    assert len(wrapped) == 7
    assert wrapped[(0, 4)][0].item() == 4  # keyed (epoch, index)
    images, targets = to_device([torch.zeros(1)], [{"boxes": torch.ones(1), "id": 5}], "cpu")
    assert images[0].device.type == "cpu" and targets[0]["boxes"].device.type == "cpu" and targets[0]["id"] == 5
