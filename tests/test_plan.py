"""The cost plan (pipeline.plan): its arithmetic on a grid computed by hand, the training set's
size, the profile's runtimes, and that it runs without torch."""

import json
import re
import shlex
import sys

import pytest

from pipeline import plan
from pipeline.dag.config import ConfigError, load_config, load_yaml, merge, section
from pipeline.dag.grid import Cell
from pipeline.dag.training_set import training_set
from pipeline.plan import DetectionSpeed, Throughput, make_plan, merged_config, minutes, render
from tests.conftest import BASE_MOCO, REPO, require, run, snakemake_cli

# Figures of made-up GPUs with round numbers, so that every expectation below is mental arithmetic.
THROUGHPUT = (
    Throughput("resnet50", 224, "moco v1/v2", 250.0, "X100", "test"),
    Throughput("resnet50", 112, "supervised", 1000.0, "Y100", "test"),
)
DETECTION = (DetectionSpeed("resnet50", "fpn", 0.5, 16, 8, "Z100", "test"),)
PROFILE = {
    "jobs": 2,
    "default-resources": {"runtime": 60},  # not the pretrain rule's: it sets its own runtime
    "set-resources": {"pretrain": {"tasks_per_node": 2}, "detect": {"runtime": 20}},
}


def config(tmp_path) -> dict:
    cfg = merge(
        merged_config([], []),
        {
            "results": str(tmp_path / "results"),
            "dataset": {"source": "cifar10", "root": str(tmp_path / "cifar")},  # 50,000 training images
            "data": {"crop_size": 224},
            "pretrain": {"backbone": "resnet50", "width": 64, "cifar_stem": False, "epochs": 36, "batch_size": 256,
                         "K": 4096},
            "detect": {"enabled": True, "root": str(tmp_path / "coco"), "cells": ["base"], "task": "detection",
                       "head": "fpn", "iterations": 900,
                       "batch_size": 8,
                       "ranks": 2, "trials": 2},
        },
    )  # fmt: skip
    cfg["grid"] = {
        "one_at_a_time": {"batch_size": [512]},
        "baselines": ["random", "supervised"],
        # runtime = 10 + 0.5 x epochs x 2.5 (ResNet-50) / nodes; one node per 256 images of batch
        "resources": {"minutes_per_epoch": 0.5, "overhead_minutes": 10, "nodes": 1, "batch_per_node": 256},
    }
    return cfg


def test_plan_arithmetic_on_a_hand_computed_grid(tmp_path):
    plan = make_plan(load_config(config(tmp_path)), PROFILE, THROUGHPUT, DETECTION)
    rows = {r["cell"]: r for r in plan["cells"]}
    assert list(rows) == ["base", "batch_size=512", "method=random", "method=supervised"]
    assert plan["images"] == 50_000
    assert {r["images_x_epochs"] for r in rows.values()} == {1_800_000}  # 50,000 x 36

    base = rows["base"]  # 1,800,000 / 250 img/s = 7,200 s = 2 GPU-hours; 1 node x 2 GPUs: 1 h
    assert (base["gpus"], base["gpu"], base["runtime_min"]) == (2, "X100", 55)  # 10 + 0.5 x 36 x 2.5
    assert base["gpu_hours"] == pytest.approx(2.0) and base["wall_h"] == pytest.approx(1.0)
    assert base["exceeds"]  # 60 min > 55 min

    wide = rows["batch_size=512"]  # 2 nodes x 2 GPUs: 0.5 h; runtime 10 + 45 / 2 = 32.5 -> 33 min
    assert (wide["nodes"], wide["gpus"], wide["runtime_min"]) == (2, 4, 33)
    assert wide["gpu_hours"] == pytest.approx(2.0) and wide["wall_h"] == pytest.approx(0.5)
    assert not wide["exceeds"]

    sup = rows["method=supervised"]  # 1000 img/s at 112 px = 250 img/s at 224 px (4x the pixels)
    assert sup["img_per_s"] == pytest.approx(250.0)
    assert sup["gpu"] == "Y100" and sup["gpu_hours"] == pytest.approx(2.0) and sup["exceeds"]

    assert rows["method=random"]["gpu_hours"] == 0

    det = plan["detect"]  # 900 iterations x 0.5 s x (8 / 16 images) x 8 GPUs = 1,800 GPU-s = 0.5 h
    assert (det["cells"], det["jobs"]) == (["base"], 2)
    assert det["per_trial_gpu_hours"] == pytest.approx(0.5)
    assert det["wall_h"] == pytest.approx(0.25) and not det["exceeds"]  # on 2 ranks: 15 min <= 20

    # the probe (cached: one forward pass of the 50,000 images) at 4 x 250 = 1,000 img/s: the MoCo
    # figure's step is the query's forward + backward (3 forwards) and the key's forward (1)
    probe = {r["cell"]: r for r in plan["probes"]}["base"]
    assert (probe["passes"], probe["gpus"], probe["gpu"], probe["img_per_s"]) == (1, 1, "X100", 1000.0)
    assert probe["gpu_hours"] == pytest.approx(50 / 3600)  # 50,000 / 1,000 = 50 s
    assert probe["runtime_min"] == 60 and not probe["exceeds"]  # the profile's default-resources

    assert plan["gpu_hours"]["pretrain"] == pytest.approx({"X100": 4.0, "Y100": 2.0})
    assert plan["gpu_hours"]["probe"] == pytest.approx({"X100": 200 / 3600})  # 4 probes x 50 s
    assert plan["gpu_hours"]["total"] == pytest.approx({"X100": 4.0 + 200 / 3600, "Y100": 2.0, "Z100": 1.0})
    # jobs: 2 -> walls 1.0, 1.0 on two slots, then 0.5 after one of them; probes 50 s x 2 on each
    # slot: 100 s; detection 0.25 | 0.25
    walls = {"pretrain": 1.5, "probe": 100 / 3600, "detect": 0.25, "total": 1.75 + 100 / 3600}
    assert plan["wall_h"] == pytest.approx(walls)
    assert plan["exceeding"] == ["base", "method=supervised"]
    assert plan["short_after_retries"] == ["base", "method=supervised"]  # no retries in the profile
    assert plan["probe_jobs"] == 4


def test_retries_give_time_limits_that_grow_with_the_attempt(tmp_path):
    plan = make_plan(load_config(config(tmp_path)), {**PROFILE, "restart-times": 1}, THROUGHPUT, DETECTION)
    assert plan["attempts"] == 2  # 55 + 110 min >= 60 min
    assert plan["exceeding"] == ["base", "method=supervised"] and plan["short_after_retries"] == []


def test_the_augmented_probe_against_its_limits_across_retries(tmp_path):
    """probe.mode augmented, 35 epochs: the features once + 35 epochs = 36 passes of 50,000
    images at 1,000 img/s = 1,800 s = 30 min on its one GPU."""
    cfg = merge(config(tmp_path), {"probe": {"mode": "augmented", "epochs": 35}})
    plans = {}
    for runtime in ("12 * attempt", "4 * attempt"):
        resources = {**PROFILE["set-resources"], "probe": {"runtime": runtime}}
        profile = {**PROFILE, "restart-times": 2, "set-resources": resources}
        plans[runtime] = make_plan(load_config(cfg), profile, THROUGHPUT, DETECTION)
    probe = {r["cell"]: r for r in plans["12 * attempt"]["probes"]}["base"]
    assert probe["passes"] == 36 and probe["wall_h"] == pytest.approx(0.5)
    # 12, 24, 36 min: over the first attempt, done within the second (12 + 24 = 36 >= 30)
    assert (probe["runtime_min"], probe["limit_all_min"]) == (12, 72)
    assert probe["exceeds"] and not probe["short"] and probe["attempts_needed"] == 2
    assert "probe base" in plans["12 * attempt"]["exceeding"]
    assert "probe base" not in plans["12 * attempt"]["short_after_retries"]
    # 4 + 8 + 12 = 24 min < 30: no attempt finishes it
    short = plans["4 * attempt"]
    assert "probe base" in short["short_after_retries"]
    assert "EXCEEDS all 3 attempts (0.4 h)" in render(short, "p")


def test_no_figure_is_not_estimated(tmp_path):
    cfg = config(tmp_path)
    cfg["pretrain"]["cifar_stem"] = True  # 16x the compute of the published ResNet-50's stem
    plan = make_plan(load_config(cfg), PROFILE, THROUGHPUT, DETECTION)
    rows = {r["cell"]: r for r in plan["cells"]}
    assert rows["base"]["gpu_hours"] is None and "cifar_stem=False" in rows["base"]["note"]
    probe = {r["cell"]: r for r in plan["probes"]}["base"]  # its figure is the training one
    assert probe["gpu_hours"] is None and "cifar_stem=False" in probe["note"]
    assert "base" in plan["probes_not_estimated"]


@pytest.mark.parametrize(
    "value, expected", [(90, 90), ("240 * attempt", 240), ("2h", 120), ("1d 4h", 1680), ("90m", 90)]
)
def test_profile_runtimes_in_minutes(value, expected):
    assert minutes(value) == expected


def test_training_images_from_this_datasets_report_only(tmp_path):
    cfg = config(tmp_path)
    report = tmp_path / "results/data/ffcv/train.json"
    report.parent.mkdir(parents=True)
    report.write_text(json.dumps({"source": {"kind": "cifar10", "root": cfg["dataset"]["root"]}, "num_samples": 123}))
    assert training_set(load_config(cfg)).images == 123
    report.write_text(json.dumps({"source": {"kind": "cifar10", "root": "/elsewhere"}, "num_samples": 123}))
    found = training_set(load_config(cfg))
    assert (found.images, found.classes) == (50_000, 10) and "another dataset" in found.where


def test_a_folder_dataset_declares_its_size_or_the_plan_asks_for_it(tmp_path):
    cfg = config(tmp_path)
    cfg["dataset"] = {"source": "imagefolder", "root": str(tmp_path)}
    with pytest.raises(ConfigError, match=r"dataset.train_images: .* declare it \(ImageNet-1k: 1281167\)"):
        training_set(load_config(cfg))
    cfg["dataset"]["train_images"] = 1_281_167
    assert training_set(load_config(cfg)).images == 1_281_167


def test_imagenet_preset_without_torch():
    """The ImageNet v2 preset's base cell is the official run: 200 epochs of ImageNet-1k, which
    took 53 h on 8 V100 = 424 V100-hours. The plan never imports torch."""
    code = (
        "import sys; from pipeline.plan import main; "
        "main(['--configfile', 'workflow/config/presets/imagenet-mocov2.yaml']); "
        "print('torch imported' if 'torch' in sys.modules else 'no torch')"
    )
    out = run([sys.executable, "-c", code], timeout=60).stdout
    base = next(line for line in out.splitlines() if line.startswith("base "))
    assert "424.0 V100" in base and "EXCEEDS" in base  # 106 h on the profile's 4 GPUs > 33.8 h
    assert out.rstrip().endswith("no torch")


@pytest.mark.integration
def test_snakemake_plan_before_the_data_is_staged(tmp_path):
    """The ImageNet preset's folders (/datasets/imagenet, /datasets/VOCdevkit) do not exist here:
    the plan needs none of them; every stage is costed and logged."""
    preset = "workflow/config/presets/imagenet-mocov2.yaml"
    proc = run([*snakemake_cli(), "plan", "--configfile", preset, "--config", f"results={tmp_path / 'r'}"], timeout=120)
    assert "Cost plan: 6 cells, profile profiles/slurm (jobs: 50, restart-times: 2)" in proc.stdout
    for stage in ("Pretraining: ", "Linear probe: ", "Detection transfer: "):
        line = next(line for line in proc.stdout.splitlines() if line.startswith(stage))
        assert "V100-hours" in line, line
    assert (tmp_path / "r/logs/plan.log").read_text().startswith("Cost plan: 6 cells")


@pytest.mark.integration
def test_a_missing_dataset_folder_still_stops_the_jobs_that_read_it(tmp_path):
    preset = "workflow/config/presets/imagenet-mocov2.yaml"
    cmd = [*snakemake_cli(), "-n", "--configfile", preset, "--config", f"results={tmp_path}"]
    proc = run(cmd, check=False, timeout=120)
    assert proc.returncode != 0 and "dataset.root: folder not found: /datasets/imagenet" in proc.stdout + proc.stderr


def test_the_claims_plan_says_what_it_will_not_train(tmp_path):
    # CIFAR-10 (50,000) at batch 256, claims.epochs 5: 195 x 5 = 975 steps, short of the 34,656
    # that 5 half-lives of m = 0.9999 need: its claim is not decidable, its cells not planned
    cfg = merge(
        config(tmp_path),
        {"claims": {"epochs": 5, "long_epochs": 13, "m": [0.5, 0.99, 0.999, 0.9999], "K": [256, 1024]}},
    )
    # SimCLR at 4 x 256 = 1,024: 48 x 5 = 240 steps, short of 5 half-lives of the reference's
    # m = 0.99 (345): MoCo's queue against it is not decidable either
    plan = make_plan(load_config(cfg), PROFILE, THROUGHPUT, DETECTION, claims=True)
    assert list(plan["not_trained"]) == ["slow_m", "queue_vs_batch"] and "has 975" in plan["not_trained"]["slow_m"]
    assert plan["not_trained"]["queue_vs_batch"] == "SimCLR at 1,024 has 240 steps, needs ≥ 345: claims.epochs ≥ 8"
    assert not [r["cell"] for r in plan["cells"] if "m=0.999" in r["cell"]]  # 0.999 and 0.9999: only it needs them
    assert plan["detect"]["jobs"] == 0  # the claims rest on the probe
    text = render(plan, "profiles/slurm")
    assert text.startswith("Cost plan of the claims study: ")
    assert "Not trained, this budget cannot decide it: slow_m (needs ≥ 34,656 steps, has 975" in text
    # 5 epochs against the BYOL paper's 300: its collapse claims can hold, never be contradicted
    one_way = "holds if every seed collapses; contradicted only at ≥ 300 epochs, has 5"
    assert plan["one_sided"] == {k: one_way for k in ("byol_predictor", "byol_predictor_lars", "byol_ema")}
    assert f"Trained, decidable one way only: byol_ema ({one_way})" in text
    from pipeline.dag.claims_plan import Budget, one_sided

    source_length = Budget(images=50_000, classes=10, batch=256, epochs=300, m=0.99, byol_m=0.99)
    assert one_sided(load_config(cfg).claims, source_length) == {}  # at the source's length: both ways


def test_the_coco_mask_rcnn_presets_are_costed():
    """Detectron2's model zoo: Mask R-CNN R50-C4 0.584 s/iter and R50-FPN 0.261 s/iter, 16
    images on 8 V100. The C4 2x preset: 180,000 x 0.584 s x 8 GPUs = 233.6 V100-hours per
    trial (29.2 h wall on its 8 ranks); the FPN 1x preset: 90,000 x 0.261 x 8 / 3600 = 52.2."""
    presets = "workflow/config/presets/"
    for extra, per_trial, wall in ((), 233.6, 29.2), (("imagenet-mocov2-coco-fpn.yaml",), 52.2, 6.525):
        files = [presets + f for f in ("imagenet-mocov2.yaml", "imagenet-mocov2-coco.yaml", *extra)]
        plan = make_plan(load_config(merged_config(files, [])), PROFILE)
        det = plan["detect"]
        assert det["task"] == "segmentation" and "Mask R-CNN" in det["source"]
        assert det["per_trial_gpu_hours"] == pytest.approx(per_trial) and det["wall_h"] == pytest.approx(wall)
        assert "Detection transfer (Mask R-CNN): " in render(plan, "profiles/slurm")


def test_the_documented_plan_is_what_the_command_prints():
    """docs/cost-model.md quotes `$ python -m pipeline.plan ...` and its output: run that command
    line and compare, so the quote cannot go stale (a failure shows the output to paste)."""
    page = (REPO / "docs" / "cost-model.md").read_text()
    found = re.search(r"```\n\$ (python -m pipeline\.plan [^\n]*)\n(.*?)```", page, re.S)
    assert found, "docs/cost-model.md: no quoted `$ python -m pipeline.plan ...` block"
    args = shlex.split(found[1])[1:]
    results = next(a.split("=", 1)[1] for a in args if a.startswith("results="))
    # a clean checkout (CI's) has no such folder; a developer's may: skip there, fail in CI
    require(not (REPO / results).exists(), f"{results} exists here: its conversion report would change the plan")
    out = run([sys.executable, *args], timeout=60).stdout
    assert out == found[2], f"docs/cost-model.md's plan is stale; the command prints:\n{out}"


def test_a_pinned_gres_gives_the_gpus_per_node(tmp_path):
    """No tasks_per_node: the pretrain rule's gres "gpu:a100:4" gives 4 GPUs per node; the detect
    rule's gres (4 GPUs) differs from detect.ranks (2): the rendered plan notes it."""
    resources = {"pretrain": {"gres": "gpu:a100:4"}, "detect": {"runtime": 20, "gres": "gpu:a100:4"}}
    plan = make_plan(load_config(config(tmp_path)), {**PROFILE, "set-resources": resources}, THROUGHPUT, DETECTION)
    rows = {r["cell"]: r for r in plan["cells"]}
    # base: 1 node x 4 GPUs; 2 GPU-hours (as in the hand-computed grid) / 4 = 0.5 h wall
    assert (rows["base"]["nodes"], rows["base"]["gpus"]) == (1, 4)
    assert rows["base"]["gpu_hours"] == pytest.approx(2.0) and rows["base"]["wall_h"] == pytest.approx(0.5)
    # batch 512: 2 nodes x 4 GPUs = 8; 2 / 8 = 0.25 h
    assert rows["batch_size=512"]["gpus"] == 8 and rows["batch_size=512"]["wall_h"] == pytest.approx(0.25)
    assert (plan["detect"]["ranks"], plan["detect"]["profile_gpus"]) == (2, 4)
    text = render(plan, "p")
    assert "  note: detect.ranks is 2 but the profile's set-resources.detect.gres gives 4 GPU(s) per job" in text


def test_without_any_figure_nothing_is_estimated(tmp_path):
    """Empty throughput and detection tables: no pretraining, probe or detection figure, so no
    GPU-hours at all and no wall time."""
    plan = make_plan(load_config(config(tmp_path)), PROFILE, (), ())
    probe = {r["cell"]: r for r in plan["probes"]}["base"]
    assert probe["gpu_hours"] is None and probe["note"] == "no training figure for resnet50"
    det = plan["detect"]
    assert det["gpu_hours"] is None and det["jobs"] == 2  # 1 cell x 2 trials
    assert det["note"] == "not estimated (no figure for {'resnet50'} fpn detection)"
    assert plan["gpu_hours"]["total"] == {}
    text = render(plan, "p")
    assert "Wall time at jobs: 2: not estimated (no job has a throughput figure)" in text
    head = "Detection transfer: 2 jobs (1 cells x 2 trials), "
    assert head + "not estimated (no figure for {'resnet50'} fpn detection)" in text.splitlines()


def test_detection_without_iterations_is_not_estimated(tmp_path):
    cfg = config(tmp_path)
    cfg["detect"]["iterations"] = None
    det = make_plan(load_config(cfg), PROFILE, THROUGHPUT, DETECTION)["detect"]
    assert det["gpu_hours"] is None and det["note"] == "not estimated (detect.iterations unset)"


def test_plan_branches(tmp_path):
    p = section("pretrain", {**BASE_MOCO, "mechanism": "memory_bank"})
    assert plan.method_key(p) == "moco memory_bank"
    with pytest.raises(ConfigError, match="runtime 'soon' is neither minutes"):
        plan.minutes("soon")
    cfg = load_config(load_yaml(plan.DEFAULT_CONFIG))
    vit = Cell(section("pretrain", {"backbone": "vit_small", "variant": "v3"}), {})
    no_resnet = plan.detection_plan(cfg, {"base": vit}, {})
    assert no_resnet["jobs"] == 0 and no_resnet["note"] == "no detection transfer"
    with pytest.raises(ConfigError, match="--config epochs: expected key=value"):
        plan.merged_config([], ["epochs"])
    assert plan.merged_config([], ["results=/x"])["results"] == "/x"


def test_plan_cli_reports_a_bad_profile(tmp_path, capsys):
    assert plan.main(["--profile", str(tmp_path / "none")]) == 2
    assert capsys.readouterr().err == f"plan: profile not found: {tmp_path / 'none'} (a folder with config.yaml)\n"
