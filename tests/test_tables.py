"""Tables and figures from synthetic metrics: numbers, "—" for missing cells, "fail" for failed
runs, mean ± 95 % CI and n over seeds, Δ paired by seed, where the runs ran, valid LaTeX
(booktabs), figures as PNG + PDF, the CLI. Expected intervals are computed by hand with the t
quantiles of a printed table: t(0.975, 1) = 12.706, t(0.975, 2) = 4.303."""

import csv
import json
import re
import shutil
import subprocess
import sys

import pytest
from conftest import REPO, require, run

from pipeline.base.layout import STUDY_NAMES
from pipeline.dag.config import merge
from pipeline.dag.grid import parse_cell_id
from pipeline.methods import method_spec
from pipeline.pretrain import LOG_COLUMNS, log_columns, rows_to_csv
from pipeline.report.writers import latex
from pipeline.tables import run as write_tables
from pipeline.transfer.summary import summarize_trials

BASE = {
    "method": "moco",
    "variant": "v2",
    "backbone": "resnet18",
    "width": 16,
    "K": 4096,
    "m": 0.99,
    "T": 0.2,
    "epochs": 30,
    "batch_size": 256,
    "lr": 0.06,
    "seed": 0,
}
CONFIG = {
    "dataset": {"source": "synthetic", "synthetic": {"train_per_class": 500}},
    "pretrain": BASE,
    "probe": {"mode": "cached", "epochs": 100},
    "detect": {"enabled": True, "task": "detection", "epochs": 8},  # boxes only: Faster R-CNN
    "grid": {
        "one_at_a_time": {
            "K": [1024, 16384],
            "m": [0, 0.9, 0.999],
            "epochs": [60],
            "seed": [1],
            "mechanism": ["end_to_end", "memory_bank"],
        },
        "baselines": ["random", "supervised"],
    },
}
# the studies CONFIG's grid sweeps (its one_at_a_time axes, Faster R-CNN transfer): not the BN
# leak (no shuffle_bn cell) nor segmentation (boxes only)
SWEPT_HERE = ["methods", "ablation_K", "ablation_m", "ablation_epochs", "mechanisms", "detection", "grid"]
T_975 = {1: 12.706, 2: 4.303}  # t(0.975, dof), from a printed table


FROZEN = "frozen BN (pretrained statistics), batch 4"


def fake_cell(
    results, cell, top1, knn=None, ap=None, diverged=False, base=BASE, det_norm=FROZEN, provenance=None, mask_ap=None
):
    """A cell's outputs as the pipeline writes them (pretrain/, probe.json, detect.json);
    ``provenance``: the record its summary.json and probe.json carry (None: an older run's);
    ``mask_ap``: a Mask R-CNN's mask AP per trial beside ``ap`` (detect.task: segmentation)."""
    params = merge(base, parse_cell_id(cell))
    d = results / "cells" / cell
    (d / "pretrain").mkdir(parents=True, exist_ok=True)
    (d / "pretrain" / "checkpoint.pt").write_bytes(b"fake")
    rows = (
        []
        if params["method"] == "random"
        else [
            {
                "epoch": e,
                "loss": "nan" if diverged and e == 2 else 8.0 - e,
                "inst_acc": 10.0 * e,
                "knn": top1 - 10 if e == 2 and top1 else "",
                "lr": 0.06,
                "m": params["m"],
                "queue_age_mean": params["K"] / params["batch_size"] / 2,
                "queue_age_p99": params["K"] / params["batch_size"],
                "queue_age_max": params["K"] / params["batch_size"],
                "drift": 0.01,
                "negative_drift_mean": 0.25 * e,
                "negative_drift_max": 0.5 * e,
                "seconds": 1.0,
            }
            for e in (1, 2)
        ]
    )
    # a MoCo cell's log: every column pretrain writes for MoCo, in its order (its metric after the loss)
    moco = method_spec("moco").metrics
    assert all(log_columns([row], moco) == ["epoch", "loss", "inst_acc", *LOG_COLUMNS[2:]] for row in rows)
    (d / "pretrain" / "log.csv").write_text(rows_to_csv(rows, moco))
    (d / "pretrain" / "summary.json").write_text(
        json.dumps(
            {
                "method": params["method"],
                "epochs_run": len(rows),
                "diverged": diverged,
                "final": rows[-1] if rows else {},
                **({"provenance": provenance} if provenance else {}),
            }
        )
    )
    (d / "pretrain" / "config.json").write_text(json.dumps({"pretrain": params, "data": {}}))
    if top1 is not None:
        (d / "probe.json").write_text(
            json.dumps(
                {
                    "mode": "cached",
                    "top1": top1,
                    "top5": min(100.0, top1 + 20),
                    "knn_top1": knn if knn is not None else top1 - 5,
                    "per_class_top1": {},
                    "curve": [{"epoch": e, "train_loss": 1.0 / e, "val_top1": top1 * e / 3} for e in (1, 2, 3)],
                    "config": {"probe": {"mode": "cached", "epochs": 3}},
                    **({"provenance": provenance} if provenance else {}),
                }
            )
        )
    if ap is not None:  # one AP, or a list: one per fine-tuning trial
        trials = []
        aps = ap if isinstance(ap, list) else [ap]
        masks = [None] * len(aps) if mask_ap is None else mask_ap if isinstance(mask_ap, list) else [mask_ap]
        for t, (a, m) in enumerate(zip(aps, masks)):
            trials.append(d / "detect" / f"trial{t}.json")
            trials[-1].parent.mkdir(exist_ok=True)
            trials[-1].write_text(
                json.dumps(
                    {
                        "AP": a,
                        "AP50": a * 2,
                        "AP75": a * 0.8,
                        "APs": None,
                        "APm": a,
                        "APl": a,
                        **({} if m is None else {"mask_AP": m, "mask_AP50": m * 2, "mask_AP75": m * 0.8}),
                        "seed": t,
                        "epochs": 8,
                        "normalisation": det_norm,
                        "protocol": "COCO box AP (pycocotools)",
                    }
                )
            )
        summarize_trials(trials, d / "detect.json")


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    r = tmp_path_factory.mktemp("results")
    fake_cell(r, "base", 60.0, knn=50.0, ap=15.0)
    fake_cell(r, "seed=1", 62.0, knn=52.0, ap=17.0)  # a second seed of the base cell
    fake_cell(r, "K=1024", 55.0, ap=14.0)
    # K=16384: in the grid, not computed -> "—"
    fake_cell(r, "m=0", 10.0, ap=1.0, diverged=True)  # loss became NaN -> "fail"
    fake_cell(r, "m=0.9", 50.0, ap=12.0)
    fake_cell(r, "m=0.999", 58.0, ap=14.5)
    fake_cell(r, "m=0.999,seed=1", 5.0, diverged=True)  # one of two seeds diverged
    fake_cell(r, "epochs=60", 65.0, ap=16.0)
    fake_cell(r, "mechanism=end_to_end", 52.0, ap=13.0)  # dictionary = the batch (256)
    fake_cell(r, "mechanism=memory_bank", 54.0, ap=13.5)
    fake_cell(
        r,
        "method=supervised",
        70.0,
        ap=[17.0, 18.0, 19.0],  # three detection trials
        det_norm="SyncBN over 16 images (8 ranks x 2)",
    )
    fake_cell(r, "method=random", 20.0, ap=3.0)
    fake_cell(r, "variant=v3,backbone=vit_small", 63.0)  # no detect.json -> "—"
    write_tables(r, CONFIG)
    return r


def read_csv(results, name):
    return list(csv.DictReader((results / "tables" / f"{name}.csv").open()))


def md_rows(results, name) -> dict[str, list[str]]:
    """First column -> the other cells of each body row of a Markdown table."""
    lines = [ln for ln in (results / "tables" / f"{name}.md").read_text().splitlines() if ln.startswith("|")]
    out = {}
    for line in lines[2:]:  # after the header and the alignment row
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        out.setdefault(cells[0], cells[1:])
    return out


@pytest.mark.integration
def test_every_swept_study_written_in_three_formats(results):
    for name in SWEPT_HERE:
        for ext in ("md", "csv", "tex"):
            assert (results / "tables" / f"{name}.{ext}").is_file(), f"{name}.{ext}"
    assert (results / "tables" / "main.md").read_text() == (results / "tables" / "methods.md").read_text()
    cells = read_csv(results, "cells")
    assert {r["cell"] for r in cells} >= {"base", "seed=1", "K=16384", "m=0"}
    assert {r["status"] for r in cells if r["cell"] == "K=16384"} == {"missing"}
    # the queue's columns: the last epoch's (2) of the log, K / B = 4096 / 256 steps
    base = next(r for r in cells if r["cell"] == "base")
    assert float(base["queue_age_max"]) == 16 and float(base["negative_drift_mean"]) == 0.5
    assert float(base["negative_drift_max"]) == 1.0


def test_a_study_the_grid_does_not_sweep_is_listed_with_its_command_not_written(results):
    """Issue 47 item 6: no one-row ablation, no one-point figure; all.md says how to run them."""
    for name in set(STUDY_NAMES) - set(SWEPT_HERE):
        assert not (results / "tables" / f"{name}.md").exists(), name
    assert not (results / "figures" / "bn_leak.png").exists()
    text = (results / "tables" / "all.md").read_text()
    skipped = text[text.index("### Studies these cells do not sweep") :]
    assert "The BN leak" in skipped and "one_at_a_time: {shuffle_bn: [false]}" in skipped
    assert "only: [base, shuffle_bn=false]" in skipped
    assert "instance segmentation" in skipped and "detect='{enabled: true, task: segmentation}'" in skipped
    assert "Ablation over the queue size K" not in skipped  # swept: its own table


def test_a_table_of_a_study_no_longer_swept_is_removed(tmp_path):
    r = tmp_path / "r"
    fake_cell(r, "base", 60.0)
    fake_cell(r, "shuffle_bn=false", 40.0)
    write_tables(r, {})
    assert (r / "tables" / "shuffle_bn.md").is_file() and (r / "figures" / "bn_leak.pdf").is_file()
    shutil.rmtree(r / "cells" / "shuffle_bn=false")
    write_tables(r, {})
    assert not (r / "tables" / "shuffle_bn.md").exists() and not (r / "figures" / "bn_leak.pdf").exists()
    assert (r / "tables" / "methods.md").is_file()


def test_k_ablation_numbers_and_missing_cell(results):
    rows = {r["K"]: r for r in read_csv(results, "ablation_K")}
    assert list(rows) == ["1024", "4096", "16384"]
    assert float(rows["1024"]["top1"]) == 55.0 and float(rows["1024"]["knn_top1"]) == 50.0
    assert float(rows["1024"]["AP50"]) == 28.0 and float(rows["1024"]["AP"]) == 14.0
    assert float(rows["1024"]["AP75"]) == pytest.approx(11.2)
    assert rows["16384"]["status"] == "missing" and rows["16384"]["top1"] == ""
    md = md_rows(results, "ablation_K")
    assert md["16384"] == ["—"] * 6  # five metrics and the Δ
    assert "—: not computed" in (results / "tables" / "ablation_K.md").read_text()


def test_seeds_mean_and_confidence_interval(results):
    rows = {r["K"]: r for r in read_csv(results, "ablation_K")}
    base = rows["4096"]
    # 60 and 62: mean 61, sample std sqrt(2); 95 % CI half-width t(0.975, 1) * sqrt(2) / sqrt(2) = 12.706
    assert float(base["top1"]) == 61.0 and float(base["top1_std"]) == pytest.approx(2**0.5, abs=1e-3)
    assert float(base["top1_ci95"]) == pytest.approx(T_975[1], abs=1e-3)
    assert base["top1_n"] == "2" and base["top1_failed"] == "0" and base["cells"] == "base;seed=1"
    # every number carries its n; one run has no interval
    assert md_rows(results, "ablation_K")["4096"][:2] == ["61.0 ± 12.7 (n=2)", "51.0 ± 12.7 (n=2)"]
    assert md_rows(results, "ablation_K")["1024"][0] == "55.0 (n=1)"
    text = (results / "tables" / "ablation_K.md").read_text()
    assert "a ± b (n=k): the mean over k pretraining seeds" in text and "95 % confidence interval (Student t" in text


def test_every_table_says_how_many_runs_stand_behind_its_numbers(results):
    for name in SWEPT_HERE:
        text = (results / "tables" / f"{name}.md").read_text()
        assert "(n=" in text and "a ± b (n=k)" in text, name
    tex = (results / "tables" / "ablation_K.tex").read_text()
    assert "\\pm" in tex and "(n=2)" in tex and r"$\Delta$" in tex


def test_paired_delta_against_the_base_by_seed(tmp_path):
    """Δ = cell seed s − base seed s: the seed-to-seed spread of the base cancels; a failed seed
    is counted, not averaged; the main table's sentence states no more than the CI supports."""
    r = tmp_path / "r"
    for seed, (base, k, m, rand) in enumerate(
        [(60.0, 63.0, 50.0, 20.0), (50.0, 54.0, 9.0, 21.0), (70.0, 72.0, 65.0, 19.0)]
    ):
        suffix = f",seed={seed}" if seed else ""
        fake_cell(r, f"seed={seed}" if seed else "base", base)
        fake_cell(r, f"K=1024{suffix}", k)
        fake_cell(r, f"m=0.9{suffix}", m, diverged=seed == 1)
        fake_cell(r, f"method=random{suffix}", rand)
    write_tables(r, {}, figures=False)
    # K=1024 − base: 3, 4, 2: mean 3, std 1, half-width 4.303 / sqrt(3) = 2.484
    k = {row["K"]: row for row in read_csv(r, "ablation_K")}["1024"]
    assert float(k["delta_top1"]) == 3.0 and float(k["delta_top1_ci95"]) == pytest.approx(T_975[2] / 3**0.5, abs=1e-3)
    assert md_rows(r, "ablation_K")["1024"][-1] == "+3.0 ± 2.5 (n=3)"
    # unpaired, the base's own spread (60, 50, 70: std 10) gives ± 4.303 * 10 / sqrt(3) = 24.8
    assert md_rows(r, "ablation_K")["4096"][0] == "60.0 ± 24.8 (n=3)"
    # m=0.9: seed 1 diverged; pairs of seeds 0 and 2: -10, -5: mean -7.5, std 3.536, half 12.706 * 3.536 / 1.414 = 31.8
    m = md_rows(r, "ablation_m")["0.9"]
    assert m[2] == "57.5 ± 95.3 (n=2; 1 of 3 failed)" and m[-1] == "-7.5 ± 31.8 (n=2; 1 of 3 failed)"
    # base − random init: 40, 29, 51: mean 40, std 11, half 4.303 * 11 / sqrt(3) = 27.3: CI [12.7, 67.3]
    main = (r / "tables" / "main.md").read_text()
    assert md_rows(r, "methods")["MoCo (base cell)"][-1] == "+40.0 ± 27.3 (n=3)"
    assert md_rows(r, "methods")["random init"][-1] == "reference"
    assert "Δ +40.0 ± 27.3 (n=3): MoCo (base cell) is above random init on this data" in main


def test_the_main_table_pairs_moco_with_supervised_too(tmp_path):
    """The ceiling as well as the floor: MoCo − supervised, paired by seed, says its direction."""
    r = tmp_path / "r"
    for seed, (base, sup, rand) in enumerate([(60.0, 96.0, 20.0), (65.0, 97.0, 21.0), (70.0, 95.0, 19.0)]):
        suffix = f",seed={seed}" if seed else ""
        fake_cell(r, f"seed={seed}" if seed else "base", base)
        fake_cell(r, f"method=supervised{suffix}", sup)
        fake_cell(r, f"method=random{suffix}", rand)
    main = write_tables(r, {}, figures=False)
    # base − supervised: -36, -32, -25: mean -31, deviations -5, -1, 6: variance 62 / 2 = 31,
    # std 5.568, half 4.303 * 5.568 / sqrt(3) = 13.8: CI [-44.8, -17.2], below 0
    assert "MoCo (base cell) − supervised, linear top-1, paired by seed: Δ -31.0 ± 13.8 (n=3)" in main
    assert "MoCo (base cell) is below supervised on this data" in main


def test_a_difference_the_ci_does_not_support_states_no_direction(tmp_path):
    r = tmp_path / "r"
    for seed, (base, rand) in enumerate([(43.3, 18.5), (18.0, 18.4), (22.0, 18.6)]):  # issue 30's seeds
        fake_cell(r, f"seed={seed}" if seed else "base", base)
        fake_cell(r, "method=random" + (f",seed={seed}" if seed else ""), rand)
    main = write_tables(r, {}, figures=False)
    # 24.8, -0.4, 3.4: mean 9.267, deviations 15.53, -9.67, -5.87: variance 369.1 / 2, std 13.59;
    # half 4.303 * 13.59 / sqrt(3) = 33.7: the CI includes 0
    assert "Δ +9.3 ± 33.7 (n=3): these runs show no direction" in main and "is above" not in main


def test_each_table_names_where_its_runs_ran(tmp_path):
    amd = {
        "cpu": {"model": "AMD EPYC 7B13", "flags": ["avx2"]},
        "versions": {"torch": "2.4.0", "torchvision": "0.19.0", "numpy": "1.26.4", "ffcv": "1.0.2"},
        "commit": "0123456789abcdef",
    }
    r = tmp_path / "r"
    fake_cell(r, "base", 60.0, provenance=amd)
    fake_cell(r, "K=1024", 55.0, provenance=amd)
    fake_cell(r, "m=0.9", 50.0, provenance={**amd, "cpu": {"model": "Intel Xeon", "flags": ["avx2", "avx512f"]}})
    write_tables(r, {}, figures=False)
    assert (
        "Ran on: CPU: AMD EPYC 7B13 (avx2, no avx512f); versions: torch 2.4.0, torchvision 0.19.0, numpy 1.26.4, "
        "ffcv 1.0.2; commit: 0123456789ab." in (r / "tables" / "ablation_K.md").read_text()
    )
    assert "CPU DIFFER across runs" in (r / "tables" / "ablation_m.md").read_text()
    assert "AMD EPYC 7B13" in read_csv(r, "ablation_K")[0]["environment"]


def test_bn_leak_study(tmp_path):
    """shuffle_bn on/off side by side, with the pretext instance accuracy (the leak's
    signature) and the guard each run used."""
    r = tmp_path / "r"
    fake_cell(r, "base", 60.0)
    fake_cell(r, "shuffle_bn=false", 40.0)
    for cell, guard in (
        ("base", "keys shuffled across 4 BN sub-batches per rank"),
        ("shuffle_bn=false", "off (shuffle_bn: false)"),
    ):
        summary = r / "cells" / cell / "pretrain" / "summary.json"
        summary.write_text(json.dumps({**json.loads(summary.read_text()), "bn_guard": guard}))
    write_tables(r, {})
    rows = {row["shuffle_bn"]: row for row in read_csv(r, "shuffle_bn")}
    assert list(rows) == ["true", "false"]
    assert float(rows["true"]["top1"]) == 60.0 and float(rows["false"]["top1"]) == 40.0
    assert float(rows["true"]["inst_acc"]) == 20.0  # the last epoch's instance accuracy
    assert rows["false"]["BN-leak guard"] == "off (shuffle_bn: false)"
    assert "instance accuracy" in (r / "tables" / "shuffle_bn.md").read_text()
    assert (r / "figures" / "bn_leak.png").read_bytes()[:4] == b"\x89PNG"


def test_momentum_paper_rows_fail_and_partial(results):
    md = md_rows(results, "ablation_m")
    assert list(md) == ["0", "0.5", "0.9", "0.99", "0.999", "0.9999"]  # the paper's rows and the seeds' 0.5
    # each m's EMA half-life (ln 0.5 / ln m steps) beside the queue's span K/B = 4096/256
    assert [md[m][:2] for m in md] == [
        ["0", "16"],
        ["1", "16"],
        ["6.58", "16"],
        ["69", "16"],
        ["693", "16"],
        ["6,931", "16"],
    ]
    assert md["0"][2:] == ["fail (1 of 1)"] * 6 + ["— (1 of 1 failed)"]
    assert md["0.9"][2] == "50.0 (n=1)" and md["0.9"][-2] == "1.00 (n=1)"  # the final key-encoder drift: 0.01 = 1%
    assert md["0.9"][-1] == "-10.0 (n=1)"  # 50 − the base's seed 0 (60)
    assert md["0.99"][2] == "61.0 ± 12.7 (n=2)" and md["0.99"][-1] == "reference"
    assert md["0.999"][2] == "58.0 (n=1; 1 of 2 failed)"  # one seed diverged: counted, not averaged
    assert md["0.9999"][2:] == ["—"] * 7  # not in the grid
    text = (results / "tables" / "ablation_m.md").read_text()
    assert "fail (k of k): every seed's pretraining failed: its loss diverged" in text
    assert "k of n failed: k of the n seeds failed" in text
    rows = {r["m"]: r for r in read_csv(results, "ablation_m")}
    assert rows["0"]["status"] == "fail" and rows["0"]["top1"] == ""


def test_method_comparison_and_detection(results):
    md = md_rows(results, "methods")
    assert list(md) == ["MoCo (base cell)", "MoCo", "supervised", "random init"]
    assert md["MoCo (base cell)"][:3] == ["v2", "ResNet-18 (width 16)", "61.0 ± 12.7 (n=2)"]
    assert md["MoCo"][:3] == ["v3", "ViT-S", "63.0 (n=1)"]
    assert md["supervised"][2] == "70.0 (n=1)" and md["random init"][2] == "20.0 (n=1)"
    # paired with random init's one seed (0): 60 − 20; one pair, no interval, no direction claimed
    assert md["MoCo (base cell)"][-2] == "+40.0 (n=1)" and md["random init"][-2] == "reference"
    # and, cells being fine-tuned, AP50 against supervised's one seed (AP50 36): 30 − 36, 6 − 36
    assert md["MoCo (base cell)"][-1] == "-6.0 (n=1)" and md["random init"][-1] == "-30.0 (n=1)"
    assert md["supervised"][-1] == "reference"
    main = (results / "tables" / "main.md").read_text()
    assert "Δ AP50 vs supervised (paired by seed)" in main and "Δ vs supervised: each row's AP50 minus" in main
    assert "these runs show no direction (n = 1: no interval)" in (results / "tables" / "main.md").read_text()
    det = md_rows(results, "detection")
    assert det["MoCo"][2:] == ["—", "—", "—", "—"]  # ViT cell: no detection transfer
    # supervised: one seed, 3 trials (AP 17, 18, 19): their mean, one seed, no interval (the trials
    # of one pretraining are not independent samples of it); 2 seeds x 1 trial (AP50 30, 34: std
    # 2.83, half 12.706 * 2.83 / sqrt 2 = 25.4)
    assert det["supervised"][2:5] == ["36.0 (n=1)", "18.0 (n=1)", "14.4 (n=1)"]
    assert det["MoCo (base cell)"][2:5] == ["32.0 ± 25.4 (n=2)", "16.0 ± 12.7 (n=2)", "12.8 ± 10.2 (n=2)"]
    assert det["random init"][2] == "6.0 (n=1)"
    # Δ AP50 against supervised (the transfer claim's), paired by seed: only seed 0 has both;
    # base 30 − 36, random init 6 − 36
    assert det["supervised"][-1] == "reference"
    assert det["MoCo (base cell)"][-1] == "-6.0 (n=1)" and det["random init"][-1] == "-30.0 (n=1)"
    rows = {r["method"]: r for r in read_csv(results, "detection")}
    assert rows["supervised"]["AP_n"] == "1" and rows["supervised"]["AP_std"] == ""
    # which normalisation and batch each number came from, and how it was scored
    text = (results / "tables" / "detection.md").read_text()
    assert (
        f"Fine-tuning normalisation and batch: MoCo (base cell) v2 ResNet-18 (width 16): {FROZEN}; "
        "supervised ResNet-18 (width 16): SyncBN over 16 images (8 ranks x 2); "
        f"random init ResNet-18 (width 16): {FROZEN}."
    ) in text
    assert "Scored as: COCO box AP (pycocotools)." in text
    assert "SyncBN over 16 images" in (results / "tables" / "detection.tex").read_text()


def test_the_rivals_join_the_main_table_and_its_figure(tmp_path):
    """SimCLR and BYOL cells stand between MoCo and the baselines (their registry order), the title
    names them, and the methods figure draws each method's seeds paired."""
    for s in (0, 1):
        seed = f",seed={s}" if s else ""
        for cid, top1 in (("base", 60.0), ("method=simclr", 58.0), ("method=byol", 40.0), ("method=random", 20.0)):
            fake_cell(tmp_path, (cid + seed).removeprefix("base,") if s else cid, top1 + s)
    write_tables(tmp_path, {"grid": {"seeds": 2}})
    assert list(md_rows(tmp_path, "methods")) == ["MoCo (base cell)", "SimCLR", "BYOL", "supervised", "random init"]
    assert "### MoCo vs SimCLR vs BYOL vs supervised vs random init" in (tmp_path / "tables" / "main.md").read_text()
    assert (tmp_path / "figures" / "methods.png").read_bytes()[:4] == b"\x89PNG"


def test_the_methods_figure_tells_apart_rows_of_one_method(tmp_path):
    """SimCLR at two batches in one folder (the claims' cells beside the grid's): two rows of the
    table, two ticks of the figure, each with its other settings."""
    from pipeline.report import figures
    from pipeline.report.studies import collect, groups

    for cid, top1 in (("base", 60.0), ("method=simclr", 58.0), ("method=simclr,batch_size=512", 55.0)):
        fake_cell(tmp_path, cid, top1)
    write_tables(tmp_path, {})
    simclr = [ln for ln in (tmp_path / "tables" / "methods.md").read_text().splitlines() if ln.startswith("| SimCLR")]
    assert len(simclr) == 2 and sum("| batch_size=512 |" in ln for ln in simclr) == 1
    fig = figures.methods(groups(collect(tmp_path)))
    ticks = [t.get_text() for t in fig.axes[0].get_xticklabels()]
    assert ticks[:3] == ["MoCo (base cell) v2", "SimCLR", "SimCLR\nbatch_size=512"]


def test_the_methods_figure_without_cells_says_so():
    from pipeline.report import figures

    fig = figures.methods({})
    assert [t.get_text() for t in fig.axes[0].texts] == ["no data yet"]


@pytest.mark.integration
def test_the_main_table_says_how_the_supervised_baseline_trained(results, tmp_path):
    # CONFIG sets no grid.supervised: the baseline trained on MoCo's views, and the footnote says so
    main = (results / "tables" / "main.md").read_text()
    assert "supervised: trained on MoCo's views, augmentation and schedule (grid.supervised unset)." in main
    # with its own recipe (torchvision's, as the paper presets), the footnote lists the set keys
    fake_cell(tmp_path, "base", 60.0)
    fake_cell(tmp_path, "method=supervised", 70.0)
    recipe = {"epochs": 90, "lr": 0.1, "lr_step_epochs": [30, 60], "aug": "none", "batch_size": None}
    write_tables(tmp_path, merge(CONFIG, {"grid": {"supervised": recipe}}))
    main = (tmp_path / "tables" / "main.md").read_text()
    assert (
        "supervised: its own recipe (grid.supervised: epochs=90, lr=0.1, lr_step_epochs=[30, 60], aug=none); "
        "other settings as the base cell."
    ) in main


def test_detection_records_from_before_the_footnote_still_name_norm_batch_and_protocol():
    from pipeline.report.records import DetectRecord, from_json

    old = {"AP": 40.6, "norm": "frozen_bn", "sync_bn": False, "config": {"detect": {"batch_size": 4}}}
    record = from_json(DetectRecord, {**old, "a key of a newer version": 1})
    assert record is not None and record.AP == 40.6 and record.each_trial() == [record]
    assert record.setup == "frozen_bn, batch 4" and record.scored_as == "COCO box AP (pycocotools)"
    assert from_json(DetectRecord, {}) is None


def test_mechanisms_over_k(results):
    rows = {r["K"]: r for r in read_csv(results, "mechanisms")}
    assert float(rows["256"]["end_to_end_top1"]) == 52.0  # end-to-end: K is the batch size
    assert float(rows["4096"]["memory_bank_top1"]) == 54.0
    assert float(rows["4096"]["moco_top1"]) == 61.0 and float(rows["1024"]["moco_top1"]) == 55.0
    assert rows["256"]["moco_top1"] == ""


def test_epochs_and_grid_tables(results):
    assert md_rows(results, "ablation_epochs")["60"][0] == "65.0 (n=1)"
    grid = md_rows(results, "grid")
    assert list(grid)[0] == "base" and "seed=1" not in grid and grid["m=0"][0] == "fail (1 of 1)"


def test_every_table_states_its_provenance(results):
    for name in SWEPT_HERE:
        text = (results / "tables" / f"{name}.md").read_text()
        for word in (
            "dataset: embedded synthetic shapes (10 classes, 500 train",
            "backbone:",
            "epochs",
            "protocol: linear probe",
            "kNN",
            "detection: Faster R-CNN",
        ):
            assert word in text, (name, word)
    assert (
        "backbone: ResNet-18 (width 16); pretraining: 30 epochs" in (results / "tables" / "ablation_K.md").read_text()
    )
    assert "pretraining: per row (30, 60) epochs" in (results / "tables" / "ablation_epochs.md").read_text()


# --- LaTeX --------------------------------------------------------------------------------------
def check_latex_structure(tex: str) -> None:
    unescaped = re.sub(r"\\[{}&%$#_]", "", tex)
    depth = 0
    for ch in unescaped:
        depth += {"{": 1, "}": -1}.get(ch, 0)
        assert depth >= 0, "unbalanced braces"
    assert depth == 0, "unbalanced braces"
    for word in (r"\toprule", r"\midrule", r"\bottomrule", r"\begin{tabular}", r"\end{tabular}"):
        assert unescaped.count(word) == 1, word
    assert unescaped.index(r"\toprule") < unescaped.index(r"\midrule") < unescaped.index(r"\bottomrule")
    ncols = len(re.search(r"\\begin\{tabular\}\{([lrc]+)\}", tex).group(1))
    table = unescaped[unescaped.index(r"\toprule") : unescaped.index(r"\bottomrule")]
    for line in table.splitlines():
        if not line.endswith(r"\\"):
            continue
        spans = sum(int(n) - 1 for n in re.findall(r"\\multicolumn\{(\d+)\}", line))
        assert line.count("&") + 1 + spans == ncols, line


def test_latex_is_booktabs_with_consistent_columns(results):
    for name in SWEPT_HERE:
        tex = (results / "tables" / f"{name}.tex").read_text()
        check_latex_structure(tex)
        assert "—" not in tex and "±" not in tex and "Δ" not in tex  # pdflatex-safe: ---, $\pm$, $\Delta$
    assert r"61.0 $\pm$ 12.7" in (results / "tables" / "ablation_K.tex").read_text()
    assert r"\multicolumn{3}{c}{linear top-1}" in (results / "tables" / "mechanisms.tex").read_text()


def test_latex_escapes_specials():
    from pipeline.report.studies import Row, Table, Value

    t = Table(
        "x_y", "50% & more_", ["a_b"], ["top1"], ["linear top-1"], [Row(["#1 {x}"], [Value(1.0)])], "root ~/data_1"
    )
    tex = latex(t)
    check_latex_structure(tex)
    assert r"\#1 \{x\}" in tex and r"50\% \& more\_" in tex and r"\textasciitilde{}/data\_1" in tex


def test_latex_compiles(results, tmp_path):
    # make test installs TeX (texlive-latex-base/-recommended); outside CI it may be absent
    require(shutil.which("pdflatex") is not None, "no TeX engine (pdflatex): structural checks only")
    inputs = "\n".join(rf"\input{{{results / 'tables' / name}.tex}}" for name in SWEPT_HERE)
    doc = tmp_path / "doc.tex"
    doc.write_text(
        f"\\documentclass{{article}}\n\\usepackage{{booktabs}}\n\\begin{{document}}\n{inputs}\n\\end{{document}}\n"
    )
    proc = subprocess.run(
        ["pdflatex", "-interaction=nonstopmode", "-halt-on-error", doc.name],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert (tmp_path / "doc.pdf").stat().st_size > 0


# --- figures and the CLI ------------------------------------------------------------------------
def test_figures_png_and_pdf(results):
    fig = results / "figures"
    for stem in (
        "accuracy_vs_K",
        "accuracy_vs_m",
        "staleness",
        "curves/base",
        "curves/m=0",
        "curves/method=random",
        "curves/K=16384",
    ):
        assert (fig / f"{stem}.png").read_bytes()[:4] == b"\x89PNG", stem
        assert (fig / f"{stem}.pdf").read_bytes()[:4] == b"%PDF", stem


def test_cli_without_snakemake(tmp_path):
    r = tmp_path / "results"
    fake_cell(r, "base", 60.0, ap=15.0)
    fake_cell(r, "K=1024", 55.0, ap=14.0)
    proc = run([sys.executable, "-m", "pipeline.tables", str(r)], cwd=REPO, timeout=300)
    assert "### MoCo vs supervised vs random init" in proc.stdout and "| MoCo (base cell) |" in proc.stdout
    assert md_rows(r, "ablation_K")["1024"][0] == "55.0 (n=1)"
    # no config: only the cells found, the dataset from the conversion report if any
    assert "dataset: unknown" in (r / "tables" / "ablation_K.md").read_text()
    assert (r / "figures" / "curves" / "K=1024.png").is_file()
    proc = run([sys.executable, "-m", "pipeline.tables", str(tmp_path / "nope")], cwd=REPO, check=False)
    assert proc.returncode != 0 and "results folder not found" in proc.stderr


def test_empty_results(tmp_path):
    text = write_tables(tmp_path, figures=False)
    assert "No cell results" in text
    assert md_rows(tmp_path, "methods")["MoCo (base cell)"][-1] == "—"
    assert sorted(p.stem for p in (tmp_path / "tables").glob("*.md")) == ["all", "grid", "main", "methods"]
    check_latex_structure((tmp_path / "tables" / "methods.tex").read_text())


def test_half_life_of_the_momentum():
    from pipeline.dag.claims_plan import half_life

    assert half_life(0.5) == 1.0 and half_life(0) == 0.0 and half_life(1) == float("inf")
    assert half_life(0.999) == pytest.approx(692.8, abs=0.1) and half_life(0.9) == pytest.approx(6.579, abs=1e-3)


@pytest.mark.integration
def test_detection_ci_is_over_seeds_and_a_seed_without_output_is_counted(tmp_path):
    # seed 0: trials 10, 12 -> 11; seed 1: trials 14, 16 -> 15; seed 2: probe only, no detection.
    # Over seeds: 11, 15: mean 13, std 2.83, half 12.706 * 2.83 / sqrt 2 = 25.4 (pooling the 4
    # trials as independent would give n=4, 13.0 ± 4.1)
    for cid, ap in (("base", [10.0, 12.0]), ("seed=1", [14.0, 16.0]), ("seed=2", None)):
        fake_cell(tmp_path, cid, 60.0, ap=ap)
    write_tables(tmp_path, CONFIG)
    det = md_rows(tmp_path, "detection")
    assert det["MoCo (base cell)"][3] == "13.0 ± 25.4 (n=2; 1 of 3 missing)"
    assert "k of n missing: k of the n seeds have no output" in (tmp_path / "tables" / "detection.md").read_text()
    row = next(r for r in read_csv(tmp_path, "detection") if r["method"] == "MoCo (base cell)")
    assert (row["AP_n"], row["AP_missing"], row["AP_failed"]) == ("2", "1", "0")


@pytest.mark.integration
def test_segmentation_table_and_the_main_tables_mask_columns(results, tmp_path):
    """Mask AP as the detection study: trials averaged within a seed, the CI over seeds.
    Seed 0: mask AP trials 10, 12 -> 11; seed 1: 14, 16 -> 15: mean 13, std 2.83, half
    12.706 * 2.83 / sqrt 2 = 25.4. Mask AP50 (twice): 22, 30 -> 26 ± 50.8. Paired Δ in mask
    AP50 against supervised's one seed (mask AP 5: AP50 10): seed 0 only, 22 − 10 = +12; random
    init's (mask AP 3: AP50 6): 6 − 10 = −4."""
    fake_cell(tmp_path, "base", 60.0, ap=[20.0, 22.0], mask_ap=[10.0, 12.0])
    fake_cell(tmp_path, "seed=1", 62.0, ap=[24.0, 26.0], mask_ap=[14.0, 16.0])
    fake_cell(tmp_path, "method=random", 20.0, ap=4.0, mask_ap=3.0)
    fake_cell(tmp_path, "method=supervised", 70.0, ap=6.0, mask_ap=5.0)
    write_tables(tmp_path, CONFIG)
    seg = md_rows(tmp_path, "segmentation")  # variant, backbone, AP50, AP, AP75, mask AP50, AP, AP75, Δ
    assert seg["MoCo (base cell)"][3] == "23.0 ± 25.4 (n=2)"  # box AP: 21, 25
    assert seg["MoCo (base cell)"][5:9] == [
        "26.0 ± 50.8 (n=2)",
        "13.0 ± 25.4 (n=2)",
        "10.4 ± 20.3 (n=2)",
        "+12.0 (n=1)",
    ]
    assert seg["supervised"][-1] == "reference" and seg["random init"][-1] == "-4.0 (n=1)"
    assert "mask AP50" in (tmp_path / "tables" / "segmentation.md").read_text()
    main = md_rows(tmp_path, "methods")  # variant, backbone, top-1, kNN, AP50, AP, AP75, mask AP50, AP, AP75, Δ
    assert main["MoCo (base cell)"][8] == "13.0 ± 25.4 (n=2)"
    assert "mask AP" not in (results / "tables" / "main.md").read_text()  # boxes only: no mask columns


def test_a_failed_pretraining_fails_its_ap_only_where_a_fine_tuning_ran(tmp_path):
    """A failed pretraining counts as failed in its probe's columns; in the AP columns only where
    it was fine-tuned: a cell outside detect.cells has no AP, failed or not ("—")."""
    r = tmp_path / "r"
    fake_cell(r, "base", 60.0, ap=15.0)
    fake_cell(r, "method=supervised", 70.0, ap=18.0)
    fake_cell(r, "method=random", 20.0, ap=3.0)
    fake_cell(r, "variant=v1", 10.0, diverged=True)  # failed, never fine-tuned
    fake_cell(r, "variant=v3", 10.0, ap=1.0, diverged=True)  # failed, fine-tuned
    write_tables(r, CONFIG)
    lines = [ln for ln in (r / "tables" / "methods.md").read_text().splitlines() if ln.startswith("| MoCo |")]
    # method | variant | backbone | linear, kNN, AP50, AP, AP75 | Δ linear vs random init, Δ AP50 vs supervised
    rows = {cells[1]: cells[3:] for cells in ([c.strip() for c in ln.strip("|").split("|")] for ln in lines)}
    assert rows["v1"] == ["fail (1 of 1)"] * 2 + ["—"] * 3 + ["— (1 of 1 failed)", "—"]
    assert rows["v3"] == ["fail (1 of 1)"] * 5 + ["— (1 of 1 failed)"] * 2
