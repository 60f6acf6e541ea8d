"""Exports load strictly into torchvision, timm and (by key and value) Detectron2's format, and
give the same features as our backbone."""

import hashlib
import json
import pickle

import pytest
import torch

from pipeline import export
from pipeline.nets.models import build_backbone
from pipeline.runtime import checkpoint


def make_checkpoint(tmp_path, arch, seed=0):
    torch.manual_seed(seed)
    backbone = build_backbone(arch)
    with torch.no_grad():  # non-default BN statistics: a lost buffer would show in the features
        for mod in backbone.modules():
            if isinstance(mod, torch.nn.BatchNorm2d):
                mod.running_mean.uniform_(-0.2, 0.2)
                mod.running_var.uniform_(0.5, 1.5)
    path = tmp_path / "checkpoint.pt"
    checkpoint.save(
        path, arch=arch, method="moco", backbone=backbone.state_dict(), config={"pretrain": {"method": "moco", **arch}}
    )
    (tmp_path / "probe.json").write_text(json.dumps({"top1": 42.5, "knn_top1": 40.0}))
    return path, backbone.eval()


def run_export(tmp_path, arch):
    path, ours = make_checkpoint(tmp_path, arch)
    out = tmp_path / "export" / "export.json"
    export.main(
        ["--checkpoint", str(path), "--probe", str(tmp_path / "probe.json"), "--cell", "base", "--out", str(out)]
    )
    return json.loads(out.read_text()), out.parent, ours


@pytest.mark.parametrize("cifar_stem, norm", [(False, "bn"), (True, "bn"), (False, "gn")])
def test_resnet_loads_into_torchvision_strictly_with_equal_features(tmp_path, cifar_stem, norm):
    import torchvision

    arch = {"backbone": "resnet18", "width": 64, "cifar_stem": cifar_stem, "norm": norm}
    sidecar, folder, ours = run_export(tmp_path, arch)
    loading = sidecar["files"]["torchvision.pth"]["load"]
    scope = {"torch": torch, "torchvision": torchvision, "path": folder / "torchvision.pth"}
    exec(loading, scope)  # the sidecar's own instructions
    model = scope["model"].eval()
    x = torch.randn(2, 3, 32 if cifar_stem else 64, 32 if cifar_stem else 64)
    with torch.no_grad():
        assert torch.allclose(model(x), ours(x), atol=1e-5)
    assert "fc is not exported" in loading


def test_detectron2_pickle_holds_every_tensor_under_its_names(tmp_path):
    arch = {"backbone": "resnet50", "width": 64, "cifar_stem": False}
    sidecar, folder, ours = run_export(tmp_path, arch)
    blob = pickle.loads((folder / "detectron2.pkl").read_bytes())
    assert blob["matching_heuristics"] is True and blob["__author__"]
    model, state = blob["model"], ours.state_dict()
    names = {
        "stem.conv1.weight": "conv1.weight",
        "stem.conv1.norm.running_var": "bn1.running_var",
        "res2.0.shortcut.weight": "layer1.0.downsample.0.weight",
        "res2.0.shortcut.norm.bias": "layer1.0.downsample.1.bias",
        "res5.2.conv3.norm.weight": "layer4.2.bn3.weight",
        "res4.5.conv2.weight": "layer3.5.conv2.weight",
    }
    for d2, tv in names.items():
        assert torch.equal(torch.from_numpy(model[d2]), state[tv]), d2
    assert len(model) == len([k for k in state if not k.endswith("num_batches_tracked")])


def test_vit_loads_into_timm_strictly_with_equal_features(tmp_path):
    import timm

    arch = {"backbone": "vit_tiny", "patch_size": 4, "image_size": 32, "depth": 2}
    sidecar, folder, ours = run_export(tmp_path, arch)
    scope = {"torch": torch, "timm": timm, "path": folder / "timm.pth"}
    exec(sidecar["files"]["timm.pth"]["load"], scope)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.allclose(scope["model"].eval()(x), ours(x), atol=1e-5)


def test_sidecar_names_the_cell_its_accuracy_and_each_files_hash(tmp_path):
    sidecar, folder, _ = run_export(tmp_path, {"backbone": "resnet18", "width": 16, "cifar_stem": True})
    assert (sidecar["cell"], sidecar["method"], sidecar["probe_top1"], sidecar["knn_top1"]) == (
        "base",
        "moco",
        42.5,
        40.0,
    )
    assert sidecar["params"]["backbone"] == "resnet18" and set(sidecar["files"]) == {
        "torchvision.pth",
        "detectron2.pkl",
    }
    for name, record in sidecar["files"].items():
        assert record["sha256"] == hashlib.sha256((folder / name).read_bytes()).hexdigest()
    # width 16 is no torchvision ResNet: the sidecar says how to load it instead
    assert "build_backbone" in sidecar["files"]["torchvision.pth"]["load"]


def test_export_names_a_missing_checkpoint(tmp_path):
    from pipeline import export

    missing = tmp_path / "checkpoint.pt"
    with pytest.raises(SystemExit, match=rf"^\[export\] error: checkpoint not found: {missing}$"):
        export.main(["--checkpoint", str(missing), "--out", str(tmp_path / "export.json")])
