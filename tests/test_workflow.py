"""The whole DAG through Snakemake on the tiny preset: every stage real, end to end."""

import csv
import json
import os
import re

import pytest
from conftest import REPO, run, snakemake_cli

pytestmark = pytest.mark.integration  # a stage run as processes: make test-quick leaves it out

TINY = ["--configfile", "workflow/config/presets/tiny.yaml"]


def snakemake(results, *args, timeout=900):
    return run([*snakemake_cli(), *TINY, "--config", f"results={results}", "--cores", "2", *args], timeout=timeout)


def pretraining_jobs(counts: dict) -> int:
    """Pretraining jobs of a dry run, the random-init baseline's rule included."""
    return counts.get("pretrain", 0) + counts.get("pretrain_random_init", 0)


def jobs_planned(dry_run_stdout: str) -> dict:
    """Job counts from the 'Job stats' table of a dry run."""
    lines = dry_run_stdout.split("Job stats:")[1].splitlines()[3:]
    counts = {}
    for line in lines:
        parts = line.split()
        if len(parts) != 2 or parts[0] == "total":
            break
        counts[parts[0]] = int(parts[1])
    return counts


def test_dry_run_shows_full_dag(tmp_path):
    out = snakemake(tmp_path / "results", "-n").stdout
    # the random-init baseline is a rule of its own (one small process, never a GPU job)
    assert jobs_planned(out) == {
        "synthetic": 2,  # the classification images and the detection scenes
        "convert": 2,
        "pretrain": 4,
        "pretrain_random_init": 1,
        "probe": 5,
        "detect": 5,
        "detect_trials": 5,
        "tables": 1,
        "all": 1,
    }


def test_lint_is_clean():
    proc = run([*snakemake_cli(), "--lint"], timeout=120)
    assert "Congratulations" in proc.stdout + proc.stderr


def test_bad_config_fails_at_dag_build(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("pretrain:\n  K: 100\n  batch_size: 64\n")
    proc = run(
        [*snakemake_cli(), *TINY, "--configfile", str(bad), "--config", f"results={tmp_path}", "-n"],
        check=False,
        timeout=120,
    )
    assert proc.returncode != 0
    assert "K=100 is not a multiple of the global batch size 64" in proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def tiny_results(tmp_path_factory):
    """The whole tiny workflow, run once for the tests below."""
    results = tmp_path_factory.mktemp("tiny") / "results"
    snakemake(results)
    return results


@pytest.mark.slow
def test_tiny_workflow_end_to_end(tiny_results):
    results = tiny_results
    cells = sorted(p.name for p in (results / "cells").iterdir())
    assert cells == ["K=128", "base", "m=0.9", "method=random", "shuffle_bn=false"]
    for cell in cells:
        probe = json.loads((results / "cells" / cell / "probe.json").read_text())
        assert probe["mode"] == "cached" and 0 <= probe["top1"] <= probe["top5"] <= 100
        det = json.loads((results / "cells" / cell / "detect.json").read_text())
        assert {"AP", "AP50", "AP75"} <= set(det)
        assert (results / "logs" / "pretrain" / f"{cell}.log").is_file()
        assert (results / "benchmarks" / "pretrain" / f"{cell}.tsv").is_file()
    rows = list(csv.DictReader((results / "cells" / "base" / "pretrain" / "log.csv").open()))
    assert [int(r["epoch"]) for r in rows] == [1, 2]
    assert all(float(r["loss"]) > 0 and 0 <= float(r["inst_acc"]) <= 100 for r in rows)
    # K=256 at batch 64: the oldest key in the queue is K/B = 4 steps old
    assert float(rows[-1]["queue_age_max"]) == 256 / 64
    # the key encoder of the finished run: no optimizer entry, no gradient, the EMA replayed
    summary = json.loads((results / "cells" / "base" / "pretrain" / "summary.json").read_text())
    check = summary["key_encoder"]
    assert check["holds"] and check["ema_replay"]["steps"] == 3, check
    # where it ran: this CPU, these libraries; every table's footnote names it
    assert summary["provenance"]["versions"]["torch"] and summary["provenance"]["cpu"]["model"]
    main = (results / "tables" / "main.md").read_text()
    assert "random init" in main and "MoCo (base cell)" in main
    assert f"Ran on: CPU: {summary['provenance']['cpu']['model']}" in main
    assert summary["provenance"]["fast_path"] == "fp32" and "pretraining steps: fp32." in main  # auto: off on CPU
    assert (results / "tables" / "ablation_K.md").is_file() and (results / "tables" / "ablation_m.md").is_file()
    shuffle = {r["shuffle_bn"]: r for r in csv.DictReader((results / "tables" / "shuffle_bn.csv").open())}
    # the tiny preset's batch of 64 in one process: the most sub-batches of >= 32 images, 64 / 32
    assert shuffle["true"]["BN-leak guard"] == "keys shuffled across 2 BN sub-batches per rank"
    assert shuffle["false"]["BN-leak guard"] == "off (shuffle_bn: false)" and shuffle["false"]["top1"]
    # every job says where its time went, and the pipeline benchmark sets it beside Snakemake's
    timing = json.loads((results / "cells" / "base" / "pretrain" / "summary.json").read_text())["timing"]
    assert {"setup", "loader_first_batch", "steps", "data_wait", "knn_monitor", "checkpoints"} <= set(timing)
    # the phases do not overlap (a nested phase would count its seconds twice); their arithmetic
    # is checked by hand in test_stopwatch.py::test_stopwatch_report_by_hand
    named = sum(v for k, v in timing.items() if k not in ("other", "wall"))
    assert named <= timing["wall"] + 0.05  # rounding of each to 0.01 s
    from pipeline.bench import pipeline as bench_pipeline

    jobs = bench_pipeline.collect(results)
    phases = bench_pipeline.attribution(results, jobs)
    assert {"pretrain", "probe", "detect"} <= set(phases["stage"])
    assert (phases["outside"] >= -0.5).all() and (phases["wall"] <= phases["job_s"] + 0.5).all()
    # TensorBoard: every epoch of log.csv as scalars, and the probe's curve
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    board = EventAccumulator(str(results / "cells" / "base" / "tensorboard" / "pretrain")).Reload()
    assert [(e.step, round(e.value, 5)) for e in board.Scalars("pretrain/loss")] == [
        (int(r["epoch"]), float(r["loss"])) for r in rows
    ]
    assert {"pretrain/inst_acc", "pretrain/lr", "pretrain/m", "pretrain/queue_age_max", "pretrain/drift"} <= set(
        board.Tags()["scalars"]
    )
    probe_board = EventAccumulator(str(results / "cells" / "base" / "tensorboard" / "probe")).Reload()
    assert len(probe_board.Scalars("probe/val_top1")) == len(
        json.loads((results / "cells" / "base" / "probe.json").read_text())["curve"]
    )
    # job logs a user reads: no traceback of any kind (numba's finalizer KeyErrors were one)
    logs = sorted((results / "logs").rglob("*.log"))
    assert logs and not [str(p) for p in logs if re.search(r"Traceback|Exception ignored", p.read_text())]
    # a second run has nothing to do: nothing already computed is redone
    again = snakemake(results, "-n").stdout
    assert "Nothing to be done" in again


def markdown_row(table, first: str) -> dict[str, str]:
    """A Markdown table's row whose first cell is ``first``, by column header."""
    lines = [ln for ln in table.read_text().splitlines() if ln.startswith("|")]
    header, *body = [[c.strip() for c in ln.strip().strip("|").split("|")] for ln in lines[:1] + lines[2:]]
    row = next(r for r in body if r[0] == first)
    return dict(zip(header, row))


@pytest.mark.slow
def test_the_base_cells_mask_ap_in_the_tables(tiny_results):
    """The tiny preset fine-tunes a Mask R-CNN (detect.task: segmentation): the base cell's
    box and mask AP reach main.md and the segmentation table."""
    det = json.loads((tiny_results / "cells" / "base" / "detect.json").read_text())
    assert det["task"] == "segmentation" and 0.0 <= det["mask_AP50"] <= 100.0
    for table in ("main", "segmentation"):
        base = markdown_row(tiny_results / "tables" / f"{table}.md", "MoCo (base cell)")
        for column in ("AP50", "mask AP50", "mask AP", "mask AP75"):
            assert re.match(r"\d+\.\d", base[column]), (table, column, base)


@pytest.mark.slow
def test_exports_of_every_cell(tiny_results):
    """`snakemake exports`: each cell's weights with a sidecar, after the default target."""
    snakemake(tiny_results, "exports")
    for cell in ("base", "method=random"):
        sidecar = json.loads((tiny_results / "cells" / cell / "export" / "export.json").read_text())
        assert set(sidecar["files"]) == {"torchvision.pth", "detectron2.pkl"} and sidecar["cell"] == cell
        assert sidecar["probe_top1"] == json.loads((tiny_results / "cells" / cell / "probe.json").read_text())["top1"]


@pytest.mark.slow
def test_workflow_without_ffcv(tmp_path):
    """data.loader: torchvision runs the DAG where FFCV cannot be imported: convert writes only
    the reports, and pretrain, the kNN monitor and the probe read the source images."""
    blocked = tmp_path / "no_ffcv" / "ffcv"
    blocked.mkdir(parents=True)
    (blocked / "__init__.py").write_text("raise ImportError('ffcv is blocked in this test')\n")
    overlay = tmp_path / "torchvision.yaml"
    overlay.write_text("data:\n  loader: torchvision\ndetect:\n  enabled: false\npretrain:\n  knn_every: 1\n")
    results = tmp_path / "results"
    run(
        [*snakemake_cli(), *TINY, str(overlay), "--config", f"results={results}", "cell=base", "--cores", "2", "cell"],
        env={"PYTHONPATH": os.pathsep.join([str(blocked.parent), str(REPO), os.environ["PYTHONPATH"]])},
        timeout=900,
    )
    converted = results / "data" / "ffcv"
    assert sorted(p.name for p in converted.iterdir()) == ["train.json", "val.json"]
    assert json.loads((converted / "train.json").read_text())["beton"] is None
    probe = json.loads((results / "cells" / "base" / "probe.json").read_text())
    assert 0 <= probe["top1"] <= 100
    rows = list(csv.DictReader((results / "cells" / "base" / "pretrain" / "log.csv").open()))
    assert [int(r["epoch"]) for r in rows] == [1, 2] and all(r["knn"] for r in rows)


def test_submitit_launcher_accepts_what_the_loader_reads(tmp_path):
    """The launcher checks the converted train split before queueing: the torchvision loader
    needs only the report (no .beton exists without FFCV), the FFCV loader the .beton."""
    from pipeline.dag.config import DEFAULT_CONFIG, load_yaml
    from pipeline.launch import check_pretrain_args

    defaults = load_yaml(DEFAULT_CONFIG)
    (tmp_path / "train.json").write_text("{}")  # a report-only conversion

    def check(loader):
        cfg = tmp_path / f"{loader}.json"
        cfg.write_text(json.dumps({"data": {**defaults["data"], "loader": loader}, "pretrain": defaults["pretrain"]}))
        check_pretrain_args(["--config", str(cfg), "--data", str(tmp_path), "--out", str(tmp_path / "out")])

    check("torchvision")
    with pytest.raises(SystemExit, match="no converted train split for data.loader: ffcv"):
        check("ffcv")


def test_submitit_launcher_checks_the_job_with_pretrains_own_parser(tmp_path, capsys):
    """A flag pipeline.pretrain does not know fails before anything is queued."""
    from pipeline.launch import check_pretrain_args

    with pytest.raises(SystemExit):
        check_pretrain_args(["--config", "{}", "--data", str(tmp_path), "--out", str(tmp_path), "--epochs", "3"])
    assert "unrecognized arguments: --epochs 3" in capsys.readouterr().err


def test_detection_trials_are_separate_jobs(tmp_path):
    """detect.trials: 3 -> three fine-tuning jobs per cell (parallel on a cluster), one summary;
    detect.ranks: 2 -> each job starts 2 processes with torchrun."""
    overlay = tmp_path / "trials.yaml"
    overlay.write_text("detect:\n  trials: 3\n  ranks: 2\n")
    out = run(
        [*snakemake_cli(), *TINY, str(overlay), "--config", f"results={tmp_path / 'results'}", "-n", "-p"], timeout=120
    ).stdout
    counts = jobs_planned(out)
    assert (counts["detect"], counts["detect_trials"]) == (15, 5)  # 5 cells x 3 trials
    assert all(f"--seed {seed} --out" in out for seed in (0, 1, 2))
    assert out.count("-m torch.distributed.run --standalone --nproc-per-node 2 -m pipeline.detect") == 15


# --- paper-scale presets (GPU clusters): valid, and the DAG they describe builds ----------------
PRESETS = {  # preset -> the config files it is used with, as its header documents
    "imagenet-mocov2": ["imagenet-mocov2"],
    "imagenet-mocov1": ["imagenet-mocov2", "imagenet-mocov1"],
    "imagenet-mocov3-vit": ["imagenet-mocov2", "imagenet-mocov3-vit"],
    "imagenet-mocov3-r50": ["imagenet-mocov2", "imagenet-mocov3-r50"],
    "imagenet-mocov2-coco": ["imagenet-mocov2", "imagenet-mocov2-coco"],
    "imagenet-mocov2-coco-fpn": ["imagenet-mocov2", "imagenet-mocov2-coco", "imagenet-mocov2-coco-fpn"],
    "imagenet-rivals": ["imagenet-mocov2", "imagenet-rivals"],
    "cifar10": ["cifar10"],
}


def preset_config(name: str) -> dict:
    from pipeline.dag.config import DEFAULT_CONFIG, load_yaml, merge

    cfg = load_yaml(DEFAULT_CONFIG)
    for part in PRESETS[name]:
        cfg = merge(cfg, load_yaml(REPO / "workflow" / "config" / "presets" / f"{part}.yaml"))
    return cfg


def test_every_preset_is_covered():
    on_disk = {p.stem for p in (REPO / "workflow" / "config" / "presets").glob("*.yaml")}
    assert on_disk == set(PRESETS) | {"tiny", "demo-long", "transfer", "methods"}


def test_the_transfer_preset_decides_the_transfer_claim_on_the_novel_scenes(tmp_path):
    """Its cells are the demo's at 5 seeds, the scenes' categories the novel ones, each fine-tuned
    under the default protocol and frozen BN beside it, and both transfer claims have everything
    they need before any job (no gap)."""
    from pipeline.claims import norm_protocols, transfer_gaps
    from pipeline.dag.config import DEFAULT_CONFIG, load_config, load_yaml, merge

    preset = REPO / "workflow" / "config" / "presets" / "transfer.yaml"
    cfg = load_config(merge(load_yaml(DEFAULT_CONFIG), load_yaml(preset)))
    assert cfg.dataset.synthetic.det_shapes == "novel" and cfg.grid.seeds == 5 and cfg.detect.epochs == 12
    assert transfer_gaps(cfg) == [] and norm_protocols(cfg.detect) == ("frozen_bn", "main")
    out = run(
        [*snakemake_cli(), "--configfile", str(preset), "--config", f"results={tmp_path / 'r'}", "-n"], timeout=120
    )
    jobs = jobs_planned(out.stdout)
    assert jobs["detect"] == jobs["detect_protocol"] == 10  # base and supervised, 5 seeds each, both protocols
    assert pretraining_jobs(jobs) == 15


def test_demo_long_is_the_demo_at_the_longer_schedule(tmp_path):
    from pipeline.dag.config import DEFAULT_CONFIG, load_yaml

    long = load_yaml(REPO / "workflow" / "config" / "presets" / "demo-long.yaml")
    assert long == {"pretrain": {"epochs": 25}, "detect": {"epochs": 8}}
    assert load_yaml(DEFAULT_CONFIG)["pretrain"]["epochs"] < 25
    out = run(
        [
            *snakemake_cli(),
            "--configfile",
            str(REPO / "workflow" / "config" / "presets" / "demo-long.yaml"),
            "--config",
            f"results={tmp_path / 'r'}",
            "-n",
        ],
        timeout=120,
    ).stdout
    assert pretraining_jobs(jobs_planned(out)) == 9  # base, random init and supervised, 3 seeds each


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_preset_builds_its_dag(name, tmp_path):
    """With the site's dataset roots in place, the preset validates and plans every stage."""
    site = tmp_path / "site.yaml"
    (tmp_path / "data").mkdir()
    site.write_text(f"dataset:\n  root: {tmp_path / 'data'}\ndetect:\n  root: {tmp_path / 'data'}\n")
    files = [str(REPO / "workflow" / "config" / "presets" / f"{p}.yaml") for p in PRESETS[name]]
    out = run(
        [*snakemake_cli(), "--configfile", *files, str(site), "--config", f"results={tmp_path / 'r'}", "-n"],
        timeout=120,
    ).stdout
    jobs = jobs_planned(out)
    assert jobs["convert"] == 2 and pretraining_jobs(jobs) == jobs["probe"] >= 2 and jobs["tables"] == 1
    cfg = preset_config(name)
    if cfg["detect"]["enabled"]:
        assert jobs["detect"] == len(cfg["detect"]["cells"]) * cfg["detect"]["trials"]


def test_paper_presets_hold_the_reference_settings():
    """The papers' settings (NOTES: MoCo reference settings), so that an edit that drifts fails."""
    v2 = preset_config("imagenet-mocov2")
    p = v2["pretrain"]
    assert (p["backbone"], p["width"], p["cifar_stem"], p["K"], p["m"], p["T"], p["dim"]) == (
        "resnet50",
        64,
        False,
        65536,
        0.999,
        0.2,
        128,
    )
    assert (p["epochs"], p["batch_size"], p["lr"], p["weight_decay"], p["schedule"], p["aug"], p["crop_scale_min"]) == (
        200,
        256,
        0.03,
        0.0001,
        "cosine",
        "v2",
        0.2,
    )
    assert (v2["probe"]["protocol"], v2["probe"]["mode"], v2["probe"]["epochs"]) == ("moco", "augmented", 100)
    d = v2["detect"]
    assert (d["dataset"], d["head"], d["voc"], d["trials"]) == (
        "voc",
        "c4",
        {"train": ["2007/trainval", "2012/trainval"], "val": "2007/test"},
        5,
    )
    # Detectron2's pascal_voc_R_50_C4_24k on Base-RCNN-C4-BN (moco/detection/configs at 7397dfe)
    assert (d["norm"], d["ranks"], d["batch_size"], d["lr"]) == ("bn", 8, 16, 0.02)  # SyncBN over 16 images
    assert (d["schedule"], d["iterations"], d["lr_steps"]) == ("step", 24000, [18000, 22000])
    assert d["train_sizes"] == list(range(480, 801, 32)) and (d["image_size"], d["max_image_size"]) == (800, 1333)
    assert d["rpn"] == {"pre_nms_train": 12000, "post_nms_train": 2000, "pre_nms_test": 6000, "post_nms_test": 1000}
    assert d["roi_per_image"] == 512 and d["voc_metric"] in ("auto", "11point")
    coco = preset_config("imagenet-mocov2-coco")["detect"]  # coco_R_50_C4_2x
    assert (coco["dataset"], coco["iterations"], coco["lr_steps"]) == ("coco", 180000, [120000, 160000])
    assert coco["train_sizes"] == list(range(640, 801, 32)) and coco["rpn"] == d["rpn"] and coco["ranks"] == 8
    # the claims at ImageNet scale: the seed's 100 vs 200 epochs, K/B = 64 and 256 steps
    assert v2["claims"] == {
        "epochs": 100,
        "long_epochs": 200,
        "seeds": 3,
        "first_seed": None,
        "pilot_seeds": 3,
        "invariant_seeds": 2,
        "only": None,
        "random_init_margin": 5.0,
        "m": [0.0, 0.5, 0.9, 0.99, 0.999, 0.9999],
        "K": [16384, 65536],
    }
    assert preset_config("imagenet-mocov2")["probe"]["ranks"] == 8  # main_lincls.py's 8 GPUs
    v1 = preset_config("imagenet-mocov1")["pretrain"]
    assert (v1["variant"], v1["T"], v1["schedule"], v1["aug"], v1["K"], v1["m"], v1["lr"]) == (
        "v1",
        0.07,
        "step",
        "v1",
        65536,
        0.999,
        0.03,
    )
    v3 = preset_config("imagenet-mocov3-vit")
    p = v3["pretrain"]
    assert (p["variant"], p["backbone"], p["patch_size"], p["optimizer"], p["batch_size"], p["warmup_epochs"]) == (
        "v3",
        "vit_small",
        16,
        "adamw",
        4096,
        40,
    )
    assert p["lr"] == pytest.approx(1.5e-4 * 4096 / 256) and (p["T"], p["m"], p["aug"]) == (0.2, 0.99, "v3")
    assert (v3["probe"]["protocol"], v3["probe"]["epochs"]) == ("mocov3", 90)


# --- every paper preset against its reference, key by key (docs/configuration.md) -------------
SOURCES = {  # the reference files the values below are read from (docs/configuration.md: the same legend)
    "moco": "facebookresearch/moco@7397dfe main_moco.py (v2: --mlp --moco-t 0.2 --aug-plus --cos)",
    "lincls": "facebookresearch/moco@7397dfe main_lincls.py",
    "ffcv": "libffcv/ffcv-imagenet write_imagenet.sh (500 0.50 90)",
    "torchvision": "pytorch/vision references/classification/train.py and its README (ResNet-50)",
    "demo": "facebookresearch/moco colab-notebook branch, colab/moco_cifar10_demo.ipynb",
    "v3": "facebookresearch/moco-v3 CONFIG.md (ResNet-50, 300 epochs) and main_moco.py defaults",
    "v3-vit": "facebookresearch/moco-v3 CONFIG.md (ViT-Small) and main_moco.py defaults",
    "v3-lincls": "facebookresearch/moco-v3 main_lincls.py (and CONFIG.md for ViTs)",
    "v1-paper": "He et al. 2020 (MoCo v1), Table 1: momentum measured at K = 4,096",
    "moco-det": "facebookresearch/moco@7397dfe detection/configs/coco_R_50_C4_2x_moco.yaml (MASK_ON)",
    "d2-fpn": "facebookresearch/detectron2 configs/COCO-InstanceSegmentation/mask_rcnn_R_50_FPN_1x.yaml",
    "simclr": "Chen et al. 2020 (SimCLR), 2.3 Default setting and B.1 (LARS, wd 1e-6, warmup, head), Table 5 (T)",
    "byol": "Grill et al. 2020 (BYOL), 3.3, Appendix B (Table 6: asymmetric views) and C (LARS, wd 1.5e-6, "
    "tau 0.996, batch 4096, heads)",
    "mocov2-report": "Chen et al. 2020 (MoCo v2 report), Table 2: SimCLR at batch 256 and 8,192, 200 epochs",
}
MOCO, LINCLS, FFCV, TORCHVISION, DEMO, V3, V3_VIT, V3_LINCLS, PAPER_V1, MOCO_DET, D2_FPN, SIMCLR, BYOL, V2_REPORT = (
    SOURCES
)
COCO_SIZES = [640, 672, 704, 736, 768, 800]  # Detectron2's MIN_SIZE_TRAIN for COCO (test: 800)
REFERENCE = {  # preset -> [(key, the reference's value, where it is written)]
    "imagenet-rivals": [
        ("grid.product.batch_size", [256, 8192], V2_REPORT),
        ("grid.simclr.optimizer", "lars", SIMCLR),
        ("grid.simclr.weight_decay", 1e-6, SIMCLR),
        ("grid.simclr.warmup_epochs", 10, SIMCLR),
        ("grid.simclr.T", 0.1, SIMCLR),
        ("grid.simclr.dim", 128, SIMCLR),
        ("grid.simclr.mlp_dim", 2048, SIMCLR),
        ("grid.simclr.crop_scale_min", 0.08, SIMCLR),
        ("grid.simclr.jitter_scale", 2.0, SIMCLR),  # colour distortion strength 1.0 (0.8, 0.8, 0.8, 0.2)
        ("grid.simclr.aug", "v2", SIMCLR),  # the same recipe on both views, blur p 0.5
        ("grid.byol.optimizer", "lars", BYOL),
        ("grid.byol.weight_decay", 1.5e-6, BYOL),
        ("grid.byol.warmup_epochs", 10, BYOL),
        ("grid.byol.batch_size", 4096, BYOL),
        ("grid.byol.m", 0.996, BYOL),  # tau_base, raised to 1 by a cosine
        ("grid.byol.dim", 256, BYOL),
        ("grid.byol.mlp_dim", 4096, BYOL),
        ("grid.byol.aug", "v3", BYOL),  # asymmetric views: blur 1.0 / 0.1, solarize 0 / 0.2 (Table 6)
        ("grid.byol.jitter_scale", 1.0, BYOL),  # jitter (0.4, 0.4, 0.2, 0.1), p 0.8
    ],
    "imagenet-mocov2-coco": [
        ("detect.task", "segmentation", MOCO_DET),
        ("detect.head", "c4", MOCO_DET),
        ("detect.norm", "bn", MOCO_DET),  # SyncBN over the 8 ranks
        ("detect.batch_size", 16, MOCO_DET),
        ("detect.lr", 0.02, MOCO_DET),
        ("detect.iterations", 180000, MOCO_DET),
        ("detect.lr_steps", [120000, 160000], MOCO_DET),
        ("detect.train_sizes", COCO_SIZES, MOCO_DET),
        ("detect.image_size", 800, MOCO_DET),
    ],
    "imagenet-mocov2-coco-fpn": [
        ("detect.task", "segmentation", D2_FPN),
        ("detect.head", "fpn", D2_FPN),
        ("detect.fpn_channels", 256, D2_FPN),
        ("detect.batch_size", 16, D2_FPN),
        ("detect.lr", 0.02, D2_FPN),
        ("detect.iterations", 90000, D2_FPN),
        ("detect.lr_steps", [60000, 80000], D2_FPN),
        ("detect.train_sizes", COCO_SIZES, D2_FPN),
        ("detect.image_size", 800, D2_FPN),
    ],
    "imagenet-mocov2": [
        ("convert.max_resolution", 500, FFCV),
        ("convert.compress_probability", 0.5, FFCV),
        ("convert.jpeg_quality", 90, FFCV),
        ("data.crop_size", 224, MOCO),
        ("pretrain.batch_size", 256, MOCO),
        ("pretrain.lr", 0.03, MOCO),
        ("pretrain.weight_decay", 0.0001, MOCO),
        ("pretrain.sgd_momentum", 0.9, MOCO),
        ("pretrain.epochs", 200, MOCO),
        ("pretrain.K", 65536, MOCO),
        ("pretrain.m", 0.999, MOCO),
        ("pretrain.T", 0.2, MOCO),
        ("pretrain.dim", 128, MOCO),
        ("pretrain.variant", "v2", MOCO),
        ("pretrain.schedule", "cosine", MOCO),
        ("pretrain.aug", "v2", MOCO),
        ("pretrain.crop_scale_min", 0.2, MOCO),
        ("probe.protocol", "moco", LINCLS),  # lr 30, batch 256, x0.1 at 60 and 80
        ("probe.epochs", 100, LINCLS),
        ("probe.crop_ratio", 0.875, LINCLS),  # Resize(256) + CenterCrop(224)
        ("grid.supervised.epochs", 90, TORCHVISION),
        ("grid.supervised.batch_size", 256, TORCHVISION),
        ("grid.supervised.lr", 0.1, TORCHVISION),
        ("grid.supervised.optimizer", "sgd", TORCHVISION),
        ("grid.supervised.weight_decay", 0.0001, TORCHVISION),
        ("grid.supervised.schedule", "step", TORCHVISION),
        ("grid.supervised.lr_step_epochs", [30, 60], TORCHVISION),
        ("grid.supervised.aug", "none", TORCHVISION),  # RandomResizedCrop + flip only
        ("grid.supervised.crop_scale_min", 0.08, TORCHVISION),
    ],
    "imagenet-mocov1": [
        ("pretrain.variant", "v1", MOCO),
        ("pretrain.T", 0.07, MOCO),
        ("pretrain.schedule", "step", MOCO),  # x0.1 at 120 and 160 of 200
        ("pretrain.aug", "v1", MOCO),
        ("pretrain.K", 65536, MOCO),
        ("pretrain.m", 0.999, MOCO),
        ("grid.product.K", [4096], PAPER_V1),
        ("grid.product.m", [0, 0.9, 0.99, 0.999, 0.9999], PAPER_V1),
        ("grid.one_at_a_time.m", [0.999], PAPER_V1),  # the base's: no m cell at K = 65,536
    ],
    "imagenet-mocov3-r50": [
        ("pretrain.variant", "v3", V3),
        ("pretrain.backbone", "resnet50", V3),
        ("pretrain.batch_size", 4096, V3),
        ("pretrain.optimizer", "lars", V3),
        ("pretrain.lr", 4.8, V3),  # --lr .3 x 4096 / 256
        ("pretrain.weight_decay", 1e-6, V3),
        ("pretrain.sgd_momentum", 0.9, V3),
        ("pretrain.epochs", 300, V3),
        ("pretrain.warmup_epochs", 10, V3),
        ("pretrain.dim", 256, V3),
        ("pretrain.mlp_dim", 4096, V3),
        ("pretrain.T", 1.0, V3),
        ("pretrain.m", 0.99, V3),
        ("pretrain.crop_scale_min", 0.2, V3),
        ("pretrain.aug", "v3", V3),
        ("probe.protocol", "mocov3", V3_LINCLS),  # batch 1024, lr 0.1 x bs/256, cosine
        ("probe.epochs", 90, V3_LINCLS),
        ("probe.crop_ratio", 0.875, V3_LINCLS),
    ],
    "imagenet-mocov3-vit": [
        ("pretrain.backbone", "vit_small", V3_VIT),
        ("pretrain.optimizer", "adamw", V3_VIT),
        ("pretrain.lr", 0.0024, V3_VIT),  # 1.5e-4 x 4096 / 256
        ("pretrain.weight_decay", 0.1, V3_VIT),
        ("pretrain.epochs", 300, V3_VIT),
        ("pretrain.warmup_epochs", 40, V3_VIT),
        ("pretrain.T", 0.2, V3_VIT),
        ("pretrain.freeze_patch_embed", True, V3_VIT),  # --stop-grad-conv1
        ("pretrain.crop_scale_min", 0.08, V3_VIT),
        ("probe.protocol", "mocov3", V3_LINCLS),  # lr 3 x bs/256 for ViTs (CONFIG.md)
        ("probe.crop_ratio", 0.875, V3_LINCLS),
    ],
    "cifar10": [
        ("pretrain.backbone", "resnet18", DEMO),
        ("pretrain.width", 64, DEMO),
        ("pretrain.cifar_stem", True, DEMO),  # 3x3 conv1, no max-pool
        ("pretrain.variant", "v1", DEMO),  # its head: one linear layer
        ("pretrain.dim", 128, DEMO),
        ("pretrain.batch_size", 512, DEMO),
        ("pretrain.lr", 0.06, DEMO),  # for batch 512
        ("pretrain.schedule", "cosine", DEMO),
        ("pretrain.weight_decay", 0.0005, DEMO),
        ("pretrain.K", 4096, DEMO),
        ("pretrain.m", 0.99, DEMO),
        ("pretrain.T", 0.1, DEMO),
        ("pretrain.bn_splits", 8, DEMO),
        ("pretrain.epochs", 200, DEMO),
        ("pretrain.crop_scale_min", 0.08, DEMO),  # RandomResizedCrop(32)'s default scale
        ("pretrain.aug", "cifar", DEMO),  # jitter p=0.8 + grayscale p=0.2, no blur
        ("pretrain.symmetric", False, DEMO),
        ("probe.knn_k", 200, DEMO),
        ("probe.knn_t", 0.1, DEMO),
        ("probe.crop_ratio", 1.0, DEMO),  # its test transform: the whole 32 px image
    ],
}


def table_row(name: str, key: str, ours, ref, source: str) -> str:
    """One row of the "preset vs reference" table in docs/configuration.md."""
    return f"| {name} | `{key}` | {ours!r} | {ref!r} | {source} |".replace("'", "")


def test_the_documented_table_is_the_reference_table():
    """docs/configuration.md: "preset vs reference" holds every row of REFERENCE, with the preset's value."""
    page = (REPO / "docs" / "configuration.md").read_text()
    rows = [
        table_row(name, key, _at(preset_config(name), key), ref, src)
        for name in REFERENCE
        for key, ref, src in REFERENCE[name]
    ]
    assert [row for row in rows if row not in page] == []
    assert all(f"{tag}: {SOURCES[tag]}" in page for tag in SOURCES)


def _at(cfg: dict, key: str):
    for part in key.split("."):
        cfg = cfg[part]
    return cfg


def test_every_paper_preset_has_a_reference_table():
    assert set(REFERENCE) == set(PRESETS)


@pytest.mark.parametrize("name", sorted(REFERENCE))
def test_preset_holds_its_references_values(name):
    cfg = preset_config(name)
    wrong = [(key, _at(cfg, key), ref, src) for key, ref, src in REFERENCE[name] if _at(cfg, key) != pytest.approx(ref)]
    assert wrong == []


def test_the_rivals_cells_take_their_papers_lr_rule_at_their_batch():
    """imagenet-rivals: each SimCLR cell's lr is 0.3 x B/256 at its own batch, BYOL's 0.2 x B/256,
    both LARS (the papers' rules: pipeline/methods/<name>.recipe)."""
    from pipeline.dag.config import load_config
    from pipeline.dag.grid import grid_cells

    cells = {cid: c.pretrain for cid, c in grid_cells(load_config(preset_config("imagenet-rivals"))).items()}
    small, large, byol = cells["method=simclr"], cells["method=simclr,batch_size=8192"], cells["method=byol"]
    assert (small.lr, large.lr, byol.lr) == (pytest.approx(0.3), pytest.approx(9.6), pytest.approx(3.2))
    assert small.optimizer == large.optimizer == byol.optimizer == "lars" and byol.m == 0.996
    assert cells["base"].method == "moco" and cells["base"].batch_size == 256


def test_supervised_baseline_trains_with_its_own_recipe():
    """The paper presets' supervised cell: torchvision's recipe (grid.supervised), under the
    id method=supervised; lr 0.1 until epoch 30, 0.01 until 60, then 0.001. The demo's keeps
    the base cell's recipe (MoCo's views)."""
    from pipeline.dag.config import DEFAULT_CONFIG, load_config, load_yaml
    from pipeline.dag.grid import cell_params, cell_resources, grid_cells
    from pipeline.methods.build import pretrain_schedule

    cfg = load_config(preset_config("imagenet-mocov2"))
    cell = grid_cells(cfg)["method=supervised"]
    assert cell == cell_params(cfg, "method=supervised")
    p = cell.pretrain
    assert (p.epochs, p.lr, p.aug, p.crop_scale_min, p.weight_decay) == (90, 0.1, "none", 0.08, 0.0001)
    schedule = pretrain_schedule(p, steps_per_epoch=10)  # epoch e starts at step 10 e
    assert [p.lr * schedule.factor(s) for s in (0, 299, 300, 599, 600, 899)] == pytest.approx(
        [0.1, 0.1, 0.01, 0.01, 0.001, 0.001]
    )
    assert cell_resources(p, cfg.grid.resources)["runtime"] == 30 + 4 * 90 * 2.5
    demo = load_yaml(DEFAULT_CONFIG)
    demo["grid"]["only"] = None  # the demo's whole grid (make demo itself runs base and random init)
    supervised = grid_cells(load_config(demo))["method=supervised"]
    assert supervised.stated(demo["pretrain"]) == {**demo["pretrain"], "method": "supervised"}


def test_mocov1_momentum_ablation_sits_at_K_4096():
    """The paper's Table 1 (He et al. 2020): m in {0, 0.9, 0.99, 0.999, 0.9999} at K = 4,096;
    no momentum cell at the base K = 65,536, and the momentum table is built around K=4096."""
    from pipeline.dag.config import load_config
    from pipeline.dag.grid import grid_cells, group_id, momentum_reference

    cells = {cid: c.pretrain for cid, c in grid_cells(load_config(preset_config("imagenet-mocov1"))).items()}
    at_4096 = {p.m for p in cells.values() if p.K == 4096 and p.method == "moco" and p.mechanism == "moco"}
    assert at_4096 == {0, 0.9, 0.99, 0.999, 0.9999}
    assert not [cid for cid, p in cells.items() if p.K == 65536 and p.m != 0.999]
    assert momentum_reference([group_id(c) for c in cells]) == "K=4096"
    v2 = grid_cells(load_config(preset_config("imagenet-mocov2")))
    assert momentum_reference([group_id(c) for c in v2]) == "base"
